"""The generated parts of README.md and the docs pages are what their generators give now: the
Layout (docs/development.md, from the tree), the headline table (docs/results.md, from
benchmarks/results.json, the numbers BENCHMARKS.md shows) and every command sample (`$ command`,
`error: ...`: from running the command now, scripts/readme_samples.py, in whichever page it
lives). When one fails, `make docs` rewrites them all; commit the result.

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
FIX = "run `make docs` and commit README.md and docs/"


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
PAGES = SAMPLES.pages()


def _page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _holding(marker: str) -> list[str]:
    return [_page_id(page) for page in PAGES if marker in page.read_text()]


def test_each_generated_section_lives_in_one_page():
    # The front page links to the page a section moved to; a copy left behind would go stale.
    layout = _readme_layout()
    assert _holding(layout.BEGIN) == [_page_id(layout.PAGE)]
    assert _holding(bench.README_BEGIN) == [bench.HEADLINE_PAGE.as_posix()]
    SAMPLES.located()  # raises on a sample marked twice, in two pages, or in none


def test_the_front_page_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"]({_page_id(page)})" in readme, f"README.md does not link {_page_id(page)}"


def test_the_layout_is_the_tree():
    layout = _readme_layout()
    shown = _between(layout.PAGE.read_text(), layout.BEGIN, layout.END)
    assert shown == layout.layout(), f"{_page_id(layout.PAGE)}'s Layout is not the tree's: {FIX}"


def test_the_layout_names_every_package():
    shown = _readme_layout().layout()
    for init in (ROOT / "magi_lp").glob("*/__init__.py"):
        assert f"  {init.parent.name}/ " in shown


def test_the_headline_table_is_rendered_from_results_json():
    results = json.loads((ROOT / bench.RESULTS).read_text())
    shown = _between((ROOT / bench.HEADLINE_PAGE).read_text(), bench.README_BEGIN, bench.README_END)
    assert shown == bench.readme_table(results), (
        f"{bench.HEADLINE_PAGE}'s headline table is not what benchmarks/results.json gives: {FIX}"
    )


def test_the_headline_links_reach_benchmarks_md():
    results = json.loads((ROOT / bench.RESULTS).read_text())
    page = (ROOT / bench.PAGE).read_text()
    for link in bench.readme_table(results).split("](")[1:]:
        target, anchor = link.split(")")[0].split("#")
        assert (ROOT / bench.HEADLINE_PAGE.parent / target).resolve() == ROOT / bench.PAGE
        assert f"#{anchor})" in page  # BENCHMARKS.md's summary links the same anchor


def test_the_replay_row_gives_the_device_store_cost():
    # The replay's cost on the headline is the device store's (figure 11), beside the Reverb
    # frame replay's (figure 10), not the Reverb path's alone.
    results = json.loads((ROOT / bench.RESULTS).read_text())
    device_store = importlib.import_module("benchmarks.device_store")
    measured, against, _ = device_store.summary(results["figures"]["device_store"])
    assert f"| {measured} | {against} |" in bench.readme_table(results)
    assert "Reverb frame replay" in against


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_command_sample_is_a_generated_one(page):
    # A `$ command` or `error: ...` quoted in a page, in a block or in a sentence, stands
    # between a sample's markers (or says it was captured, and whence), so `make docs` keeps it
    # what the command prints; each sample of the script is marked once.
    text = page.read_text()
    SAMPLES._blocks(text, _page_id(page))  # raises on a sample marked twice, unknown or malformed
    outside = SAMPLES.unmarked(text)
    assert not outside, (
        f"{_page_id(page)} quotes commands or errors outside a generated sample; add them to "
        f"SAMPLES in scripts/readme_samples.py with markers around the block, then {FIX}: "
        f"{outside}"
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
    page = SAMPLES.located()[name]
    shown = SAMPLES.shown(page.read_text(), name)
    printed = SAMPLES.render(name)
    diff = "".join(
        difflib.unified_diff(
            shown.splitlines(True), printed.splitlines(True), _page_id(page), "printed now"
        )
    )
    assert shown == printed, (
        f"{_page_id(page)}'s sample {name!r} is not what its command prints: {FIX}\n" + diff
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
