"""`make learn-check`: this DrQ-v2 beside the official one, same settings, same machine.

    python -m benchmarks.learn_check --official PATH [--seeds 1,2,3] [--tasks cartpole_balance]
        [--cores 0,1] [--agents magi_lp,official] [--out runs/learn_check] [--report-only]
    python -m benchmarks.learn_check --tiny --agents magi_lp --out DIR   # a check of the command

Runs every (agent, task, seed) whose result is not kept yet (benchmarks/learn_check/results/,
committed), one per core at a time (each run pinned to its core; its logs under --out), this
project's and the official run of a seed side by side; then
writes benchmarks/learn_check.json (curves, AUC ratio with its bootstrap interval, frames/s)
and the CSV and PNG beside it, and `python -m benchmarks.run --only learn_check` renders the
figure into benchmarks/results.json and BENCHMARKS.md. Seeds accumulate: a later call with
more seeds runs only the new ones.
"""

from __future__ import annotations

import argparse
import queue
import subprocess
import sys
import threading
from pathlib import Path

from benchmarks import common
from benchmarks.learn_check import comparison, official
from benchmarks.learn_check.runs import run_one
from benchmarks.learn_check.settings import (
    AGENTS,
    DEFAULT_SEEDS,
    DEFAULT_TASKS,
    FULL,
    KEPT,
    OUT,
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
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)))
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    parser.add_argument("--agents", default=",".join(AGENTS))
    parser.add_argument("--cores", default="0,1", help="one run at a time on each")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--tiny", action="store_true", help="tiny settings: checks the command")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report")
    args = parser.parse_args(argv)
    settings = TINY if args.tiny else FULL
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
    out = Path(args.out)
    # Tiny checks keep their results beside their runs; real ones in the repository.
    kept = out / "results" if args.tiny else KEPT
    jobs: queue.Queue = queue.Queue()
    for seed in _ints(args.seeds):
        for task in _names(args.tasks):
            for agent in agents:
                folder = run_dir(out, agent, task, seed)
                if not kept_result(kept, agent, task, seed).is_file() and not args.report_only:
                    jobs.put((agent, task, seed, folder))
    print(f"learn_check: {jobs.qsize()} run(s) to do ({settings.reduced()}); kept in {out}")

    def work(core: int) -> None:
        while True:
            try:
                agent, task, seed, folder = jobs.get_nowait()
            except queue.Empty:
                return
            print(f"learn_check: core {core}: {agent} {task} seed {seed} -> {folder}", flush=True)
            result = run_one(agent, settings, task, seed, folder, core, checkout, kept)
            print(
                f"learn_check: {agent} {task} seed {seed}: exit {result['exit_code']}, "
                f"{result['wall_s']:.0f} s, evaluations {result['evaluations']}",
                flush=True,
            )

    workers = [threading.Thread(target=work, args=(core,)) for core in _ints(args.cores)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    summary = comparison.write(kept, settings, args.tiny, out)
    print(f"learn_check: {summary}")
    if not args.tiny and str(out) == str(OUT):
        subprocess.run(
            [sys.executable, "-m", "benchmarks.run", "--only", "learn_check"],
            cwd=common.REPO,
            check=False,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
