"""Which JAX build this Python has, found without importing JAX.

jaxlib from the registry is CPU only; CUDA comes from a PJRT plugin, a package that puts a
module `jax_plugins.xla_cuda<N>` on the path (jax-cuda12-pjrt for CUDA 12, ...). JAX imports
every module under the `jax_plugins` namespace package when it starts, so the plugin being
importable is what decides whether JAX can serve CUDA. `detect_jax_build()` reads package
metadata and lists that namespace without importing anything from it, so the placement plan
can refuse a GPU it cannot use in well under a second, before any process starts.

The set-up (`scripts/choose_jax_build.py`) installs the plugin from requirements-cuda12.txt
when the machine's NVIDIA driver supports CUDA 12; `explain_cuda_failure` turns a node's
failed CUDA start into a sentence (plugin missing, driver too old, no device visible).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import sys
from collections.abc import Mapping

from magi_lp.placement.gpu_inventory import GpuInventory

# jax 0.4.30's CUDA 12 wheels need CUDA 12.0 from the driver (CUDA minor-version
# compatibility). scripts/choose_jax_build.py repeats this number (it runs before magi_lp
# is installed); tests/test_setup_choice.py checks that the two agree.
MIN_DRIVER_CUDA12 = "525.60.13"

# Where the pinned ptxas lives in a venv with requirements-cuda12.txt (nvidia-cuda-nvcc-cu12).
_NVCC_PACKAGE = ("nvidia", "cuda_nvcc")
_PLUGIN_MODULE = re.compile(r"^xla_cuda(\d+)$")

COMPILATION_CACHE_VAR = "JAX_COMPILATION_CACHE_DIR"
"""JAX's persistent compilation cache: compiled programs on disk, shared by processes."""
_CACHE_SAFE_JAXLIB = (0, 5)
"""The oldest jaxlib whose compilation cache the tests use (tests/conftest.py). With jaxlib
0.4.30 (the Launchpad stack's) a learner running DrQ-v2's update read from the cache died of a
segmentation fault: tests/test_drq_e2e.py's device-store stop and resume, 2 runs of 2."""


@dataclasses.dataclass(frozen=True)
class CudaPlugin:
    """A JAX CUDA plugin found on the path.

    Attributes:
      module: "jax_plugins.xla_cuda12".
      cuda_major: the CUDA major version it was built for (12).
      version: the installed jax-cuda<N>-pjrt (or -plugin) version, or "" when unknown.
    """

    module: str
    cuda_major: int
    version: str = ""

    @property
    def label(self) -> str:
        """ "jax-cuda12-plugin 0.4.30", the way plans and errors name it."""
        return f"jax-cuda{self.cuda_major}-plugin {self.version}".rstrip()


@dataclasses.dataclass(frozen=True)
class JaxBuild:
    """What the installed JAX can run on.

    Attributes:
      jaxlib_version: the installed jaxlib's version, or "" when jaxlib is missing.
      cuda_plugins: the CUDA plugins JAX will load.
      cuda_nvcc_dir: the folder of the pinned nvidia-cuda-nvcc-cu12 wheel (holds bin/ptxas)
        when it is installed next to a CUDA 12 plugin, else "".
    """

    jaxlib_version: str = ""
    cuda_plugins: tuple[CudaPlugin, ...] = ()
    cuda_nvcc_dir: str = ""

    @property
    def serves_cuda(self) -> bool:
        """Whether JAX in this Python can start its CUDA backend (given a driver and a GPU).

        Old jaxlib builds with CUDA built in carry "+cuda" in their version.
        """
        return bool(self.cuda_plugins) or "+cuda" in self.jaxlib_version

    @property
    def compilation_cache_safe(self) -> bool:
        """Whether JAX's persistent compilation cache may be used (`_CACHE_SAFE_JAXLIB`)."""
        return parse_version(self.jaxlib_version)[:2] >= _CACHE_SAFE_JAXLIB

    def describe(self) -> str:
        """One phrase for messages: "jaxlib 0.4.30 + jax-cuda12-plugin 0.4.30"."""
        if not self.jaxlib_version:
            return "no jaxlib installed"
        base = f"jaxlib {self.jaxlib_version}"
        if self.cuda_plugins:
            return f"{base} + {', '.join(p.label for p in self.cuda_plugins)}"
        if self.serves_cuda:
            return f"{base} (CUDA built in)"
        return f"{base}, CPU only"


