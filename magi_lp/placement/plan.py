"""The placement plan: which devices every node gets, and the env that gives them.

`make_plan` resolves each node group's `ResourceSpec` against the GPU inventory and checks
the plan as a whole, so a bad plan is a `ConfigError` naming the group and the fix before
any process starts. Launchpad applies env per group, not per node; when the nodes of one
logical group need different envs (round_robin over GPUs) the plan splits the group into
launch groups ("actor_gpu0", "actor_gpu1"), and program assembly asks
`plan.launch_group(group, node_index)` where each node goes.

The plan also checks the JAX build (`jax_build.detect_jax_build`, read from package metadata):
on a machine with a GPU but a CPU-only jaxlib, a `gpu` group is refused and a
`gpu_if_available` group runs on the CPU with a notice, instead of a node dying at start.

GPU memory: a group's `gpu_memory='auto'` becomes each node's fraction of its GPU when
`make_plan` is given the groups' reckoned needs (`magi_lp.placement.memory`, compiled by
`magi_lp.runtime.memory_reckoning` before anything starts); the plan then checks every GPU's
nodes against its memory (pools and CUDA contexts), warns where a user's fraction is below
the reckoning, and the dry run shows the reckoning and what is left on each GPU.

This module imports neither Launchpad nor JAX, so `--dry_run` and the tests stay fast.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import tabulate

from magi_lp.config_schema import fact_refusal, fail_unless, is_int, refusal
from magi_lp.errors import ConfigError
from magi_lp.formatting import format_ranges
from magi_lp.placement import device_choice, gpu_budget
from magi_lp.placement import memory as memory_lib
from magi_lp.placement.gpu_inventory import GpuInventory
from magi_lp.placement.jax_build import (
    JaxBuild,
    cuda_data_dir_flag,
    detect_jax_build,
    jax_backend,
)
from magi_lp.placement.resources import (
    JAX_DEFAULT_PREALLOCATED_FRACTION,
    MANAGED_VARIABLES,
    ResourceSpec,
    spec_to_env,
)


@dataclasses.dataclass(frozen=True)
class GroupRequest:
    """A logical node group to place: its spec and how many nodes it has (0 is allowed).

    Attributes:
      spec: the group's resource spec.
      num_nodes: how many nodes the group has.
      batch_size: for a group that splits each batch over its devices (the data-parallel
        learner), the batch; the plan refuses a device count that does not divide it.
        None: no such check.
      batch_key: the config key that sets `batch_size`, named in that refusal.
      renders: the environments each node steps (and renders, as its spec's `render` says):
        where that is EGL on a GPU, each holds a GL context there, which the memory check
        counts (`memory.RENDER_CONTEXT_BYTES`). 0: the node steps none.
    """

    spec: ResourceSpec
    num_nodes: int
    batch_size: int | None = None
    batch_key: str = "batch_size"
    renders: int = 0

    def __post_init__(self) -> None:
        nodes, size = self.num_nodes, self.batch_size
        fail_unless(is_int(nodes) and nodes >= 0, "num_nodes", "an integer >= 0", nodes)
        ok = size is None or (is_int(size) and size >= 1)
        fail_unless(ok, self.batch_key, "an integer >= 1", size)
        renders = self.renders
        fail_unless(is_int(renders) and renders >= 0, "renders", "an integer >= 0", renders)


@dataclasses.dataclass(frozen=True)
class GroupPlacement:
    """One launch group: nodes of one logical group that share devices and env.

    Attributes:
      group: the logical node group ("actor").
      launch_group: the Launchpad group these nodes go into ("actor" or "actor_gpu1").
      node_indices: indices of the logical group's nodes in this launch group.
      device: "cpu" or "gpu", after resolving "gpu_if_available".
      gpu_ids: the GPUs each of these nodes computes on (empty for CPU).
      gpu_memory: the spec's gpu_memory on a GPU; None on the CPU.
      preallocate: whether JAX preallocates (GPU only; None on the CPU).
      render_gpu: the GPU these nodes' EGL renders on: the spec's `render_gpu`, else a GPU
        node's first GPU; None where they render on no GPU (another backend, or a CPU node
        on Mesa's software EGL). The memory check counts their environments' GL contexts
        there.
      env: the environment overrides for these nodes.
      jax_backend: the backend JAX makes the default in these nodes ("cuda" or "cpu").
      cpu_devices: JAX devices a CPU node sees (`ResourceSpec.cpu_devices`); 1 on a GPU.
      memory_auto: the spec said gpu_memory='auto' (`gpu_memory` then holds the reckoned
        fraction, or 'auto' where the plan was made without a reckoning).
    """

    group: str
    launch_group: str
    node_indices: tuple[int, ...]
    device: str
    gpu_ids: tuple[int, ...]
    gpu_memory: float | str | None
    preallocate: bool | None
    render_gpu: int | None
    env: Mapping[str, str] = dataclasses.field(hash=False)
    jax_backend: str = "cpu"
    cpu_devices: int = 1
    memory_auto: bool = False

    @property
    def num_devices(self) -> int:
        """How many devices JAX computes on in each of these nodes (its GPUs, or host devices)."""
        return len(self.gpu_ids) if self.device == "gpu" else self.cpu_devices

    def device_names(self) -> str:
        """The node's devices in Cleanba's notation: GPU ids "1,2", or "cpu" / "cpu0,1"."""
        if self.device == "gpu":
            return ",".join(str(i) for i in self.gpu_ids)
        if self.cpu_devices == 1:
            return "cpu"
        return "cpu" + ",".join(str(i) for i in range(self.cpu_devices))


@dataclasses.dataclass(frozen=True)
class PlacementPlan:
    """A validated plan: launch group -> placement, plus notices for the user.

    Attributes:
      groups: launch group name -> `GroupPlacement`, in request order.
      notices: one-line messages the entry point prints (e.g. a GPU fallback to CPU).
      inventory: the GPUs the plan was made against.
      jax_build: the JAX build the plan was made against.
      memory: node group -> its reckoned GPU memory need (`make_plan(memory=...)`).
      memory_lines: what is left on each GPU after its nodes (with a reckoning).
      warnings: one-line warnings the entry point prints (a fraction below the reckoning).
    """

    groups: Mapping[str, GroupPlacement]
    notices: tuple[str, ...]
    inventory: GpuInventory
    jax_build: JaxBuild = dataclasses.field(default_factory=JaxBuild)
    memory: Mapping[str, memory_lib.MemoryNeed] = dataclasses.field(default_factory=dict)
    memory_lines: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def needs_reckoning(self) -> dict[str, GroupPlacement]:
        """Node group -> a GPU placement of it whose memory a reckoning sizes or checks:
        gpu_memory 'auto' or a fraction ('grow' and JAX's default have no limit to check)."""
        out: dict[str, GroupPlacement] = {}
        for p in self.groups.values():
            if p.device == "gpu" and (p.memory_auto or isinstance(p.gpu_memory, float)):
                out.setdefault(p.group, p)
        return out

    def launch_group(self, group: str, node_index: int) -> str:
        """The launch group node `node_index` of logical group `group` belongs in."""
        for placement in self.groups.values():
            if placement.group == group and node_index in placement.node_indices:
                return placement.launch_group
        known = sorted({p.group for p in self.groups.values()})
        raise KeyError(f"no node {node_index} in group {group!r}; planned groups: {known}")

    def envs(self) -> dict[str, dict[str, str]]:
        """Launch group -> env overrides (copies; safe to modify)."""
        return {name: dict(p.env) for name, p in self.groups.items()}

    def device_split(self) -> str:
        """Where actors act and the learner learns, in Cleanba's notation: "a0-l1,2".

        "a" lists the devices of the actor nodes (GPU ids, or "cpu"), "l" the learner's (all
        of them: it is data-parallel over them); "cpu0,1" is a CPU node with two host
        devices. A group the plan does not hold (no actors) is left out.
        """
        parts = []
        for letter, group in (("a", "actor"), ("l", "learner")):
            placements = [p for p in self.groups.values() if p.group == group]
            if not placements:
                continue
            names: list[str] = []
            for p in placements:
                for name in p.device_names().split(","):
                    if name not in names:
                        names.append(name)
            parts.append(letter + ",".join(names))
        return "-".join(parts)

    def format_table(self) -> str:
        """The plan as a text table: one row per launch group, env one variable per line.

        The first line is the actor/learner device split (`device_split`). Notices are not
        included; print `plan.notices` next to it. Variables set to the empty string (the
        library default, set so nothing leaks in from the launching shell) are listed once
        under the table instead of in every row, and so is the JAX build the "JAX backend"
        column was decided against.
        """
        header = (
            "node group",
            "launch group",
            "nodes",
            "device",
            "JAX backend",
            "gpus",
            "GPU memory",
            "env",
        )
        rows = []
        for p in self.groups.values():
            if p.gpu_ids:
                gpus = ", ".join(self.inventory[i].label for i in p.gpu_ids)
            elif p.render_gpu is not None:
                gpus = f"- (EGL on {self.inventory[p.render_gpu].label})"
            else:
                gpus = "-"
            env_lines = [f"{k}={v}" for k, v in p.env.items() if v or k in _ALWAYS_SHOWN]
            rows.append(
                (
                    p.group,
                    p.launch_group,
                    f"{len(p.node_indices)} ({format_ranges(p.node_indices)})",
                    p.device if p.cpu_devices == 1 else f"{p.device} x{p.cpu_devices}",
                    p.jax_backend,
                    gpus,
                    _describe_memory(p),
                    "\n".join(env_lines),
                )
            )
        out = [
            f"device split: {self.device_split()} (Cleanba's notation: a = actor devices, "
            "l = learner devices)",
            tabulate.tabulate(rows, header, tablefmt="simple", disable_numparse=True),
        ]
        emptied = sorted(
            {k for p in self.groups.values() for k, v in p.env.items() if not v} - _ALWAYS_SHOWN
        )
        if emptied:
            out.append(f"set to '' (library default) where not shown: {', '.join(emptied)}")
        out.append(f"JAX build: {self.jax_build.describe()}")
        out += memory_lib.reckoning_lines(self.memory, self.memory_lines)
        return "\n".join(out)


# An empty CUDA_VISIBLE_DEVICES is the point of a CPU node (it sees no GPU): always show it.
_ALWAYS_SHOWN = frozenset({"CUDA_VISIBLE_DEVICES"})


def _describe_memory(p: GroupPlacement) -> str:
    if p.device != "gpu":
        return "-"
    cap = JAX_DEFAULT_PREALLOCATED_FRACTION
    if p.memory_auto and not isinstance(p.gpu_memory, float):
        return f"auto, not reckoned: on demand, up to {cap:g}"
    if p.memory_auto:
        return (
            f"{p.gpu_memory:g} prealloc (auto)"
            if p.preallocate
            else f"up to {p.gpu_memory:g} (auto)"
        )
    if isinstance(p.gpu_memory, float):
        return f"{p.gpu_memory:g} prealloc" if p.preallocate else f"up to {p.gpu_memory:g}"
    # Without a fraction JAX caps its allocator at 75% of the GPU, preallocated or not.
    return f"{cap:g} prealloc (JAX default)" if p.preallocate else f"on demand, up to {cap:g}"


def make_plan(
    requests: Mapping[str, GroupRequest],
    inventory: GpuInventory,
    jax_build: JaxBuild | None = None,
    memory: Mapping[str, memory_lib.MemoryNeed] | None = None,
) -> PlacementPlan:
    """Resolves and validates every node group's placement against `inventory`.

    Args:
      requests: logical group name -> its spec and node count, in program order ("auto"
        GPU picks are made in this order, each seeing what earlier groups reserved).
      inventory: the machine's GPUs (`query_inventory()`; tests inject their own).
      jax_build: what the installed JAX can run on; None: `detect_jax_build()` (tests
        inject their own). GPU nodes need one that serves CUDA.
      memory: node group -> its reckoned need per node (`magi_lp.runtime.memory_reckoning`).
        A group with gpu_memory='auto' gets the fraction of its GPU that holds it; every GPU
        is then checked against its nodes' pools and CUDA contexts, and a user's fraction
        below its group's reckoning is a warning. None: 'auto' groups are left unsized
        (on demand, with a notice), as for a first plan that says what to reckon.

    Returns:
      The plan; `plan.notices` holds choices the user should see (CPU fallbacks, ...).

    Raises:
      ConfigError: naming the group and the fix, for: a GPU group on a machine with no GPU
        or with a JAX build that cannot use it;
        a GPU id that does not exist; GPUs of different models in one node; no identical
        set of the size asked for; memory fractions on one GPU summing over 1.0; two or
        more nodes on a GPU with JAX's default 75% preallocation; a bad render_gpu; a
        launch group name that collides with another group; a `batch_size` the group's
        device count does not divide; with `memory`: a GPU whose nodes need more than it has
        (naming the node, its need and what to change).
    """
    if jax_build is None:
        jax_build = detect_jax_build()
    memory = dict(memory or {})
    placed = _Placed()
    for group, request in requests.items():
        if not isinstance(group, str) or not group:
            raise ConfigError(
                refusal("a node group's name", "a non-empty string", group, "name the group")
            )
        if request.num_nodes == 0:
            continue  # e.g. num_evaluators=0: nothing to place, nothing to validate against
        _place_group(group, request, requests, inventory, jax_build, memory.get(group), placed)

    memory_lines: list[str] = []
    if memory:
        auto = {g: r.spec.gpu_memory == "auto" for g, r in requests.items()}
        memory_lines = gpu_budget.check_reckoned(
            placed.on_gpu, inventory, memory, auto, placed.renders_on
        )
    gpu_budget.check_shared_gpus(placed.on_gpu, inventory, placed.notices)
    placements = placed.placements
    return PlacementPlan(
        groups=placements,
        notices=tuple(placed.notices),
        inventory=inventory,
        jax_build=jax_build,
        memory={g: n for g, n in memory.items() if any(p.group == g for p in placements.values())},
        memory_lines=tuple(memory_lines),
        warnings=tuple(placed.warnings),
    )


@dataclasses.dataclass
class _Placed:
    """What `make_plan` has placed so far; each group's "auto" picks see the earlier ones."""

    placements: dict[str, GroupPlacement] = dataclasses.field(default_factory=dict)
    notices: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    # GPU id -> the share of it planned so far (`gpu_budget.budget_fraction`).
    planned_load: dict[int, float] = dataclasses.field(default_factory=dict)
    # GPU id -> [(group, node index, spec)] of the nodes computing on it.
    on_gpu: dict[int, list[tuple[str, int, ResourceSpec]]] = dataclasses.field(default_factory=dict)
    # GPU id -> the environments rendering on it through EGL (each a GL context there).
    renders_on: dict[int, int] = dataclasses.field(default_factory=dict)


def _place_group(
    group: str,
    request: GroupRequest,
    requests: Mapping[str, GroupRequest],
    inventory: GpuInventory,
    jax_build: JaxBuild,
    need: memory_lib.MemoryNeed | None,
    placed: _Placed,
) -> None:
    """Places the nodes of one group: its device, each node's GPUs and size, its launch groups."""
    notices = placed.notices
    spec = request.spec
    device = device_choice.resolve_device(group, request, inventory, jax_build, notices)
    spec = device_choice.check_render_gpu(group, spec, device, inventory, notices)
    if device == "gpu":
        per_node, node_specs = _on_gpus(group, request, spec, inventory, need, placed)
    else:
        # Without render_gpu a CPU node sees no GPU, so EGL falls back to Mesa's
        # software renderer. No notice: most CPU groups (replay, counter) never render.
        per_node = [()] * request.num_nodes
        node_specs = [spec] * request.num_nodes

    overridden = sorted(set(spec.env) & set(MANAGED_VARIABLES))
    if overridden:
        notices.append(
            f"{group}: resources.{group}.env overrides managed variable(s) {', '.join(overridden)}"
        )

    # Nodes that see the same GPUs get the same env, so they can share a launch group.
    by_ids: dict[tuple[int, ...], list[int]] = {}
    for index, node_ids in enumerate(per_node):
        by_ids.setdefault(tuple(node_ids), []).append(index)
    for node_ids, indices in by_ids.items():
        name = group if len(by_ids) == 1 else f"{group}_gpu{'-'.join(map(str, node_ids))}"
        if name in placed.placements or (name != group and name in requests):
            raise ConfigError(
                fact_refusal(
                    f"launch group {name!r} (from node group {group!r}) collides",
                    "another group has that name",
                    f"rename the node group {group!r} or the other one",
                )
            )
        node_spec = node_specs[indices[0]]  # nodes that see the same GPUs: the same size
        placement = _launch_group(
            group, name, tuple(indices), device, node_ids, spec, node_spec, jax_build
        )
        placed.placements[name] = placement
        _check_batch_divides(group, request, placement)
        render_gpu = placement.render_gpu
        if render_gpu is not None and request.renders:
            renders = len(indices) * request.renders
            placed.renders_on[render_gpu] = placed.renders_on.get(render_gpu, 0) + renders


def _on_gpus(
    group: str,
    request: GroupRequest,
    spec: ResourceSpec,
    inventory: GpuInventory,
    need: memory_lib.MemoryNeed | None,
    placed: _Placed,
) -> tuple[list[tuple[int, ...]], list[ResourceSpec]]:
    """The GPUs each node of a GPU group sees, and each node's spec with its 'auto' sized for
    them; books the nodes on their GPUs."""
    ids = device_choice.resolve_gpus(group, spec, request.num_nodes, inventory, placed.planned_load)
    if spec.gpu_distribution == "shared":
        device_choice.check_one_model(group, ids, inventory)
        per_node = [ids] * request.num_nodes
    else:
        per_node = [(ids[i % len(ids)],) for i in range(request.num_nodes)]
    node_specs = [
        gpu_budget.sized_spec(group, spec, node_ids, inventory, need) for node_ids in per_node
    ]
    for index, (node_ids, node_spec) in enumerate(zip(per_node, node_specs, strict=True)):
        for gpu_id in node_ids:
            load = placed.planned_load.get(gpu_id, 0.0) + gpu_budget.budget_fraction(node_spec)
            placed.planned_load[gpu_id] = load
            placed.on_gpu.setdefault(gpu_id, []).append((group, index, node_spec))
    gpu_budget.note_memory(
        group, spec, per_node[0], inventory, need, placed.notices, placed.warnings
    )
    return per_node, node_specs


def _launch_group(
    group: str,
    name: str,
    indices: tuple[int, ...],
    device: str,
    node_ids: tuple[int, ...],
    spec: ResourceSpec,
    node_spec: ResourceSpec,
    jax_build: JaxBuild,
) -> GroupPlacement:
    """The placement of the nodes `indices` of `group`, which see the GPUs `node_ids`."""
    env = spec_to_env(node_spec, node_ids, group=group)
    if device == "gpu":
        env = _with_pinned_ptxas(env, spec, jax_build)
    return GroupPlacement(
        group=group,
        launch_group=name,
        node_indices=indices,
        device=device,
        gpu_ids=node_ids,
        # A reckoned 'auto' shows its fraction; an unsized one stays 'auto'.
        gpu_memory=(node_spec.memory_fraction or spec.gpu_memory) if device == "gpu" else None,
        preallocate=node_spec.effective_preallocate if device == "gpu" else None,
        render_gpu=device_choice.render_gpu_of(spec, node_ids),
        env=env,
        jax_backend=jax_backend(env, jax_build),
        cpu_devices=spec.cpu_devices if device == "cpu" else 1,
        memory_auto=device == "gpu" and spec.gpu_memory == "auto",
    )


def _check_batch_divides(group: str, request: GroupRequest, placement: GroupPlacement) -> None:
    """A data-parallel node splits each batch evenly over its devices, or not at all."""
    devices = placement.num_devices
    if request.batch_size is None or request.batch_size % devices == 0:
        return
    size = request.batch_size
    which = (
        f"resources.{group}.gpus={list(placement.gpu_ids)}"
        if placement.device == "gpu"
        else f"resources.{group}.cpu_devices={devices}"
    )
    fit = next(n for n in range(devices - 1, 0, -1) if size % n == 0)
    raise ConfigError(
        fact_refusal(
            f"{request.batch_key}={size} does not split evenly over the {devices} devices of "
            f"{group} ({which})",
            "its update is data-parallel over all of them",
            f"use a multiple of {devices} (e.g. {(size // devices + 1) * devices}) or {fit} "
            "device(s)",
        )
    )


def _with_pinned_ptxas(
    env: dict[str, str], spec: ResourceSpec, jax_build: JaxBuild
) -> dict[str, str]:
    """Points a GPU node's XLA at the pinned ptxas (see `jax_build.cuda_data_dir_flag`).

    Left out when the spec sets XLA_FLAGS through `env` (that wins, as documented) or names
    a CUDA data dir itself.
    """
    flag = cuda_data_dir_flag(jax_build)
    if not flag or "XLA_FLAGS" in spec.env or "--xla_gpu_cuda_data_dir" in env["XLA_FLAGS"]:
        return env
    # First, so thread flags and the user's xla_flags come after it.
    return {**env, "XLA_FLAGS": " ".join(f for f in (flag, env["XLA_FLAGS"]) if f)}
