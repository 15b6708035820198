"""Prints the Layout section of docs/development.md: the repository's folders and packages,
from the tree.

Each Python package is described by the first paragraph of its `__init__.py` docstring, each
top-level magi_lp module by its docstring's first line, and the folders that are not packages
(configs/, docs/, scripts/, tests/) by `FOLDERS` below. So moving a module or adding a package
(e.g. magi_lp/replay/) needs no hand edit of the docs, only:

    make docs                                 # or:
    python scripts/readme_layout.py --write   # replace the Layout in docs/development.md
    python scripts/readme_layout.py           # print it

tests/test_readme.py fails, naming `make docs`, while `PAGE` holds another Layout (or another
page holds one too).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "development.md"
"""The page the Layout lives in (the front page, README.md, links to it)."""
BEGIN = "<!-- layout: make docs (scripts/readme_layout.py --write) -->"
END = "<!-- end of layout -->"

# The top-level folders that are not Python packages; a package describes itself. A new
# folder must be added here (`layout()` says so), and every file named here must exist.
FOLDERS = {
    "configs": "Experiment configs (ml_collections files: `--config configs/<name>.py`)",
    "docs": "The manual behind the front page: set-up and the two stacks (setup.md), running an "
    "experiment and its plan (usage.md), GPUs (gpus.md), the replay store (replay.md), a run's "
    "stop, resume and logs (runs.md), the engines (engines.md), several hosts (cluster.md), "
    "writing an agent (agents.md), results (results.md), tests and this layout "
    "(development.md), the architecture (architecture.md: the layers, every module, a run's "
    "flow), launchpad-notes.md (what magi_lp relies on in Launchpad)",
    "scripts": "Set-up (setup_venv.sh, setup_venv312.sh, setup_official_venv.sh, find_python.sh, "
    "write_home_pth.sh, choose_jax_build.py; the GPU machine's wheels: gpu_check_wheels.sh, "
    "gpu_learn_wheels.sh, gpu_system_wheels.sh, repack_wheel.py), both stacks' suite "
    "(test_both_stacks.sh), the one-machine SLURM "
    "cluster (slurm_cluster.py: make slurm-up / slurm-down) and the generated docs "
    "(module_table.py, readme_layout.py, readme_samples.py: make docs)",
    "tests": "Pytest (`make test`, `make test-fast`); golden/: the cluster renderers' files",
}
FIRST = ("magi_lp", "projects")  # then the other folders, alphabetically
NAME_WIDTH = 19  # the description column starts after the indent and this
WIDTH = 96


def _files() -> list[str]:
    """The repository's files, tracked or new (not ignored), relative to the root, each once
    (during a merge git lists a conflicted file once per side)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({line for line in out.splitlines() if (ROOT / line).exists()})


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def first_paragraph(path: Path) -> str:
    """A module's docstring up to its first blank line, as one line."""
    lines = []
    for line in _docstring(path).strip().splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    return " ".join(lines)


def _entry(indent: int, name: str, text: str) -> list[str]:
    width = WIDTH - indent - NAME_WIDTH
    wrapped = textwrap.wrap(text, width=width, break_on_hyphens=False) or [""]
    head = " " * indent + name.ljust(NAME_WIDTH)
    if len(name) >= NAME_WIDTH:  # a long name: its description starts on the next line
        return [head.rstrip()] + [" " * (indent + NAME_WIDTH) + line for line in wrapped]
    return [head + wrapped[0]] + [" " * (indent + NAME_WIDTH) + line for line in wrapped[1:]]


def _package_text(init: Path) -> str:
    text = first_paragraph(init)
    dotted = ".".join(init.parent.relative_to(ROOT).parts)
    text = text.removeprefix(f"{dotted}: ")
    if not text or text.strip(".") == dotted:
        raise SystemExit(
            f"{init.relative_to(ROOT)}: give the package a docstring whose first paragraph says "
            "what it holds (docs/development.md's Layout shows it), then run `make docs`"
        )
    return text


def layout() -> str:
    files = _files()
    packages = {str(Path(f).parent) for f in files if Path(f).name == "__init__.py"}
    folders = sorted({f.split("/", 1)[0] for f in files if "/" in f and not f.startswith(".")})
    order = [f for f in FIRST if f in folders] + [f for f in folders if f not in FIRST]
    lines = []
    for folder in order:
        if folder in packages:
            lines += _entry(0, f"{folder}/", _package_text(ROOT / folder / "__init__.py"))
            subpackages = sorted(p for p in packages if Path(p).parent == Path(folder))
            for package in subpackages:
                lines += _entry(
                    2, f"{Path(package).name}/", _package_text(ROOT / package / "__init__.py")
                )
            if folder == "magi_lp":
                modules = sorted(
                    f
                    for f in files
                    if Path(f).parent == Path(folder)
                    and f.endswith(".py")
                    and Path(f).name not in ("__init__.py", "__main__.py")
                )
                for module in modules:
                    lines += _entry(2, Path(module).name, first_paragraph(ROOT / module))
        elif folder in FOLDERS:
            text = FOLDERS[folder]
            for named in re.findall(r"[\w.-]+\.(?:py|sh|md)", text):
                if not any(f == f"{folder}/{named}" for f in files):
                    raise SystemExit(
                        f"scripts/readme_layout.py: FOLDERS[{folder!r}] names {named}, "
                        f"which is not in {folder}/; correct it, then run `make docs`"
                    )
            lines += _entry(0, f"{folder}/", text)
        else:
            raise SystemExit(
                f"{folder}/ is a new top-level folder: describe it in FOLDERS in "
                "scripts/readme_layout.py (or make it a package with a docstring), then run "
                "`make docs`"
            )
    return "```\n" + "\n".join(lines) + "\n```"


def main() -> int:
    """Prints the Layout block; with --write, puts it between `PAGE`'s markers."""
    block = layout()
    if "--write" not in sys.argv:
        print(block)
        return 0
    before, rest = PAGE.read_text().split(BEGIN, 1)
    after = rest[rest.index(END) :]
    PAGE.write_text(f"{before}{BEGIN}\n{block}\n{after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