def installed_version(distribution: str) -> str:
    """The installed version of `distribution` ("0.4.30"), "" when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _namespace_paths(package: str) -> list[str]:
    """The folders of a (namespace) package, without importing anything inside it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return list(spec.submodule_search_locations)


def detect_jax_build(paths: list[str] | None = None) -> JaxBuild:
    """The JAX build of this Python, read from package metadata; never imports JAX.

    Args:
      paths: folders to search for `jax_plugins` and `nvidia` instead of `sys.path` (tests
        build fake site-packages folders). Versions still come from installed metadata.
    """
    if paths is None:
        plugin_dirs = _namespace_paths("jax_plugins")
        nvidia_dirs = _namespace_paths(_NVCC_PACKAGE[0])
    else:
        plugin_dirs = [os.path.join(p, "jax_plugins") for p in paths]
        nvidia_dirs = [os.path.join(p, _NVCC_PACKAGE[0]) for p in paths]
    plugins: dict[int, CudaPlugin] = {}
    for info in pkgutil.iter_modules([d for d in plugin_dirs if os.path.isdir(d)]):
        match = _PLUGIN_MODULE.match(info.name)
        if not match or int(match.group(1)) in plugins:
            continue
        major = int(match.group(1))
        version = installed_version(f"jax-cuda{major}-pjrt")
        version = version or installed_version(f"jax-cuda{major}-plugin")
        plugins[major] = CudaPlugin(f"jax_plugins.{info.name}", major, version)
    nvcc_dir = ""
    if 12 in plugins:
        for folder in nvidia_dirs:
            candidate = os.path.join(folder, _NVCC_PACKAGE[1])
            if os.path.isfile(os.path.join(candidate, "bin", "ptxas")):
                nvcc_dir = candidate
                break
    return JaxBuild(
        jaxlib_version=installed_version("jaxlib"),
        cuda_plugins=tuple(plugins[m] for m in sorted(plugins)),
        cuda_nvcc_dir=nvcc_dir,
    )


def cuda_data_dir_flag(build: JaxBuild) -> str:
    """`--xla_gpu_cuda_data_dir=<pinned nvcc>` for GPU nodes, or "" when not needed.

    jax 0.4.30's XLA takes the first ptxas on PATH before the pip-installed one, so a
    system CUDA older than 12.6.3 would bring back the Hopper miscompile the pinned
    nvidia-cuda-nvcc-cu12 avoids (openxla/xla#19927). Naming the wheel's folder makes XLA
    look there first (newer JAX does the same by itself).
    """
    return f"--xla_gpu_cuda_data_dir={build.cuda_nvcc_dir}" if build.cuda_nvcc_dir else ""


