"""ResourceSpec parsing and spec_to_env."""

import os
from pathlib import Path

import ml_collections
import pytest

from magi_lp.errors import ConfigError
from magi_lp.placement.resources import MANAGED_VARIABLES, ResourceSpec, spec_to_env
from tests.e2e_utils import run_python

REPO_ROOT = Path(__file__).resolve().parents[1]

# --- parsing ------------------------------------------------------------------------


def test_from_config_accepts_dict_and_configdict_and_normalises():
    raw = {"device": "gpu", "gpus": [1, 0], "gpu_memory": 1, "env": {"A": "b"}}
    from_dict = ResourceSpec.from_config("learner", raw)
    from_cfg = ResourceSpec.from_config("learner", ml_collections.ConfigDict(raw))
    assert from_dict == from_cfg
    assert from_dict.gpus == (1, 0)  # order kept: it is the user's CUDA_VISIBLE_DEVICES order
    assert from_dict.gpu_memory == 1.0 and isinstance(from_dict.gpu_memory, float)
    assert from_dict.env == {"A": "b"}
    assert ResourceSpec.from_config("learner", None) == ResourceSpec()


def test_unknown_key_is_refused_by_name_with_suggestion_and_valid_keys():
    with pytest.raises(ConfigError) as err:
        ResourceSpec.from_config("learner", {"device": "gpu", "gpu_mem": 0.5})
    msg = str(err.value)
    assert "resources.learner.gpu_mem" in msg
    assert "did you mean resources.learner.gpu_memory?" in msg
    for key in ResourceSpec.field_names():
        assert key in msg


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("device", "tpu", "'gpu_if_available'"),
        ("gpus", -1, "'auto'"),
        ("gpus", 0, "device='cpu'"),
        ("gpus", True, "'auto'"),
        ("gpus", "all", "'auto'"),
        ("gpus", [0, 0], "repeated"),
        ("gpus", [], "'auto'"),
        ("gpu_distribution", "spread", "'round_robin'"),
        ("gpu_memory", 1.5, "(0, 1]"),
        ("gpu_memory", 0, "(0, 1]"),
        ("gpu_memory", "half", "'grow'"),
        ("gpu_memory", True, "'grow'"),
        ("preallocate", "yes", "True, False, or None"),
        ("allocator", "cuda_async", "'platform'"),
        ("tf_gpu", 1, "True or False"),
        ("render", "glfw", "'osmesa'"),
        ("render_gpu", -1, "a GPU id >= 0"),
        ("cpu_threads", 0, "an integer >= 1"),
        ("cpu_devices", 0, "an integer >= 1"),
        ("cpu_devices", None, "an integer >= 1"),
        ("cpu_threads", 2.5, "an integer >= 1"),
        ("xla_flags", "xla_gpu_autotune_level=0", "'--flag=value'"),
    ],
)
def test_bad_value_names_key_value_and_allowed(key, value, allowed):
    with pytest.raises(ConfigError) as err:
        ResourceSpec.from_config("actor", {key: value})
    msg = str(err.value)
    assert msg.startswith(f"resources.actor.{key} must be ")
    assert f", got {value!r}" in msg
    assert allowed in msg


def test_non_string_env_value_is_refused_with_the_fix():
    with pytest.raises(
        ConfigError, match=r"resources\.actor\.env\.SEED must be a string, got 3; write '3'"
    ):
        ResourceSpec.from_config("actor", {"env": {"SEED": 3}})


@pytest.mark.parametrize("name", ["XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"])
def test_a_memory_fraction_in_env_is_refused_for_gpu_memory(name):
    # The plan sets both names from gpu_memory: a second value stops a GPU node at its start
    # on jaxlib 0.11, or is ignored on 0.4.30.
    with pytest.raises(
        ConfigError,
        match=rf"resources\.learner\.env\.{name} must be set through gpu_memory, got '0\.5'; "
        r"drop it and set gpu_memory=0\.5",
    ):
        ResourceSpec.from_config("learner", {"device": "gpu", "env": {name: "0.5"}})


