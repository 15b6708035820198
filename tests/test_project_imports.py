"""The projects import from magi_lp only what docs/architecture.md says they may ("What a
project imports"): the public names, and the toolkit modules its table lists, each used."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import magi_lp

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- project imports: tests/test_project_imports.py -->"
END = "<!-- end of project imports -->"


def _listed() -> list[str]:
    """The modules of the doc's table (its first column), in order."""
    text = DOC.read_text()
    table = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip().splitlines()
    return [row.split("|")[1].strip().strip("`") for row in table[2:]]


def _imports() -> dict[str, set[str]]:
    """Every magi_lp module any file of projects/ imports (at any depth), with the files."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "projects").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                if name == "magi_lp" or name.startswith("magi_lp."):
                    found.setdefault(name, set()).add(where)
    return found


def test_projects_import_only_the_modules_the_doc_lists():
    unlisted = {m: sorted(f) for m, f in _imports().items() if m not in _listed()}
    assert not unlisted, (
        f"projects import toolkit modules docs/architecture.md does not list under 'What a "
        f"project imports': {unlisted}; import the public name from magi_lp, or list the "
        "module there with the reason a project needs it"
    )


def test_every_listed_module_exists_and_is_used():
    listed, used = _listed(), set(_imports())
    assert listed[0] == "magi_lp" and len(set(listed)) == len(listed)
    for module in listed:
        assert importlib.util.find_spec(module) is not None, f"{module} no longer exists"
    unused = [m for m in listed if m not in used]
    assert not unused, f"docs/architecture.md lists modules no project imports: {unused}"


def test_names_from_magi_lp_are_its_public_names():
    for path in sorted((ROOT / "projects").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "magi_lp" and not node.level:
                for alias in node.names:
                    assert alias.name in magi_lp.__all__, f"{path}: magi_lp.{alias.name}"
