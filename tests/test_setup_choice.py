"""The set-up's JAX build choice (scripts/choose_jax_build.py) and what scripts/setup_venv.sh
does with it, against fake drivers: a fake NVML (`pynvml`) first on PYTHONPATH and a fake
`nvidia-smi` first on PATH. setup_venv.sh runs with MAGI_LP_SETUP_DRY_RUN=1 on a throwaway
venv folder: it prints its pip commands instead of installing, and keeps its stamp there."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from magi_lp.placement.jax_build import MIN_DRIVER_CUDA12
from tests.fake_nvidia import env_with, write_fake_nvidia_smi, write_fake_pynvml

REPO = Path(__file__).resolve().parents[1]
CHOOSER = REPO / "scripts" / "choose_jax_build.py"
H100 = [("NVIDIA H100 80GB HBM3", 80)]
NO_LIBRARY = "NVML Shared Library Not Found"
SMI_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def _machine(tmp_path, *, nvml=None, smi=None, smi_fail=""):
    """Folders for PYTHONPATH and PATH: NVML with `nvml` (kwargs of write_fake_pynvml) or
    failing as without a driver; nvidia-smi answering `smi`, failing, or absent (None)."""
    nvml_dir = write_fake_pynvml(tmp_path / "nvml", **(nvml or {"init_error": NO_LIBRARY}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi or smi_fail:
        write_fake_nvidia_smi(bin_dir, driver=smi or "", fail=smi_fail)
    return nvml_dir, bin_dir


def choose(tmp_path, request=None, **machine):
    nvml_dir, bin_dir = _machine(tmp_path, **machine)
    # PATH holds only the fake bin: nvidia-smi is there or nowhere.
    env = env_with(pythonpath=[nvml_dir], base={"PATH": str(bin_dir)})
    args = [sys.executable, str(CHOOSER)] + ([request] if request else [])
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    return result.returncode, result.stdout.strip(), result.stderr.strip()


# --- the choice -------------------------------------------------------------------------


def test_no_driver_chooses_cpu_and_says_why(tmp_path):
    code, choice, reason = choose(tmp_path)
    assert (code, choice) == (0, "cpu")
    assert reason == (
        "magi_lp setup: JAX build cpu: no NVIDIA driver found "
        f"(NVML: {NO_LIBRARY}; nvidia-smi: not on PATH)"
    )


def test_nvidia_smi_without_a_loaded_driver_chooses_cpu(tmp_path):
    code, choice, reason = choose(tmp_path, smi_fail=SMI_NO_DRIVER)
    assert (code, choice) == (0, "cpu")
    assert f"NVML: {NO_LIBRARY}; nvidia-smi: exit 9: NVIDIA-SMI has failed" in reason


def test_old_driver_chooses_cpu(tmp_path):
    nvml = {"gpus": H100, "driver": "470.82.01", "cuda": 11040}
    code, choice, reason = choose(tmp_path, nvml=nvml)
    assert (code, choice) == (0, "cpu")
    assert "NVIDIA driver 470.82.01, CUDA 11.4, 1 GPU(s) (NVML) is too old" in reason
    assert f">= {MIN_DRIVER_CUDA12}" in reason and "\n" not in reason


def test_old_driver_seen_only_by_nvidia_smi_chooses_cpu(tmp_path):
    code, choice, reason = choose(tmp_path, smi="515.65.01")
    assert (code, choice) == (0, "cpu")
    assert f"driver 515.65.01, 1 GPU(s) (nvidia-smi) is older than {MIN_DRIVER_CUDA12}" in reason


def test_cuda12_driver_chooses_cuda12(tmp_path):
    code, choice, reason = choose(tmp_path, nvml={"gpus": H100 * 2, "cuda": 12060})
    assert (code, choice) == (0, "cuda12")
    assert reason.startswith(
        "magi_lp setup: JAX build cuda12: NVIDIA driver 560.35.03, CUDA 12.6, 2 GPU(s) (NVML)"
    )
    assert "requirements-cuda12.txt" in reason and "1.9 GB" in reason


def test_cuda12_driver_seen_only_by_nvidia_smi_chooses_cuda12(tmp_path):
    code, choice, reason = choose(tmp_path, smi="535.104.05")
    assert (code, choice) == (0, "cuda12")
    assert "NVIDIA driver 535.104.05, 1 GPU(s) (nvidia-smi)" in reason


def test_driver_without_a_gpu_chooses_cpu(tmp_path):
    code, choice, reason = choose(tmp_path, nvml={"gpus": [], "driver": "560.35.03"})
    assert (code, choice) == (0, "cpu")
    assert "0 GPU(s) (NVML): no GPU to use" in reason


def test_overrides_are_obeyed_and_say_so(tmp_path):
    code, choice, reason = choose(tmp_path, "cpu", nvml={"gpus": H100})
    assert (code, choice) == (0, "cpu")
    assert reason.startswith("magi_lp setup: JAX build cpu (forced by JAX=cpu; NVIDIA driver")

    code, choice, reason = choose(tmp_path, "cuda12", nvml={"gpus": H100})
    assert (code, choice) == (0, "cuda12")
    assert reason.startswith("magi_lp setup: JAX build cuda12 (forced by JAX=cuda12; NVIDIA")


def test_forcing_cuda12_without_a_driver_warns_about_the_jax_0_4_30_trap(tmp_path):
    code, choice, reason = choose(tmp_path, "cuda12")
    assert (code, choice) == (0, "cuda12")
    assert reason.startswith("magi_lp setup: warning: JAX build cuda12 forced by JAX=cuda12")
    assert "no NVIDIA driver found" in reason and "JAX_PLATFORMS is unset" in reason
    assert "\n" not in reason


def test_a_bad_request_is_one_line_and_exit_2(tmp_path):
    code, choice, reason = choose(tmp_path, "gpu")
    assert (code, choice) == (2, "")
    assert reason == "error: JAX=gpu is not a JAX build; use JAX=auto, JAX=cpu or JAX=cuda12"


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="this machine has a GPU")
def test_this_machine_gets_cpu():
    result = subprocess.run(
        [sys.executable, str(CHOOSER)], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "cpu"
    assert result.stderr.startswith("magi_lp setup: JAX build cpu: no NVIDIA driver found (NVML:")


def test_both_copies_of_the_minimum_driver_agree():
    text = CHOOSER.read_text()
    assert f'MIN_DRIVER_CUDA12 = "{MIN_DRIVER_CUDA12}"' in text
    assert MIN_DRIVER_CUDA12 in (REPO / "requirements-cuda12.txt").read_text()


# --- the set-up script ------------------------------------------------------------------


@pytest.fixture
def sandbox(tmp_path):
    """A copy of the set-up's inputs and a throwaway venv whose python is this one."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("requirements.txt", "requirements-cuda12.txt", "setup.py", "Makefile"):
        shutil.copy(REPO / name, repo / name)
    for name in ("setup_venv.sh", "find_python.sh", "choose_jax_build.py", "write_home_pth.sh"):
        shutil.copy(REPO / "scripts" / name, repo / "scripts" / name)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return repo, venv


