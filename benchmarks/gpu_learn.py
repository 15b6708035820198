"""Does this DrQ-v2 learn from pixels as the paper's does? `make gpu-learn`.

On a GPU machine (one GPU, 16 cores), in one device call of at most 8 minutes: 3 seeds of
single-process DrQ-v2 (`projects/drq_v2/main.py` on the device replay store, through
`benchmarks.learn_check.ours_main`, as the learn check runs it) side by side on the one GPU,
at the paper's settings on cartpole_balance (84x84 pixels, batch 256, everything else the
paper's; replay 100k transitions instead of 1M: no run stores more than 30k, so nothing is
ever evicted either way), each to 60k frames or until `--minutes` is spent, with an
evaluation of 10 episodes at 0 and every 20k frames (the published curves' points).
Optionally seeds of the official agent beside them (`--official PATH`, with
`.venv-official` holding a CUDA build of torch; `--official-seeds 1` by default); `--seeds`
picks ours ("" for none: a call of official seeds only). A second call with the same `--out`
on a warm machine continues every run where the first's deadline stopped it (ours from the
checkpoint its SIGTERM wrote, replay included; the official agent from its snapshot at its
episode's start); each run folder's `launches.json` keeps the launch times, which the one
frames/s rule leaves out. Writes, under `--out` (default
`runs/gpu_learn`): each run's folder, `curves.csv` (each seed's evaluation returns beside the
official agent's published mean/min/max at the same frames), `curves.png`, and
`gpu_learn.json` (device, JAX/PyTorch versions, frames/s of each run by the learn check's
one rule, returns).

The reference is the official agent's own published curves: facebookresearch/drqv2 at
c0c650b, `curves/dmc_<task>.csv` (MIT licence), summarised per frame count (mean, lowest and
highest seed, mean wall-clock hour) in `benchmarks/reference/drqv2_official_curves.csv`.

Without a GPU it says so in one line and runs the same code at a tiny size (32x32 pixels
without shadows, small networks, 600 frames, 3 seeds side by side): a check of the command,
not a result.

    python -m benchmarks.gpu_learn [--minutes 7] [--out DIR] [--tiny] [--seeds 1,2,3]
        [--official PATH [--official-seeds 1]] [--frames 60000]

The preregistered comparisons of the two agents at these settings (to 40k frames; the current
one, the third, counts seeds 20-24 of each on a GPU only) are `benchmarks.gpu_learn_check`: its
runs are made with this command, `--seeds` and `--official-seeds` naming them (benchmarks/
README.md gives the device calls).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.metadata
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "benchmarks" / "reference" / "drqv2_official_curves.csv"
REFERENCE_SOURCE = "facebookresearch/drqv2 at c0c650b, curves/dmc_<task>.csv"
ACTION_REPEAT = 2  # the paper's, for every task used here
TASK = "cartpole_balance"
SEEDS = (1, 2, 3)
FRAMES = 60_000
EVAL_EVERY_FRAMES = 20_000
EVAL_EPISODES = 10
SEED_FRAMES = 4_000
MINUTES = 7.0
"""The whole command's budget by default: one device call of at most 8 minutes, with room
for the machine's start of the processes and the writing of the figure."""
TITLE = "Learning on one GPU: 3 seeds of DrQ-v2 side by side at the paper's settings"
NOT_MEASURED = (
    "not measured: `make gpu-learn` has not run on a GPU machine (benchmarks/gpu_learn.json)"
)
STOP_GRACE_S = 45.0
"""Before the deadline, each run gets SIGTERM (main.py: a final checkpoint, then exit)."""
EVALUATION_S = 45.0
"""One evaluation of 10 episodes at 84x84, about: the official seed's log on the H200 (its
clock at 5,000 and 6,000 frames, 13 s per 1,000 training frames) leaves about 40 s for its
frame-0 evaluation beside the seed frames. What a continuing call adds for the evaluation at
the goal."""
CALL_START_S = 30.0
"""A continuing call's start before its runs go on: the tool's transfer, the install check,
the runs' imports and their checkpoint's or snapshot's load (not measured apart)."""
GPU_MEMORY_FRACTION = 0.28
"""Each of the 3 processes' share of the GPU's memory (JAX's preallocation)."""

