"""`make run`'s program on each replay store, for the same time: frames/s, learner updates/s
and the CPU each node used (figure 11 of BENCHMARKS.md).

Runs `projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py` (what
`make run` launches) once with `replay.store=reverb` (its 1M-transition Reverb frame replay)
and once with `replay.store=device` at a capacity this machine holds beside the other nodes
(`agent.replay_buffer_size`, default 100,000: 2.2 GB), each for `--seconds` of wall time
after launch, then stops it with SIGTERM and reads the launcher's `status.csv`: rates are
averaged over the samples after learning started, each node's CPU (percent of one core)
over the same samples.

    python -m benchmarks.make_run_stores [--seconds 300] [--device_capacity 100000]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"


def _run(store: str, seconds: float, capacity: int, workdir: Path) -> dict:
    command = [
        sys.executable,
        str(ROOT / "projects" / "drq_v2" / "lp_main.py"),
        "--config",
        str(ROOT / "configs" / "reacher_hard_distributed.py"),
        "--workdir",
        str(workdir),
        f"--config.replay.store={store}",
        "--status_every=5",
    ]
    if store == "device":
        command.append(f"--config.agent.replay_buffer_size={capacity}")
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    time.sleep(seconds)
    stop = time.monotonic()
    os.killpg(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    stopped_s = time.monotonic() - stop
    with open(workdir / "status.csv") as file:
        rows = list(csv.DictReader(file))
    learning = [r for r in rows if r.get("updates_per_s") not in ("", None)]

    def mean(key: str, source: list[dict]) -> float | None:
        values = [float(r[key]) for r in source if r.get(key) not in ("", None)]
        return sum(values) / len(values) if values else None

    nodes = sorted({k.split(":")[0] for k in rows[0] if k.endswith(":cpu")})
    return {
        "store": store,
        "capacity": capacity if store == "device" else 1_000_000,
        "seconds": seconds,
        "frames": float(rows[-1]["frames"] or 0),
        "frames_per_s": mean("frames_per_s", learning),
        "updates_per_s": mean("updates_per_s", learning),
        "samples_per_s": mean("samples_per_s", learning),
        "learning_samples": len(learning),
        "cpu_percent": {node: mean(f"{node}:cpu", learning) for node in nodes},
        "rss_mib": {node: mean(f"{node}:rss_mib", learning) for node in nodes},
        "stop_s": round(stopped_s, 1),
        "exit_code": process.returncode,
        "output_tail": output[-1500:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--device_capacity", type=int, default=100_000)
    args = parser.parse_args()
    results = {}
    for store in ("reverb", "device"):
        with tempfile.TemporaryDirectory(prefix=f"make_run_{store}_") as folder:
            results[store] = _run(store, args.seconds, args.device_capacity, Path(folder))
        r = results[store]
        cpu = ", ".join(f"{k} {v:.0f}%" for k, v in r["cpu_percent"].items() if v is not None)
        print(
            f"{store}: {r['frames_per_s']} frames/s, {r['updates_per_s']} updates/s, "
            f"{r['samples_per_s']} samples/s over {r['learning_samples']} samples; CPU: {cpu}"
        )
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    existing["make_run_stores"] = results
    RESULTS.write_text(json.dumps(existing, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
