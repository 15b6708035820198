"""What one node group needs (`ResourceSpec`) and the environment variables that give it.

A spec is written by the user in `config.resources.<group>`; `ResourceSpec.from_config`
refuses unknown keys and bad values by name, before anything starts, in the one shape of
`magi_lp.config_schema` ("resources.learner.gpu_memory must be ..., got 2; e.g. ...").
`spec_to_env` turns a spec plus the GPU ids a node sees (decided by
`magi_lp.placement.plan`) into the string variables Launchpad applies to that node's process.

Launchpad copies the launching shell's environment into every node and applies the
overrides on top: a variable can be overridden but never removed. So `spec_to_env` sets
every variable it manages, always, to a value that means "library default" when the spec
leaves it open (an empty string for the numeric knobs, which every reader here treats as
unset), so no export in the launching shell leaks into a node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict

from magi_lp.config_schema import (
    allowed,
    check,
    choices,
    fact_refusal,
    fail_unless,
    is_int,
    is_one_of,
    not_among,
    refusal,
    typed_section,
)
from magi_lp.errors import ConfigError

DEVICES = ("cpu", "gpu", "gpu_if_available")
GPU_DISTRIBUTIONS = ("shared", "round_robin")
ALLOCATORS = ("bfc", "platform")
RENDERERS = ("egl", "osmesa", "none")
GPU_MEMORY_WORDS = {
    "auto": "reckoned from the node's compiled programs before anything starts",
    "grow": "allocate on demand",
}
"""`gpu_memory`'s values besides a fraction and None, with what each does: a new one is one
line here (and what it means, in `effective_preallocate` / `memory_fraction`; 'auto' becomes
a fraction in `make_plan`, from `magi_lp.placement.memory`)."""

# MUJOCO_GL per `render`. "off" is in both dm_control's and mujoco's list of values that
# disable rendering, so a state-only node never loads an OpenGL library.
_MUJOCO_GL = {"egl": "egl", "osmesa": "osmesa", "none": "off"}
# dm_control's EGL and OSMesa renderers refuse to import when PYOPENGL_PLATFORM names the
# other platform, so it must always match MUJOCO_GL; "" counts as unset for them.
_PYOPENGL_PLATFORM = {"egl": "egl", "osmesa": "osmesa", "none": ""}

# Every variable spec_to_env sets, in the order it sets them. `spec.env` may add more.
MANAGED_VARIABLES = (
    "CUDA_DEVICE_ORDER",
    "CUDA_VISIBLE_DEVICES",
    "JAX_PLATFORMS",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "MAGI_LP_TF_GPU",
    "MUJOCO_GL",
    "PYOPENGL_PLATFORM",
    "MUJOCO_EGL_DEVICE_ID",
    "XLA_FLAGS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
)

# The XLA flag that gives a CPU process several JAX devices (`cpu_devices`).
HOST_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"

_MEMORY_FRACTION_VARIABLES = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")
"""The GPU memory fraction's names (jaxlib 0.4.30's; 0.11 reads the second first): the plan
sets both from `gpu_memory`."""

# What JAX does when XLA_PYTHON_CLIENT_MEM_FRACTION is not given and preallocation is on.
JAX_DEFAULT_PREALLOCATED_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class ResourceSpec:
    """One node group's needs, in the user's words (see docs/architecture.md).

    Attributes:
      device: "cpu", "gpu", or "gpu_if_available" (GPU when one is found, else CPU, and
        the plan says so in a notice).
      gpus: which GPUs a GPU node group uses. "auto": with `shared`, the least-loaded GPU;
        with `round_robin`, the least-loaded GPUs, one per node, up to every GPU present.
        A count n: with `shared`, the least-loaded set of n identical GPUs (every node sees
        all n, as pmap needs); with `round_robin`, the n least-loaded GPUs of any model.
        A list/tuple of ids: exactly those (ids as nvidia-smi numbers them: PCI bus order).
      gpu_distribution: "shared" (every node sees all of `gpus`) or "round_robin" (node i
        sees only `gpus[i % len(gpus)]`).
      gpu_memory: fraction in (0, 1] of each visible GPU's total memory that JAX may use,
        "auto" (the fraction the node's compiled programs need, reckoned before anything
        starts: `magi_lp.placement.memory`), "grow" (allocate on demand), or None (JAX's
        default: preallocate 75%).
      preallocate: whether JAX reserves its memory up front. None: true with a fraction,
        "auto" or None, false with "grow".
      allocator: "bfc", "platform" (allocate and free exactly; slow, no fragmentation), or
        None (JAX default, which is bfc).
      tf_gpu: whether TensorFlow in this node may use the GPU. Off by default: TF is only
        the Reverb dataset pipeline here, and a TF that sees a GPU grabs memory for nothing.
      render: MuJoCo's OpenGL backend: "egl", "osmesa" or "none" (no rendering).
      render_gpu: GPU id EGL renders on, or None (a GPU node renders on its first GPU; a
        CPU node sees no GPU and renders with Mesa's software EGL). On a CPU node this
        exposes that one GPU to the process for EGL while JAX stays on the CPU.
      cpu_threads: threads for XLA, BLAS, OpenMP and TF pools, or None (library defaults).
      cpu_devices: how many JAX devices a CPU node sees (XLA's
        `--xla_force_host_platform_device_count`); more than 1 makes a CPU learner
        data-parallel over that many host devices, which tests the multi-device learner on
        a machine without GPUs (it does not make the CPU faster). A GPU node's devices are
        its `gpus`; there this must stay 1.
      xla_flags: extra XLA flags ("--name=value ..."), appended after the thread flags.
        An unknown flag aborts the node when JAX starts, so test new ones locally first.
      env: extra environment variables (str -> str), applied last, so they win.
    """

    device: str = allowed(choices(DEVICES), default="cpu")
    gpus: str | int | tuple[int, ...] = allowed(
        "'auto', a count >= 1, or a list of distinct GPU ids >= 0", default="auto"
    )
    gpu_distribution: str = allowed(choices(GPU_DISTRIBUTIONS), default="shared")
    gpu_memory: float | str | None = allowed(
        "a fraction in (0, 1] of each GPU's memory, "
        + "".join(f"{word!r} ({what}), " for word, what in GPU_MEMORY_WORDS.items())
        + "or None (JAX's default: preallocate 75%)",
        default=None,
    )
    preallocate: bool | None = allowed("True, False, or None", default=None)
    allocator: str | None = allowed(choices((*ALLOCATORS, None)), default=None)
    tf_gpu: bool = allowed("True or False", default=False)
    render: str = allowed(choices(RENDERERS), default="egl")
    render_gpu: int | None = allowed("a GPU id >= 0, or None", default=None)
    cpu_threads: int | None = allowed("an integer >= 1, or None", default=None)
    cpu_devices: int = allowed("an integer >= 1", default=1)
    xla_flags: str = allowed("a string of '--flag=value' items", default="")
    # hash=False: a dict cannot be hashed; the spec stays comparable with ==.
    env: Mapping[str, str] = allowed(
        "a dict of variable names (without '=') -> strings", default_factory=dict, hash=False
    )

    def __post_init__(self) -> None:
        """Checks every field (config_schema's one-line refusals: `from_config` names them
        `resources.<group>.<key>`) and writes each in its one canonical form."""
        self._check_choices()
        gpus = self._checked_gpus()
        memory = self._checked_memory()
        self._check_render_and_cpus()
        flags = self._checked_xla_flags()
        env = self._checked_env()
        check(
            self,
            "tf_gpu",
            not (self.device == "cpu" and self.tf_gpu),
            "False on a CPU node (device='cpu')",
            fix="set device='gpu' or tf_gpu=False",
        )
        canonical = {"gpus": gpus, "gpu_memory": memory, "xla_flags": flags, "env": env}
        for name, value in canonical.items():
            # Frozen: normalised values (tuple ids, float fraction, a private env copy)
            # are written once here, so every spec in the program has one canonical form.
            object.__setattr__(self, name, value)

    def _check_choices(self) -> None:
        """The fields that name one of a few words; a word in the wrong case is told so
        (a user who wrote 'GPU' meant 'gpu')."""
        for key, options in (
            ("device", DEVICES),
            ("gpu_distribution", GPU_DISTRIBUTIONS),
            ("render", RENDERERS),
            ("allocator", (*ALLOCATORS, None)),
        ):
            value = getattr(self, key)
            cased = isinstance(value, str) and value.lower() in options and value not in options
            fix = f"did you mean {value.lower()!r}? (lower case)" if cased else ""
            check(self, key, is_one_of(value, options), fix=fix)

    def _checked_gpus(self) -> int | str | tuple[int, ...]:
        """`gpus` checked, a list of ids as a tuple (hashable, one form for equal specs)."""
        gpus = self.gpus
        if isinstance(gpus, list | tuple):
            check(self, "gpus", bool(gpus) and all(is_int(i) and i >= 0 for i in gpus))
            repeated = sorted({i for i in gpus if gpus.count(i) > 1})
            fix = f"GPU {repeated[0]} is repeated; list each id once" if repeated else ""
            check(self, "gpus", not repeated, fix=fix)
            return tuple(gpus)
        zero = is_int(gpus) and gpus == 0
        ok = gpus == "auto" or (is_int(gpus) and gpus >= 1)
        check(self, "gpus", ok, fix="use device='cpu' for no GPU" if zero else "")
        return gpus

    def _checked_memory(self) -> float | str | None:
        """`gpu_memory` with the allocator fields that must agree with it; a fraction as a
        float (an int 1 is the fraction 1.0)."""
        memory = self.gpu_memory
        fraction = isinstance(memory, int | float) and not isinstance(memory, bool)
        word = isinstance(memory, str) and memory in GPU_MEMORY_WORDS
        check(self, "gpu_memory", memory is None or word or (fraction and 0.0 < memory <= 1.0))
        check(self, "preallocate", self.preallocate is None or isinstance(self.preallocate, bool))
        check(self, "tf_gpu", isinstance(self.tf_gpu, bool))
        check(
            self,
            "preallocate",
            not (self.preallocate is True and memory == "grow"),
            "False or None with gpu_memory='grow' (which contradicts preallocating)",
            fix="give gpu_memory a fraction to preallocate, or drop preallocate",
        )
        return float(memory) if fraction else memory

    def _check_render_and_cpus(self) -> None:
        """The render GPU (only EGL renders on a GPU) and the CPU budget (a GPU node's
        devices are its GPUs, so it has one CPU device)."""
        render_gpu = self.render_gpu
        check(self, "render_gpu", render_gpu is None or (is_int(render_gpu) and render_gpu >= 0))
        check(
            self,
            "render_gpu",
            render_gpu is None or self.render == "egl",
            f"None unless render='egl' (render is {self.render!r})",
            fix="set render='egl' or render_gpu=None",
        )
        threads, cpu_devices = self.cpu_threads, self.cpu_devices
        check(self, "cpu_threads", threads is None or (is_int(threads) and threads >= 1))
        check(self, "cpu_devices", is_int(cpu_devices) and cpu_devices >= 1)
        check(
            self,
            "cpu_devices",
            not (self.device == "gpu" and cpu_devices > 1),
            "1 on a GPU node (device='gpu': its devices are its gpus)",
            fix=f"set gpus={cpu_devices} for a node on that many GPUs, or cpu_devices=1",
        )

    def _checked_xla_flags(self) -> str:
        """`xla_flags` checked token by token, stripped ("" for None)."""
        flags = "" if self.xla_flags is None else self.xla_flags
        check(self, "xla_flags", isinstance(flags, str))
        for token in flags.split():
            # XLA silently ignores a token without "--", so a typo would do nothing.
            fix = f"{token!r} does not start with '--' (XLA would ignore it)"
            check(self, "xla_flags", token.startswith("--"), fix=fix)
        return flags.strip()

    def _checked_env(self) -> dict[str, str]:
        """`env` checked, as a private dict copy: names and string values here, where the
        user wrote them (Launchpad would raise TypeError inside the launcher, too late)."""
        env = {} if self.env is None else self.env
        env = env.to_dict() if hasattr(env, "to_dict") else env
        check(self, "env", isinstance(env, Mapping))
        for name, value in env.items():
            good_name = isinstance(name, str) and bool(name) and "=" not in name
            check(self, "env", good_name, value=dict(env), fix=f"{name!r} is no variable name")
            check(
                self,
                f"env.{name}",
                isinstance(value, str),
                "a string",
                value=value,
                fix=f"write {str(value)!r}",
            )
            # The plan gives the fraction under one name and "" under the other; a second
            # value stops a GPU node at its start on jaxlib 0.11, or is ignored on 0.4.30.
            check(
                self,
                f"env.{name}",
                name not in _MEMORY_FRACTION_VARIABLES,
                "set through gpu_memory",
                value=value,
                fix=f"drop it and set gpu_memory={value}",
            )
        return dict(env)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The keys `from_config` accepts, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_config(cls, group_name: str, mapping: Any) -> ResourceSpec:
        """Parses `config.resources.<group_name>` (a dict, ConfigDict or None).

        Raises:
          ConfigError: naming `resources.<group>.<key>` for an unknown key (with the
            closest valid key and the full list) or a bad value (with the allowed values).
        """
        where = f"resources.{group_name}"
        if mapping is None:
            return cls()
        if hasattr(mapping, "to_dict"):  # ml_collections ConfigDict / FrozenConfigDict
            mapping = mapping.to_dict()
        keys = ", ".join(cls.field_names())
        fail_unless(
            isinstance(mapping, Mapping), where, f"a dict of ResourceSpec fields ({keys})", mapping
        )
        # Checked over the full set of values, so that cross-field checks (tf_gpu needs a
        # GPU device, ...) see the defaults and still name the user's group.
        defaults = cls()
        values = {name: getattr(defaults, name) for name in cls.field_names()}
        return typed_section(cls, {**values, **mapping}, f"{where}.", suggest_defaults=True)

    @property
    def effective_preallocate(self) -> bool:
        """Whether JAX will reserve its GPU memory at start (the spec's default applied)."""
        if self.preallocate is not None:
            return self.preallocate
        return self.gpu_memory != "grow"

    @property
    def memory_fraction(self) -> float | None:
        """The fraction of each visible GPU this node may take; None for "grow"/default, and
        for an "auto" the plan has not reckoned yet (`make_plan` puts the reckoned fraction
        in its place)."""
        return self.gpu_memory if isinstance(self.gpu_memory, float) else None


def _thread_flags(cpu_threads: int | None) -> list[str]:
    """XLA flags for a thread budget.

    XLA's CPU backend sizes its Eigen pool from the CPUs the process may run on and has no
    flag for "N threads"; the only switch is single-threaded Eigen. So cpu_threads=1 maps
    to the usual recipe, and N > 1 leaves XLA alone (pin the process with taskset to cap
    it). Only "--" flags belong here: XLA stops parsing XLA_FLAGS at the first token
    without "--" (the often-shared `intra_op_parallelism_threads=1` is such a token), so
    every flag after it, the user's `xla_flags` included, would be silently dropped.
    """
    if cpu_threads == 1:
        return ["--xla_cpu_multi_thread_eigen=false"]
    return []


def _format_fraction(fraction: float) -> str:
    # repr keeps every digit, so the node gets exactly the fraction the plan checked.
    return repr(fraction)


def spec_to_env(
    spec: ResourceSpec, gpu_ids: Sequence[int] = (), *, group: str | None = None
) -> dict[str, str]:
    """The environment variables for one node of `spec` that sees physical GPUs `gpu_ids`.

    Args:
      spec: the node group's spec.
      gpu_ids: the GPU ids (nvidia-smi / PCI bus order) the node computes on; empty for a
        CPU node, including a `gpu_if_available` node that fell back to the CPU.
      group: the node group's name, used only in error messages.

    Returns:
      Every variable in `MANAGED_VARIABLES` (all str), then `spec.env` on top.

    Raises:
      ConfigError: device="gpu" with no GPU ids, or a render_gpu the node cannot see.
      ValueError: device="cpu" given GPU ids (a bug in the caller, not a user mistake).
    """
    where = f"resources.{group}" if group else "ResourceSpec"
    gpu_ids = tuple(int(i) for i in gpu_ids)
    if spec.device == "cpu" and gpu_ids:
        raise ValueError(f"{where}: a device='cpu' node was given GPU ids {gpu_ids}")
    if spec.device == "gpu" and not gpu_ids:
        raise ConfigError(
            fact_refusal(
                f"{where}.device='gpu'",
                "the node was given no GPU",
                f"give it GPU ids (make_plan does), or set {where}.device='cpu'",
            )
        )
    on_gpu = bool(gpu_ids)
    env: dict[str, str] = {
        # Ids everywhere in magi_lp are NVML's, which are PCI bus order; CUDA's default
        # order is "fastest first", which differs on mixed-model machines.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    visible, render_index = _visible_gpus_env(spec, gpu_ids, where)
    env.update(visible)
    env.update(_allocator_env(spec, on_gpu))
    # TensorFlow: growth on, so a TF that does see a GPU takes only what it uses;
    # MAGI_LP_TF_GPU=0 tells prepare_node_process() to hide GPUs from TF altogether.
    env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    env["MAGI_LP_TF_GPU"] = "1" if on_gpu and spec.tf_gpu else "0"
    env["MUJOCO_GL"] = _MUJOCO_GL[spec.render]
    env["PYOPENGL_PLATFORM"] = _PYOPENGL_PLATFORM[spec.render]
    # Always an integer: dm_control int()s any value present, and a stale export from
    # the launching shell could point past the node's device list.
    env["MUJOCO_EGL_DEVICE_ID"] = str(render_index)
    env.update(_thread_env(spec, on_gpu))
    env.update(spec.env)
    return env


def _visible_gpus_env(
    spec: ResourceSpec, gpu_ids: tuple[int, ...], where: str
) -> tuple[dict[str, str], int]:
    """Which GPUs the process sees, and for what (`CUDA_VISIBLE_DEVICES`, `JAX_PLATFORMS`),
    and the EGL index of the render GPU among them.

    MUJOCO_EGL_DEVICE_ID, from the installed dm_control (_render/pyopengl/
    egl_renderer.py): it is an index into eglQueryDevicesEXT(), not a CUDA id, and no
    CUDA mapping is applied. NVIDIA's EGL lists only the GPUs in CUDA_VISIBLE_DEVICES
    (reports: mujoco#3245, starVLA#390: with CUDA_VISIBLE_DEVICES=1 the valid range is
    "0 and 0"), and Mesa's software device (the only one on a machine without a GPU)
    follows. So the index is the render GPU's position in the node's own visible list;
    with one visible GPU that is 0 and unambiguous. With several, EGL's order can differ
    from CUDA's (mujoco#3245), so give a multi-GPU node render_gpu only when it matters.
    A CPU node sees no NVIDIA device at all, so to render on a GPU it must see that GPU:
    CUDA_VISIBLE_DEVICES then holds only the render GPU, while JAX_PLATFORMS=cpu keeps
    JAX (and its CUDA context) off it and MAGI_LP_TF_GPU=0 keeps TF off it.
    """
    renders_on_gpu = spec.render == "egl" and spec.render_gpu is not None
    if not gpu_ids:
        # Empty, not unset: CUDA then finds no device, so nothing pays for a context.
        visible = str(spec.render_gpu) if renders_on_gpu else ""
        return {"CUDA_VISIBLE_DEVICES": visible, "JAX_PLATFORMS": "cpu"}, 0
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_ids),
        # "cuda", not "gpu": in jax 0.4.30 "gpu" expands to cuda AND rocm, and an explicit
        # list fails loudly on the missing rocm. Naming cuda first makes it the default
        # backend and makes a node that cannot start CUDA fail instead of running slowly
        # on the CPU; "cpu" stays available for host-side arrays.
        "JAX_PLATFORMS": "cuda,cpu",
    }
    if not renders_on_gpu:
        return env, 0
    if spec.render_gpu not in gpu_ids:
        raise ConfigError(
            refusal(
                f"{where}.render_gpu",
                f"one of the GPUs this node sees, {list(gpu_ids)} (EGL lists only those)",
                spec.render_gpu,
                f"set it to one of {list(gpu_ids)}, or None",
            )
        )
    return env, gpu_ids.index(spec.render_gpu)


def _allocator_env(spec: ResourceSpec, on_gpu: bool) -> dict[str, str]:
    """JAX's GPU allocator: preallocation, the memory fraction and the allocator kind.
    jaxlib treats "" as unset for the fraction."""
    fraction = spec.memory_fraction
    return {
        "XLA_PYTHON_CLIENT_PREALLOCATE": (
            "true" if on_gpu and spec.effective_preallocate else "false"
        ),
        "XLA_PYTHON_CLIENT_MEM_FRACTION": (
            _format_fraction(fraction) if on_gpu and fraction is not None else ""
        ),
        # jaxlib 0.11's name for it, read first, and refused beside the old one: a shell's
        # (or a job's) would override the plan, or stop a GPU node at its start. "" is unset
        # for both jaxlibs (0.4.30 knows only the old name).
        "XLA_CLIENT_MEM_FRACTION": "",
        "XLA_PYTHON_CLIENT_ALLOCATOR": spec.allocator if on_gpu and spec.allocator else "default",
    }


def _thread_env(spec: ResourceSpec, on_gpu: bool) -> dict[str, str]:
    """XLA's flags (the thread flags, a CPU node's device count, then the user's) and the
    thread pools' sizes.

    "" is read as unset by OpenBLAS, MKL, TF and XLA. libgomp would print a one-line
    warning for "" and then use its default, but nothing in this stack loads libgomp
    (checked: numpy, scipy, TF, jax, reverb, mujoco, dm_control)."""
    flags = _thread_flags(spec.cpu_threads)
    if not on_gpu and spec.cpu_devices > 1:
        flags.append(f"{HOST_DEVICE_COUNT_FLAG}={spec.cpu_devices}")
    if spec.xla_flags:
        flags.append(spec.xla_flags)  # after the thread flags, so the user's win
    env = {"XLA_FLAGS": " ".join(flags)}
    threads = "" if spec.cpu_threads is None else str(spec.cpu_threads)
    for name in (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TF_NUM_INTRAOP_THREADS",
        "TF_NUM_INTEROP_THREADS",
    ):
        env[name] = threads
    return env


def resource_spec(**settings: Any) -> ml_collections.ConfigDict:
    """A `config.resources.<group>` entry listing EVERY ResourceSpec field.

    Fields not in `settings` get ResourceSpec's defaults. Listing them all matters because
    `--config.<key>=value` can only override keys that exist. Fields that may hold more
    than one type or None (gpus, gpu_memory, preallocate, allocator, render_gpu,
    cpu_threads) are stored as untyped field references: ml_collections cannot override a
    None-valued field at all, and would parse `--config.resources.learner.gpus=1` into the
    string '1' for a field that holds 'auto'. As untyped references, command-line values
    are parsed as Python literals (0.5, 1, [0, 1], None, False) or kept as strings
    ('grow', 'auto', 'platform').
    """
    defaults = ResourceSpec()
    unknown = sorted(set(settings) - set(ResourceSpec.field_names()))
    if unknown:
        fields = ResourceSpec.field_names()
        what = f"resource_spec() keyword {unknown[0]!r} is not a ResourceSpec field"
        raise not_among(what, unknown[0], fields, "the fields")
    spec = ml_collections.ConfigDict()
    for field in dataclasses.fields(ResourceSpec):
        value = settings.get(field.name, getattr(defaults, field.name))
        if field.name == "env":
            if not isinstance(value, Mapping | ml_collections.ConfigDict):
                raise ConfigError(
                    refusal(
                        "resource_spec(env=...)",
                        "a mapping of variable names to strings",
                        value,
                        'e.g. env={"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}',
                    )
                )
            spec.env = ml_collections.ConfigDict(dict(value))
        elif value is None or "|" in str(field.type):
            spec[field.name] = config_dict.FieldReference(value, field_type=object)
        else:
            spec[field.name] = value
    return spec