PAPER = (
    "--config.env.image_size=84",
    "--config.agent.batch_size=256",
    "--config.agent.replay_buffer_size=100000",
    f"--config.agent.min_replay_frames={SEED_FRAMES}",
    f"--config.agent.num_expl_steps={SEED_FRAMES // ACTION_REPEAT}",
)
TINY = (
    "--config.env.image_size=32",
    "--config.agent.batch_size=32",
    "--config.agent.feature_dim=16",
    "--config.agent.hidden_dim=64",
    "--config.agent.encoder_channels=8",
    "--config.agent.min_replay_frames=200",
    "--config.agent.num_expl_steps=50",
    "--config.agent.replay_buffer_size=5000",
    "--config.env.max_episode_frames=100",
    "--config.env.render_shadows=False",  # most of a frame's cost without a GPU
    # Every training episode a row: tiny episodes end within a second, and the default 1 s
    # filter had dropped the one a run ended on, leaving the frames/s rule no window (a run
    # alone on its core, in 3 of 8 tiny test runs here). The paper's episodes take seconds each.
    "--config.logging.time_delta=0",
)
TINY_FRAMES = 600
TINY_EVAL = (200, 1)
TINY_SEED_FRAMES = 200


def has_gpu() -> bool:
    """Whether JAX here computes on a GPU."""
    import jax

    return jax.default_backend() == "gpu"


