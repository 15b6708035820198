"""What every benchmark figure shares: the figure-process protocol, the machine's
description, subprocess handling that leaves nothing behind, small measuring helpers, and
the actor figures' (2 and 8) way of timing acting variants against the raw environment.

Each figure is a module `benchmarks.<name>` with

    measure(quick: bool) -> dict   runs in its own fresh process (`python -m
                                   benchmarks.<name> --out result.json [--quick]`)
    report(result: dict) -> str    Markdown for BENCHMARKS.md; light, imported by run.py
    subprocess_env() -> dict       (optional) environment variables of the figure's process

and ends with `if __name__ == "__main__": figure_main(measure)`. Modules import JAX,
TensorFlow, Reverb and MuJoCo inside `measure` only, so `run.py` can import every module to
render the page without paying for (or initialising) any of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from magi_lp.launch import processes

REPO = Path(__file__).resolve().parent.parent
"""The repository root (figure processes run there)."""

OUT_DIR_VAR = "MAGI_LP_BENCH_OUT_DIR"
"""Where run.py writes the page; figures that make files (the PNG) put them under it."""

MARK_VAR = "MAGI_LP_BENCH_MARK"
"""Every process a benchmark starts carries this variable; leftovers are found by it."""


# ---------------------------------------------------------------------------------------
# The figure process.


def figure_main(measure: Callable[[bool], dict]) -> None:
    """Entry point of a figure module: runs `measure` and writes its result as JSON.

    The result file gets `{"status": "ok", **result}`, or `{"status": "error", "error": ...}`
    with the traceback when `measure` raised, so the page can say what went wrong.
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes, to validate")
    parser.add_argument("--out", required=True, help="where the JSON result goes")
    args = parser.parse_args()
    # Pixels without a display; set before anything imports dm_control (run.py sets it too).
    os.environ.setdefault("MUJOCO_GL", "egl")
    started = time.monotonic()
    try:
        result = {"status": "ok", **measure(args.quick)}
    except BaseException as error:  # the page records it; the run goes on
        result = {
            "status": "error",
            "error": f"{type(error).__name__}: {error}",
            "traceback": traceback.format_exc()[-4000:],
        }
    result["seconds"] = round(time.monotonic() - started, 1)
    Path(args.out).write_text(json.dumps(result, indent=2, default=_json_default))
    print(json.dumps({k: v for k, v in result.items() if k != "traceback"}, default=str)[:4000])
    sys.stdout.flush()
    # Some libraries (Reverb, TF, Launchpad) leave non-daemon threads behind; the result is
    # written, so leave without waiting for them.
    os._exit(1 if result["status"] == "error" else 0)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def progress(message: str) -> None:
    """A progress line on stderr (the figure's log), with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# The machine.


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo, else platform)."""
    match = re.search(r"^model name\s*:\s*(.+)$", _read("/proc/cpuinfo"), re.MULTILINE)
    return match.group(1).strip() if match else (platform.processor() or platform.machine())


def cpu_id() -> str:
    """Which CPU behind the model name, for telling hosts apart where the name is generic (a
    VM's "AMD EPYC"): family, model and stepping, and the widest vector instructions it has
    (what XLA and oneDNN pick their kernels by, so what a result's last bits can depend on).
    Empty where /proc/cpuinfo says nothing."""
    info = _read("/proc/cpuinfo")

    def field(name: str) -> str:
        match = re.search(rf"^{name}\s*:\s*(.+)$", info, re.MULTILINE)
        return match.group(1).strip() if match else "?"

    if not info:
        return ""
    flags = set(field("flags").split())
    widest = next(
        (isa for isa in ("avx512f", "avx2", "avx", "sse4_2", "asimd") if isa in flags), "?"
    )
    return (
        f"family {field('cpu family')} model {field('model')} stepping {field('stepping')}, "
        f"{widest.removesuffix('f')}"
    )


def ram_gib() -> float:
    """Total RAM in GiB."""
    match = re.search(r"^MemTotal:\s+(\d+) kB", _read("/proc/meminfo"), re.MULTILINE)
    return round(int(match.group(1)) / 2**20, 1) if match else float("nan")


