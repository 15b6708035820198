"""`make learn-check`: this DrQ-v2 beside the official one, same settings, same machine.

    python -m benchmarks.learn_check --official PATH [--tasks cartpole_balance]
        [--cores 0,1] [--agents magi_lp,official] [--out runs/learn_check] [--report-only]
    python -m benchmarks.learn_check --tiny --agents magi_lp --out DIR   # a check of the command
    python -m benchmarks.learn_check --paper --official PATH   # the GPU check's runs, on CPU

Runs every preregistered (agent, task, seed) (`settings.SEEDS`, fixed before the runs) whose
result is not kept yet (benchmarks/learn_check/results/, committed), one per core at a time
(each run pinned to its core; its logs under --out). A run cut short (this command killed,
the machine's session ended) continues from its checkpoint on the next call: call it again.
Then writes benchmarks/learn_check.json (the verdict, curves, AUC ratio with its bootstrap
interval, frames/s, each run's provenance and the unfinished runs' state) and the CSV and PNG
beside it; `python -m benchmarks.run --only learn_check` renders the figure into
benchmarks/results.json and BENCHMARKS.md (done here when every run is finished).

Exit code: 0 the goal held (both agents learned, AUC ratio >= 0.9), 1 it did not, 3 runs
are unfinished (run again to continue them), 2 the official checkout is missing.
`--seeds` runs other seeds too, but only the preregistered ones are counted.

`--paper` runs the six runs of the preregistered comparison the CPU machine serves
(`benchmarks.gpu_learn_check.CPU_CURRENT`, the second: seeds 10-12 of each agent at the paper's
settings, 84x84, batch 256, to 40k frames; the third counts GPU runs only) here, one per core,
as its amendment allows: run folders under runs/learn_check_paper, results kept under
benchmarks/gpu_learn_check/cpu/, and `gpu_learn_check`'s verdicts (the second's exit code)
instead of figure 13's (its learn_check.json is not touched). `--seeds 4,5,6` goes on with
the first preregistration's.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from benchmarks import common, gpu_learn, gpu_learn_check
from benchmarks.learn_check import comparison, official, runs
from benchmarks.learn_check.settings import (
    AGENTS,
    DEFAULT_SEEDS,
    DEFAULT_TASKS,
    FULL,
    KEPT,
    OUT,
    PAPER_OUT,
    TINY,
    kept_result,
    run_dir,
)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official", default="", help="a checkout of facebookresearch/drqv2")
    parser.add_argument("--seeds", default="", help="default: the preregistered ones")
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    parser.add_argument("--agents", default=",".join(AGENTS))
    parser.add_argument("--cores", default="0,1", help="one run at a time on each")
    parser.add_argument("--out", default="", help=f"default: {OUT} ({PAPER_OUT} for --paper)")
    parser.add_argument(
        "--kept",
        default="",
        help="where finished results are kept (default: the repository's, for --tiny "
        "OUT/results); background.sh runs from a pinned worktree and keeps them here",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny settings: checks the command")
    parser.add_argument(
        "--paper",
        action="store_true",
        help="the preregistered GPU comparison's runs (benchmarks.gpu_learn_check), here",
    )
    parser.add_argument("--report-only", action="store_true", help="run nothing; report")
    args = parser.parse_args(argv)
    if args.paper and args.tiny:
        parser.error("--paper and --tiny: choose one (--paper runs the paper's settings)")
    if args.paper and _names(args.tasks) != [gpu_learn.TASK]:
        parser.error(f"--paper: its task is {gpu_learn.TASK} only; leave --tasks out")
    settings = gpu_learn_check.SETTINGS if args.paper else TINY if args.tiny else FULL
    args.seeds = args.seeds or ",".join(
        map(str, gpu_learn_check.SEEDS if args.paper else DEFAULT_SEEDS)
    )
    agents = _names(args.agents)
    unknown = sorted(set(agents) - set(AGENTS))
    if unknown:
        parser.error(f"--agents: unknown {', '.join(unknown)}; choose from {', '.join(AGENTS)}")
    checkout = Path(args.official).expanduser() if args.official else None
    if "official" in agents and not args.report_only:
        try:
            official.check_checkout(checkout or Path("<not given>"))
        except official.OfficialCodeMissing as error:
            print(f"learn_check: {error}", file=sys.stderr)
            return 2
    out = Path(args.out or (PAPER_OUT if args.paper else OUT))
    other = _background_pid(out)
    if other and not args.report_only:
        log = out / "background.log"
        print(f"learn_check: the runs in {out} are going in the background (pid {other}; "
              f"log {log}): --report-only reports them", file=sys.stderr)  # fmt: skip
        return 2
    # Tiny checks keep their results beside their runs; real ones in the repository.
    kept = Path(args.kept) if args.kept else out / "results" if args.tiny else KEPT
    if args.paper and not args.kept:
        kept = gpu_learn_check.CPU_KEPT
    jobs: queue.Queue = queue.Queue()
    for seed in _ints(args.seeds):
        for task in _names(args.tasks):
            for agent in agents:
                if not _kept(kept, agent, task, seed, settings) and not args.report_only:
                    jobs.put(runs.Run(agent, task, seed, run_dir(out, agent, task, seed), kept))
    todo = "report only" if args.report_only else f"{jobs.qsize()} run(s) to do"
    print(f"learn_check: {todo} ({settings.reduced()}); kept in {out}")
    stopping = threading.Event()

    def stop(signum, frame):  # SIGTERM: stop the runs at a checkpoint; they resume
        stopping.set()
        runs.stop_all()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return _run_and_report(args, settings, agents, checkout, out, kept, jobs, stopping)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_and_report(args, settings, agents, checkout, out, kept, jobs, stopping) -> int:
    """Works through `jobs` on the cores; writes the comparison; returns the exit code."""

    def work(core: int) -> None:
        while not stopping.is_set():
            try:
                run = jobs.get_nowait()
            except queue.Empty:
                return
            print(f"learn_check: core {core}: {run.name} -> {run.folder}", flush=True)
            result = runs.run_one(run, settings, core, checkout)
            print(
                f"learn_check: {run.name}: exit {result['exit_code']}, "
                f"{result['wall_s']:.0f} s, evaluations {result['evaluations']}",
                flush=True,
            )

    workers = [threading.Thread(target=work, args=(core,)) for core in _ints(args.cores)]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            while worker.is_alive():
                worker.join(timeout=1.0)
    except KeyboardInterrupt:
        stopping.set()
        runs.stop_all()
        for worker in workers:
            worker.join()
    if args.paper:  # the GPU check's verdict over every kept result, GPU and CPU
        tasks = tuple(_names(args.tasks))
        for state in comparison.progress(out, settings, tasks, kept, gpu_learn_check.SEEDS):
            if state["state"] != "done":
                evals = comparison.evaluations_text(state["evaluations"])
                lost = state.get("lost_runs", 0)
                lost_text = f"; {lost} earlier run(s) lost with a machine" if lost else ""
                print(f"learn_check: {state['agent']} seed {state['seed']}: {state['state']}"
                      f"{'; evaluations ' + evals if evals else ''}{lost_text}")  # fmt: skip
        founds = gpu_learn_check.check_all(gpu_learn_check.gpu_results(), kept)
        for found in founds:
            print("\n".join(gpu_learn_check.lines(found)))
        # The exit code is the verdict of the comparison these CPU runs serve (the third
        # counts GPU runs only: its verdict says nothing of them).
        cpu = next(f for f in founds if f["preregistration"] == gpu_learn_check.CPU_CURRENT.name)
        return comparison.EXIT[cpu["agents"]["comparison"]["verdict"]]
    result = comparison.write(kept, settings, args.tiny, out, tuple(_names(args.tasks)))
    print(f"learn_check: verdict {result['verdict']}: {result['line']}")
    print(f"learn_check: wrote {', '.join(result['files'])}")
    finished = result["verdict"] != comparison.INCOMPLETE
    if not args.tiny and Path(kept).resolve() == KEPT.resolve() and finished:
        subprocess.run(
            [sys.executable, "-m", "benchmarks.run", "--only", "learn_check"],
            cwd=common.REPO,
            check=False,
        )
    return comparison.EXIT[result["verdict"]]


def _background_pid(out: Path) -> int | None:
    """The pid of another live learn check started by background.sh on `out`, if any."""
    try:
        pid = int((Path(out) / "background.pid").read_text().split()[0])
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid != os.getpid() and b"benchmarks.learn_check" in command else None


def _kept(kept: Path, agent: str, task: str, seed: int, settings) -> bool:
    """Whether a finished result of this run at these settings is kept."""
    path = kept_result(kept, agent, task, seed)
    if not path.is_file():
        return False
    saved = json.loads(path.read_text()).get("settings", {})
    return comparison.same_settings(saved, settings)


if __name__ == "__main__":
    sys.exit(main())
