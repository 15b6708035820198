"""Runs the benchmark figures and writes BENCHMARKS.md and benchmarks/results.json.

    python -m benchmarks.run [--quick] [--only name,...] [--out-dir .]
    make bench / make bench-quick
    python -m benchmarks.run --readme    # the headline table from results.json (make docs)

Each figure runs in its own fresh Python process (`python -m benchmarks.<module>`) with the
environment variables it asks for (e.g. JAX_PLATFORMS=cpu, one-thread XLA for the actor
figure), under a time limit; everything a figure process starts carries a marker variable
and is killed when the figure ends. A figure that fails or times out is recorded with its
error and log tail on the page; the others still run.

Full mode writes the page at the repository root; quick mode writes it under
benchmarks/quick/ (ignored by git) unless --out-dir says otherwise, so a check never replaces
the measured page. With --only, the named figures are re-measured and merged into the
existing results.json; the page is rebuilt from all stored results (each figure says when,
where and in which mode it was measured). Quick mode uses small sizes to check that
everything works: its numbers are not the figures.

The headline table of docs/results.md (`HEADLINE_PAGE`, which README.md links to) is rendered
here too (`readme_table`: the `HEADLINE` figures' rows of BENCHMARKS.md's summary, from the same
results.json), by a full run and by `--readme`, which runs nothing; tests/test_readme.py fails
while the page holds another table.

The GPU check (figure 7) is not run here: `make gpu-check` measures it on a GPU machine and
writes benchmarks/gpu_check.json, which this script only reads ("not measured: no GPU machine
was available" until that file holds a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from benchmarks import common

RESULTS = Path("benchmarks") / "results.json"
PAGE = Path("BENCHMARKS.md")
HEADLINE_PAGE = Path("docs") / "results.md"
README_BEGIN = "<!-- headline table: make docs (python -m benchmarks.run --readme) -->"
README_END = "<!-- end of headline table -->"
QUICK_OUT_DIR = "benchmarks/quick"  # ignored by git


@dataclasses.dataclass(frozen=True)
class Figure:
    """One figure: its module and how long its process may take (quick, full).

    A figure with `stored` is measured by its own command on another machine (the GPU
    check); its JSON result, at that path in the repository, is read instead of run.
    """

    name: str
    module: str
    timeout_quick_s: float
    timeout_full_s: float
    stored: str = ""


def _measured_here(name: str, timeout_quick_s: float, timeout_full_s: float) -> Figure:
    """The figure that `python -m benchmarks.<name>` measures, within those limits."""
    return Figure(name, f"benchmarks.{name}", timeout_quick_s, timeout_full_s)


def _measured_elsewhere(name: str) -> Figure:
    """The figure that `benchmarks.<name>` measured on another machine into
    benchmarks/<name>.json."""
    return Figure(name, f"benchmarks.{name}", 0, 0, stored=f"benchmarks/{name}.json")


FIGURES = (
    _measured_here("learner_updates", 420, 600),
    _measured_here("actor_throughput", 300, 600),
    _measured_here("replay_memory", 300, 600),
    _measured_here("launch_latency", 600, 1200),
    _measured_here("actor_scaling", 600, 1200),
    _measured_here("td3_learning", 420, 900),
    _measured_elsewhere("gpu_check"),
    _measured_here("batched_actor", 420, 900),
    _measured_here("data_parallel_learner", 300, 900),
    _measured_here("replay_sampling", 300, 600),
    _measured_here("device_store", 300, 900),
    _measured_here("make_run_stores", 400, 900),
    _measured_elsewhere("learn_check"),
    _measured_here("engines", 900, 3600),
    _measured_elsewhere("gpu_system"),
    _measured_elsewhere("gpu_learn"),
    _measured_elsewhere("gpu_learn_check"),
    _measured_here("host_frame_store", 300, 1500),
    _measured_here("served_acting", 300, 600),
)
BY_NAME = {figure.name: figure for figure in FIGURES}
HEADLINE = (
    "learn_check",
    "gpu_learn",
    "replay_memory",
    "device_store",
    "actor_throughput",
    "launch_latency",
    "actor_scaling",
    "learner_updates",
    "td3_learning",
    "gpu_check",
    "gpu_system",
    "batched_actor",
    "data_parallel_learner",
)
"""The headline table's figures (docs/results.md), in its order. The replay's cost is the
device store's (figure 11, which compares it with the Reverb frame replay's figure 10)."""


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def run_figure(figure: Figure, quick: bool, out_dir: Path, logs: Path) -> dict:
    """Runs one figure in its own process; returns its result with run metadata."""
    module = importlib.import_module(figure.module)
    extra = module.subprocess_env() if hasattr(module, "subprocess_env") else {}
    extra = {**extra, common.OUT_DIR_VAR: str(out_dir.resolve())}
    env = common.marked_env(extra)
    result_path = logs / f"{figure.name}.json"
    log_path = logs / f"{figure.name}.log"
    result_path.unlink(missing_ok=True)
    command = [sys.executable, "-m", figure.module, "--out", str(result_path)]
    if quick:
        command.append("--quick")
    timeout = figure.timeout_quick_s if quick else figure.timeout_full_s
    meta = {
        "measured_at": _now(),
        "mode": "quick" if quick else "full",
        "commit": common.git_commit(),
        "machine": common.machine_summary(),
        "load_before": common.load_average(),
    }
    start = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            cwd=common.REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            common.stop(process, 2, timeout_s=20.0)  # SIGINT first, then SIGKILL
    leftovers = common.kill_marked(env[common.MARK_VAR])
    meta["wall_s"] = round(time.monotonic() - start, 1)
    meta["load_after"] = common.load_average()
    if leftovers:
        meta["leftover_processes_killed"] = len(leftovers)
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        reason = f"timed out after {timeout:.0f} s" if timed_out else "wrote no result"
        result = {
            "status": "error",
            "error": f"the figure process {reason} (exit code {process.returncode})",
            "log_tail": common.tail(log_path, 40),
        }
    if result.get("status") == "error" and "log_tail" not in result:
        result["log_tail"] = common.tail(log_path, 40)
    return {**result, "run": meta}


def stored_result(figure: Figure) -> dict:
    """A stored figure's result with run metadata; "not measured" when it holds none."""
    module = importlib.import_module(figure.module)
    result = _load(common.REPO / figure.stored)
    if result.get("status") != "ok":
        return {"status": "skipped", "reason": module.NOT_MEASURED, "run": {"mode": "stored"}}
    meta = {
        "mode": "stored",
        "measured_at": result.get("measured_at", "?"),
        "commit": result.get("commit", "?"),
        "machine": result.get("machine", {}).get("gpu", "?"),
        "wall_s": result.get("seconds", "?"),
        "source": figure.stored,
    }
    return {**result, "run": meta}


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _section(number: int, figure: Figure, result: dict | None) -> str:
    module = importlib.import_module(figure.module)
    heading = f"## {number}. {module.TITLE}"
    if result is None:
        return f"{heading}\n\nNot measured yet: `python -m benchmarks.run --only {figure.name}`."
    run = result.get("run", {})
    if run.get("mode") == "stored":
        if result.get("status") != "ok":
            return f"{heading}\n\n**{result['reason']}**"
        # Rendered from the file itself: its own keys (gpu_system's "run") beside the page's
        # "run" metadata would be overwritten in `result`.
        stored = _load(common.REPO / run["source"]) or result
        return f"{heading}\n\n_read from `{run['source']}`_\n\n{module.report(stored).strip()}"
    stamp = (
        f"_{run.get('mode', '?')} mode, {run.get('measured_at', '?')}, commit "
        f"{run.get('commit', '?')}, {run.get('wall_s', '?')} s; load average "
        f"{run.get('load_before', '?')} before, {run.get('load_after', '?')} after_"
    )
    if result.get("status") == "skipped":
        body = f"**{result['reason']}**\n\n" + (module.report(result) if result.get("how") else "")
    elif result.get("status") != "ok":
        body = common.error_section(result)
    else:
        try:
            body = module.report(result)
        except Exception as error:  # a report bug must not lose the other figures
            body = f"**Could not render this figure's result**: `{error!r}` (see results.json)."
    return f"{heading}\n\n{stamp}\n\n{body.strip()}"


