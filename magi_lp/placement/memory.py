"""GPU memory a node needs (`MemoryNeed`), reckoned from its compiled programs, and the checks.

`resources.<group>.gpu_memory='auto'` sizes a GPU node's memory limit from what its programs
need instead of a fraction the user guesses. The numbers come from XLA: before anything
starts, `magi_lp.runtime.memory_reckoning` compiles each GPU group's programs in a short-lived
process (the learner's update at its batch, an actor's batched policy step at its
`envs_per_actor`) and reads their memory analysis; this module adds what lives between calls
and a stated margin, turns the bytes into each node's fraction, and checks the GPUs as a whole:

    need = state + compiled peak + batches + store + margin
      state          buffers that live between calls: the learner's parameters, optimizer
                     state and target networks; an actor's parameters, twice (the ones it
                     acts with, and the ones a pull brings in)
      compiled peak  what one call adds (XLA's memory analysis): its outputs, temporaries and
                     generated code; a learner has `updates_in_flight` calls queued, each
                     with its own outputs
      batches        a learner's batches on the device: the prefetch depth plus one per
                     update in flight (an actor's observations are among its call's
                     arguments)
      store          the device replay store's shard (`FrameReplaySpec.nbytes`) and its
                     staged writes
      margin         MARGIN_FRACTION of the rest, at least MIN_MARGIN_BYTES: the allocator's
                     rounding and what a GPU compile adds over the CPU's (cuDNN/cuBLAS
                     workspaces), when the reckoning was compiled on the CPU

JAX takes its limit as a fraction of the device's memory (XLA_PYTHON_CLIENT_MEM_FRACTION; no
JAX build here takes bytes), so the need is rounded up to the next `FRACTION_STEP` of the
node's smallest GPU. Each process on a GPU also holds a CUDA context outside JAX's pool
(`CUDA_CONTEXT_BYTES`), and each environment that renders through EGL on a GPU a GL context
there (`RENDER_CONTEXT_BYTES`), counted in what is left of each GPU, not in the fraction.

This module imports no JAX (the placement layer never does): it only does the arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError

MARGIN_FRACTION = 0.10
"""Margin on top of the reckoned bytes (see the module docstring)."""

MIN_MARGIN_BYTES = 256 << 20
"""The least margin a node gets."""

CUDA_CONTEXT_BYTES = 512 << 20
"""What each process that starts CUDA holds outside JAX's pool (300-700 MB measured)."""

RENDER_CONTEXT_BYTES = 80 << 20
"""What each environment that renders through EGL on a GPU holds there, outside JAX's pool
(its GL context and framebuffers; MuJoCo keeps one per environment). Measured on an H200
(figure 15): 77 MiB for an evaluator rendering one environment with no CUDA context; 587 MiB
for an actor's 8 environments over its reckoned pool and CUDA context."""

FRACTION_STEP = 0.001
"""The fraction is rounded up to this (80 MB of an 80 GB GPU)."""

_GB = 1e9


def gb(nbytes: float) -> str:
    """Bytes in decimal GB with one decimal ("21.9 GB", as the replay plan writes them), or in
    MB below 1 GB ("37 MB"), so that an actor's need does not read 0.0 GB."""
    if abs(nbytes) < _GB:
        return f"{nbytes / 1e6:.0f} MB"
    return f"{nbytes / _GB:.1f} GB"