@pytest.mark.parametrize(
    ("mapping", "fragment"),
    [
        (
            {"device": "gpu", "gpu_memory": "grow", "preallocate": True},
            r"preallocate must be False or None with gpu_memory='grow' .*contradicts.*got True",
        ),
        (
            {"render": "osmesa", "render_gpu": 0},
            r"render_gpu must be None unless render='egl' .*got 0; set render='egl'",
        ),
        (
            {"device": "cpu", "tf_gpu": True},
            r"tf_gpu must be False on a CPU node .*got True; set device='gpu'",
        ),
        (
            {"device": "gpu", "cpu_devices": 3},
            r"cpu_devices must be 1 on a GPU node .*got 3; set gpus=3",
        ),
    ],
)
def test_contradictory_settings_are_refused(mapping, fragment):
    with pytest.raises(ConfigError, match=fragment):
        ResourceSpec.from_config("learner", mapping)


def test_direct_construction_validates_too():
    with pytest.raises(ConfigError, match=r"ResourceSpec\.gpu_memory must be .*\(0, 1\].*got 1\.5"):
        ResourceSpec(device="gpu", gpu_memory=1.5)


# --- spec_to_env ----------------------------------------------------------------------


def test_cpu_node_sees_no_gpu_and_every_managed_variable_is_set():
    env = spec_to_env(ResourceSpec(device="cpu"), ())
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["MAGI_LP_TF_GPU"] == "0"
    assert set(env) == set(MANAGED_VARIABLES)
    assert all(isinstance(v, str) for v in env.values())


GPU = {"device": "gpu"}