def write_page(out_dir: Path, results: dict) -> Path:
    """BENCHMARKS.md from the stored results."""
    machine = results["machine"]
    figures = results["figures"]
    modes = sorted({f.get("run", {}).get("mode", "?") for f in figures.values()} - {"stored"})
    quick_note = (
        "\n> **Quick mode** results below (small sizes, to validate the scripts): they are "
        "not the figures. `make bench` measures them.\n"
        if "quick" in modes
        else ""
    )
    lines = [
        "# magi_lp benchmarks",
        "",
        "<!-- Generated by `python -m benchmarks.run`; do not edit by hand. -->",
        "_This page is written by `make bench` (`python -m benchmarks.run`) from "
        "`benchmarks/results.json`; never edit it by hand. How each figure is measured: "
        "[benchmarks/README.md](benchmarks/README.md)._",
        quick_note,
        "| | |",
        "| --- | --- |",
        f"| machine | {machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB "
        f"RAM, GPU: {machine['gpu']} |",
        f"| software | Python {machine['python']}, Linux {machine['kernel']} |",
        f"| date | {results['written_at']} |",
        f"| git commit | {results['commit']} |",
        f"| mode | {', '.join(modes)} |",
        f"| run time | {_run_times(results)} |",
        "",
        "Load average before and after each figure is given with it: other work on the "
        "machine inflates wall-clock timings (frames per CPU-second and CPU-seconds per "
        "update are given where they help).",
        "",
        "| # | figure | number | comparison | ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for number, figure in enumerate(FIGURES, start=1):
        module = importlib.import_module(figure.module)
        result = figures.get(figure.name)
        summary = _summary(module, result)
        lines.append(f"| {number} | [{module.TITLE}](#{_anchor(number, module.TITLE)}) | {summary}")
    lines.append("")
    for number, figure in enumerate(FIGURES, start=1):
        lines += [_section(number, figure, figures.get(figure.name)), ""]
    page = out_dir / PAGE
    page.write_text("\n".join(lines).rstrip() + "\n")
    return page


def readme_table(results: dict) -> str:
    """The headline table: each `HEADLINE` figure's row of BENCHMARKS.md's summary, linked
    from `HEADLINE_PAGE`."""
    page = Path(os.path.relpath(PAGE, HEADLINE_PAGE.parent)).as_posix()
    number = {figure.name: n for n, figure in enumerate(FIGURES, start=1)}
    rows = ["| figure | measured | against | ratio |", "| --- | --- | --- | --- |"]
    for name in HEADLINE:
        module = importlib.import_module(BY_NAME[name].module)
        title = f"{number[name]}. {module.TITLE}"
        link = f"{page}#{_anchor(number[name], module.TITLE)}"
        rows.append(f"| [{title}]({link}) | {_summary(module, results['figures'].get(name))}")
    return "\n".join(rows)


def write_readme(results: dict, readme: Path = common.REPO / HEADLINE_PAGE) -> None:
    """Replaces the headline table of `HEADLINE_PAGE` (between its markers) with
    `readme_table(results)`."""
    text = readme.read_text()
    start = text.index(README_BEGIN) + len(README_BEGIN)
    end = text.index(README_END)
    readme.write_text(text[:start] + "\n\n" + readme_table(results) + "\n\n" + text[end:])


def _run_times(results: dict) -> str:
    parts = [
        f"all figures, {mode} mode: {run['seconds']:.0f} s ({run['at']})"
        for mode, run in sorted(results.get("complete_runs", {}).items())
    ]
    figures = results.get("last_run_figures", [])
    if len(figures) < len(FIGURES):
        parts.append(f"last run ({', '.join(figures)}): {results.get('last_run_s', '?')} s")
    return "; ".join(parts) or "?"


def _summary(module: ModuleType, result: dict | None) -> str:
    if result is None:
        return "not measured | | |"
    if result.get("status") == "skipped":
        return f"{result['reason']} | | |"
    if result.get("status") != "ok":
        return f"failed: {result.get('error', '?')[:80]} | | |"
    try:
        number, comparison, ratio_text = module.summary(result)
    except Exception as error:
        return f"(summary failed: {error!r}) | | |"
    return f"{number} | {comparison} | {ratio_text} |"


def _anchor(number: int, title: str) -> str:
    text = f"{number}. {title}".lower()
    kept = "".join(c for c in text if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a quick check")
    parser.add_argument("--only", default="", help=f"comma-separated figures: {', '.join(BY_NAME)}")
    parser.add_argument(
        "--out-dir",
        default=None,
        help=f"where BENCHMARKS.md goes (default: . in full mode, {QUICK_OUT_DIR} with --quick)",
    )
    parser.add_argument(
        "--readme",
        action="store_true",
        help=f"only render {HEADLINE_PAGE}'s headline table from benchmarks/results.json "
        "(runs nothing)",
    )
    args = parser.parse_args(argv)
    if args.readme:
        write_readme(json.loads((common.REPO / RESULTS).read_text()))
        print(f"wrote {HEADLINE_PAGE}'s headline table from {RESULTS}")
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    # Quick numbers are not the figures: by default they never replace the committed page.
    out_dir = Path(args.out_dir or (QUICK_OUT_DIR if args.quick else "."))
    (out_dir / "benchmarks").mkdir(parents=True, exist_ok=True)
    logs = out_dir / "benchmarks" / "logs"
    logs.mkdir(exist_ok=True)
    results_path = out_dir / RESULTS
    stored = _load(results_path)
    figures = dict(stored.get("figures", {})) if args.only else {}
    for name in set(figures) - set(BY_NAME):
        del figures[name]  # a figure that no longer exists (e.g. gpu_memory, now gpu_check)

    start = time.monotonic()
    for name in names:
        figure = BY_NAME[name]
        print(f"[{time.strftime('%H:%M:%S')}] {name} ({'quick' if args.quick else 'full'})")
        sys.stdout.flush()
        if figure.stored:
            figures[name] = stored_result(figure)
        else:
            figures[name] = run_figure(figure, args.quick, out_dir, logs)
        status = figures[name].get("status")
        detail = figures[name].get("error") or figures[name].get("reason") or ""
        print(f"    {status} in {figures[name]['run'].get('wall_s', 0)} s {detail[:200]}")
        # Write after every figure: an interrupted run keeps what it measured.
        elapsed = round(time.monotonic() - start, 1)
        complete = dict(stored.get("complete_runs", {}))
        if not args.only and name == names[-1]:
            complete["quick" if args.quick else "full"] = {"seconds": elapsed, "at": _now()}
        if stored and all(BY_NAME[n].stored for n in names):
            # Only re-read figures measured elsewhere (the GPU check): nothing ran on this
            # machine, so the page's machine, date and commit stay those of its measurements.
            results = {**stored, "figures": figures}
        else:
            results = {
                "written_at": _now(),
                "commit": common.git_commit(),
                "machine": common.machine(),
                "last_run_s": elapsed,
                "last_run_figures": names,
                "complete_runs": complete,
                "figures": figures,
            }
        results_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        write_page(out_dir, results)
        if out_dir.resolve() == common.REPO.resolve():  # the measured page, not a quick check
            write_readme(results)
    print(f"wrote {out_dir / PAGE} and {results_path} in {time.monotonic() - start:.0f} s")
    failed = [n for n in names if figures[n].get("status") == "error"]
    if failed:
        print(f"failed: {', '.join(failed)} (see the page and {logs})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
