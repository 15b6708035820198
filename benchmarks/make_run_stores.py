"""`make run`'s program on each replay store, for the same time: frames/s, learner updates/s,
the CPU and the memory each node used (figure 12 of BENCHMARKS.md).

Runs `projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py` (what
`make run` launches) once with `replay.store=reverb` (its 1M-transition Reverb frame replay)
and once with `replay.store=device` at a capacity this machine holds beside the other nodes
(`agent.replay_buffer_size` = 100,000: 2.2 GB), both on the Launchpad stack (.venv), and once
on the current stack (.venv312, `--launcher ray`) as the config is, `replay.store=auto` at its
own 1M transitions: the compressed host store there (issue 67). Each runs for the same wall
time (240 s) after launch, then stops with SIGTERM; the launcher's `status.csv` gives the
rates, averaged over the samples after learning started, each node's CPU (percent of one core)
over the same samples, and each node's RSS (mean over them, and its peak over the run).

    python -m benchmarks.run --only make_run_stores
"""

from __future__ import annotations

import csv
import os
import re
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


CURRENT_PYTHON = ROOT / ".venv312" / "bin" / "python"
"""The current stack's Python (`make setup312`): the run there goes through Ray."""
RUNS = {
    "reverb": ("reverb", sys.executable, ()),
    "device": ("device", sys.executable, ()),
    "auto on .venv312 (Ray)": ("auto", str(CURRENT_PYTHON), ("--launcher=ray",)),
}
"""Each run: its `replay.store`, its Python and its extra flags."""


def _run(
    store: str,
    seconds: float,
    capacity: int,
    workdir: Path,
    python: str = sys.executable,
    extra: tuple[str, ...] = (),
) -> dict:
    command = [
        python,
        str(ROOT / "projects" / "drq_v2" / "lp_main.py"),
        "--config",
        str(ROOT / "configs" / "reacher_hard_distributed.py"),
        "--workdir",
        str(workdir),
        f"--config.replay.store={store}",
        "--status_every=5",
        *extra,
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
    said = [m.group(1) for m in re.finditer(r"(?:^|\] )replay: (.*)$", output, re.M)]
    peak = {
        node: max(
            (float(r[f"{node}:rss_mib"]) for r in rows if r.get(f"{node}:rss_mib")), default=None
        )
        for node in nodes
    }
    return {
        "store": store,
        "replay_line": said[0] if said else None,
        "capacity": capacity if store == "device" else 1_000_000,
        "run_seconds": seconds,
        "frames": float(rows[-1]["frames"] or 0),
        "frames_per_s": mean("frames_per_s", learning),
        "updates_per_s": mean("updates_per_s", learning),
        "samples_per_s": mean("samples_per_s", learning),
        "learning_samples": len(learning),
        "cpu_percent": {node: mean(f"{node}:cpu", learning) for node in nodes},
        "rss_mib": {node: mean(f"{node}:rss_mib", learning) for node in nodes},
        "peak_rss_mib": peak,
        "stop_s": round(stopped_s, 1),
        "exit_code": process.returncode,
        "output_tail": output[-1500:],
    }


def measure(quick: bool) -> dict:
    seconds = 60.0 if quick else 240.0
    capacity = 10_000 if quick else DEVICE_CAPACITY
    results = {}
    for name, (store, python, extra) in RUNS.items():
        if not Path(python).exists():
            results[name] = {"status": "skipped", "reason": f"{python} is not here"}
            continue
        with tempfile.TemporaryDirectory(prefix=f"make_run_{store}_") as folder:
            results[name] = _run(store, seconds, capacity, Path(folder), python, extra)
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
        if "frames_per_s" not in r:
            lines.append(f"| {name} | not run: {r.get('reason', '?')} | | | | | |")
            continue
        lines.append(
            f"| {name} | {r['capacity']:,} | {fmt(r['frames_per_s'])} | "
            f"{fmt(r['updates_per_s'], 2)} | {fmt(r['samples_per_s'], 0)} | {r['stop_s']} | "
            f"{_cpu_line(r)} |"
        )
    lines += [
        "",
        "| run | replay | peak RSS per node (MiB) | peak RSS, all nodes |",
        "| --- | --- | --- | --- |",
    ]
    for name, r in result["stores"].items():
        peaks = r.get("peak_rss_mib") or {}
        if not peaks:
            continue
        each = ", ".join(f"{node} {value:,.0f}" for node, value in peaks.items() if value)
        total = sum(value for value in peaks.values() if value)
        lines.append(f"| {name} | {r.get('replay_line') or r['store']} | {each} | {total:,.0f} |")
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
