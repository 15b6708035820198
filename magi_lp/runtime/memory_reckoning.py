"""`gpu_memory='auto'`: each GPU node's memory, reckoned from its compiled programs before launch.

`size_gpu_memory(experiment, plan, store)` is what the entry point calls once the placement plan
and the replay store are decided: for every GPU group whose memory is 'auto' or a fraction, it
compiles the group's programs in a short-lived process (`magi_lp.runtime.program_memory`: the
learner's update at the batch each of its devices gets, an actor's policy step over its
`envs_per_actor` environments), turns XLA's memory analysis into a `MemoryNeed` (state,
compiled peak, batches, store, margin: `magi_lp.placement.memory`) and makes the plan again
with those needs: 'auto' becomes each node's fraction, every GPU is checked against its nodes,
and a user's fraction below its reckoning is a warning.

Where the programs compile: on the CPU, unless this machine has an NVIDIA device and a JAX
that serves CUDA; then in the first reckoned group's own env (its GPUs, preallocation off),
so that the numbers are the GPU's. A CPU compile's temporaries differ from a GPU's (other
fusions, no cuDNN workspaces): the margin is there for that, and `make gpu-check` measures
by how much they differ.

A reckoning is kept in the process, and handed to the network-isolated re-run of the same
command through its environment, under a key of what decides the programs (the config but its
resources and replay sections, the requests, the Python and its jaxlib): that re-run does not
compile again. Nothing is written outside the run's temporary folder (removed at once).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError
from magi_lp.placement.jax_build import installed_version
from magi_lp.placement.memory import MemoryNeed
from magi_lp.runtime.config import placement_requests

RECKONED_GROUPS = ("learner", "actor", "evaluator")
"""Groups whose programs the reckoning knows (others on a GPU take a fraction or 'grow')."""

TIMEOUT_S = 600
"""How long the compiling process may take."""

_CACHE: dict[str, dict[str, Any]] = {}

_HANDED_DOWN = "MAGI_LP_GPU_MEMORY_RECKONING"
"""The environment variable that hands the last reckoning to this command's re-run."""


def _cuda_here(plan: Any) -> bool:
    # The NVIDIA device node, as jax >= 0.4.31 checks it: a fake inventory has none.
    return plan.jax_build.serves_cuda and os.path.exists("/dev/nvidia0")