@dataclasses.dataclass(frozen=True)
class MemoryNeed:
    """What one node of a GPU group needs on each of its GPUs, and how it was reckoned.

    Attributes:
      group: the node group ("learner", "actor", "evaluator").
      state: bytes that live between calls (parameters, optimizer state, target networks).
      compiled: bytes one call adds, from XLA's memory analysis (outputs, temporaries,
        generated code), times the calls in flight.
      batches: bytes of the batches waiting on the device (prefetch and updates in flight).
      store: bytes of the device replay store on this device (0 without one).
      compiled_on: where the programs were compiled ("cpu", or "cuda" on a GPU machine),
        with the JAX version, e.g. "cpu, jax 0.4.30".
      program: what was compiled, in words ("update at batch 256", "policy step x 8").
      notes: what else the reckoning says (e.g. the store's sizes).
    """

    group: str
    state: int
    compiled: int
    batches: int
    store: int
    compiled_on: str
    program: str
    notes: str = ""

    @property
    def subtotal(self) -> int:
        """Everything but the margin."""
        return self.state + self.compiled + self.batches + self.store

    @property
    def margin(self) -> int:
        """MARGIN_FRACTION of the subtotal, at least MIN_MARGIN_BYTES."""
        return max(math.ceil(MARGIN_FRACTION * self.subtotal), MIN_MARGIN_BYTES)

    @property
    def total(self) -> int:
        """Bytes JAX's pool must hold in this node, on each of its GPUs."""
        return self.subtotal + self.margin

    def fraction_of(self, device_bytes: int) -> float:
        """The node's limit as a fraction of a GPU of `device_bytes`, rounded up to
        `FRACTION_STEP` (may exceed 1: the caller refuses that)."""
        steps = math.ceil(self.total / device_bytes / FRACTION_STEP - 1e-9)
        return round(steps * FRACTION_STEP, 6)

    def breakdown(self) -> str:
        """How the need was reckoned: "compiled peak ... + margin ... (program; compiled on)"."""
        parts = [
            f"compiled peak {gb(self.compiled)}",
            f"state {gb(self.state)}",
            f"batches {gb(self.batches)}",
        ]
        if self.store:
            parts.append(f"store {gb(self.store)}")
        parts.append(f"margin {gb(self.margin)}")
        return f"{' + '.join(parts)} ({self.program}; compiled on {self.compiled_on})"

    def describe(self) -> str:
        """One line: the need and how it was reckoned."""
        return f"{self.group}: {gb(self.total)} per node = {self.breakdown()}"


def fix_for(group: str, need: MemoryNeed, *, alone: bool = False) -> str:
    """What to change so that `group` needs less, in the config's keys (`alone`: the node
    does not fit the GPU even by itself, so moving others away does not help)."""
    if group == "learner":
        fixes = ["a smaller agent.batch_size"]
        if need.store:
            fixes = ["a smaller agent.replay_buffer_size (the store)", *fixes]
            fixes.append("replay.store=reverb")
        if not alone:
            fixes.append("fewer nodes on that GPU (num_actors, resources.actor.gpus)")
        return ", ".join(fixes[:-1]) + f", or {fixes[-1]}" if len(fixes) > 1 else fixes[0]
    if group == "actor":
        return (
            "fewer actors per GPU (num_actors, resources.actor.gpus, gpu_distribution="
            "'round_robin'), fewer envs_per_actor, or resources.actor.device='cpu'"
        )
    return f"fewer nodes on that GPU, or resources.{group}.device='cpu'"


@dataclasses.dataclass(frozen=True)
class GpuShare:
    """One node's share of one GPU, for the whole-GPU check and the dry run.

    Attributes:
      group: the node group.
      index: the node's index in its group.
      pool: bytes of JAX's pool (its fraction times the GPU's memory, or the need for a
        node on demand; 0 where nothing is known: 'grow' without a reckoning).
      need: the reckoning, when there is one.
      sized: whether the pool was sized from the reckoning (gpu_memory='auto').
    """

    group: str
    index: int
    pool: int
    need: MemoryNeed | None
    sized: bool = False


def overheads(shares: Sequence[GpuShare], render_contexts: int = 0) -> tuple[int, str]:
    """(bytes, words) of what a GPU's processes hold outside their pools: a CUDA context per
    node computing on it, a GL context per environment rendering on it."""
    contexts = CUDA_CONTEXT_BYTES * len(shares)
    words = f"{len(shares)} CUDA context(s) {gb(contexts)}"
    renders = RENDER_CONTEXT_BYTES * render_contexts
    if render_contexts:
        words += f", {render_contexts} EGL render context(s) {gb(renders)}"
    return contexts + renders, words


