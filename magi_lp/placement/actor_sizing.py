"""Actors sized to the machine: what `num_actors='auto'` and `envs_per_actor='auto'` become.

The learner is fed by the actors: with too few, it waits for batches while cores idle
(figure 15: 2 actors on a 16-core H200 machine, the learner waiting 52% of its steps, about
5 cores busy). So 'auto' gives the actors what the other nodes leave:

    actors = the least of
      cores       (cores - the other busy nodes' threads) // an actor's threads, at least 1
      GPU memory  where the actors' processes hold GPU memory: the room there // what one
                  process holds (a CUDA context and its policy's pool where it acts on the
                  GPU, `RENDER_CONTEXT_BYTES` per environment rendering there through EGL)
      RAM         `ACTOR_RAM_SHARE` of what the other nodes leave // an actor's resident
                  memory (the rest is for the replay's data)
    environments per actor: `GPU_ACTOR_ENVS` where the policy runs on a GPU (one batched call
      for all of them: few CUDA processes, many environments each), else `CPU_ACTOR_ENVS`
      (figure 8: on one core a batch of k saves at most 8%, stepping is the work), raised
      where the learner's devices need more writers (one replay shard per device).

A number the config gives is kept; one that does not fit the actors' GPU memory is refused
in one line. Too many threads for the cores, or too much RAM, stays a warning
(`magi_lp.runtime.config.capacity_warnings`): the run still works, slower.

The arithmetic only: the caller (`magi_lp.runtime.config.resolve_actor_counts`) reads the
config, the machine and a first placement plan, and hands the numbers in. The compiled
reckoning (`gpu_memory='auto'`) still checks every GPU before launch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from magi_lp.config_schema import fact_refusal, is_int
from magi_lp.errors import ConfigError
from magi_lp.placement.memory import CUDA_CONTEXT_BYTES, RENDER_CONTEXT_BYTES, gb
from magi_lp.placement.resources import JAX_DEFAULT_PREALLOCATED_FRACTION

AUTO = "auto"
"""The value of `num_actors` / `envs_per_actor` that asks for this module's sizing."""

GPU_ACTOR_ENVS = 8
"""Environments per actor whose policy runs on a GPU (the GPU layouts' measured choice:
figure 15 ran 8 per actor, each actor on 91% of one core)."""

CPU_ACTOR_ENVS = 1
"""Environments per actor on the CPU (figure 8: k=4 and k=16 gain 5-8% per core, k=8 none)."""

LEARNER_THREADS = 2
"""Threads a learner keeps busy when its spec gives no `cpu_threads`: its update's, and the one
that samples or drains ahead of it (its prefetch)."""

ACTING_POOL_BYTES = 384 << 20
"""An acting process's JAX pool on its GPU before its reckoning: DrQ-v2's policy step over 8
environments was reckoned at 303 MB (figure 15), most of it the reckoning's least margin."""

ACTOR_GPU_SHARE = 0.25
"""Of a GPU's free memory, what 'auto' gives the actors where the learner shares the GPU with
memory not known yet ('auto', 'grow'): the rest is for its update and its device store."""

ACTOR_RAM_SHARE = 0.5
"""Of the RAM the other nodes leave, what 'auto' gives the actors' processes."""


