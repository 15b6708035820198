"""The `reckoning` part of the GPU check: `gpu_memory='auto'`'s reckoned bytes against each
process's measured peak, for `make run`'s config and the 1-GPU layout.

For each layout the plan is made as `lp_main.py` makes it (replay store chosen, every GPU
group's programs compiled and its memory sized: `magi_lp.runtime.memory_reckoning`); then one
process per reckoned group runs its real work on the GPU with that group's env, except that
JAX does not preallocate (so the pool grows only as far as the work takes it, capped by the
reckoned fraction): the learner fills the device store the plan sized (`DeviceFrameStore` at
the config's capacity) with a few episodes of random frames and runs its update through the
builder (`make_learner` over `DeviceReplayIterator`); an actor runs its batched policy step
over `envs_per_actor` random observations. Measured per process: the peak GPU MiB NVML lists
for its pid (pool plus CUDA context) and JAX's own `peak_bytes_in_use`; compared with the
reckoned need (plus `CUDA_CONTEXT_BYTES` for NVML). The goal (issue 29): every node runs at its
reckoned limit, and the reckoning is at most 15% above the measured peak.

Needs the agents' stack (Haiku, dm_control, MuJoCo: `make gpu-learn-wheels` on a bare GPU
machine); where it is missing the part says so and measures nothing. Workers are this module
run again: `python -m benchmarks.gpu_check.reckoning --worker GROUP LAYOUT STATUS`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO
from benchmarks.gpu_check.settings import CONFIG, MIB, SHARED_CONFIG

LAYOUTS = {"make_run": (CONFIG, None), "1gpu": (SHARED_CONFIG, "1gpu")}
"""Layout name -> (config file, get_config argument)."""

UPDATES = 30
"""Learner updates (actor steps) a worker runs before it reports its peak."""

GOAL_ABOVE = 0.15
"""The reckoning may be this much above the measured peak (issue 29)."""


def _config(layout: str, gpu_id: int, overrides: dict[str, Any] | None = None) -> Any:
    from benchmarks.gpu_check.plan import load_config

    path, argument = LAYOUTS[layout]
    config = load_config(overrides, path=path, argument=argument)
    for group in ("learner", "actor", "evaluator"):
        if config.resources[group].device != "cpu":
            config.resources[group].device = "gpu"
            config.resources[group].gpus = [gpu_id]
    return config


def _sized_plan(layout: str, inventory: Any, gpu_id: int) -> tuple[Any, Any, Any]:
    from magi_lp.replay.plan import plan_replay_store
    from magi_lp.runtime.config import make_placement_plan
    from magi_lp.runtime.memory_reckoning import size_gpu_memory
    from projects.drq_v2.experiment import make_experiment

    config = _config(layout, gpu_id)
    plan = make_placement_plan(config, inventory)
    experiment = make_experiment(config)
    store = plan_replay_store(config, experiment.builder, plan)
    return config, size_gpu_memory(experiment, plan, store), store


def sized_if_possible(config: Any, plan: Any) -> Any:
    """`plan` with its 'auto' groups sized as `lp_main.py` sizes them, where the agents' stack
    is installed; else as it is ('auto' then allocates on demand)."""
    if missing_stack():
        return plan
    from magi_lp.replay.plan import plan_replay_store
    from magi_lp.runtime.memory_reckoning import size_gpu_memory
    from projects.drq_v2.experiment import make_experiment

    experiment = make_experiment(config)
    return size_gpu_memory(experiment, plan, plan_replay_store(config, experiment.builder, plan))


AGENT_STACK = ("haiku", "dm_control", "mujoco", "dm_env", "acme")
"""What building the agents needs beyond CUDA JAX (the `gpu-learn` wheels)."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses it
        return False


def missing_stack() -> str | None:
    """Why this Python cannot run the part (None: it can)."""
    missing = [m for m in AGENT_STACK if not _importable(m)]
    if missing:
        return (
            f"{', '.join(missing)} not installed in this Python; carry them with "
            "`make gpu-learn-wheels` (benchmarks/README.md)"
        )
    return None