@pytest.mark.parametrize(
    ("fields", "gpu_ids", "expected"),
    [
        (
            GPU,
            (0, 2),
            {
                "CUDA_VISIBLE_DEVICES": "0,2",
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "JAX_PLATFORMS": "cuda,cpu",
            },
        ),
        ({"device": "gpu_if_available"}, (1,), {"CUDA_VISIBLE_DEVICES": "1"}),
        ({"device": "gpu_if_available"}, (), {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}),
        (
            {**GPU, "gpu_memory": 0.25},
            (0,),
            {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
        ),
        (
            {**GPU, "gpu_memory": 0.5, "preallocate": False},
            (0,),
            {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
        ),
        (
            {**GPU, "gpu_memory": "grow"},
            (0,),
            {"XLA_PYTHON_CLIENT_MEM_FRACTION": "", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
        ),
        (
            {**GPU, "gpu_memory": None},
            (0,),
            {"XLA_PYTHON_CLIENT_MEM_FRACTION": "", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
        ),
        ({**GPU, "allocator": "platform"}, (0,), {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}),
        ({**GPU, "allocator": "bfc"}, (0,), {"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"}),
        ({**GPU, "allocator": None}, (0,), {"XLA_PYTHON_CLIENT_ALLOCATOR": "default"}),
        (
            {**GPU, "tf_gpu": True},
            (0,),
            {"MAGI_LP_TF_GPU": "1", "TF_FORCE_GPU_ALLOW_GROWTH": "true"},
        ),
        ({**GPU, "tf_gpu": False}, (0,), {"MAGI_LP_TF_GPU": "0"}),
        ({"render": "egl"}, (), {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}),
        ({"render": "osmesa"}, (), {"MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"}),
        ({"render": "none"}, (), {"MUJOCO_GL": "off", "PYOPENGL_PLATFORM": ""}),
        ({**GPU, "render_gpu": 2}, (1, 2), {"MUJOCO_EGL_DEVICE_ID": "1"}),
        ({**GPU, "render_gpu": None}, (3,), {"MUJOCO_EGL_DEVICE_ID": "0"}),
        (
            {"device": "cpu", "render_gpu": 3},
            (),
            {"CUDA_VISIBLE_DEVICES": "3", "JAX_PLATFORMS": "cpu", "MUJOCO_EGL_DEVICE_ID": "0"},
        ),
        (
            {"cpu_threads": 1},
            (),
            {
                "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1",
                "TF_NUM_INTRAOP_THREADS": "1",
                "TF_NUM_INTEROP_THREADS": "1",
            },
        ),
        ({"cpu_threads": 4}, (), {"XLA_FLAGS": "", "OMP_NUM_THREADS": "4"}),
        ({"cpu_devices": 2}, (), {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}),
        # A gpu_if_available node that got its GPU: its devices are the GPU, no host devices.
        ({"device": "gpu_if_available", "cpu_devices": 2}, (0,), {"XLA_FLAGS": ""}),
        ({"cpu_threads": None}, (), {"OMP_NUM_THREADS": "", "TF_NUM_INTEROP_THREADS": ""}),
        (
            {"cpu_threads": 1, "xla_flags": " --xla_dump_to=/tmp/x "},
            (),
            {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false --xla_dump_to=/tmp/x"},
        ),
        ({"env": {"FOO": "bar"}}, (), {"FOO": "bar"}),
        ({"env": {"JAX_PLATFORMS": "cpu,tpu"}}, (), {"JAX_PLATFORMS": "cpu,tpu"}),  # env wins
    ],
)
def test_each_field_reaches_its_variable(fields, gpu_ids, expected):
    env = spec_to_env(ResourceSpec.from_config("g", fields), gpu_ids)
    assert {k: env[k] for k in expected} == expected
    assert set(MANAGED_VARIABLES) <= set(env)


def test_gpu_spec_without_gpu_ids_is_an_error():
    with pytest.raises(ConfigError, match=r"resources\.learner\.device='gpu'"):
        spec_to_env(ResourceSpec(device="gpu"), (), group="learner")


def test_cpu_spec_given_gpu_ids_is_a_bug():
    with pytest.raises(ValueError, match="device='cpu'"):
        spec_to_env(ResourceSpec(device="cpu"), (0,))


def test_render_gpu_must_be_visible_to_a_gpu_node():
    with pytest.raises(
        ConfigError, match=r"resources\.learner\.render_gpu must be .* \[0, 1\] .*got 3"
    ):
        spec_to_env(ResourceSpec(device="gpu", render_gpu=3), (0, 1), group="learner")


@pytest.mark.integration  # a Python process of its own that imports a framework
def test_cpu_env_really_gives_jax_only_the_cpu(tmp_path):
    """Runs a real interpreter with the env a CPU node gets (thread flags included)."""
    env = dict(os.environ)
    # Simulate a launching shell that would otherwise leak settings into the node.
    env.update({"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": "0", "XLA_FLAGS": "--bogus"})
    env.update(spec_to_env(ResourceSpec(device="cpu", cpu_threads=1), ()))
    code = (
        "import os, jax; "
        "print(sorted({d.platform for d in jax.devices()}), "
        "repr(os.environ['CUDA_VISIBLE_DEVICES']), float(jax.numpy.ones(3).sum()))"
    )
    out = run_python(code, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["['cpu']", "''", "3.0"]


def test_cross_field_check_against_a_default_names_the_group():
    # device is left at its default ("cpu"), which tf_gpu=True contradicts.
    with pytest.raises(ConfigError, match=r"resources\.evaluator\.tf_gpu must be False .*got True"):
        ResourceSpec.from_config("evaluator", {"tf_gpu": True})


def test_user_xla_flags_after_the_thread_flags_reach_xla(tmp_path):
    # XLA stops reading XLA_FLAGS at the first token without "--": a real JAX process shows
    # whether the user's flag, placed after the thread flags, still takes effect.
    dump = tmp_path / "xla_dump"
    spec = ResourceSpec.from_config("g", {"cpu_threads": 1, "xla_flags": f"--xla_dump_to={dump}"})
    env = {**os.environ, **spec_to_env(spec, ())}
    run_python("import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()", env=env, check=True)
    assert dump.is_dir() and any(dump.iterdir()), env["XLA_FLAGS"]