@dataclasses.dataclass(frozen=True)
class ActorGpus:
    """Where the actors' processes hold GPU memory, and how much room they have there.

    Attributes:
      label: the GPU(s), as the plan names them ("0:NVIDIA H100 80GB HBM3").
      computes: the policy runs there (each process holds a CUDA context and a JAX pool);
        False: only its environments render there (EGL).
      count: GPUs the processes are spread over, one each in turn (round robin); 1 when
        every process sees the same GPU(s).
      free_bytes: per GPU, its memory less what is in use and what other nodes claim: what
        a given `num_actors` may fill.
      auto_bytes: per GPU, what 'auto' gives the actors (at most `free_bytes`).
      pool_bytes: an acting process's JAX pool there (its fraction where its spec gives one,
        else `ACTING_POOL_BYTES`).
    """

    label: str
    computes: bool
    count: int
    free_bytes: int
    auto_bytes: int
    pool_bytes: int = ACTING_POOL_BYTES

    def process_bytes(self, envs: int) -> int:
        """What one actor process of `envs` environments holds on its GPU."""
        acting = CUDA_CONTEXT_BYTES + self.pool_bytes if self.computes else 0
        return acting + envs * RENDER_CONTEXT_BYTES

    def fits(self, room: int, envs: int) -> int:
        """How many such processes `room` bytes per GPU hold, over all `count` GPUs."""
        return self.count * max(0, room // self.process_bytes(envs))


@dataclasses.dataclass(frozen=True)
class ActingSite:
    """What one actor node takes, as the plan places it.

    Attributes:
      threads: the threads it keeps busy (its spec's `cpu_threads`, 1 unless given).
      rss_bytes: its resident memory after start-up.
      gpus: where it holds GPU memory; None where it holds none (a CPU actor rendering with
        Mesa's software EGL).
    """

    threads: int
    rss_bytes: int
    gpus: ActorGpus | None = None


@dataclasses.dataclass(frozen=True)
class ActorSizing:
    """The counts a run gets, and the line that says why."""

    num_actors: int
    envs_per_actor: int
    line: str


def _envs_word(envs: int) -> str:
    return f"{envs} env{'s' if envs != 1 else ''}"


def _cores_reason(cores: int, busy: Mapping[str, int], threads: int) -> tuple[int, str]:
    """(actors the cores allow, the words for it)."""
    taken = sum(busy.values())
    after = ", ".join(f"{group} {n}" for group, n in busy.items() if n)
    left = cores - taken
    each = f"{threads} thread{'s' if threads != 1 else ''} each"
    if left < threads:
        return 1, f"{cores} cores: none left after {after}; at least 1 actor, {each}"
    return left // threads, f"{cores} cores: {left} left after {after}; {each}"


def size_actors(
    num_actors: int | str,
    envs_per_actor: int | str,
    *,
    cores: int,
    busy: Mapping[str, int],
    site: ActingSite,
    memory_bytes: int | None = None,
    others_rss_bytes: int = 0,
    min_writers: int = 1,
) -> ActorSizing:
    """The actors' count and environments each (see the module docstring).

    Args:
      num_actors: `config.num_actors`: 'auto' or a count >= 1 (kept).
      envs_per_actor: `config.envs_per_actor`: 'auto' or a count >= 1 (kept).
      cores: the CPUs this run may use.
      busy: the other busy nodes' threads by group, in the order the line names them
        ({"learner": 2, "replay": 1, "evaluator": 1, "counter": 1}).
      site: what one actor node takes (`ActingSite`).
      memory_bytes: the machine's RAM; None: no RAM bound.
      others_rss_bytes: the other nodes' resident memory.
      min_writers: the fewest writers (actors x environments) the replay needs: the
        learner's devices, one shard each.

    Raises:
      ConfigError: a given count whose GPU memory does not fit (naming the key and the fix).
    """
    gpus = site.gpus
    envs = envs_per_actor if is_int(envs_per_actor) else _auto_envs(gpus)
    if num_actors != AUTO:
        envs = _envs_for_given(int(num_actors), envs, envs_per_actor, gpus)
        envs = max(envs, math.ceil(min_writers / num_actors)) if envs_per_actor == AUTO else envs
        said = "auto" if envs_per_actor == AUTO else "given"
        return ActorSizing(
            int(num_actors), envs, f"actors: {num_actors} (given) x {_envs_word(envs)} ({said})"
        )
    by_cores, why = _cores_reason(cores, busy, site.threads)
    actors, bound = by_cores, "cores"
    if gpus is not None:
        by_gpu = gpus.fits(gpus.auto_bytes, envs)
        if by_gpu < 1 and envs_per_actor == AUTO and envs > 1:
            envs = 1
            by_gpu = gpus.fits(gpus.auto_bytes, envs)
        if by_gpu < 1:
            raise ConfigError(fact_refusal(*_gpu_refusal("auto", 1, envs, gpus, gpus.auto_bytes)))
        why += (
            f"; GPU {gpus.label}: {gb(gpus.process_bytes(envs))} each, room for {by_gpu} in "
            f"{gb(gpus.auto_bytes * gpus.count)}"
        )
        if by_gpu < actors:
            actors, bound = by_gpu, "GPU memory"
    if memory_bytes is not None:
        room = int(ACTOR_RAM_SHARE * max(0, memory_bytes - others_rss_bytes))
        by_ram = max(1, room // site.rss_bytes)
        if by_ram < actors:
            actors, bound = by_ram, "RAM"
            why += f"; RAM: room for {by_ram} at {gb(site.rss_bytes)} each"
    if envs_per_actor == AUTO:
        envs = max(envs, math.ceil(min_writers / actors))
    given = "" if envs_per_actor == AUTO else " (given)"
    if bound != "cores":
        why += f"; {bound} bounds it"
    line = f"actors: auto -> {actors} x {_envs_word(envs)}{given} ({why})"
    return ActorSizing(actors, envs, line)


def _auto_envs(gpus: ActorGpus | None) -> int:
    return GPU_ACTOR_ENVS if gpus is not None and gpus.computes else CPU_ACTOR_ENVS


def _envs_for_given(
    actors: int, envs: int, envs_per_actor: int | str, gpus: ActorGpus | None
) -> int:
    """`envs`, or fewer where `envs_per_actor` is 'auto' and `actors` processes of `envs`
    environments do not fit their GPU; refuses `actors` that do not fit even so."""
    if gpus is None:
        return envs
    while gpus.fits(gpus.free_bytes, envs) < actors and envs_per_actor == AUTO and envs > 1:
        envs //= 2
    if gpus.fits(gpus.free_bytes, envs) < actors:
        raise ConfigError(fact_refusal(*_gpu_refusal(actors, actors, envs, gpus, gpus.free_bytes)))
    return envs


def _gpu_refusal(
    given: int | str, actors: int, envs: int, gpus: ActorGpus, room: int
) -> tuple[str, str, str]:
    """The refusal's parts (what, facts, fix) of actors whose GPU memory does not fit."""
    what = "CUDA context, policy pool and " if gpus.computes else ""
    fits = gpus.fits(gpus.free_bytes, envs)
    return (
        f"num_actors={given}: {actors} actor process(es) of {_envs_word(envs)} need "
        f"{gb(actors * gpus.process_bytes(envs))} on GPU {gpus.label}",
        f"each holds {gb(gpus.process_bytes(envs))} there ({what}{envs} x "
        f"{gb(RENDER_CONTEXT_BYTES)} rendering) and the actors have "
        f"{gb(room * gpus.count)} there",
        f"lower num_actors (at most {fits} fit, or 'auto'), envs_per_actor, or set "
        "resources.actor.device='cpu'",
    )


def _pool_fraction(placement: Any) -> float | None:
    """The share of its GPU a GPU node's JAX pool takes up front; None where it is not known
    before the reckoning ('auto') or grows on demand."""
    memory = placement.gpu_memory
    if isinstance(memory, int | float) and not isinstance(memory, bool):
        return float(memory) if placement.preallocate else None
    if memory is None and placement.preallocate:
        return JAX_DEFAULT_PREALLOCATED_FRACTION
    return None


def _room(plan: Any, gpu_id: int) -> tuple[int, int]:
    """(free, auto) bytes for actors on GPU `gpu_id` of a first plan (`ActorGpus`)."""
    gpu = plan.inventory[gpu_id]
    total = gpu.memory_total_bytes
    free, unsized = total - gpu.memory_used_bytes, False
    for placement in plan.groups.values():
        if placement.group == "actor":
            continue
        nodes = len(placement.node_indices)
        if placement.device == "gpu" and gpu_id in placement.gpu_ids:
            fraction = _pool_fraction(placement)
            unsized |= fraction is None
            free -= nodes * (CUDA_CONTEXT_BYTES + int((fraction or 0.0) * total))
        if placement.render_gpu == gpu_id:
            free -= nodes * RENDER_CONTEXT_BYTES
    free = max(0, free)
    return free, int(ACTOR_GPU_SHARE * free) if unsized else free


def actor_gpus(plan: Any) -> ActorGpus | None:
    """Where the actors of a first placement plan (`magi_lp.placement.plan.PlacementPlan`)
    hold GPU memory, with their room on each of those GPUs; None where they hold none."""
    actors = [p for p in plan.groups.values() if p.group == "actor"]
    computes = any(p.device == "gpu" for p in actors)
    homes = {p.gpu_ids[0] if p.device == "gpu" else p.render_gpu for p in actors}
    ids = sorted(i for i in homes if i is not None)
    if not ids:
        return None
    rooms = [_room(plan, i) for i in ids]
    first = plan.groups[actors[0].launch_group]
    fraction = _pool_fraction(first) if first.device == "gpu" else None
    smallest = min(plan.inventory[i].memory_total_bytes for i in ids)
    return ActorGpus(
        label=", ".join(plan.inventory[i].label for i in ids),
        computes=computes,
        count=len(ids),
        free_bytes=min(free for free, _ in rooms),
        auto_bytes=min(auto for _, auto in rooms),
        pool_bytes=int(fraction * smallest) if fraction is not None else ACTING_POOL_BYTES,
    )
