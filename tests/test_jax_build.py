"""The JAX build, read without importing JAX, and why a node's CUDA start failed."""

from pathlib import Path

from magi_lp.placement.gpu_inventory import GpuInventory
from magi_lp.placement.jax_build import (
    MIN_DRIVER_CUDA12,
    JaxBuild,
    compilation_cache_warning,
    cuda_data_dir_flag,
    detect_jax_build,
    explain_cuda_failure,
    jax_backend,
)
from tests.e2e_utils import run_python
from tests.fake_nvidia import CPU_ONLY, CUDA12, env_with, gpu, write_fake_cuda_plugin
from tests.fake_nvidia import H100 as H100_NAME

REPO = Path(__file__).resolve().parents[1]
H100 = gpu(0, H100_NAME, total_gib=80)


def test_this_python_is_read_from_metadata_without_importing_jax():
    code = (
        "import sys; from magi_lp.placement.jax_build import detect_jax_build; "
        "b = detect_jax_build(); "
        "print(b.jaxlib_version, b.serves_cuda, 'jax' in sys.modules, 'jaxlib' in sys.modules)"
    )
    out = run_python(code, check=True).stdout.split()
    import jaxlib

    assert out[0] == jaxlib.__version__
    assert out[2:] == ["False", "False"]  # neither jax nor jaxlib was imported


def test_a_cuda_plugin_on_the_path_is_found(tmp_path):
    assert detect_jax_build([str(tmp_path)]).cuda_plugins == ()
    write_fake_cuda_plugin(tmp_path)
    build = detect_jax_build([str(tmp_path)])
    assert [(p.module, p.cuda_major) for p in build.cuda_plugins] == [
        ("jax_plugins.xla_cuda12", 12)
    ]
    assert build.serves_cuda and build.cuda_nvcc_dir == ""
    (tmp_path / "jax_plugins" / "xla_cuda13").mkdir()
    (tmp_path / "jax_plugins" / "xla_cuda13" / "__init__.py").write_text("")
    assert [p.cuda_major for p in detect_jax_build([str(tmp_path)]).cuda_plugins] == [12, 13]


def test_the_pinned_nvcc_folder_is_found_next_to_a_cuda12_plugin(tmp_path):
    write_fake_cuda_plugin(tmp_path, with_nvcc=True)
    build = detect_jax_build([str(tmp_path)])
    assert build.cuda_nvcc_dir == str(tmp_path / "nvidia" / "cuda_nvcc")
    assert cuda_data_dir_flag(build) == f"--xla_gpu_cuda_data_dir={build.cuda_nvcc_dir}"
    assert cuda_data_dir_flag(CUDA12) == ""


def test_a_plugin_on_pythonpath_is_seen_by_a_fresh_process(tmp_path):
    write_fake_cuda_plugin(tmp_path)
    code = "from magi_lp.placement.jax_build import detect_jax_build as d; print(d().describe())"
    out = run_python(code, env=env_with(pythonpath=[tmp_path]), check=True).stdout.strip()
    assert "jax-cuda12-plugin" in out


def test_describe_and_backend():
    assert CPU_ONLY.describe() == "jaxlib 0.4.30, CPU only" and not CPU_ONLY.serves_cuda
    assert CUDA12.describe() == "jaxlib 0.4.30 + jax-cuda12-plugin 0.4.30"
    assert JaxBuild("0.4.30+cuda12.cudnn89").serves_cuda  # old jaxlib with CUDA built in
    assert JaxBuild().describe() == "no jaxlib installed"
    assert jax_backend({"JAX_PLATFORMS": "cuda,cpu"}, CPU_ONLY) == "cuda"
    assert jax_backend({"JAX_PLATFORMS": "cpu"}, CUDA12) == "cpu"
    assert jax_backend({}, CUDA12) == "cuda"
    assert jax_backend({"CUDA_VISIBLE_DEVICES": ""}, CUDA12) == "cpu"
    assert jax_backend({}, CPU_ONLY) == "cpu"


def _inventory(driver="560.35.03", cuda=12060, gpus=(H100,), reason=""):
    return GpuInventory(gpus, reason, driver, cuda)


def test_the_compilation_cache_is_warned_of_where_jaxlib_crashed_with_it():
    settings = {"the environment": "/c", "resources.learner.env": "/d"}
    old, current = JaxBuild(jaxlib_version="0.4.30"), JaxBuild(jaxlib_version="0.11.2")
    assert not old.compilation_cache_safe and current.compilation_cache_safe
    warning = compilation_cache_warning(old, settings)
    assert warning is not None and warning.startswith(
        "JAX_COMPILATION_CACHE_DIR is set (resources.learner.env, the environment): with "
        "jaxlib 0.4.30, CPU only, a learner running DrQ-v2's update read from JAX's "
        "compilation cache died of a segmentation fault; unset it"
    )
    assert compilation_cache_warning(old, {}) is None
    assert compilation_cache_warning(current, settings) is None


def test_failure_reasons_in_words():
    env = {"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "0"}
    no_plugin = explain_cuda_failure(CPU_ONLY, env, _inventory())
    assert no_plugin.startswith("JAX's CUDA plugin is not installed in this Python")
    assert "make setup JAX=cuda12" in no_plugin

    no_driver = explain_cuda_failure(
        CUDA12, env, GpuInventory((), "NVML is unavailable: Driver Not Loaded")
    )
    assert "no NVIDIA driver is reachable" in no_driver and "Driver Not Loaded" in no_driver

    old = explain_cuda_failure(CUDA12, env, _inventory("470.82.01", 11040))
    assert "driver 470.82.01 supports CUDA 11.4" in old and MIN_DRIVER_CUDA12 in old
    old_no_cuda = explain_cuda_failure(CUDA12, env, _inventory("515.43.04", 0))
    assert f"older than {MIN_DRIVER_CUDA12}" in old_no_cuda

    hidden = explain_cuda_failure(CUDA12, {**env, "CUDA_VISIBLE_DEVICES": ""}, _inventory())
    assert hidden.startswith("CUDA_VISIBLE_DEVICES is empty")
    wrong = explain_cuda_failure(CUDA12, {**env, "CUDA_VISIBLE_DEVICES": "0,3"}, _inventory())
    assert "CUDA_VISIBLE_DEVICES=0,3 names GPU(s) [3]" in wrong and "0:NVIDIA H100" in wrong

    none = explain_cuda_failure(CUDA12, env, _inventory(gpus=(), reason="NVML found no GPU"))
    assert "names GPU(s) [0]" in none
    unset = {"JAX_PLATFORMS": "cuda"}
    assert "no GPU device is visible" in explain_cuda_failure(
        CUDA12, unset, _inventory(gpus=(), reason="NVML found no GPU")
    )
    fine = explain_cuda_failure(CUDA12, env, _inventory())
    assert "look usable" in fine
    for message in (no_plugin, no_driver, old, hidden, wrong, none, fine):
        assert "\n" not in message


def test_placement_imports_no_framework():
    code = (
        "import sys; import magi_lp.placement.plan, magi_lp.placement.jax_build; "
        "heavy = ('jax', 'jaxlib', 'tensorflow', 'reverb', 'launchpad', 'acme'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = run_python(code, check=True)
    assert out.stdout.strip() == "[]"