def run_part(nvml: Any, inventory: Any, root: Path, every_s: float = 0.5) -> dict:
    """Both layouts: reckoned vs measured, per reckoned group (one worker each)."""
    why = missing_stack()
    if why:
        return {"state": "skipped", "reason": why}
    gpu_id = inventory.gpus[0].index
    from magi_lp.placement.memory import CUDA_CONTEXT_BYTES

    out: dict[str, Any] = {"state": "done", "goal_above": GOAL_ABOVE, "layouts": {}}
    for layout in LAYOUTS:
        try:
            _, plan, store = _sized_plan(layout, inventory, gpu_id)
        except Exception as error:  # a refusal is a result too
            out["layouts"][layout] = {"state": "refused", "error": str(error)}
            continue
        rows = {}
        for group, need in plan.memory.items():
            env = dict(os.environ)
            env.update(plan.groups[plan.launch_group(group, 0)].env)
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # measure use, capped at the limit
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
            status = root / f"reckoning-{layout}-{group}.json"
            log = open(root / f"reckoning-{layout}-{group}.log", "w")  # noqa: SIM115
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.gpu_check.reckoning",
                    "--worker",
                    group,
                    layout,
                    str(status),
                    str(gpu_id),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
            peak_mib = 0.0
            while process.poll() is None:
                usage = nvml.by_pid().get(process.pid, 0.0)
                peak_mib = max(peak_mib, usage)
                time.sleep(every_s)
            log.close()
            state = json.loads(status.read_text()) if status.exists() else {}
            reckoned = need.total + CUDA_CONTEXT_BYTES
            measured = peak_mib * MIB
            rows[group] = {
                "ran": process.returncode == 0 and state.get("state") == "done",
                "error": state.get("error"),
                "reckoned_bytes": need.total,
                "reckoned_with_context_bytes": reckoned,
                "fraction": plan.groups[plan.launch_group(group, 0)].gpu_memory,
                "nvml_peak_bytes": measured,
                "jax_peak_bytes": state.get("peak_bytes_in_use"),
                "above_nvml": reckoned / measured - 1 if measured else None,
                "above_jax": (
                    need.total / state["peak_bytes_in_use"] - 1
                    if state.get("peak_bytes_in_use")
                    else None
                ),
                "how": need.describe(),
            }
        out["layouts"][layout] = {
            "state": "done",
            "store": store.line if store is not None else None,
            "groups": rows,
        }
    return out


def report_lines(result: dict | None) -> list[str]:
    """Figure 7's lines for the part: reckoned vs measured per process."""
    if not result or result.get("state") != "done":
        return [] if not result else [f"**Memory reckoning**: {result.get('reason', 'skipped')}"]
    lines = [
        "**Memory reckoning** (`gpu_memory='auto'`): reckoned bytes (+ CUDA context) vs the peak "
        "NVML lists per process, and vs JAX's `peak_bytes_in_use` (goal: every node runs, "
        f"reckoned at most {GOAL_ABOVE:.0%} above the peak)"
    ]
    for layout, done in result["layouts"].items():
        if done.get("state") != "done":
            lines.append(f"- {layout}: {done.get('state')}: `{done.get('error')}`")
            continue
        for group, row in done["groups"].items():
            above = row["above_nvml"]
            lines.append(
                f"- {layout}, {group}: {'ran' if row['ran'] else 'FAILED'} at {row['fraction']}; "
                f"reckoned {row['reckoned_with_context_bytes'] / 1e9:.2f} GB, NVML peak "
                f"{row['nvml_peak_bytes'] / 1e9:.2f} GB"
                + (f" ({above:+.0%})" if above is not None else "")
                + (
                    f"; JAX peak {row['jax_peak_bytes'] / 1e9:.2f} GB ({row['above_jax']:+.0%})"
                    if row["jax_peak_bytes"]
                    else ""
                )
            )
    return lines


# --- the worker ---------------------------------------------------------------------------


