"""README.md's generated parts are what their generators give now: the Layout (from the tree),
the headline table (from benchmarks/results.json, the numbers BENCHMARKS.md shows) and every
command sample (`$ command`, `error: ...`: from running the command now,
scripts/readme_samples.py). When one fails, `make docs` rewrites them all; commit the result.

Running the samples' commands starts the entry points (two compile DrQ-v2's update), so that
check is in the integration lane; that every sample block is a generated one is not."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from benchmarks import run as bench

ROOT = Path(__file__).resolve().parents[1]
FIX = "run `make docs` and commit README.md"


def _between(text: str, begin: str, end: str) -> str:
    start = text.index(begin) + len(begin)
    return text[start : text.index(end, start)].strip()


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"scripts/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _readme_layout():
    return _script("readme_layout")


SAMPLES = _script("readme_samples")


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


def test_every_command_sample_is_a_generated_one():
    # A `$ command` or `error: ...` quoted in README, in a block or in a sentence, stands
    # between a sample's markers (or says it was captured, and whence), so `make docs` keeps it
    # what the command prints; each sample of the script is marked once.
    text = (ROOT / "README.md").read_text()
    SAMPLES._blocks(text)  # raises on a sample marked twice, unknown or missing
    outside = SAMPLES.unmarked(text)
    assert not outside, (
        "README quotes commands or errors outside a generated sample; add them to SAMPLES in "
        f"scripts/readme_samples.py with markers around the block, then {FIX}: {outside}"
    )


def test_a_hand_written_sample_is_found():
    begin = "<!-- sample refusals: make docs (scripts/readme_samples.py --write) -->"
    captured = "<!-- captured 2026-11-23, commit e6e9c4e: a live run -->"
    text = "\n".join(
        [
            *(begin, "```", "$ python a.py", "error: a", "```", SAMPLES.END),
            *(captured, "```", "error: from a live run", "```"),
            *("```", "$ python b.py", "error: b", "```"),
            "a sentence quoting `error: c`, and `$ python d.py` (a usage, not a sample)",
        ]
    )
    assert SAMPLES.unmarked(text) == [
        "line 12: $ python b.py",
        "line 13: error: b",
        "line 15: a sentence quoting `error: c`, and `$ python d.py` (a usage, not a sample)",
    ]


@pytest.mark.integration
@pytest.mark.parametrize("name", list(SAMPLES.SAMPLES))
def test_each_command_sample_is_what_the_command_prints_now(name):
    why = SAMPLES.unpinned(name)
    if why:
        pytest.skip(why)
    shown = SAMPLES.shown((ROOT / "README.md").read_text(), name)
    printed = SAMPLES.render(name)
    diff = "".join(
        difflib.unified_diff(
            shown.splitlines(True), printed.splitlines(True), "README.md", "printed now"
        )
    )
    assert shown == printed, (
        f"README's sample {name!r} is not what its command prints: {FIX}\n" + diff
    )


def test_a_sample_shows_only_its_lines_and_marks_what_it_leaves_out():
    lines = ["a", "node group  x", "b", "c", "learner  y", "d"]
    assert SAMPLES._excerpt(lines, r"^(node group|learner )") == [
        "...",
        "node group  x",
        "...",
        "learner  y",
        "...",
    ]
    assert SAMPLES._excerpt(lines, "") == lines


def test_writing_a_sample_keeps_the_block_and_its_indent():
    text = "\n".join(
        [
            "- item:",
            "  <!-- sample refusals: make docs (scripts/readme_samples.py --write) -->",
            "  ```",
            "  old",
            "  ```",
            "  <!-- end of sample -->",
        ]
    )
    written = SAMPLES.write(text, {"refusals": "$ new\nerror: x"})
    assert written.split("\n")[2:6] == ["  ```", "  $ new", "  error: x", "  ```"]