def jax_backend(env: Mapping[str, str], build: JaxBuild) -> str:
    """The backend JAX will make the default in a process with `env` ("cuda" or "cpu")."""
    platforms = [p.strip() for p in env.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if platforms:
        return platforms[0]
    # Unset: JAX picks CUDA when it can start it, else the CPU.
    return "cuda" if build.serves_cuda and env.get("CUDA_VISIBLE_DEVICES") != "" else "cpu"


def parse_version(text: str) -> tuple[int, ...]:
    """The first three numbers of a version ("0.4.30+cuda12" -> (0, 4, 30))."""
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def jaxlib_0_11_or_later(build: JaxBuild) -> bool:
    """Whether this jaxlib reads its environment as 0.11 does (the current stack's), not as
    0.4.30 (the Launchpad stack's): see `memory_fraction_in`, `client_allocators`."""
    return parse_version(build.jaxlib_version)[:2] >= (0, 11)


_CLIENT_ALLOCATORS = ("default", "platform", "bfc", "cuda_async")
"""What jaxlib 0.4.30 takes as XLA_PYTHON_CLIENT_ALLOCATOR (jaxlib/xla_client.py); it raises
at the GPU's start on any other value, the empty one included."""


def client_allocators(build: JaxBuild) -> tuple[str, ...]:
    """The XLA_PYTHON_CLIENT_ALLOCATOR values this jaxlib takes (0.11 adds two)."""
    return _CLIENT_ALLOCATORS + (("vmm", "address") if jaxlib_0_11_or_later(build) else ())


def memory_fraction_in(env: Mapping[str, str], build: JaxBuild) -> float | None:
    """The GPU memory fraction this jaxlib takes from `env`, or None (JAX's default): 0.11
    reads XLA_CLIENT_MEM_FRACTION, else the deprecated XLA_PYTHON_CLIENT_MEM_FRACTION; an
    older one only the latter. "" is unset, as for jaxlib; a value that is no number is
    None too (main.py refuses it before it gets here)."""
    names = ["XLA_PYTHON_CLIENT_MEM_FRACTION"]
    if jaxlib_0_11_or_later(build):
        names.insert(0, "XLA_CLIENT_MEM_FRACTION")
    for name in names:
        if env.get(name):
            try:
                return float(env[name])
            except ValueError:
                return None
    return None


def compilation_cache_warning(build: JaxBuild, settings: Mapping[str, str]) -> str | None:
    """One warning line when JAX's compilation cache is set where this jaxlib crashed with it.

    Args:
      build: this Python's JAX build.
      settings: where `JAX_COMPILATION_CACHE_DIR` is set to a non-empty value -> that value
        ("the environment", "resources.learner.env").
    """
    if build.compilation_cache_safe or not settings:
        return None
    return (
        f"{COMPILATION_CACHE_VAR} is set ({', '.join(sorted(settings))}): with "
        f"{build.describe()}, a learner running DrQ-v2's update read from JAX's compilation "
        "cache died of a segmentation fault; unset it (the current stack's jaxlib 0.11 runs "
        "with it)"
    )


def explain_cuda_failure(build: JaxBuild, env: Mapping[str, str], inventory: GpuInventory) -> str:
    """Why a process whose JAX_PLATFORMS asks for CUDA cannot start it, in one sentence.

    Args:
      build: this Python's JAX build (`detect_jax_build()`).
      env: the process's environment (CUDA_VISIBLE_DEVICES is read).
      inventory: the machine's GPUs and driver as NVML reports them (`query_inventory()`).
    """
    python = sys.executable or "this Python"
    if not build.serves_cuda:
        return (
            f"JAX's CUDA plugin is not installed in this Python ({python}: "
            f"{build.describe()}): run `make setup JAX=cuda12` (installs "
            "requirements-cuda12.txt), or give this node device='cpu'"
        )
    driver = inventory.driver_version
    if not inventory.gpus and not driver:
        return (
            f"no NVIDIA driver is reachable from this process ({inventory.reason or 'NVML failed'})"
            "; install or load the driver, or give this node device='cpu'"
        )
    majors = sorted(p.cuda_major for p in build.cuda_plugins)
    cuda = inventory.cuda_driver_version
    if majors and cuda and cuda // 1000 < majors[-1]:
        needed = majors[-1]
        minimum = f" (>= {MIN_DRIVER_CUDA12})" if needed == 12 else ""
        return (
            f"the NVIDIA driver {driver or '?'} supports CUDA {cuda // 1000}."
            f"{cuda % 1000 // 10}, older than the CUDA {needed} of {build.describe()}: update "
            f"the driver{minimum}, or run `make setup JAX=cpu`"
        )
    if 12 in majors and driver and parse_version(driver) < parse_version(MIN_DRIVER_CUDA12):
        return (
            f"the NVIDIA driver {driver} is older than {MIN_DRIVER_CUDA12}, the oldest that "
            "runs CUDA 12: update the driver, or run `make setup JAX=cpu`"
        )
    ids = inventory.ids()
    present = inventory.describe()
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        tokens = [t.strip() for t in visible.split(",") if t.strip()]
        if not tokens:
            return (
                "CUDA_VISIBLE_DEVICES is empty, so no GPU is visible to this process (GPUs "
                f"present: {present}); the plan gives a GPU node its ids: check "
                "resources.<group>.env and the node's launch group"
            )
        missing = [int(t) for t in tokens if t.isdigit() and int(t) not in ids]
        if missing:
            return (
                f"CUDA_VISIBLE_DEVICES={visible} names GPU(s) {missing} that NVML does not "
                f"list (GPUs present: {present}); use ids from that list"
            )
    if not ids:
        return f"no GPU device is visible: {present}"
    return (
        f"the CUDA backend failed although the driver ({driver or '?'}) and GPU(s) {present} "
        f"look usable with {build.describe()}; see JAX's message"
    )
