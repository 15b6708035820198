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

less `HEADROOM` of it for the learner's own networks, optimizer and activations. The
compressed host store (`magi_lp.replay.compressed_frames`: zstd frames in the learner's host
memory, about a quarter of the raw bytes) is counted the same way against the host's RAM less
the other nodes' resident memory, from an estimate (`estimated_nbytes`: no frame exists yet).
'auto' takes the first that fits of the device store, the host store and Reverb's frame replay
(`magi_lp.replay.stores.auto_frame_store`, the one rule); a store asked for that does not fit,
or nothing fitting for 'auto', is one line naming the key, the bytes, the budget and the fix.
The resolved store is written back into `config.replay.store`, so every node reads 'device',
'host' or 'reverb'.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError
from magi_lp.placement.host_memory import NODE_RSS_GIB, node_counts
from magi_lp.placement.memory import gb
from magi_lp.replay.stores import auto_frame_store, reverb_installed
from magi_lp.replay.stores.device import DeviceStore
from magi_lp.replay.stores.host_frames import HostFrameStore

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
      store: 'device', 'host' or 'reverb'.
      nbytes: what the device store takes (whether or not it is chosen).
      budget: what the learner's device can give it (after the headroom).
      where: the learner's device in words.
      line: one line for the dry run and the launch.
      host_nbytes: what the compressed host store is expected to take in the learner's host
        memory when full (whether or not it is chosen; `compressed_frames.estimated_nbytes`).
    """

    store: str
    nbytes: int
    budget: int
    where: str
    line: str
    host_nbytes: int = 0


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
    budget, where = _host_budget(config, plan, single_process)
    shards = 1 if single_process else max(1, learner.num_devices)
    return budget, f"{where} (the learner's cpu)", shards


def _host_budget(config: Any, plan: Any, single_process: bool) -> tuple[int, str]:
    """(bytes of host memory the learner's process may take for a store, where): the host's
    RAM less the other nodes' resident memory (`config.NODE_RSS_GIB`)."""
    import psutil

    total = psutil.virtual_memory().total
    if single_process or plan is None:
        others, count = NODE_RSS_GIB["learner"] * GIB, 0
    else:
        counts = node_counts(config)
        others = sum(NODE_RSS_GIB[g] * n for g, n in counts.items()) * GIB
        count = sum(counts.values()) - 1
    beside = f" beside {count} other nodes" if count else ""
    return int(total - others), f"this host's {gb(total)} RAM{beside}"


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
                "use replay.store=auto, device or host",
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
    device = _Room(device_store.nbytes(shards), _less_headroom(budget), where)
    host_budget, host_where = _host_budget(config, plan, single_process)
    host_store = HostFrameStore(builder, config, single_process=single_process)
    host = _Room(host_store.host_nbytes(), _less_headroom(host_budget), host_where)
    frames = "x".join(str(d) for d in spec.frame_shape)
    size = f"{spec.capacity:,} transitions of {frames} frames"
    if asked == "auto":
        store = auto_frame_store(
            device_fits=device.fits, host_fits=host.fits, reverb=reverb_available
        )
    elif asked == "reverb":
        store = "reverb"  # available: checked above
    else:
        store = asked if {"device": device, "host": host}[asked].fits else None
    if store is None:
        raise ConfigError(
            fact_refusal(*_refusal(asked, spec.capacity, size, device, host, reverb_available))
        )
    config.replay.store = store
    line = _line(store, size, device, host, auto=asked == "auto")
    return ReplayStorePlan(store, device.nbytes, device.budget, where, line, host.nbytes)


@dataclasses.dataclass(frozen=True)
class _Room:
    """A store's bytes against the budget of where it would live."""

    nbytes: int
    budget: int
    where: str

    @property
    def fits(self) -> bool:
        return self.nbytes <= self.budget

    def needs(self, what: str) -> str:
        return f"{what} needs {gb(self.nbytes)}, {self.where} has room for {gb(self.budget)}"


def _less_headroom(budget: int) -> int:
    return int(budget - max(HEADROOM * budget, MIN_HEADROOM_BYTES))


def _line(store: str, size: str, device: _Room, host: _Room, *, auto: bool) -> str:
    """The plan's line for the chosen store: what it holds, where, its bytes and its room."""
    if store == "device":
        return (
            f"replay: device store on the learner's device, {gb(device.nbytes)} ({size}); "
            f"room: {gb(device.budget)} on {device.where}"
        )
    why = f"; auto: the {device.needs('device store')}" if auto else ""
    if store == "host":
        return (
            f"replay: host store, zstd-compressed frames in the learner's host memory, about "
            f"{gb(host.nbytes)} ({size}); room: {gb(host.budget)} on {host.where}{why}"
        )
    return f"replay: reverb frame replay in the replay node ({size}{why})"


def _refusal(
    asked: str, capacity: int, size: str, device: _Room, host: _Room, reverb_available: bool
) -> tuple[str, str, str]:
    """The refusal's parts (what, facts, fix): the store asked for (or none of 'auto''s) does
    not fit, and what would."""
    room = host if asked == "host" else device
    fitting = max(1, int(capacity * room.budget / max(room.nbytes, 1) * 0.95))
    if asked == "host":
        fact = f"the compressed host store needs about {gb(host.nbytes)} ({size}) but "
    else:
        fact = f"the device replay store needs {gb(device.nbytes)} ({size}) but "
        if asked == "auto":
            fact = f"the {device.needs('device store')} and the host store about "
            fact += f"{gb(host.nbytes)} of {gb(host.budget)}; nothing fits ({size}) and "
    fact += f"{room.where} has room for {gb(room.budget)}"
    others = []
    if asked == "device" and host.fits:
        others.append(f"replay.store=host (about {gb(host.nbytes)} in host memory)")
    if reverb_available:
        others.append("replay.store=reverb")
    elif not others:
        others.append("more memory (Reverb, the other store, is not installed here)")
    fix = f"set agent.replay_buffer_size={fitting} or less"
    return f"replay.store={asked}", fact, ", or use ".join([fix, *others])


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