def _learner_work(experiment: Any, environment_spec: Any, networks: Any) -> None:
    import jax
    import numpy as np

    from magi_lp.replay.frame_store import DeviceFrameStore, DeviceReplayIterator
    from magi_lp.runtime.program_memory import make_quiet_learner

    config = experiment.config
    builder = experiment.builder
    spec = builder.frame_replay(environment_spec)
    writers = int(config.num_actors) * int(config.envs_per_actor)
    store = DeviceFrameStore(spec, writers=writers)
    rng = np.random.default_rng(0)
    action = np.zeros(spec.action_shape, spec.action_dtype)
    for writer in range(writers):  # a short episode per writer: every shard has data
        store.add_first(writer, rng.integers(0, 255, spec.frame_shape, np.uint8))
        for t in range(spec.window + 8):
            frame = rng.integers(0, 255, spec.frame_shape, np.uint8)
            store.add(writer, frame, action, 0.0, 1.0, last=t == spec.window + 7)
    store.flush()
    learner = make_quiet_learner(
        builder, networks, environment_spec, DeviceReplayIterator(store, jax.random.PRNGKey(1))
    )
    for _ in range(UPDATES):
        learner.step()
    jax.block_until_ready(learner.state)


def _actor_work(
    experiment: Any, environment_spec: Any, networks: Any, group: str, envs: int
) -> None:
    import jax
    import numpy as np

    from magi_lp.agent.builder import POLICY_VARIABLES
    from magi_lp.runtime.program_memory import make_quiet_learner

    builder = experiment.builder
    with jax.default_device(jax.devices("cpu")[0]):  # the learner's state is not the actor's
        learner = make_quiet_learner(builder, networks, environment_spec)
        params = learner.get_variables([POLICY_VARIABLES])[0]
    params = jax.device_put(params, jax.devices()[0])
    policy = builder.make_policy(networks, environment_spec, group == "evaluator")
    spec = environment_spec.observations
    rng = np.random.default_rng(0)
    state = jax.vmap(policy.init)(jax.random.split(jax.random.PRNGKey(2), envs))
    step = jax.jit(jax.vmap(policy.select_action, in_axes=(None, 0, 0)))
    for _ in range(UPDATES):
        observation = rng.integers(0, 255, (envs, *spec.shape)).astype(spec.dtype)
        actions, state = step(params, observation, state)
    jax.block_until_ready(actions)


def worker_main(
    group: str, layout: str, status: str, gpu_id: int, overrides: dict[str, Any] | None = None
) -> int:
    """One reckoned node's real work in this process; writes its status (and JAX's peak)."""
    import jax

    from magi_lp.runtime.node_devices import prepare_node_process
    from projects.drq_v2.experiment import make_experiment

    prepare_node_process()
    try:
        config = _config(layout, gpu_id, overrides)
        config.replay.store = "device"
        experiment = make_experiment(config)
        environment_spec = experiment.get_environment_spec()
        networks = experiment.network_factory(environment_spec)
        if group == "learner":
            _learner_work(experiment, environment_spec, networks)
        else:
            envs = int(config.envs_per_actor) if group == "actor" else 1
            _actor_work(experiment, environment_spec, networks, group, envs)
        stats = jax.devices()[0].memory_stats() or {}
        result = {"state": "done", "peak_bytes_in_use": stats.get("peak_bytes_in_use")}
    except Exception as error:  # reported, not raised: the parent reads the status file
        result = {"state": "failed", "error": f"{type(error).__name__}: {error}"}
    Path(status).write_text(json.dumps(result))
    return 0 if result["state"] == "done" else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=4, metavar=("GROUP", "LAYOUT", "STATUS", "GPU"))
    parser.add_argument(
        "--set", action="append", default=[], help="KEY=VALUE config overrides (tests)"
    )
    args = parser.parse_args()
    group, layout, status, gpu = args.worker
    overrides = {}
    for item in args.set:
        key, value = item.split("=", 1)
        overrides[key] = json.loads(value)
    sys.exit(worker_main(group, layout, status, int(gpu), overrides))