def gpus() -> list[dict]:
    """The GPUs NVML lists (empty when there is no GPU or no driver)."""
    try:
        from magi_lp.placement.gpu_inventory import query_inventory

        inventory = query_inventory()
    except Exception:  # no NVML: no GPU as far as the benchmarks are concerned
        return []
    return [
        {"index": g.index, "name": g.name, "memory_gib": round(g.memory_total_bytes / 2**30, 1)}
        for g in inventory
    ]


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def git_commit() -> str:
    """HEAD's short hash, with "+dirty" when tracked files differ from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def machine() -> dict:
    """What the page says about the machine the numbers come from."""
    gpu_list = gpus()
    return {
        "cpu": cpu_model(),
        "cpu_id": cpu_id(),
        "cores": os.cpu_count(),
        "ram_gib": ram_gib(),
        "gpus": gpu_list,
        "gpu": ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in gpu_list) or "none",
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def machine_summary() -> str:
    """One line naming the machine (stored with each figure's result)."""
    m = machine()
    return f"{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB, GPU: {m['gpu']}"


# ---------------------------------------------------------------------------------------
# Environment variables.


def single_thread_env() -> dict[str, str]:
    """One compute thread for XLA, BLAS and TensorFlow: what an actor node gets in the plan
    (`cpu_threads=1`); the figure process also pins itself to one core."""
    from magi_lp.placement.resources import ResourceSpec, spec_to_env

    return spec_to_env(ResourceSpec(device="cpu", render="egl", cpu_threads=1), ())


def cpu_only_env() -> dict[str, str]:
    """No GPU for JAX or TensorFlow; EGL rendering (Mesa's software EGL without a GPU)."""
    return {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "MUJOCO_GL": "egl"}


def steady_state_experiment():
    """The DrQ-v2 reacher_hard experiment (distributed config) as a long run writes replay.

    `agent.min_replay_frames=0`: otherwise every adder would send its share of the first
    `min_replay_size` items unchunked (`eager_items`, one round trip per step), i.e. most of
    what a benchmark measures, and a run only its first few hundred items.
    """
    from projects.drq_v2.experiment import make_experiment
    from projects.drq_v2.tasks import make_config

    config = make_config("reacher_hard", distributed=True)
    config.agent.min_replay_frames = 0
    return make_experiment(config)


class SteadyStateReplay(NamedTuple):
    """`make run`'s experiment writing into its own replay tables on a local Reverb server."""

    experiment: Any
    spec: Any  # the environment spec
    server: Any  # reverb.Server (stop it when done)
    client: Any  # reverb.Client of that server


UNUSED_CHECKPOINTS = "magi_lp_unused_reverb_checkpoints"
"""A Reverb checkpoint folder under the temp folder that no benchmark makes: Reverb creates it
only when a checkpoint is taken, and none is."""


def no_checkpoints() -> Any:
    """A checkpointer for a Reverb server that takes no checkpoint. With none, `reverb.Server`
    makes a folder in the temp folder (its TempDirCheckpointer) and never removes it: one
    stray folder per server a benchmark starts."""
    import tempfile

    import reverb

    path = os.path.join(tempfile.gettempdir(), UNUSED_CHECKPOINTS)
    return reverb.checkpointers.DefaultCheckpointer(path=path)


def steady_state_replay() -> SteadyStateReplay:
    """`steady_state_experiment()` and its replay tables, served without rate limits, so an
    actor benchmark measures acting and inserting, never waiting for a learner."""
    import reverb

    from magi_lp.replay.reverb_seam import without_rate_limit
    from magi_lp.replay.stores import resolve_store

    experiment = steady_state_experiment()
    spec = experiment.get_environment_spec()
    tables = resolve_store(experiment.builder, experiment.config).make_tables(spec)
    server = reverb.Server(
        [without_rate_limit(table) for table in tables], checkpointer=no_checkpoints()
    )
    return SteadyStateReplay(experiment, spec, server, reverb.Client(f"localhost:{server.port}"))


def pin_to_one_core() -> int:
    """Pins this process (and the threads it starts from now on) to one allowed core."""
    core = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


# ---------------------------------------------------------------------------------------
# Subprocesses that leave nothing behind.


def kill_marked(mark: str, wait_s: float = 5.0) -> list[str]:
    """SIGKILLs every live process carrying `mark`; returns them as `pid (name)`."""
    return processes.kill_marked(MARK_VAR, mark, wait_s=wait_s)


def marked_env(extra: dict[str, str] | None = None, mark: str | None = None) -> dict[str, str]:
    """This process's environment plus a fresh (or given) mark, the repo on PYTHONPATH,
    unbuffered output, and `extra` on top."""
    env = dict(os.environ)
    env[MARK_VAR] = mark or uuid.uuid4().hex
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("MUJOCO_GL", "egl")
    env.update(extra or {})
    return env


def entry_point(script: str, config: str, workdir: Path, *overrides: str) -> list[str]:
    """The command line of a project entry point (`projects/<agent>/main.py`, `lp_main.py`)
    run with `config` (both relative to the repository), `workdir` and `--config.*` flags."""
    return [
        sys.executable,
        str(REPO / script),
        f"--config={REPO / config}",
        f"--workdir={workdir}",
        *overrides,
    ]


@contextlib.contextmanager
def started(
    command: Sequence[str], env: dict[str, str], log: Path, cwd: Path = REPO
) -> Iterator[subprocess.Popen]:
    """Starts `command` in its own session, output to `log`; on leaving, stops it (SIGINT,
    then SIGKILL of its group after 30 s) and SIGKILLs anything still carrying its mark."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        stop(process, signal.SIGINT, timeout_s=30.0)
        kill_marked(env[MARK_VAR])


def stop(process: subprocess.Popen, sig: int, timeout_s: float) -> float | None:
    """Sends `sig` to `process`; SIGKILLs its process group when it has not exited within
    `timeout_s`. Returns the seconds it took to exit by itself, or None when killed."""
    if process.poll() is not None:
        return 0.0
    start = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
    try:
        process.wait(timeout=timeout_s)
        return time.monotonic() - start
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a text file ("" when missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------------------------------
# Measuring.


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (VmRSS)."""
    match = re.search(r"^VmRSS:\s+(\d+) kB", _read(f"/proc/{pid}/status"), re.MULTILINE)
    if not match:
        raise RuntimeError(f"no VmRSS for process {pid}")
    return int(match.group(1)) * 1024


def process_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process so far (this one by default)."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def descendants(pid: int | None = None) -> list[int]:
    """The processes started by process `pid` (this one by default), and theirs: an embedded
    Ray's GCS, raylet, agents and workers."""
    import psutil

    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


def cpu_seconds_of(pids: Iterable[int]) -> dict[int, float]:
    """`process_cpu_seconds` of each of `pids` still running."""
    seconds = {}
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            seconds[pid] = process_cpu_seconds(pid)
    return seconds


@contextlib.contextmanager
def embedded_ray(prefix: str, num_cpus: int) -> Iterator[Any]:
    """Ray started on this machine for a figure as the Ray engine starts it (its own temporary
    folder and token, loopback, no dashboard, no task events), shut down and its folder
    removed after; yields the `ray` module."""
    import ray

    from magi_lp.engines import ray_paths, ray_seam

    folder = ray_paths.run_temp_folder(prefix)
    ray_seam.use_run_token()
    ray.init(
        _temp_dir=folder,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        log_to_driver=False,
        num_cpus=num_cpus,
        _system_config={ray_seam.TASK_EVENTS_KEY: 0},  # as the Ray engine starts it
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


def random_frame_batch(batch_size: int, window: int, image: int, actions: int) -> Any:
    """A seeded random batch in the replay's layout (`FrameTransition`: `window` frames of
    `image` x `image` RGB per item), for timing the DrQ-v2 update on the same numbers in
    every run (and every environment: `learn_check/update_cost.py`'s `params_sha256`)."""
    import numpy as np

    from magi_lp.replay.frame_window import FrameTransition

    rng = np.random.default_rng(0)
    return FrameTransition(
        frames=rng.integers(0, 256, (batch_size, window, image, image, 3), dtype=np.uint8),
        action=rng.uniform(-1, 1, (batch_size, actions)).astype(np.float32),
        reward=rng.uniform(0, 1, (batch_size,)).astype(np.float32),
        discount=np.full((batch_size,), 0.99**3, np.float32),
    )


class TimedUpdates(NamedTuple):
    """`timed_updates`' result: the state and metrics after the last update, the first
    (compiling) call's seconds, and the wall and CPU seconds of the `updates` after it."""

    state: Any
    metrics: Any
    first_s: float
    wall_s: float
    cpu_s: float


def timed_updates(update: Callable[[Any, Any], Any], state: Any, batch: Any, updates: int):
    """Runs the jitted `update` on `batch`: once apart (it compiles), then `updates` times,
    timed (this process's CPU seconds, user + system)."""
    import jax

    start = time.perf_counter()
    state, metrics = update(state, batch)
    jax.block_until_ready(state)
    first = time.perf_counter() - start
    cpu0, wall0 = process_cpu_seconds(), time.perf_counter()
    for _ in range(updates):
        state, metrics = update(state, batch)
    jax.block_until_ready(state)
    wall = time.perf_counter() - wall0
    return TimedUpdates(state, metrics, first, wall, process_cpu_seconds() - cpu0)


def median(values: Sequence[float]) -> float:
    """The median (NaN for none)."""
    return statistics.median(values) if values else float("nan")


def fmt(value: Any, digits: int = 1) -> str:
    """A number for the page: thousands separators, `digits` decimals, "-" for None."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{value:,}"
    if value != value:  # NaN
        return "n/a"
    return f"{value:,.{digits}f}"


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is 0."""
    if numerator is None or denominator in (None, 0):
        return None
    return numerator / denominator


# ---------------------------------------------------------------------------------------
# Actor frames/s against the raw environment (figures 2 and 8).


class _InProcessVariables:
    """A variable source in this process: the policy params with a global agent step past
    the random phase (so the behaviour policy acts with its network, as after warm-up)."""

    def __init__(self, policy_params: Any, global_agent_steps: int):
        import numpy as np

        from projects.drq_v2.acting import GLOBAL_AGENT_STEPS

        policy = {**policy_params, GLOBAL_AGENT_STEPS: np.int32(global_agent_steps)}
        self._values = {"policy": policy}

    def get_variables(self, names):
        return [self._values[name] for name in names]


def policy_source(experiment: Any, spec: Any) -> tuple[Any, _InProcessVariables]:
    """The experiment's networks for `spec`, and a variable source in this process serving
    their initial 'policy' variables (encoder and actor) past the random phase: what an
    actor's VariableClient pulls from the learner, without a learner."""
    import jax

    networks = experiment.network_factory(spec)
    params = networks.init(jax.random.PRNGKey(0), spec.observations.generate_value())
    source = _InProcessVariables(
        {"encoder": params["encoder"], "actor": params["actor"]}, global_agent_steps=200_000
    )
    return networks, source


class StepCounting:
    """An environment that adds 1 to `counter[0]` at every step; environments stepped by one
    loop share one counter, so a runner can stop after a number of environment steps."""

    def __init__(self, env: Any, counter: list[int]):
        self._env = env
        self._counter = counter

    def reset(self):
        return self._env.reset()

    def step(self, action):
        self._counter[0] += 1
        return self._env.step(action)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


Runner = tuple[Callable[[int], None], list[int]]
"""(run(environment steps), the step counter of its environments) for one variant."""


def raw_runner(environment: Any, action_shape: tuple[int, ...], count: list[int]) -> Runner:
    """The raw environment as a Runner: uniform random numpy actions, no policy, no toolkit.

    Episodes go on across calls, as in the acting loop (a reset costs about as much as
    several steps, so resetting at every call would flatter the actors).
    """
    import numpy as np

    rng = np.random.default_rng(0)
    state: dict[str, Any] = {}

    def run(steps: int) -> None:
        if "timestep" not in state:
            state["timestep"] = environment.reset()
        for _ in range(steps):
            if state["timestep"].last():
                state["timestep"] = environment.reset()
            action = rng.uniform(-1.0, 1.0, action_shape).astype(np.float32)
            state["timestep"] = environment.step(action)

    return run, count


def acting_runner(
    environments: list[Any], actor: Any, count: list[int], frames_per_step: int
) -> Runner:
    """The toolkit's `ActingLoop` over `environments` of `actor` (a `BatchedActor`, or an
    `acme.core.Actor` for one environment), counting into a throwaway counter and logging
    nothing, as a Runner: each call runs it until its environments have taken `steps` more
    steps, mid-episode if need be (the loop checks its stop before every step; episodes go
    on across calls)."""
    from acme.utils import counting, loggers

    from magi_lp.runtime.acting_loop import ActingLoop

    loop = ActingLoop(
        environments,
        actor,
        counting.Counter(time_delta=0.0),
        loggers.NoOpLogger(),
        frames_per_step=frames_per_step,
    )

    def run(steps: int) -> None:
        target = count[0] + steps
        loop.run(should_stop=lambda: count[0] >= target)

    return run, count


def timed_rounds(
    runners: dict[str, Runner],
    steps: int,
    rounds: int,
    frames_per_step: int,
    steps_key: str = "steps",
) -> dict[str, list[dict]]:
    """Runs every variant for `steps` environment steps per round, the order rotating from
    round to round (so no variant always runs first, on the coldest caches); a sample per
    variant and round: steps taken (under `steps_key`), wall and CPU seconds of this process
    (all its threads), frames per second and per CPU-second."""
    names = list(runners)
    samples: dict[str, list[dict]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            run, count = runners[name]
            before = count[0]
            cpu = process_cpu_seconds()
            start = time.perf_counter()
            run(steps)
            wall = time.perf_counter() - start
            cpu = process_cpu_seconds() - cpu
            taken = count[0] - before
            samples[name].append(
                {
                    steps_key: taken,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "frames_per_second": taken * frames_per_step / wall,
                    "frames_per_cpu_second": taken * frames_per_step / max(cpu, 1e-9),
                }
            )
            progress(
                f"round {round_index + 1} {name}: {taken * frames_per_step / wall:.1f} frames/s"
            )
    return samples


def rates_against_raw(samples: dict[str, list[dict]]) -> dict[str, dict]:
    """Per variant the median frames per second and per CPU-second of `timed_rounds`'
    samples, and each as a ratio to the variant "raw" (the environment alone)."""
    variants = {
        name: {
            "frames_per_second": median([s["frames_per_second"] for s in runs]),
            "frames_per_cpu_second": median([s["frames_per_cpu_second"] for s in runs]),
            "samples": runs,
        }
        for name, runs in samples.items()
    }
    raw = variants["raw"]
    for variant in variants.values():
        variant["ratio_to_raw"] = ratio(variant["frames_per_second"], raw["frames_per_second"])
        variant["cpu_ratio_to_raw"] = ratio(
            variant["frames_per_cpu_second"], raw["frames_per_cpu_second"]
        )
    return variants


def rates_table(rows: Iterable[tuple[str, dict]]) -> list[str]:
    """Markdown table lines of `rates_against_raw` variants, a row per (label, variant)."""
    lines = [
        "| variant | frames/s | ratio to raw | frames per CPU-second | CPU ratio to raw |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, v in rows:
        lines.append(
            f"| {label} | {fmt(v['frames_per_second'])} | {fmt(v['ratio_to_raw'], 3)} "
            f"| {fmt(v['frames_per_cpu_second'])} | {fmt(v['cpu_ratio_to_raw'], 3)} |"
        )
    return lines


def error_section(result: dict) -> str:
    """Markdown for a figure that failed: the error and the end of its traceback."""
    lines = [f"**Failed**: `{result.get('error', 'unknown error')}`"]
    details = result.get("traceback") or result.get("log_tail")
    if details:
        lines += ["", "```", details.strip()[-2500:], "```"]
    return "\n".join(lines)
