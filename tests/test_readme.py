"""README.md's generated parts are what their generators give now: the Layout (from the tree)
and the headline table (from benchmarks/results.json, the numbers BENCHMARKS.md shows).
When one fails, `make docs` rewrites both; commit the result."""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

from benchmarks import run as bench

ROOT = Path(__file__).resolve().parents[1]
FIX = "run `make docs` and commit README.md"


def _between(text: str, begin: str, end: str) -> str:
    start = text.index(begin) + len(begin)
    return text[start : text.index(end, start)].strip()


def _readme_layout():
    spec = importlib.util.spec_from_file_location(
        "readme_layout", ROOT / "scripts/readme_layout.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_layout_is_the_tree():
    layout = _readme_layout()
    shown = _between((ROOT / "README.md").read_text(), layout.BEGIN, layout.END)
    assert shown == layout.layout(), f"README's Layout is not the tree's: {FIX}"


def test_the_layout_names_every_package():
    shown = _readme_layout().layout()
    for init in (ROOT / "magi_lp").glob("*/__init__.py"):
        assert f"  {init.parent.name}/ " in shown


def test_the_headline_table_is_rendered_from_results_json():
    results = json.loads((ROOT / bench.RESULTS).read_text())
    shown = _between((ROOT / "README.md").read_text(), bench.README_BEGIN, bench.README_END)
    assert shown == bench.readme_table(results), (
        f"README's headline table is not what benchmarks/results.json gives: {FIX}"
    )


def test_the_replay_row_gives_the_device_store_cost():
    # The replay's cost on the headline is the device store's (figure 11), beside the Reverb
    # frame replay's (figure 10), not the Reverb path's alone.
    results = json.loads((ROOT / bench.RESULTS).read_text())
    device_store = importlib.import_module("benchmarks.device_store")
    measured, against, _ = device_store.summary(results["figures"]["device_store"])
    assert f"| {measured} | {against} |" in bench.readme_table(results)
    assert "Reverb frame replay" in against
