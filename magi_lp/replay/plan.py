"""Which store serves a pixel agent's replay (`replay.store`), decided before anything starts.

A device store puts every frame on the learner's device: 1M transitions of 84x84 RGB frames
are 21.9 GB. That fits an 80 GB GPU beside the learner, not a 24 GiB host beside eight other
nodes. So the plan counts the store's bytes (`FrameReplaySpec.nbytes`: frames + index, one
shard per learner device) against the learner's budget:

- a GPU learner: its memory fraction (`resources.learner.gpu_memory`; JAX's default 0.75 when
  unset; the free memory for 'grow'; for 'auto', what the other nodes' fractions leave) of
  its smallest GPU, per device;
- a CPU learner: the host's RAM less the other nodes' resident memory
  (`config.NODE_RSS_GIB`), all shards together;

less `HEADROOM` of it for the learner's own networks, optimizer and activations. 'device'
that does not fit is one line naming the key, the bytes, the budget and the fix; 'auto'
picks the device store where it fits and Reverb's frame replay otherwise (or, where Reverb is
not installed, refuses in one line). The resolved store is written back into
`config.replay.store`, so every node reads 'device' or 'reverb'.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError
from magi_lp.placement.host_memory import NODE_RSS_GIB, node_counts
from magi_lp.placement.memory import gb
from magi_lp.replay.stores import reverb_installed
from magi_lp.replay.stores.device import DeviceStore

GIB = 1 << 30

HEADROOM = 0.25
"""Share of the learner's budget kept for its networks, optimizer state and activations:
the DrQ-v2 learner at batch 256 held 3-5 GB on an H100 beside a 61 GB preallocation."""

MIN_HEADROOM_BYTES = 2 * GIB
"""At least this much is kept, however small the budget."""

JAX_DEFAULT_FRACTION = 0.75
"""What JAX takes of a GPU when `gpu_memory` is not set."""


@dataclasses.dataclass(frozen=True)
class ReplayStorePlan:
    """The store a run uses, and why.

    Attributes:
      store: 'device' or 'reverb'.
      nbytes: what the device store takes (whether or not it is chosen).
      budget: what the learner's device can give it (after the headroom).
      where: the learner's device in words.
      line: one line for the dry run and the launch.
    """

    store: str
    nbytes: int
    budget: int
    where: str
    line: str


def _learner_budget(config: Any, plan: Any, single_process: bool) -> tuple[int, str, int]:
    """(bytes the store may take, where, shards)."""
    learner = next(p for p in plan.groups.values() if p.group == "learner")
    if learner.device == "gpu" and not single_process:
        gpus = [plan.inventory[i] for i in learner.gpu_ids]
        smallest = min(g.memory_total_bytes for g in gpus)
        fraction = learner.gpu_memory
        if fraction == "grow":
            free = min(g.memory_total_bytes - g.memory_used_bytes for g in gpus)
            setting, budget = "grow (free memory)", free
        elif learner.memory_auto:
            # Sized after this choice (magi_lp.runtime.memory_reckoning), from the store chosen
            # here: the store may take what the other nodes' fractions leave free.
            budget = min(_left_beside(plan, learner, g) for g in gpus)
            setting = "resources.learner.gpu_memory=auto (what the other nodes leave)"
        else:
            value = JAX_DEFAULT_FRACTION if fraction is None else float(fraction)
            setting = f"resources.learner.gpu_memory={fraction}"
            budget = int(value * smallest)
        ids = ",".join(str(i) for i in learner.gpu_ids)
        where = f"GPU {ids} at {setting} of {gb(smallest)}"
        shards = len(learner.gpu_ids)
        return budget * shards, where, shards
    import psutil

    total = psutil.virtual_memory().total
    if single_process:
        others, count = NODE_RSS_GIB["learner"] * GIB, 0
    else:
        counts = node_counts(config)
        others = sum(NODE_RSS_GIB[g] * n for g, n in counts.items()) * GIB
        count = sum(counts.values()) - 1
    beside = f" beside {count} other nodes" if count else ""
    where = f"this host's {gb(total)} RAM{beside} (the learner's cpu)"
    shards = 1 if single_process else max(1, learner.num_devices)
    return int(total - others), where, shards


def _left_beside(plan: Any, learner: Any, gpu: Any) -> int:
    """Bytes of `gpu` neither in use nor given by a fraction to another node of the plan."""
    taken = sum(
        float(p.gpu_memory) * gpu.memory_total_bytes * len(p.node_indices)
        for p in plan.groups.values()
        if p is not learner and gpu.index in p.gpu_ids and isinstance(p.gpu_memory, float)
    )
    return int(gpu.memory_total_bytes - gpu.memory_used_bytes - taken)


def plan_replay_store(
    config: Any,
    builder: Any,
    plan: Any = None,
    *,
    single_process: bool = False,
    reverb_available: bool | None = None,
) -> ReplayStorePlan | None:
    """Resolves `config.replay.store` for `builder`'s frame replay; None for other agents.

    Args:
      config: the validated experiment config (its `replay.store` is set to the result).
      builder: the experiment's builder (`frame_replay(None)` says what it stores).
      plan: the placement plan (distributed runs); None in one process.
      single_process: a `main.py` run: the learner is this process, on its first device.
      reverb_available: whether Reverb can be imported (default: looked up).

    Raises:
      ConfigError: the device store is asked for (or the only one installed) and does not fit.
    """
    if reverb_available is None:
        reverb_available = reverb_installed()
    asked = config.replay.store
    if asked == "reverb" and not reverb_available:
        raise ConfigError(
            fact_refusal(
                "replay.store=reverb",
                "Reverb is not installed here (it installs only on Python 3.10: `make setup`)",
                "use replay.store=auto or device",
            )
        )
    spec = builder.frame_replay(None)
    if spec is None:
        if single_process and not reverb_available and builder.transition_replay(None) is None:
            raise ConfigError(
                fact_refusal(
                    f"{type(builder).__name__} keeps its replay in Reverb",
                    "Reverb is not installed here",
                    "run it on the Python 3.10 stack (`make setup`), or give its builder a "
                    "`transition_replay` (magi_lp.agent.builder)",
                )
            )
        return None
    device_store = DeviceStore(builder, config, single_process=single_process)
    if plan is None:
        budget, where, shards = _single_process_budget()
    else:
        budget, where, shards = _learner_budget(config, plan, single_process)
    budget = int(budget - max(HEADROOM * budget, MIN_HEADROOM_BYTES))
    nbytes = device_store.nbytes(shards)
    fits = nbytes <= budget
    frames = "x".join(str(d) for d in spec.frame_shape)
    size = f"{spec.capacity:,} transitions of {frames} frames"
    if asked == "reverb" and reverb_available:
        line = f"replay: reverb frame replay in the replay node ({size})"
        return ReplayStorePlan("reverb", nbytes, budget, where, line)
    if fits:
        store = "device"
        line = (
            f"replay: device store on the learner's device, {gb(nbytes)} ({size}); "
            f"room: {gb(budget)} on {where}"
        )
    elif asked == "auto" and reverb_available:
        store = "reverb"
        line = (
            f"replay: reverb frame replay in the replay node ({size}; auto: the device store "
            f"needs {gb(nbytes)}, {where} has room for {gb(budget)})"
        )
    else:
        fitting = max(1, int(spec.capacity * budget / max(nbytes, 1) * 0.95))
        other = (
            "replay.store=reverb"
            if reverb_available
            else "more memory for the learner (Reverb, the other store, is not installed here)"
        )
        raise ConfigError(
            fact_refusal(
                f"replay.store={asked}",
                f"the device replay store needs {gb(nbytes)} ({size}) but {where} has room "
                f"for {gb(budget)}",
                f"set agent.replay_buffer_size={fitting} or less, or use {other}",
            )
        )
    config.replay.store = store
    return ReplayStorePlan(store, nbytes, budget, where, line)


def _single_process_budget() -> tuple[int, str, int]:
    """The budget of `main.py`'s learner: JAX's first GPU when it serves CUDA here, else RAM."""
    import os

    import psutil

    from magi_lp.placement.gpu_inventory import query_inventory
    from magi_lp.placement.jax_build import detect_jax_build, memory_fraction_in

    inventory = query_inventory()
    build = detect_jax_build()
    if len(inventory) and build.serves_cuda:
        gpu = inventory[inventory.ids()[0]]
        fraction = memory_fraction_in(os.environ, build) or JAX_DEFAULT_FRACTION
        where = f"GPU {gpu.index} at {fraction:g} of {gb(gpu.memory_total_bytes)}"
        return int(fraction * gpu.memory_total_bytes), where, 1
    total = psutil.virtual_memory().total
    return (
        int(total - NODE_RSS_GIB["learner"] * GIB),
        f"this host's {gb(total)} RAM (the learner's cpu)",
        1,
    )