def check_gpu(
    label: str,
    total: int,
    used_by_others: int,
    shares: Sequence[GpuShare],
    render_contexts: int = 0,
) -> int:
    """What is left of a GPU after its nodes' pools, CUDA contexts and render contexts.

    Args:
      label: the GPU in words ("0:NVIDIA H100 80GB HBM3").
      total: its memory, bytes.
      used_by_others: bytes other processes already hold on it (NVML).
      shares: the planned nodes computing on it.
      render_contexts: the environments rendering on it through EGL (any node's, a CPU
        node's with `render_gpu` too).

    Raises:
      ConfigError: they do not fit; one line naming the node that needs the most, its need
        and the fix.
    """
    held, words = overheads(shares, render_contexts)
    left = total - used_by_others - held - sum(s.pool for s in shares)
    if left >= 0:
        return left
    # The node to name: the biggest that was sized by its reckoning ('auto'), since that is
    # what the user did not choose; else the biggest pool.
    sized = [s for s in shares if s.need is not None and s.sized]
    biggest = max(sized or shares, key=lambda s: s.pool)
    summary = summarise(shares)
    others = f", {gb(used_by_others)} used by other processes" if used_by_others else ""
    need = biggest.need
    fix = fix_for(biggest.group, need) if need is not None else "lower the fractions"
    what = (
        f"{biggest.group} node {biggest.index} needs {gb(need.total)} ({need.breakdown()})"
        if need is not None
        else f"{biggest.group} node {biggest.index} takes {gb(biggest.pool)}"
    )
    raise ConfigError(
        fact_refusal(
            f"GPU {label} has {gb(total)} but its nodes need {gb(total - left - used_by_others)} "
            f"({summary}, {words}{others})",
            what,
            f"lower it with {fix}",
        )
    )


def summarise(shares: Sequence[GpuShare]) -> str:
    """[share] -> "learner 1 x 24.9 GB, actor 2 x 0.4 GB" (grouped by node group)."""
    by_group: dict[str, list[int]] = {}
    for share in shares:
        by_group.setdefault(share.group, []).append(share.pool)
    out = []
    for group, pools in by_group.items():
        each = gb(max(pools)) if len(set(pools)) > 1 else gb(pools[0])
        out.append(f"{group} {len(pools)} x {each}")
    return ", ".join(out)


def below_reckoning(group: str, fraction: float, device_bytes: int, need: MemoryNeed) -> str | None:
    """A warning when a user's fraction gives a node less than its reckoning (None if not)."""
    given = fraction * device_bytes
    if given >= need.total:
        return None
    return (
        f"resources.{group}.gpu_memory={fraction:g} gives each {group} node {gb(given)}, "
        f"below the {gb(need.total)} reckoned for it ({need.breakdown()}); "
        f"it may run out of memory: set resources.{group}.gpu_memory='auto' "
        f"(or at least {need.fraction_of(device_bytes):g})"
    )


def reckoning_lines(needs: Mapping[str, MemoryNeed], gpu_lines: Sequence[str]) -> list[str]:
    """The dry run's memory section: each reckoned group, then what is left on each GPU."""
    if not needs:
        return []
    out = [
        f"GPU memory, reckoned (need = compiled peak + state + batches + store + margin of "
        f"{MARGIN_FRACTION:.0%}, at least {gb(MIN_MARGIN_BYTES)}; each process also holds a "
        f"CUDA context, counted as {gb(CUDA_CONTEXT_BYTES)}, and each environment rendering "
        f"on a GPU a GL context, counted as {gb(RENDER_CONTEXT_BYTES)}):"
    ]
    out += [f"  {need.describe()}" for need in needs.values()]
    out += [f"  {line}" for line in gpu_lines]
    return out