def setup(tmp_path, repo, venv, jax=None, *, extra_pythonpath=(), **machine):
    """Runs setup_venv.sh (dry run) on a machine described as in `_machine`; nvidia-smi is
    always faked (failing unless given), so a real one in /usr/bin is never reached."""
    if "smi" not in machine and "smi_fail" not in machine:
        machine["smi_fail"] = SMI_NO_DRIVER
    nvml_dir, bin_dir = _machine(tmp_path, **machine)
    env = env_with(
        pythonpath=[nvml_dir, *extra_pythonpath],
        path=[bin_dir],
        base={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "MAGI_LP_SETUP_DRY_RUN": "1"},
    )
    args = ["bash", str(repo / "scripts" / "setup_venv.sh"), str(venv)] + ([jax] if jax else [])
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    return result


def pip_commands(result):
    return [line for line in result.stdout.splitlines() if line.startswith("+ ") and "pip" in line]


def stamp(venv):
    return (venv / ".magi_lp_setup").read_text()


def test_setup_installs_the_cpu_build_without_a_driver_then_stays_put(tmp_path, sandbox):
    repo, venv = sandbox
    first = setup(tmp_path, repo, venv)
    assert first.returncode == 0, first.stderr
    assert "magi_lp setup: JAX build cpu: no NVIDIA driver found" in first.stderr
    commands = pip_commands(first)
    assert any(c.endswith("pip install --quiet -r requirements.txt") for c in commands)
    assert not any("requirements-cuda12.txt" in c for c in commands)
    assert any("install --quiet --no-deps --no-build-isolation -e ." in c for c in commands)
    assert "request=auto\nchoice=cpu\ninputs=" in stamp(venv)

    again = setup(tmp_path, repo, venv)
    assert again.returncode == 0, again.stderr
    assert pip_commands(again) == []
    assert f"magi_lp setup: {venv} is up to date (JAX build cpu)" in again.stdout
    assert "JAX build cpu: no NVIDIA driver found" in again.stderr  # the choice, every time


def test_setup_with_an_old_driver_installs_cpu(tmp_path, sandbox):
    repo, venv = sandbox
    result = setup(tmp_path, repo, venv, nvml={"gpus": H100, "driver": "470.82.01", "cuda": 11040})
    assert result.returncode == 0, result.stderr
    assert "JAX build cpu: NVIDIA driver 470.82.01" in result.stderr
    assert not any("requirements-cuda12.txt" in c for c in pip_commands(result))


