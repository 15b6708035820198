"""Every name the benchmarks and scripts import from this repository exists.

Benchmarks import most of the toolkit inside `measure()`, which no fast test runs, so a
renamed or removed toolkit name would only show up as a failed figure in `make bench` (it
did: `launch_latency` still imported a helper the toolkit-seam change removed).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = ("magi_lp", "projects", "benchmarks")
FILES = sorted((REPO / "benchmarks").rglob("*.py")) + sorted((REPO / "scripts").glob("*.py"))


def _missing(module_name: str, names: list[str]) -> list[str]:
    module = importlib.import_module(module_name)
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