def device_name() -> str:
    import jax

    device = jax.devices()[0]
    return f"{device.platform}: {getattr(device, 'device_kind', '?')}"


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in ("jax", "jaxlib", "dm-haiku", "optax", "mujoco", "torch"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def reference_curve(task: str) -> dict[int, dict[str, float]]:
    """The official agent's evaluation returns for `task` by frame: mean, min, max, hour."""
    with open(REFERENCE, newline="") as file:
        return {
            int(row["frame"]): {k: float(row[k]) for k in ("mean", "min", "max", "mean_hour")}
            for row in csv.DictReader(file)
            if row["task"] == task
        }


def core_groups(count: int, cores: list[int] | None = None) -> list[list[int]]:
    """This process's cores (or `cores`) split into `count` groups, one per run, every core
    used: the groups' sizes differ by one at most, and the larger ones are the last (the
    official agent's runs, started after ours, which the one frames/s rule found the
    slower); round robin where there are fewer cores than runs."""
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if count == 0:  # every run finished in an earlier call
        return []
    if len(cores) >= count:
        size, extra = divmod(len(cores), count)
        sizes = [size + (index >= count - extra) for index in range(count)]
        starts = [sum(sizes[:index]) for index in range(count)]
        return [cores[start : start + n] for start, n in zip(starts, sizes, strict=True)]
    return [[cores[i % len(cores)]] for i in range(count)]


def ours_command(seed: int, workdir: Path, tiny: bool, frames: int = FRAMES) -> list[str]:
    frames = TINY_FRAMES if tiny else frames
    every, episodes = TINY_EVAL if tiny else (EVAL_EVERY_FRAMES, EVAL_EPISODES)
    return [
        sys.executable,
        "-m",
        "benchmarks.learn_check.ours_main",
        f"--config={ROOT / 'configs' / f'{TASK}.py'}",
        f"--workdir={workdir}",
        f"--config.seed={seed}",
        f"--config.max_actor_steps={frames // ACTION_REPEAT}",
        f"--config.evaluation.every_actor_steps={every // ACTION_REPEAT}",
        f"--config.evaluation.episodes={episodes}",
        "--config.replay.store=device",
        # The replay goes into the checkpoint the deadline's SIGTERM writes, so that a second
        # call on the same warm machine (same --out) continues the run where it stopped.
        "--config.checkpoint.replay=True",
        "--config.logging.tensorboard=False",
        "--config.env.video.every_evaluations=0",
        *(TINY if tiny else PAPER),
    ]


def official_command(
    checkout: Path, folder: Path, seed: int = 1, frames: int = FRAMES
) -> tuple[list[str], Path]:
    from benchmarks.learn_check import official

    code_dir = official.prepare(checkout, folder / "code")
    command = official.command(
        code_dir,
        ROOT / ".venv-official" / "bin" / "python",
        task=TASK,
        seed=seed,
        image_size=84,
        batch_size=256,
        train_frames=frames + ACTION_REPEAT,
        eval_every_frames=EVAL_EVERY_FRAMES,
        eval_episodes=EVAL_EPISODES,
        seed_frames=SEED_FRAMES,
        replay_size=100_000,
        workdir=folder / "work",
    )
    return [arg.replace("device=cpu", "device=cuda") for arg in command], code_dir


def official_has_cuda() -> bool:
    python = ROOT / ".venv-official" / "bin" / "python"
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0
    except OSError:
        return False


def _env(tiny: bool) -> dict[str, str]:
    from benchmarks.learn_check.settings import ALLOCATOR  # both agents' (its docstring)

    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", **ALLOCATOR}
    if not tiny:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(GPU_MEMORY_FRACTION)
        env["XLA_CLIENT_MEM_FRACTION"] = ""  # jaxlib 0.11 raises with both set
    else:
        env["JAX_PLATFORMS"] = "cpu"
    return env


def record_launch(folder: Path, when: float) -> list[float]:
    """Adds a launch time to the run folder's `launches.json`; returns them all. A run that
    a later call continues (same --out on a warm machine) has several, and the one frames/s
    rule leaves out the episodes a launch falls in."""
    path = folder / "launches.json"
    launches = json.loads(path.read_text()) if path.exists() else []
    launches.append(when)
    path.write_text(json.dumps(launches))
    return launches


def parse_seeds(text: str) -> tuple[int, ...]:
    """ "1,2,3" -> (1, 2, 3); "" -> () (no run of that agent)."""
    try:
        seeds = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        message = f"gpu_learn: seeds are whole numbers separated by commas, not {text!r}"
        raise SystemExit(message) from None
    if len(set(seeds)) != len(seeds) or any(seed < 0 for seed in seeds):
        raise SystemExit(f"gpu_learn: seeds must be distinct and >= 0, not {text!r}")
    return seeds


def run_side_by_side(jobs: list[dict], seconds: float) -> None:
    """Starts every job at once (each pinned to its cores), stops them all before the
    deadline (SIGTERM, then SIGKILL after the grace), fills in exit codes and wall times."""
    start = time.monotonic()
    for job in jobs:
        job["log_file"] = open(job["folder"] / "run.log", "w")  # noqa: SIM115 (closed below)
        job["process"] = subprocess.Popen(
            ["taskset", "-c", ",".join(map(str, job["cores"])), *job["command"]],
            cwd=job.get("cwd", ROOT),
            env=job["env"],
            stdout=job["log_file"],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        job["launches"] = record_launch(job["folder"], time.time())
    stop_at = start + max(seconds - STOP_GRACE_S, 1.0)

    def note_ends() -> None:
        for job in jobs:
            if "wall_s" not in job and job["process"].poll() is not None:
                job["wall_s"] = time.monotonic() - start

    while any(job["process"].poll() is None for job in jobs) and time.monotonic() < stop_at:
        note_ends()
        time.sleep(1.0)
    note_ends()
    for job in jobs:
        if job["process"].poll() is None:
            job["stopped_at_deadline"] = True
            os.killpg(job["process"].pid, signal.SIGTERM)
    for job in jobs:
        try:
            job["process"].wait(timeout=max(STOP_GRACE_S - 5.0, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(job["process"].pid, signal.SIGKILL)
            job["process"].wait()
        job["log_file"].close()
        job["exit_code"] = job["process"].returncode
        job.setdefault("wall_s", time.monotonic() - start)


def finished_before(job: dict, seed_frames: int) -> bool:
    """Whether an earlier call with this --out finished the job's run (its evaluation at the
    goal is complete); such a run is not started again (a relaunch would load its checkpoint
    or snapshot for nothing, and the official agent would play its last episode again), and
    its cores go to the runs still going. Marks it so: no cores, exit 0, 0 s in this call."""
    path = job["folder"] / "launches.json"
    if not path.is_file():
        return False
    earlier = {**job, "launches": json.loads(path.read_text()), "exit_code": 0, "wall_s": 0.0,
               "cores": [], "finished_before": True}  # fmt: skip
    if not any(f >= job["frames"] for f, _ in read_run(earlier, seed_frames)["evaluations"]):
        return False
    job.update(earlier)
    return True


def read_run(job: dict, seed_frames: int) -> dict:
    """Evaluations and frames/s (the learn check's one rule) of a finished job."""
    from benchmarks.learn_check import runs
    from benchmarks.learn_check.settings import Settings

    settings = Settings(
        eval_episodes=job["eval_episodes"], seed_frames=seed_frames, frames=job["frames"]
    )
    workdir = job["folder"] / "work"
    reader = runs.ours_result if job["agent"] == "magi_lp" else runs.official_result
    found = reader(settings, workdir, job["launches"])
    return {
        "agent": job["agent"],
        "seed": job["seed"],
        "cores": job["cores"],
        "exit_code": job["exit_code"],
        "stopped_at_deadline": job.get("stopped_at_deadline", False),
        "finished_before": job.get("finished_before", False),
        "wall_s": job["wall_s"],
        "frames": max([f for f, _ in found["train_episode_rewards"]], default=0),
        "evaluations": found["evaluations"],
        "train_frames_per_s": found["train_frames_per_s"],
        "fps_frames": found["fps_frames"],
        "log_tail": runs.log_tail(job["folder"] / "run.log", 15) if job["exit_code"] else [],
        "time_ms": _time_split(workdir, seed_frames) if job["agent"] == "magi_lp" else {},
    }


def ended_well(run: dict) -> bool:
    """Exit 0, or the official agent stopped at the deadline: its train.py has no SIGTERM
    handler, so the deadline's SIGTERM ends it with -15 (on the H200, 2026-11-27), which is
    what fits a call, not a failure."""
    stopped = run["stopped_at_deadline"] and run["exit_code"] == -signal.SIGTERM
    return run["exit_code"] == 0 or (run["agent"] == "official" and stopped)


def _time_split(workdir: Path, seed_frames: int) -> dict[str, float]:
    """The median over training episodes after the seed frames of where the actor loop's
    time went, ms per step (`policy_ms`, `env_ms`, `observe_ms`, `params_ms`)."""
    import statistics

    path = workdir / "logs" / "actor_0" / "logs.csv"
    if not path.is_file():
        return {}
    with open(path, newline="") as file:
        rows = [
            r
            for r in csv.DictReader(file)
            if float(r.get("actor_steps") or 0) * ACTION_REPEAT > seed_frames
        ]
    found = {}
    for key in ("policy_ms", "env_ms", "observe_ms", "params_ms"):
        values = [float(r[key]) for r in rows if r.get(key)]
        if values:
            found[key] = round(statistics.median(values), 2)
    return found


def _curves(results: list[dict], out: Path) -> Path:
    """Each run's returns beside the official ones at the nearest published frame count."""
    path = out / "curves.csv"
    reference = reference_curve(TASK)
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["task", "agent", "seed", "frame", "return", "official_frame",
                         "official_mean", "official_min", "official_max"])  # fmt: skip
        for result in results:
            for frame, value in result["evaluations"]:
                nearest = min(reference, key=lambda f: abs(f - frame))
                ref = reference[nearest]
                writer.writerow([TASK, result["agent"], result["seed"], frame, round(value, 1),
                                 nearest, ref["mean"], ref["min"], ref["max"]])  # fmt: skip
    return path


def _style(result: dict, index: int) -> dict[str, str]:
    """Ours in the colour cycle, one colour a run; the official agent in black, dashed, with
    square markers, so that no run of ours shares its look (the H100 call's figure drew the
    official seed in ours' seed 2's orange)."""
    if result["agent"] == "official":
        return {"color": "k", "linestyle": "--", "marker": "s"}
    return {"color": f"C{index}", "linestyle": "-", "marker": "o"}


def _plot(results: list[dict], out: Path, title: str) -> Path | str:
    """The curves as a PNG, or a note where matplotlib is not installed (the CSV has them)."""
    if importlib.util.find_spec("matplotlib") is None:
        return "no PNG (matplotlib is not installed here)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    reference = reference_curve(TASK)
    frames = sorted(reference)
    axis.fill_between(frames, [reference[f]["min"] for f in frames],
                      [reference[f]["max"] for f in frames], alpha=0.2, color="gray",
                      label="official, published: lowest to highest of 10 seeds")  # fmt: skip
    axis.plot(frames, [reference[f]["mean"] for f in frames], color="gray",
              label="official, published: mean")  # fmt: skip
    for index, result in enumerate(results):
        if not result["evaluations"]:
            continue
        x, y = zip(*result["evaluations"], strict=True)
        fps = result["train_frames_per_s"]
        fps_text = f"{fps:.0f} frames/s" if fps else "frames/s: no clean episode"
        axis.plot(x, y, **_style(result, index),
                  label=f"{result['agent']} seed {result['seed']} ({fps_text})")  # fmt: skip
    reached = max([r["frames"] for r in results] + [EVAL_EVERY_FRAMES])
    axis.set_xlim(0, reached * 1.05)
    axis.set_title(f"{TASK}: {title}", fontsize=9)
    axis.set_xlabel("frames")
    axis.set_ylabel("evaluation return")
    axis.legend(fontsize=7)
    figure.tight_layout()
    path = out / "curves.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=MINUTES, help="whole budget")
    parser.add_argument("--out", default=str(ROOT / "runs" / "gpu_learn"))
    parser.add_argument("--tiny", action="store_true", help="tiny sizes even with a GPU")
    parser.add_argument("--official", default="", help="a drqv2 checkout: official seeds too")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="ours, e.g. 1,2,3")
    parser.add_argument(
        "--official-seeds", default="1", help="the official agent's, with --official (1,2,3)"
    )
    parser.add_argument(
        "--commit", default="", help="the commit the tree is at, where it has no .git (a device)"
    )
    parser.add_argument(
        "--frames",
        type=int,
        default=FRAMES,
        help=f"each run's goal, a multiple of {EVAL_EVERY_FRAMES}",
    )
    args = parser.parse_args(argv)
    if args.frames <= 0 or args.frames % EVAL_EVERY_FRAMES:
        raise SystemExit(
            f"gpu_learn: --frames is each run's goal and must be a positive multiple of "
            f"{EVAL_EVERY_FRAMES} (the evaluation points), e.g. 40000; not {args.frames}"
        )
    start = time.monotonic()
    gpu = has_gpu()
    tiny = args.tiny or not gpu
    if not gpu:
        print("gpu_learn: no GPU: running at a tiny size (a check of the command, not a result)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    every, episodes = TINY_EVAL if tiny else (EVAL_EVERY_FRAMES, EVAL_EPISODES)
    frames = TINY_FRAMES if tiny else args.frames
    seeds, official_seeds = parse_seeds(args.seeds), parse_seeds(args.official_seeds)
    with_official = bool(args.official) and not tiny and official_has_cuda()
    if args.official and not with_official:
        print("gpu_learn: no official seed (tiny size, or .venv-official has no CUDA torch)")
    if not with_official:
        official_seeds = ()
    if not seeds and not official_seeds:
        raise SystemExit("gpu_learn: no run to make (--seeds is empty and no official seed)")
    seed_frames = TINY_SEED_FRAMES if tiny else SEED_FRAMES
    jobs = []
    for seed in seeds:
        folder = out / f"magi_lp_seed_{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append({
            "agent": "magi_lp", "seed": seed, "folder": folder,
            "command": ours_command(seed, folder / "work", tiny, frames), "env": _env(tiny),
            "frames": frames, "eval_episodes": episodes,
        })  # fmt: skip
    for seed in official_seeds:
        from benchmarks.learn_check import official
        from benchmarks.learn_check.settings import ALLOCATOR

        folder = out / f"official_seed_{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        command, code_dir = official_command(Path(args.official), folder, seed, frames)
        jobs.append({
            "agent": "official", "seed": seed, "folder": folder, "command": command,
            "cwd": code_dir, "env": {**os.environ, **official.environment(folder), **ALLOCATOR},
            "frames": frames, "eval_episodes": 1,
        })  # fmt: skip
    to_run = [job for job in jobs if not finished_before(job, seed_frames)]
    for job, cores in zip(to_run, core_groups(len(to_run)), strict=True):
        job["cores"] = cores
        if job["agent"] == "official":
            job["env"]["OMP_NUM_THREADS"] = str(len(cores))
    left = 60 * args.minutes - (time.monotonic() - start)
    try:
        if to_run:
            run_side_by_side(to_run, left)
    finally:
        from benchmarks.learn_check.official import remove_temp

        for job in jobs:
            if job["agent"] == "official":
                remove_temp(job["env"])
    results = [read_run(job, seed_frames) for job in jobs]
    device = device_name()
    stack = versions()
    title = (
        f"{'TINY (a check, not a result)' if tiny else 'the paper settings'}; {device}; "
        f"jax {stack.get('jax', '?')}"
    )
    for result in results:
        fps = result["train_frames_per_s"]
        stopped = " (stopped at the deadline)" if result["stopped_at_deadline"] else ""
        if result["finished_before"]:
            stopped = " (finished in an earlier call: not started again)"
        returns = [(f, round(v, 1)) for f, v in result["evaluations"]]
        print(
            f"gpu_learn: {result['agent']} seed {result['seed']} (cores {result['cores']}): "
            f"{result['frames']} frames, {result['wall_s']:.0f} s in this call, exit "
            f"{result['exit_code']}{stopped}, train frames/s "
            f"{fps if fps is None else round(fps, 1)}; returns {returns}; ms a step "
            f"{result['time_ms']}"
        )
    from benchmarks import common
    from benchmarks.learn_check.settings import ALLOCATOR

    ok = all(ended_well(r) and r["evaluations"] for r in results)
    found = common.machine()
    summary = {
        "status": "tiny" if tiny else ("ok" if ok else "error"),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": args.commit or common.git_commit(),
        "machine": {"gpu": device, "cpu": found["cpu"], "cores": found["cores"]},
        "seconds": round(time.monotonic() - start, 1),
        "device": device,
        "versions": stack,
        "tiny": tiny,
        "task": TASK,
        "settings": {
            "frames_goal": frames,
            "eval_every_frames": every,
            "eval_episodes": episodes,
            "args": list(TINY if tiny else PAPER),
        },
        "allocator": ALLOCATOR,  # both agents' processes (settings.ALLOCATOR)
        "minutes": args.minutes,
        "wall_s": time.monotonic() - start,
        "reference": REFERENCE_SOURCE,
        "runs": results,
    }
    summary["calls"] = call_history(out / "gpu_learn.json", summary)
    (out / "gpu_learn.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"gpu_learn: {next_call(summary, frames)}")
    print(f"gpu_learn: {device}; {stack}")
    print(f"gpu_learn: {_curves(results, out)}, {_plot(results, out, title)}, "
          f"{out / 'gpu_learn.json'}; reference: {REFERENCE_SOURCE}")  # fmt: skip
    # A run stopped at the deadline (SIGTERM: its checkpoint saved) is what fits, not a failure.
    return 0 if ok else 1


def _run_key(run: dict) -> str:
    """A run's name in a call's `frames` ("official 4"): what `next_call` looks up there."""
    return f"{run['agent']} {run['seed']}"


def _call(summary: dict) -> dict:
    """One device call, as the calls list keeps it: when, what code, how long, how far."""
    return {
        "measured_at": summary["measured_at"],
        "commit": summary["commit"],
        "device": summary["device"],
        "minutes": summary["minutes"],
        "wall_s": round(summary["wall_s"], 1),
        "frames": {_run_key(r): r["frames"] for r in summary["runs"]},
    }


def call_history(previous: Path, summary: dict) -> list[dict]:
    """The calls that made these runs: those the `--out` folder's last gpu_learn.json
    names (a call continuing runs on a warm machine finds it there), then this one. The runs'
    evaluations and frames/s cover every call; `minutes` and `wall_s` are this call's alone."""
    earlier: list[dict] = []
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, KeyError):
        saved = json.loads(previous.read_text())
        earlier = saved.get("calls") or [_call(saved)]
    return [*earlier, _call(summary)]


def next_call(summary: dict, goal: int) -> str:
    """How long a call continuing these runs (same --out, warm machine) must be for every
    run to reach `goal` frames, at the rate each made in this call (the frames it gained
    over the call's wall time, its start, evaluations and stop included), and then make its
    evaluation there (`EVALUATION_S`). Where a run gained nothing this call, no estimate.
    A run is done once its evaluation at `goal` is complete (one the deadline cut short is
    not kept: the next call makes it again)."""
    calls = summary["calls"]
    before = calls[-2]["frames"] if len(calls) > 1 else {}
    wall = max(summary["wall_s"], 1.0)
    needs: dict[str, float | None] = {}
    for run in summary["runs"]:
        if any(frame >= goal for frame, _ in run["evaluations"]):
            continue
        name = _run_key(run)
        left = max(goal - run["frames"], 0)
        gained = run["frames"] - before.get(name, 0)
        needs[name] = left * wall / gained + EVALUATION_S if gained > 0 else None
    if not needs:
        return f"every run has its evaluation at {goal:,} frames: no further call"
    shown = "; ".join(
        f"{name} {'no frames this call' if s is None else f'about {s:.0f} s'}"
        for name, s in needs.items()
    )
    known = [s for s in needs.values() if s is not None]
    if not known:
        return f"to reach {goal:,} frames: {shown}"
    minutes = math.ceil((max(known) + STOP_GRACE_S + CALL_START_S) / 6.0) / 10.0
    return (
        f"to reach {goal:,} frames at this call's rates: {shown}; a continuing call needs "
        f"MINUTES={minutes:g} or more (the {STOP_GRACE_S:.0f} s stop and {CALL_START_S:.0f} s "
        "start included)"
    )


def _stamp(call: dict) -> str:
    """A call's row label: when, on what, at which commit, and its minutes (each call's)."""
    calls = call.get("calls") or [call]
    minutes = " + ".join(f"{c['minutes']:g}" for c in calls)
    over = f" over {len(calls)} calls on one warm machine" if len(calls) > 1 else ""
    return (
        f"{call['measured_at']}, {call['device'].removeprefix('gpu: ')}, "
        f"commit {call['commit']}, {minutes} min{over}"
    )


def _returns_at(result: dict, frames: list[int]) -> list[str]:
    found = dict(result["evaluations"])
    return [f"{found[f]:.0f}" if f in found else "" for f in frames]


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for BENCHMARKS.md's table: the headline call's runs (the
    stored result; its replicates are in the figure's table), at the furthest evaluation
    every seed of ours reached."""
    ours = [r for r in result["runs"] if r["agent"] == "magi_lp"]
    at = max(EVAL_EVERY_FRAMES, min(max(f for f, _ in r["evaluations"]) for r in ours))
    returns = [v for v in (dict(r["evaluations"]).get(at) for r in ours) if v is not None]
    published = reference_curve(result["task"]).get(at, {})
    number = (
        f"mean return {sum(returns) / len(returns):.0f} at {at // 1000}k frames "
        f"({len(returns)} seeds of ours, {result['device']})"
    )
    comparison = (
        f"official, published: {published.get('mean', float('nan')):.0f} "
        f"[{published.get('min', float('nan')):.0f}, {published.get('max', float('nan')):.0f}]"
    )
    fps = [r["train_frames_per_s"] for r in ours if r["train_frames_per_s"]]
    beside = [r for r in result["runs"] if r["agent"] == "official" and r["train_frames_per_s"]]
    if beside:  # measured beside ours, on the same machine in the same call
        speeds = ", ".join(f"{r['train_frames_per_s']:.0f}" for r in beside)
        at_beside = [dict(r["evaluations"]).get(at) for r in beside]
        returned = ", ".join(f"{v:.0f}" for v in at_beside if v is not None)
        comparison += f"; official seed beside ours: {speeds} train frames/s"
        comparison += f", return {returned} at {at // 1000}k" if returned else ""
    return number, comparison, f"{min(fps):.0f}-{max(fps):.0f} train frames/s a seed (ours)"


def report(result: dict) -> str:
    """The figure of BENCHMARKS.md, from a GPU result (and the calls stored beside it)."""
    calls = [result, *result.get("replicates", [])]
    frames = sorted({f for call in calls for r in call["runs"] for f, _ in r["evaluations"]})
    reference = reference_curve(result["task"])
    versions_text = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    settings = result["settings"]
    lines = [
        f"`make gpu-learn` (benchmarks/gpu_learn.py) on {result['device']}, "
        f"{result['machine']['cores']} cores ({result['machine']['cpu']}); {versions_text}. "
        f"{result['task']} at the paper's settings ({' '.join(settings['args'])}), "
        f"each call's runs side by side, each with its own cores (ours with "
        f"{GPU_MEMORY_FRACTION} of the GPU's memory each), evaluated "
        f"({settings['eval_episodes']} episodes) every {settings['eval_every_frames'] // 1000}k "
        "frames, each call "
        "stopped at its deadline (SIGTERM: a checkpoint). Every number was measured there.",
        "",
        "| call | seed | frames reached | train frames/s (the learn check's rule) | "
        + " | ".join(f"return at {f // 1000}k" for f in frames)
        + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in frames) + " |",
    ]
    for call in calls:
        stamp = _stamp(call)
        for r in call["runs"]:
            fps = r["train_frames_per_s"]
            lines.append(
                f"| {stamp} | {r['agent']} {r['seed']} | {r['frames']:,} | "
                f"{'' if fps is None else f'{fps:.1f}'} | "
                + " | ".join(_returns_at(r, frames))
                + " |"
            )
    lines.append(
        "| official, published (10 seeds) | mean [lowest, highest] | | | "
        + " | ".join(
            f"{reference[f]['mean']:.0f} [{reference[f]['min']:.0f}, {reference[f]['max']:.0f}]"
            if f in reference
            else ""
            for f in frames
        )
        + " |"
    )
    lines += ["", f"Reference: {result['reference']}."]
    if result.get("png"):
        lines += ["", f"![{result['task']} on one GPU, the first row's call]({result['png']})"]
    for call in calls:  # the headline call's notes first, then each replicate's
        for note in call.get("notes", []):
            lines += ["", note]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
