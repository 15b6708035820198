"""Every name the benchmarks and scripts import from this repository exists.

Benchmarks import most of the toolkit inside `measure()`, which no fast test runs, so a
renamed or removed toolkit name would only show up as a failed figure in `make bench` (it
did: `launch_latency` still imported a helper the toolkit-seam change removed).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = ("magi_lp", "projects", "benchmarks")
FILES = sorted((REPO / "benchmarks").rglob("*.py")) + sorted((REPO / "scripts").glob("*.py"))


def _top_level_names(module_name: str) -> set[str]:
    """The names a module's source defines or imports at its top level, read without
    importing it."""
    tree = ast.parse(Path(importlib.util.find_spec(module_name).origin).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _missing(module_name: str, names: list[str]) -> list[str]:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != "ray":
            raise
        # A Ray engine module (the Ray stack, .venv312) checked from a stack without Ray:
        # its source is read instead (benchmarks.served_acting imports it inside `measure`).
        defined = _top_level_names(module_name)
        return [f"{module_name}.{name}" for name in names if name not in defined]
    missing = []
    for name in names:
        if hasattr(module, name):
            continue
        try:  # a submodule: `from magi_lp.launch import isolation`
            importlib.import_module(f"{module_name}.{name}")
        except ImportError:
            missing.append(f"{module_name}.{name}")
    return missing


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.relative_to(REPO).as_posix())
def test_every_repository_name_a_benchmark_imports_exists(path):
    tree = ast.parse(path.read_text())
    missing = []
    for node in ast.walk(tree):  # module level and inside functions alike
        ours = isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        if ours and node.module.split(".")[0] in OURS:
            missing += _missing(node.module, [alias.name for alias in node.names])
    assert not missing, f"{path.name} imports names that do not exist: {missing}"


def test_the_page_renders_every_stored_figure(tmp_path):
    """BENCHMARKS.md is written from benchmarks/results.json by each figure's `report()`:
    a report that no longer reads its stored result (a renamed key) would replace the
    figure's text with an error at the next `make bench` (figure 12 did, after its key
    `seconds` became `run_seconds`)."""
    import json

    from benchmarks.run import PAGE, write_page

    results = json.loads((REPO / "benchmarks" / "results.json").read_text())
    page = write_page(tmp_path, results).read_text()
    assert "Could not render" not in page
    assert page == (REPO / PAGE).read_text()
