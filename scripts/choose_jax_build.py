"""Chooses the JAX build `make setup` installs: `cpu`, or `cuda12` (requirements-cuda12.txt).

    python scripts/choose_jax_build.py [auto|cpu|cuda12]     prints the choice on stdout and
                                                             one line saying why on stderr
    python scripts/choose_jax_build.py --installed FILE      prints the packages named in FILE
                                                             that this Python has installed

auto picks cuda12 when an NVIDIA driver that runs CUDA 12 (>= 525.60.13) and at least one GPU
are found, through NVML (nvidia-ml-py, installed with requirements.txt) or, failing that,
`nvidia-smi`; anything else gets cpu. Never cuda12 without a GPU: with jax 0.4.30 an installed
CUDA plugin makes JAX fail at start-up on a machine without one whenever JAX_PLATFORMS is
unset (fixed in 0.4.31 only). cpu and cuda12 force the choice and say so.

Standard library only: it runs before magi_lp is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import platform
import re
import shutil
import subprocess
import sys

# The oldest driver that runs jax 0.4.30's CUDA 12 wheels (CUDA minor-version compatibility).
# Same number as magi_lp.placement.jax_build.MIN_DRIVER_CUDA12 (a test checks it).
MIN_DRIVER_CUDA12 = "525.60.13"
REQUESTS = ("auto", "cpu", "cuda12")
PREFIX = "magi_lp setup:"


@dataclasses.dataclass
class Driver:
    """What was found about the NVIDIA driver; `version` is "" when none was found."""

    version: str = ""
    cuda: int = 0  # the CUDA version the driver supports (12060 = 12.6); 0: unknown
    gpus: int = 0
    source: str = ""  # "NVML" or "nvidia-smi"
    failures: tuple[str, ...] = ()  # why each way of looking found nothing

    def describe(self) -> str:
        if not self.version:
            return f"no NVIDIA driver found ({'; '.join(self.failures)})"
        cuda = f", CUDA {self.cuda // 1000}.{self.cuda % 1000 // 10}" if self.cuda else ""
        return f"NVIDIA driver {self.version}{cuda}, {self.gpus} GPU(s) ({self.source})"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml() -> Driver:
    """The driver as NVML reports it (nvidia-ml-py's `pynvml`)."""
    try:
        import pynvml
    except ImportError as err:
        return Driver(failures=(f"NVML: nvidia-ml-py is not installed ({err})",))
    try:
        pynvml.nvmlInit()
    except Exception as err:  # pynvml.NVMLError and friends: no library, no driver
        return Driver(failures=(f"NVML: {err}",))
    try:
        version = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = 0
        for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
            try:
                cuda = int(getattr(pynvml, name)())
                break
            except Exception:  # not in this nvidia-ml-py, or not supported by the driver
                continue
        return Driver(version, cuda, int(pynvml.nvmlDeviceGetCount()), "NVML")
    except Exception as err:
        return Driver(failures=(f"NVML: {err}",))
    finally:
        with contextlib.suppress(Exception):  # done with the library either way
            pynvml.nvmlShutdown()


def read_nvidia_smi() -> Driver:
    """The driver as `nvidia-smi --query-gpu=driver_version` reports it (one line per GPU)."""
    if shutil.which("nvidia-smi") is None:
        return Driver(failures=("nvidia-smi: not on PATH",))
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return Driver(failures=(f"nvidia-smi: {err}",))
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines or not _version_tuple(lines[0]):
        said = (lines or result.stderr.strip().splitlines() or ["no output"])[0]
        return Driver(failures=(f"nvidia-smi: exit {result.returncode}: {said}",))
    return Driver(lines[0], 0, len(lines), "nvidia-smi")


def find_driver() -> Driver:
    """NVML first; `nvidia-smi` when NVML finds nothing (e.g. nvidia-ml-py missing)."""
    nvml = read_nvml()
    if nvml.version:
        return nvml
    smi = read_nvidia_smi()
    if smi.version:
        return smi
    return Driver(failures=nvml.failures + smi.failures)


def why_not_cuda12(driver: Driver, machine: str, system: str) -> str:
    """Why this machine cannot run the CUDA 12 build ("" when it can)."""
    if system != "Linux" or machine not in ("x86_64", "AMD64"):
        return f"the CUDA 12 wheels are for Linux x86_64 only (this is {system} {machine})"
    if not driver.version:
        return driver.describe()
    if driver.cuda and driver.cuda < 12000:
        return (
            f"{driver.describe()} is too old: CUDA 12 needs a driver >= {MIN_DRIVER_CUDA12}; "
            "update the driver, then run `make setup` again"
        )
    if _version_tuple(driver.version) < _version_tuple(MIN_DRIVER_CUDA12):
        return (
            f"{driver.describe()} is older than {MIN_DRIVER_CUDA12}, the oldest that runs "
            "CUDA 12; update the driver, then run `make setup` again"
        )
    if driver.gpus < 1:
        return (
            f"{driver.describe()}: no GPU to use, and jax 0.4.30's CUDA plugin makes JAX fail "
            "where there is none"
        )
    return ""


def choose(request: str, driver: Driver, machine: str, system: str) -> tuple[str, str]:
    """(choice, the one line that says why) for a request of auto, cpu or cuda12."""
    obstacle = why_not_cuda12(driver, machine, system)
    if request == "cpu":
        return "cpu", f"{PREFIX} JAX build cpu (forced by JAX=cpu; {driver.describe()})"
    if request == "cuda12":
        if obstacle:
            return "cuda12", (
                f"{PREFIX} warning: JAX build cuda12 forced by JAX=cuda12 although {obstacle}; "
                "with jax 0.4.30 the CUDA plugin makes JAX fail at start-up wherever no GPU "
                "can be used and JAX_PLATFORMS is unset (magi_lp nodes set it; set "
                "JAX_PLATFORMS=cpu for other scripts, or `make setup JAX=auto` to undo)"
            )
        return "cuda12", f"{PREFIX} JAX build cuda12 (forced by JAX=cuda12; {driver.describe()})"
    if obstacle:
        return "cpu", f"{PREFIX} JAX build cpu: {obstacle}"
    return "cuda12", (
        f"{PREFIX} JAX build cuda12: {driver.describe()}; installs requirements-cuda12.txt "
        "(about 1.9 GB to download the first time; `make setup JAX=cpu` to opt out)"
    )


def installed_from(requirements: str) -> list[str]:
    """The distributions named in a requirements file that this Python has installed."""
    names = []
    with open(requirements) as handle:
        for line in handle:
            line = line.split("#", 1)[0].strip()
            match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)", line)
            if not match:
                continue
            try:
                importlib.metadata.version(match.group(1))
            except importlib.metadata.PackageNotFoundError:
                continue
            names.append(match.group(1))
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("request", nargs="?", default="auto")
    parser.add_argument("--installed", metavar="FILE", help="list installed packages of FILE")
    args = parser.parse_args(argv)
    if args.installed:
        print(" ".join(installed_from(args.installed)))
        return 0
    if args.request not in REQUESTS:
        print(
            f"error: JAX={args.request} is not a JAX build; use JAX=auto, JAX=cpu or JAX=cuda12",
            file=sys.stderr,
        )
        return 2
    choice, reason = choose(args.request, find_driver(), platform.machine(), platform.system())
    print(reason, file=sys.stderr)
    print(choice)
    return 0


if __name__ == "__main__":
    sys.exit(main())
