"""Which device a node group computes on and which GPUs it sees, checked against the machine.

Part of the placement plan (`magi_lp.placement.plan.make_plan`): "gpu_if_available" becomes
"gpu" or "cpu" (with a notice), "auto" GPU picks take the least loaded identical GPUs, and a
GPU id, render GPU or mix of models the machine cannot serve is a `ConfigError` naming the
key and the fix. Imports neither Launchpad nor JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from magi_lp.config_schema import fact_refusal, refusal
from magi_lp.errors import ConfigError
from magi_lp.placement.gpu_inventory import GpuInventory, pick_identical, rank_by_load
from magi_lp.placement.jax_build import JaxBuild
from magi_lp.placement.resources import ResourceSpec

if TYPE_CHECKING:
    from magi_lp.placement.plan import GroupRequest


def resolve_device(
    group: str,
    request: GroupRequest,
    inventory: GpuInventory,
    jax_build: JaxBuild,
    notices: list[str],
) -> str:
    """ "cpu" or "gpu" for `group`: "gpu_if_available" falls back to the CPU with a notice
    where there is no GPU or JAX cannot use it; "gpu" there is a `ConfigError`."""
    spec = request.spec
    if spec.device == "cpu":
        return "cpu"
    if len(inventory) and jax_build.serves_cuda:
        return "gpu"
    if len(inventory):
        # The GPU is there but JAX could not start CUDA on it: a node would die ~50 s in
        # with "Unable to initialize backend 'cuda'" and no reason.
        found = f"GPU {inventory.describe()} found, but this Python's JAX cannot use it"
        fix = "`make setup JAX=cuda12` installs the CUDA build (requirements-cuda12.txt)"
        if spec.device == "gpu":
            raise ConfigError(
                fact_refusal(
                    f"resources.{group}.device='gpu'",
                    f"{found} ({jax_build.describe()})",
                    f"{fix}, or set resources.{group}.device='cpu' or 'gpu_if_available'",
                )
            )
        notices.append(
            f"{group}: {found} ({jax_build.describe()}); device='gpu_if_available' runs its "
            f"{request.num_nodes} node(s) on the CPU; {fix}"
        )
        return "cpu"
    why = inventory.reason or "NVML listed no device"
    if spec.device == "gpu":
        raise ConfigError(
            fact_refusal(
                f"resources.{group}.device='gpu'",
                f"no GPU was found ({why})",
                f"set resources.{group}.device='cpu', or 'gpu_if_available' to use a GPU only "
                "when one is present",
            )
        )
    notices.append(
        f"{group}: no GPU found ({why}); device='gpu_if_available' runs its "
        f"{request.num_nodes} node(s) on the CPU"
    )
    return "cpu"


def resolve_gpus(
    group: str,
    spec: ResourceSpec,
    num_nodes: int,
    inventory: GpuInventory,
    planned_load: Mapping[int, float],
) -> tuple[int, ...]:
    """The GPU ids the group uses, ascending (each node sees all, or one, of them)."""
    where = f"resources.{group}.gpus"
    round_robin = spec.gpu_distribution == "round_robin"
    if isinstance(spec.gpus, tuple):
        missing = [i for i in spec.gpus if inventory.get(i) is None]
        if missing:
            gpus = f"GPU {missing[0]} is" if len(missing) == 1 else f"GPUs {missing} are"
            raise ConfigError(
                fact_refusal(
                    f"{gpus} not on this machine ({where}={list(spec.gpus)})",
                    f"the GPUs present are {inventory.describe()}",
                    "use ids from that list, or 'auto'",
                )
            )
        return spec.gpus
    if isinstance(spec.gpus, int) and spec.gpus > len(inventory):
        raise ConfigError(
            refusal(
                where,
                f"at most {len(inventory)}, the GPUs on this machine ({inventory.describe()})",
                spec.gpus,
                f"ask for at most {len(inventory)}, or 'auto'",
            )
        )
    if round_robin:
        # One GPU per node, so the models need not match: take the least loaded.
        count = spec.gpus if isinstance(spec.gpus, int) else min(num_nodes, len(inventory))
        return tuple(sorted(g.index for g in rank_by_load(inventory, planned_load)[:count]))
    count = spec.gpus if isinstance(spec.gpus, int) else 1
    models = inventory.models()
    if all(len(ids) < count for ids in models.values()):
        most = max(len(ids) for ids in models.values())
        present = ", ".join(
            f"{len(ids)} x {name} (ids {list(ids)})" for name, ids in models.items()
        )
        raise ConfigError(
            refusal(
                where,
                f"at most {most} (pmap needs GPUs of one model; here: {present})",
                spec.gpus,
                "ask for fewer GPUs, or list ids of one model",
            )
        )
    return pick_identical(inventory, count, planned_load)


def check_one_model(group: str, ids: Sequence[int], inventory: GpuInventory) -> None:
    """Refuses GPUs of more than one model for nodes that see them all (pmap's rule)."""
    models = {inventory[i].name for i in ids}
    if len(models) <= 1:
        return
    by_model = "; ".join(
        f"{name}: {[i for i in ids_ if i in ids]}" for name, ids_ in inventory.models().items()
    )
    raise ConfigError(
        refusal(
            f"resources.{group}.gpus",
            f"ids of one GPU model (pmap needs identical GPUs; here: {by_model})",
            list(ids),
            f"list ids of one model, or set resources.{group}.gpu_distribution='round_robin' "
            "so each node sees one GPU",
        )
    )


def check_render_gpu(
    group: str, spec: ResourceSpec, device: str, inventory: GpuInventory, notices: list[str]
) -> ResourceSpec:
    """Validates render_gpu for a CPU node; returns the spec to build env from."""
    if spec.render_gpu is None or device != "cpu":
        return spec  # a GPU node's render_gpu is checked against what it sees, in spec_to_env
    where = f"resources.{group}.render_gpu"
    if not len(inventory):
        if spec.device == "gpu_if_available":
            # Part of the fallback: the same config must run on a machine without a GPU.
            notices.append(f"{group}: no GPU to render on; EGL uses Mesa's software renderer")
            return dataclasses.replace(spec, render_gpu=None)
        raise ConfigError(
            fact_refusal(
                f"{where}={spec.render_gpu}",
                f"no GPU was found ({inventory.reason})",
                f"set {where}=None to render with Mesa's software EGL, or render='osmesa'",
            )
        )
    if inventory.get(spec.render_gpu) is None:
        raise ConfigError(
            refusal(
                where,
                f"the id of a GPU on this machine ({inventory.describe()})",
                spec.render_gpu,
                "use an id from that list, or None",
            )
        )
    return spec


def render_gpu_of(spec: ResourceSpec, node_ids: Sequence[int]) -> int | None:
    """The GPU a node's EGL renders on: its `render_gpu`, else a GPU node's first GPU; None
    where it renders on no GPU (another backend, or a CPU node on Mesa's software EGL)."""
    if spec.render != "egl":
        return None
    if spec.render_gpu is not None:
        return spec.render_gpu
    return node_ids[0] if node_ids else None
