"""GPU memory in the placement plan: what each node may hold of its GPU, and whether the
nodes sharing a GPU fit on it.

`make_plan` sizes a group's gpu_memory='auto' from its reckoned need (`sized_spec`), warns
where a user's fraction is below the reckoning (`note_memory`), and checks every GPU: the
fractions of its nodes (`check_shared_gpus`) and, with a reckoning, their pools, CUDA
contexts and GL contexts against its memory (`check_reckoned`). Imports neither Launchpad
nor JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError
from magi_lp.formatting import format_ranges
from magi_lp.placement import memory as memory_lib
from magi_lp.placement.gpu_inventory import GpuInventory
from magi_lp.placement.resources import JAX_DEFAULT_PREALLOCATED_FRACTION, ResourceSpec

# Slack for float sums such as 0.1 + 0.2 + 0.7, which must count as 1.0.
_EPS = 1e-9


def budget_fraction(spec: ResourceSpec) -> float:
    """The share of a GPU one node of `spec` may end up holding (sum check, "auto" picks).

    A fraction is a cap whether preallocated or not; "grow" and None-without-preallocation
    are capped only by JAX's default and are not counted (they are the user's way of
    saying "share dynamically"); None with preallocation takes JAX's 75%.
    """
    if spec.memory_fraction is not None:
        return spec.memory_fraction
    return JAX_DEFAULT_PREALLOCATED_FRACTION if spec.effective_preallocate else 0.0


def sized_spec(
    group: str,
    spec: ResourceSpec,
    gpu_ids: Sequence[int],
    inventory: GpuInventory,
    need: memory_lib.MemoryNeed | None,
) -> ResourceSpec:
    """`spec` for a node on `gpu_ids`, its 'auto' replaced by the reckoned fraction (or, with
    no reckoning, by allocation on demand); other specs as they are."""
    if spec.gpu_memory != "auto":
        return spec
    if need is None:
        return dataclasses.replace(spec, gpu_memory="grow", preallocate=False)
    smallest = min(inventory[i].memory_total_bytes for i in gpu_ids)
    fraction = need.fraction_of(smallest)
    if fraction > 1.0:
        label = inventory[min(gpu_ids, key=lambda i: inventory[i].memory_total_bytes)].label
        raise ConfigError(
            fact_refusal(
                f"resources.{group}.gpu_memory='auto'",
                f"a {group} node needs {memory_lib.gb(need.total)} of GPU memory "
                f"({need.breakdown()}) but GPU {label} has {memory_lib.gb(smallest)}",
                f"lower the need with {memory_lib.fix_for(group, need, alone=True)}",
            )
        )
    return dataclasses.replace(spec, gpu_memory=fraction)


def note_memory(
    group: str,
    spec: ResourceSpec,
    gpu_ids: Sequence[int],
    inventory: GpuInventory,
    need: memory_lib.MemoryNeed | None,
    notices: list[str],
    warnings: list[str],
) -> None:
    """A notice for an unsized 'auto', a warning for a user's fraction below the reckoning."""
    if spec.gpu_memory == "auto" and need is None:
        notices.append(
            f"{group}: resources.{group}.gpu_memory='auto' was not reckoned for this plan; "
            "its nodes allocate GPU memory on demand"
        )
    elif need is not None and spec.memory_fraction is not None and gpu_ids:
        smallest = min(inventory[i].memory_total_bytes for i in gpu_ids)
        warning = memory_lib.below_reckoning(group, spec.memory_fraction, smallest, need)
        if warning:
            warnings.append(warning)