def test_setup_with_a_cuda12_driver_installs_the_lock_file_on_top(tmp_path, sandbox):
    repo, venv = sandbox
    result = setup(tmp_path, repo, venv, smi="550.54.15")  # NVML fails, nvidia-smi answers
    assert result.returncode == 0, result.stderr
    assert "JAX build cuda12: NVIDIA driver 550.54.15, 1 GPU(s) (nvidia-smi)" in result.stderr
    assert any(
        c.endswith("pip install --quiet -r requirements.txt -r requirements-cuda12.txt")
        for c in pip_commands(result)
    )
    assert "make gpu-check" in result.stdout
    assert "choice=cuda12" in stamp(venv)


def test_a_change_of_choice_reinstalls_and_a_forced_choice_is_kept(tmp_path, sandbox):
    repo, venv = sandbox
    gpu = {"nvml": {"gpus": H100}}
    assert setup(tmp_path, repo, venv, **gpu).returncode == 0
    assert "choice=cuda12" in stamp(venv)
    forced = setup(tmp_path, repo, venv, "cpu", **gpu)
    assert "JAX build cpu (forced by JAX=cpu;" in forced.stderr
    assert any(c.endswith("install --quiet -r requirements.txt") for c in pip_commands(forced))
    kept = setup(tmp_path, repo, venv, **gpu)  # plain `make run` later: still cpu
    assert "forced by JAX=cpu" in kept.stderr and pip_commands(kept) == []
    back = setup(tmp_path, repo, venv, "auto", **gpu)
    assert "JAX build cuda12: NVIDIA driver" in back.stderr
    assert any("requirements-cuda12.txt" in c for c in pip_commands(back))
    assert stamp(venv).startswith("request=auto\nchoice=cuda12\n")


def test_forcing_cuda12_without_a_driver_installs_it_with_a_warning(tmp_path, sandbox):
    repo, venv = sandbox
    result = setup(tmp_path, repo, venv, "cuda12")
    assert result.returncode == 0, result.stderr
    assert "warning: JAX build cuda12 forced by JAX=cuda12" in result.stderr
    assert any("requirements-cuda12.txt" in c for c in pip_commands(result))


def test_cpu_removes_cuda_packages_left_from_an_earlier_cuda12_build(tmp_path, sandbox):
    repo, venv = sandbox
    site = tmp_path / "site"
    for name, version in (("nvidia_cudnn_cu12", "9.5.1.17"), ("jax_cuda12_plugin", "0.4.30")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
        )
    result = setup(tmp_path, repo, venv, "cpu", extra_pythonpath=[site])
    assert result.returncode == 0, result.stderr
    uninstall = [c for c in pip_commands(result) if "uninstall" in c]
    assert len(uninstall) == 1
    assert uninstall[0].endswith("pip uninstall --quiet --yes jax-cuda12-plugin nvidia-cudnn-cu12")


def test_a_changed_lock_file_reinstalls_an_unchanged_one_does_not(tmp_path, sandbox):
    repo, venv = sandbox
    setup(tmp_path, repo, venv)
    assert pip_commands(setup(tmp_path, repo, venv)) == []
    lock = repo / "requirements-cuda12.txt"
    lock.write_text(lock.read_text() + "# a comment changes the hash too\n")
    changed = setup(tmp_path, repo, venv)
    assert "installing into" in changed.stdout and pip_commands(changed)
    base = repo / "requirements.txt"
    base.write_text(base.read_text() + "\n")
    assert pip_commands(setup(tmp_path, repo, venv))
    assert pip_commands(setup(tmp_path, repo, venv)) == []


def test_a_bad_request_stops_the_setup_in_one_line(tmp_path, sandbox):
    repo, venv = sandbox
    result = setup(tmp_path, repo, venv, "rocm")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: JAX=rocm is not a JAX build; use JAX=auto, JAX=cpu or JAX=cuda12"
    )
    assert pip_commands(result) == [] and not (venv / ".magi_lp_setup").exists()


def test_make_setup_passes_jax_through(tmp_path, sandbox):
    repo, venv = sandbox
    nvml_dir, bin_dir = _machine(tmp_path, nvml={"gpus": H100}, smi_fail=SMI_NO_DRIVER)
    env = env_with(
        pythonpath=[nvml_dir],
        path=[bin_dir],
        base={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "MAGI_LP_SETUP_DRY_RUN": "1"},
    )
    result = subprocess.run(
        ["make", "-s", "-C", str(repo), "setup", f"VENV={venv}", "JAX=cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "JAX build cpu (forced by JAX=cpu; NVIDIA driver 560.35.03" in result.stderr
    assert "request=cpu\nchoice=cpu" in stamp(venv)


@pytest.mark.parametrize("version", ["3.10", "3.12"])
def test_find_python_names_the_override_it_refuses(version):
    variable = {"3.10": "PYTHON", "3.12": "PYTHON312"}[version]
    env = {"PATH": os.environ["PATH"], variable: "/bin/false"}
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "find_python.sh"), version],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert f"error: {variable}=/bin/false is not a working Python {version} interpreter" in (
        result.stderr
    )
