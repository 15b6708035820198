"""Short runs of both agents at candidate settings: the cost per 1,000 training frames (the
one rule of runs.episode_windows) and the returns they reach, before the settings of
`make learn-check` are chosen (candidates.md records what was measured and the choice).

    python -m benchmarks.learn_check.candidates --official PATH --name c32b256 \\
        --image-size 32 --batch-size 256 --frames 6000 [--agents magi_lp,official] [--core 0]

Each (candidate, agent) runs seed 1 of cartpole_balance in runs/learn_check_candidates/<name>/
(resumable as any learn-check run) and prints one JSON line: cost, evaluations, training
episode returns, wall time, machine, load average at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
from pathlib import Path

from benchmarks import common
from benchmarks.learn_check import official
from benchmarks.learn_check.runs import Run, run_one
from benchmarks.learn_check.settings import FULL, run_dir

OUT = common.REPO / "runs" / "learn_check_candidates"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official", default="")
    parser.add_argument("--name", required=True)
    parser.add_argument("--image-size", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--agents", default="magi_lp,official")
    parser.add_argument("--cores", default="0,1", help="one agent per core, side by side")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    settings = dataclasses.replace(
        FULL,
        image_size=args.image_size,
        batch_size=args.batch_size,
        frames=args.frames,
        eval_every_frames=args.eval_every,
        eval_episodes=args.eval_episodes,
    )
    checkout = Path(args.official) if args.official else None
    if checkout is not None:
        official.check_checkout(checkout)
    out = OUT / args.name
    agents = [a for a in args.agents.split(",") if a]
    cores = [int(c) for c in args.cores.split(",")]
    results: dict[str, dict] = {}

    def work(agent: str, core: int) -> None:
        folder = run_dir(out, agent, "cartpole_balance", args.seed)
        run = Run(agent, "cartpole_balance", args.seed, folder, out / "kept")
        results[agent] = run_one(run, settings, core, checkout)

    threads = [
        threading.Thread(target=work, args=(agent, cores[i % len(cores)]))
        for i, agent in enumerate(agents)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for agent, result in results.items():
        line = {
            "candidate": args.name,
            "agent": agent,
            "settings": vars(settings),
            "seconds_per_1000_frames": result.get("seconds_per_1000_frames"),
            "fps_frames": result.get("fps_frames"),
            "evaluations": result.get("evaluations"),
            "train_episode_rewards": result.get("train_episode_rewards"),
            "wall_s": result.get("wall_s"),
            "exit_code": result.get("exit_code"),
            "versions": result.get("versions"),
            "machine": result.get("machine"),
            "commit": result["attempts"][-1]["commit"],
            "dirty": result["attempts"][-1]["dirty"],
            "loadavg_at_end": os.getloadavg(),
        }
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