def check_reckoned(
    on_gpu: Mapping[int, list[tuple[str, int, ResourceSpec]]],
    inventory: GpuInventory,
    memory: Mapping[str, memory_lib.MemoryNeed],
    requested_auto: Mapping[str, bool],
    renders_on: Mapping[int, int],
) -> list[str]:
    """Every GPU's nodes (and the environments rendering on it) against its memory; returns
    one "what is left" line per GPU.

    Raises:
      ConfigError: one line naming the node that needs the most, its need and the fix.
    """
    lines = []
    for gpu_id in sorted(set(on_gpu) | set(renders_on)):
        gpu = inventory[gpu_id]
        shares = []
        for group, index, spec in on_gpu.get(gpu_id, []):
            need = memory.get(group)
            if spec.memory_fraction is not None:
                pool = int(spec.memory_fraction * gpu.memory_total_bytes)
            elif spec.effective_preallocate:
                pool = int(JAX_DEFAULT_PREALLOCATED_FRACTION * gpu.memory_total_bytes)
            else:  # on demand: it takes what it needs, as far as the reckoning knows
                pool = need.total if need is not None else 0
            sized = need is not None and requested_auto.get(group, False)
            shares.append(memory_lib.GpuShare(group, index, pool, need, sized))
        renders = renders_on.get(gpu_id, 0)
        left = memory_lib.check_gpu(
            gpu.label, gpu.memory_total_bytes, gpu.memory_used_bytes, shares, renders
        )
        used = (
            f", {memory_lib.gb(gpu.memory_used_bytes)} in use already"
            if gpu.memory_used_bytes
            else ""
        )
        nodes = f"{memory_lib.summarise(shares)}, " if shares else ""
        lines.append(
            f"GPU {gpu.label}: {memory_lib.gb(gpu.memory_total_bytes)}{used}; "
            f"{nodes}{memory_lib.overheads(shares, renders)[1]}; left: {memory_lib.gb(left)}"
        )
    return lines


def _summarise(nodes: Sequence[tuple[str, int, ResourceSpec]]) -> list[str]:
    """[(group, index, spec)] -> ["learner node 0: 0.5", "actor nodes 0-3: 4 x 0.25"]."""
    by_group: dict[str, list[int]] = {}
    specs: dict[str, ResourceSpec] = {}
    for group, index, spec in nodes:
        by_group.setdefault(group, []).append(index)
        specs[group] = spec
    out = []
    for group, indices in by_group.items():
        spec = specs[group]
        each = spec.gpu_memory if spec.gpu_memory is not None else "None (JAX default)"
        which = f"node {indices[0]}" if len(indices) == 1 else f"nodes {format_ranges(indices)}"
        amount = f"{each}" if len(indices) == 1 else f"{len(indices)} x {each}"
        out.append(f"{group} {which}: {amount}")
    return out


def check_shared_gpus(
    on_gpu: Mapping[int, list[tuple[str, int, ResourceSpec]]],
    inventory: GpuInventory,
    notices: list[str],
) -> None:
    """Every GPU's nodes (`on_gpu`: GPU id -> [(group, index, spec)]) against their shares:
    a `ConfigError` where JAX's default preallocation is shared or the fractions sum over
    1.0, a notice where other processes already hold part of the GPU."""
    for gpu_id in sorted(on_gpu):
        nodes = on_gpu[gpu_id]
        label = inventory[gpu_id].label
        summary = "; ".join(_summarise(nodes))
        if len(nodes) >= 2:
            defaulted = sorted(
                {g for g, _, s in nodes if s.gpu_memory is None and s.effective_preallocate}
            )
            if defaulted:
                keys = " and ".join(f"resources.{g}.gpu_memory" for g in defaulted)
                raise ConfigError(
                    fact_refusal(
                        f"GPU {label} is shared by {len(nodes)} nodes ({summary})",
                        f"{keys} is None with preallocation on, so JAX would preallocate "
                        f"{JAX_DEFAULT_PREALLOCATED_FRACTION:.0%} of the GPU in each",
                        f"set a fraction (e.g. {1 / len(nodes):.2g} each to share it equally) "
                        "or 'grow'",
                    )
                )
        total = sum(budget_fraction(spec) for _, _, spec in nodes)
        if total > 1.0 + _EPS:
            groups = sorted({g for g, _, _ in nodes})
            keys = ", ".join(f"resources.{g}.gpu_memory" for g in groups)
            raise ConfigError(
                fact_refusal(
                    f"GPU {label}",
                    f"the memory fractions of the nodes sharing it sum to {total:.3g} > 1.0 "
                    f"({summary})",
                    f"lower {keys} so they sum to at most 1.0, or use 'grow'",
                )
            )
        used = inventory[gpu_id].memory_used_fraction
        if total > 0 and total + used > 1.0 + _EPS:
            notices.append(
                f"GPU {label} already has {used:.0%} of its memory in use by other "
                f"processes; the {total:.3g} planned for {summary} may not fit"
            )