def _child_env(plan: Any, launch_group: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if launch_group is not None:
        env.update(plan.envs()[launch_group])  # MAGI_LP_TF_GPU=0 among them
        # The process only compiles: it takes what it uses, and no fraction.
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = ""
        env["XLA_CLIENT_MEM_FRACTION"] = ""  # jaxlib 0.11's name for it
    else:
        env.update({"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "XLA_FLAGS": ""})
    # The throwaway environment of the spec may render, also in a group that renders nothing
    # (the learner's MUJOCO_GL is 'off': its compile failed with "No OpenGL rendering backend
    # is available" on a GPU machine); EGL there uses the GPUs the group sees.
    if env.get("MUJOCO_GL", "off") in ("off", ""):
        env["MUJOCO_GL"] = env["PYOPENGL_PLATFORM"] = "egl"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _learner_batch(experiment: Any) -> int:
    """The learner's batch: its replay spec's, else the config's `agent.batch_size`."""
    builder = experiment.builder
    for spec in (builder.frame_replay(None), builder.transition_replay(None)):
        if spec is not None:
            return int(spec.batch_size)
    batch = experiment.config.get("agent", {}).get("batch_size", None)
    if batch is None:
        raise ConfigError(
            fact_refusal(
                f"resources.learner.gpu_memory: {type(builder).__name__}'s batch size is "
                "unknown before its replay exists",
                "it has no frame_replay / transition_replay, the config no agent.batch_size",
                "give resources.learner.gpu_memory a fraction or 'grow'",
            )
        )
    return int(batch)


def _requests(experiment: Any, plan: Any) -> dict[str, dict[str, Any]]:
    config = experiment.config
    requests: dict[str, dict[str, Any]] = {}
    for group, placement in plan.needs_reckoning().items():
        if group not in RECKONED_GROUPS:
            if placement.memory_auto:
                raise ConfigError(
                    fact_refusal(
                        f"resources.{group}.gpu_memory='auto'",
                        "only the learner, actors and evaluators are reckoned",
                        f"give resources.{group}.gpu_memory a fraction or 'grow'",
                    )
                )
            continue
        if group == "learner":
            devices = placement.num_devices
            batch = _learner_batch(experiment) // devices  # the plan checked that it divides
            requests[group] = {"batch_size": max(1, batch), "devices": devices}
        else:
            envs = int(config.envs_per_actor) if group == "actor" else 1
            requests[group] = {"envs": envs, "evaluation": group == "evaluator"}
    return requests


def compile_programs(
    experiment: Any, requests: dict[str, dict[str, Any]], env: dict[str, str]
) -> dict[str, Any]:
    """Runs `magi_lp.runtime.program_memory` on `requests` in a fresh process with `env`.

    Raises:
      ConfigError: the process failed (its last line, and how to do without the reckoning).
    """
    key = hashlib.sha256(
        pickle.dumps(
            (
                # Where the programs run and which replay serves them do not change them
                # (the requests carry the devices; the store is added by `needs_from`).
                repr(
                    {
                        k: v
                        for k, v in experiment.config.to_dict().items()
                        if k not in ("resources", "replay")
                    }
                ),
                type(experiment.builder).__qualname__,
                sorted(requests.items()),
                sys.executable,  # another Python (or another jaxlib) has another XLA
                installed_version("jaxlib"),
                env.get("JAX_PLATFORMS"),
                env.get("CUDA_VISIBLE_DEVICES"),
            )
        )
    ).hexdigest()
    if key in _CACHE:
        return _CACHE[key]
    handed_down = os.environ.get(_HANDED_DOWN)
    if handed_down:
        try:
            kept = json.loads(handed_down)
            if kept.get("key") == key:
                _CACHE[key] = kept["result"]
                return _CACHE[key]
        except (ValueError, KeyError, AttributeError):
            pass
    with tempfile.TemporaryDirectory(prefix="magi_lp-memory-") as folder:
        request_path = Path(folder) / "request.pkl"
        result_path = Path(folder) / "result.json"
        request_path.write_bytes(pickle.dumps((experiment, requests)))
        command = [sys.executable, "-m", "magi_lp.runtime.program_memory"]
        try:
            done = subprocess.run(
                [*command, str(request_path), str(result_path)],
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            done = None
        if done is None or done.returncode != 0 or not result_path.exists():
            lines = [] if done is None else done.stderr.strip().splitlines()
            why = lines[-1] if lines else f"no answer in {TIMEOUT_S} s"
            groups = ", ".join(f"resources.{g}.gpu_memory" for g in requests)
            raise ConfigError(
                fact_refusal(
                    f"the GPU memory reckoning (compiling {', '.join(requests)}) failed",
                    why,
                    f"give {groups} a fraction or 'grow' to launch without it",
                )
            )
        result = json.loads(result_path.read_text())
    _CACHE[key] = result
    # The network-isolated re-run of this command (`magi_lp.launch.isolation`) inherits the
    # environment: it takes the reckoning from there instead of compiling again. Nothing is
    # kept on disk.
    os.environ[_HANDED_DOWN] = json.dumps({"key": key, "result": result})
    return result


def _store_bytes(builder: Any, store: Any, devices: int) -> tuple[int, str]:
    """The device store's bytes on one learner device (`FrameReplaySpec.nbytes`, as the replay
    plan counted them), with the host writes staged for one insert."""
    if store is None or store.store != "device":
        return 0, ""
    from magi_lp.replay.frame_store import staged_insert_bytes

    spec = builder.frame_replay(None)
    staged = staged_insert_bytes(spec)
    per_device = -(-store.nbytes // devices) + staged
    return per_device, f"store {spec.capacity:,} transitions"


def needs_from(
    result: dict[str, Any], requests: dict[str, dict[str, Any]], builder: Any, store: Any
) -> dict[str, MemoryNeed]:
    """Group -> `MemoryNeed`, from `program_memory`'s answer (see placement.memory for the sum)."""
    where = f"{result['backend']}, jax {result['jax']}"
    needs: dict[str, MemoryNeed] = {}
    for group, measured in result["groups"].items():
        a = measured["analysis"]
        if group == "learner":
            in_flight = int(measured["updates_in_flight"])
            store_bytes, store_note = _store_bytes(builder, store, int(requests[group]["devices"]))
            # A device store's gather runs one batch ahead; host batches are prefetched.
            depth = 1 if store_bytes else int(measured["prefetch"])
            batch = requests[group]["batch_size"]
            per = (
                f" per device of {requests[group]['devices']}"
                if requests[group]["devices"] > 1
                else ""
            )
            needs[group] = MemoryNeed(
                group=group,
                state=measured["state"],
                compiled=a["temp"] + a["generated_code"] + in_flight * (a["output"] - a["alias"]),
                batches=(depth + in_flight) * measured["batch"],
                store=store_bytes,
                compiled_on=where,
                program=f"update at batch {batch}{per}, {in_flight} in flight",
                notes=store_note,
            )
        else:
            params = measured["params"]
            envs = requests[group]["envs"]
            needs[group] = MemoryNeed(
                group=group,
                state=2 * params,  # the parameters it acts with, and the next pull's
                compiled=a["argument"]
                - params
                + a["output"]
                - a["alias"]
                + a["temp"]
                + a["generated_code"],
                batches=0,
                store=0,
                compiled_on=where,
                program=f"policy step over {envs} environment{'s' if envs > 1 else ''}",
            )
    return needs


def size_gpu_memory(experiment: Any, plan: Any, store: Any = None) -> Any:
    """The plan made again with every reckoned GPU group's need (see the module docstring).

    Args:
      experiment: the run's `Experiment` (its config is the validated experiment config).
      plan: the placement plan made without a reckoning (`make_placement_plan`).
      store: the replay store plan (`plan_replay_store`), whose device store the learner holds.

    Returns:
      `plan` itself when no GPU group needs a reckoning, else the plan with `memory` set.

    Raises:
      ConfigError: a GPU whose nodes do not fit (the node, its need, what to change), or a
        reckoning that could not be made.
    """
    from magi_lp.placement.plan import make_plan

    needs = reckon_needs(experiment, plan, store)
    if not needs:
        return plan
    config = experiment.config
    return make_plan(placement_requests(config), plan.inventory, plan.jax_build, memory=needs)


def reckon_needs(experiment: Any, plan: Any, store: Any = None) -> dict[str, MemoryNeed]:
    """Group -> `MemoryNeed` for every GPU group of `plan` with 'auto' or a fraction (compiled
    once per process for the same programs); {} when there is none."""
    requests, result = compile_for_plan(experiment, plan)
    if not requests:
        return {}
    return needs_from(result, requests, experiment.builder, store)


def compile_for_plan(experiment: Any, plan: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what to compile per group, `program_memory`'s answer) for `plan`'s reckoned groups;
    ({}, {}) when there is none. On the CPU unless CUDA is really here (module docstring)."""
    requests = _requests(experiment, plan)
    if not requests:
        return {}, {}
    launch_group = None
    if _cuda_here(plan):
        launch_group = plan.launch_group(next(iter(requests)), 0)
    return requests, compile_programs(experiment, requests, _child_env(plan, launch_group))
