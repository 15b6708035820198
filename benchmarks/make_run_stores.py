"""`make run`'s program on each replay store, for the same time: frames/s, learner updates/s
and the CPU each node used (figure 12 of BENCHMARKS.md).

Runs `projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py` (what
`make run` launches) once with `replay.store=reverb` (its 1M-transition Reverb frame replay)
and once with `replay.store=device` at a capacity this machine holds beside the other nodes
(`agent.replay_buffer_size` = 100,000: 2.2 GB), each for the same wall time (240 s)
after launch, then stops it with SIGTERM and reads the launcher's `status.csv`: rates are
averaged over the samples after learning started, each node's CPU (percent of one core)
over the same samples.

    python -m benchmarks.run --only make_run_stores
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import figure_main, fmt, ratio
from magi_lp.runtime.workdir import Workdir

ROOT = Path(__file__).resolve().parents[1]
TITLE = "make run's program on each replay store: frames/s, updates/s, CPU per node"
DEVICE_CAPACITY = 100_000  # 2.2 GB at 84x84: fits this machine beside the other nodes


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
    with open(Workdir(workdir).status_csv) as file:
        rows = list(csv.DictReader(file))
    learning = [r for r in rows if r.get("updates_per_s") not in ("", None)]

    def mean(key: str, source: list[dict]) -> float | None:
        values = [float(r[key]) for r in source if r.get(key) not in ("", None)]
        return sum(values) / len(values) if values else None

    nodes = sorted({k.split(":")[0] for k in rows[0] if k.endswith(":cpu")})
    return {
        "store": store,
        "capacity": capacity if store == "device" else 1_000_000,
        "run_seconds": seconds,
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


def measure(quick: bool) -> dict:
    seconds = 60.0 if quick else 240.0
    capacity = 10_000 if quick else DEVICE_CAPACITY
    results = {}
    for store in ("reverb", "device"):
        with tempfile.TemporaryDirectory(prefix=f"make_run_{store}_") as folder:
            results[store] = _run(store, seconds, capacity, Path(folder))
    return {"run_seconds": seconds, "cores": os.cpu_count(), "stores": results}


def _cpu_line(result: dict) -> str:
    return ", ".join(
        f"{node} {value:.0f}%" for node, value in result["cpu_percent"].items() if value is not None
    )


def summary(result: dict) -> tuple[str, str, str]:
    device, reverb = result["stores"]["device"], result["stores"]["reverb"]
    return (
        f"device store: {fmt(device['frames_per_s'])} frames/s, "
        f"{fmt(device['updates_per_s'], 2)} updates/s; learner CPU "
        f"{fmt(device['cpu_percent'].get('learner/0'), 0)}%",
        f"Reverb store: {fmt(reverb['frames_per_s'])} frames/s, "
        f"{fmt(reverb['updates_per_s'], 2)} updates/s; learner CPU "
        f"{fmt(reverb['cpu_percent'].get('learner/0'), 0)}%",
        f"{fmt(ratio(device['updates_per_s'], reverb['updates_per_s']), 2)} (updates/s)",
    )


def report(result: dict) -> str:
    lines = [
        f"`make run`'s program, {fmt(result['run_seconds'], 0)} s of wall time on each store, on "
        f"this {result['cores']}-core machine (the learner on its CPU). Rates are the means "
        "over the status samples once learning had started; CPU is percent of one core.",
        "",
        "| store | capacity | frames/s | updates/s | samples/s | stop (s) | CPU per node |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in result["stores"].items():
        lines.append(
            f"| {name} | {r['capacity']:,} | {fmt(r['frames_per_s'])} | "
            f"{fmt(r['updates_per_s'], 2)} | {fmt(r['samples_per_s'], 0)} | {r['stop_s']} | "
            f"{_cpu_line(r)} |"
        )
    lines += [
        "",
        "On this CPU the learner's update (several CPU-s at batch 256: figure 1) is the "
        "bottleneck with either store; what the device store changes here is the CPU the "
        "learner's process spends on sampling, and the replay node's work (a queue instead of "
        "the sampled table).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    figure_main(measure)
