"""Placement plans over injected GPU inventories and JAX builds."""

import dataclasses
from pathlib import Path

import pytest

from magi_lp.errors import ConfigError
from magi_lp.placement import plan as plan_module
from magi_lp.placement.gpu_inventory import GpuInventory
from magi_lp.placement.jax_build import JaxBuild, detect_jax_build
from magi_lp.placement.plan import GroupRequest
from magi_lp.placement.resources import MANAGED_VARIABLES, ResourceSpec
from tests.fake_nvidia import (
    CPU_ONLY,
    CUDA12,
    NO_GPU,
    RTX3060,
    RTX3080,
    gpu,
    lp_main_on_fake_gpus,
)

REPO = Path(__file__).resolve().parents[1]

TWO_3080 = GpuInventory((gpu(0), gpu(1)))
MIXED = GpuInventory((gpu(0, RTX3060), gpu(1, RTX3080)))


def make_plan(requests, inventory, jax_build=CUDA12):
    """The plan against a CUDA-capable JAX unless a test says otherwise."""
    return plan_module.make_plan(requests, inventory, jax_build)


def launch_groups(plan, group):
    return tuple(p.launch_group for p in plan.groups.values() if p.group == group)


def req(num_nodes=1, **fields):
    return GroupRequest(ResourceSpec.from_config("test", fields), num_nodes)


# --- no GPU -----------------------------------------------------------------------------


def test_cpu_program_on_machine_without_gpu():
    plan = make_plan({"replay": req(), "actor": req(3)}, NO_GPU)
    assert list(plan.groups) == ["replay", "actor"]
    assert plan.groups["actor"].node_indices == (0, 1, 2)
    assert plan.launch_group("actor", 2) == "actor"
    for env in plan.envs().values():
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["JAX_PLATFORMS"] == "cpu"
    assert plan.notices == ()  # no GPU to render on, so nothing to point out


def test_gpu_group_without_gpu_says_why_and_how_to_fix():
    with pytest.raises(ConfigError) as err:
        make_plan({"replay": req(), "learner": req(device="gpu")}, NO_GPU)
    msg = str(err.value)
    assert "resources.learner.device='gpu'" in msg
    assert "no GPU was found" in msg and "NVML Shared Library Not Found" in msg
    assert "device='cpu'" in msg and "'gpu_if_available'" in msg


def test_gpu_if_available_falls_back_to_cpu_and_records_it():
    plan = make_plan(
        {"learner": req(device="gpu_if_available", gpu_memory=0.5, tf_gpu=True)}, NO_GPU
    )
    placement = plan.groups["learner"]
    assert placement.device == "cpu" and placement.gpu_ids == ()
    assert placement.env["CUDA_VISIBLE_DEVICES"] == ""
    assert placement.env["MAGI_LP_TF_GPU"] == "0"
    assert len(plan.notices) == 1
    notice = plan.notices[0]
    assert notice.startswith("learner:") and "on the CPU" in notice and "\n" not in notice


def test_same_spec_uses_the_gpu_when_there_is_one():
    plan = make_plan({"learner": req(device="gpu_if_available", gpu_memory=0.5)}, TWO_3080)
    assert plan.groups["learner"].device == "gpu"
    assert plan.groups["learner"].env["JAX_PLATFORMS"] == "cuda,cpu"
    assert plan.notices == ()


def test_group_with_no_nodes_is_not_placed_or_checked():
    plan = make_plan({"evaluator": req(0, device="gpu"), "actor": req(1)}, NO_GPU)
    assert list(plan.groups) == ["actor"]
    assert launch_groups(plan, "evaluator") == ()


def test_negative_node_count_is_refused():
    with pytest.raises(ConfigError, match="num_nodes must be an integer >= 0, got -1"):
        req(-1)


# --- two identical GPUs -----------------------------------------------------------------


def test_auto_groups_spread_over_identical_gpus():
    inventory = GpuInventory((gpu(0, used_gib=1.2), gpu(1)))
    plan = make_plan(
        {
            "learner": req(device="gpu", gpu_memory=0.6),
            "evaluator": req(device="gpu", gpu_memory=0.3),
        },
        inventory,
    )
    # GPU 1 is idle, so the learner takes it; then GPU 1 is 60% planned, GPU 0 10% used.
    assert plan.groups["learner"].gpu_ids == (1,)
    assert plan.groups["evaluator"].gpu_ids == (0,)
    assert plan.groups["learner"].env["CUDA_VISIBLE_DEVICES"] == "1"
    assert plan.groups["learner"].env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.6"


def test_shared_count_two_sees_both_gpus():
    plan = make_plan({"learner": req(device="gpu", gpus=2, gpu_memory=0.9)}, TWO_3080)
    assert plan.groups["learner"].env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_count_larger_than_machine_is_refused():
    with pytest.raises(
        ConfigError, match=r"^resources\.learner\.gpus must be at most 2, the GPUs on .*got 3; "
    ):
        make_plan({"learner": req(device="gpu", gpus=3)}, TWO_3080)


# --- mixed models -----------------------------------------------------------------------


def test_node_asking_for_two_models_is_refused_naming_them():
    with pytest.raises(ConfigError) as err:
        make_plan({"learner": req(device="gpu", gpus=[0, 1], gpu_memory=0.5)}, MIXED)
    msg = str(err.value)
    assert msg.startswith("resources.learner.gpus must be ids of one GPU model")
    assert "got [0, 1]; " in msg
    assert f"{RTX3060}: [0]" in msg and f"{RTX3080}: [1]" in msg
    assert "round_robin" in msg


def test_auto_count_two_on_mixed_models_is_refused():
    with pytest.raises(
        ConfigError, match=r"^resources\.learner\.gpus must be at most 1 \(pmap needs GPUs of one"
    ):
        make_plan({"learner": req(device="gpu", gpus=2)}, MIXED)


def test_auto_count_one_on_mixed_models_picks_least_loaded():
    inventory = GpuInventory((gpu(0, RTX3060, used_gib=0.5), gpu(1, RTX3080, used_gib=3)))
    plan = make_plan({"learner": req(device="gpu")}, inventory)
    assert plan.groups["learner"].gpu_ids == (0,)


def test_four_gpus_count_two_picks_the_less_loaded_identical_pair():
    inventory = GpuInventory(
        (
            gpu(0, RTX3060, used_gib=4),
            gpu(1, RTX3060, used_gib=0),
            gpu(2, RTX3080, used_gib=1),
            gpu(3, RTX3080, used_gib=1),
        )
    )
    plan = make_plan({"learner": req(device="gpu", gpus=2, gpu_memory=0.5)}, inventory)
    assert plan.groups["learner"].gpu_ids == (2, 3)
    assert plan.groups["learner"].env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_round_robin_may_mix_models_since_each_node_sees_one():
    plan = make_plan(
        {"actor": req(2, device="gpu", gpus=[0, 1], gpu_distribution="round_robin")}, MIXED
    )
    assert [p.gpu_ids for p in plan.groups.values()] == [(0,), (1,)]


# --- ids --------------------------------------------------------------------------------


def test_missing_id_is_refused_naming_the_ids_that_exist():
    with pytest.raises(ConfigError) as err:
        make_plan({"learner": req(device="gpu", gpus=[1, 3])}, TWO_3080)
    msg = str(err.value)
    assert msg.startswith("GPU 3 is not on this machine (resources.learner.gpus=[1, 3]): ")
    assert f"the GPUs present are 0:{RTX3080}, 1:{RTX3080}; use ids from that list" in msg


# --- memory -----------------------------------------------------------------------------


def test_oversubscribed_gpu_names_nodes_and_total():
    with pytest.raises(ConfigError) as err:
        make_plan(
            {
                "learner": req(device="gpu", gpus=[0], gpu_memory=0.5),
                "actor": req(4, device="gpu", gpus=[0], gpu_memory=0.2),
            },
            TWO_3080,
        )
    msg = str(err.value)
    assert f"GPU 0:{RTX3080}" in msg
    assert "sum to 1.3 > 1.0" in msg
    assert "learner node 0: 0.5" in msg and "actor nodes 0-3: 4 x 0.2" in msg
    assert "resources.actor.gpu_memory" in msg and "resources.learner.gpu_memory" in msg


def test_fractions_summing_to_exactly_one_fit():
    plan = make_plan(
        {
            "learner": req(device="gpu", gpus=[0], gpu_memory=0.7),
            "actor": req(3, device="gpu", gpus=[0], gpu_memory=0.1),
        },
        TWO_3080,
    )
    assert plan.groups["actor"].env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1"


def test_default_preallocation_on_a_shared_gpu_is_refused():
    with pytest.raises(ConfigError) as err:
        make_plan(
            {
                "learner": req(device="gpu", gpus=[0]),
                "evaluator": req(device="gpu", gpus=[0], gpu_memory="grow"),
            },
            TWO_3080,
        )
    msg = str(err.value)
    assert "shared by 2 nodes" in msg and "75%" in msg
    assert "resources.learner.gpu_memory" in msg
    assert "resources.evaluator.gpu_memory" not in msg  # grow is fine


def test_default_preallocation_alone_on_a_gpu_is_fine():
    plan = make_plan({"learner": req(device="gpu", gpus=[0])}, TWO_3080)
    assert plan.groups["learner"].env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_growing_nodes_may_share_a_gpu():
    plan = make_plan({"actor": req(6, device="gpu", gpus=[1], gpu_memory="grow")}, TWO_3080)
    assert plan.groups["actor"].env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_memory_already_in_use_is_a_notice():
    inventory = GpuInventory((gpu(0, used_gib=6),))
    plan = make_plan({"learner": req(device="gpu", gpu_memory=0.8)}, inventory)
    assert any("GPU 0:" in n and "50%" in n for n in plan.notices)


# --- round robin ------------------------------------------------------------------------


def test_round_robin_splits_into_launch_groups_with_distinct_devices():
    plan = make_plan(
        {
            "learner": req(device="gpu", gpus=[0], gpu_memory=0.5),
            "actor": req(
                5, device="gpu", gpus=[0, 1], gpu_distribution="round_robin", gpu_memory=0.1
            ),
        },
        TWO_3080,
    )
    assert launch_groups(plan, "actor") == ("actor_gpu0", "actor_gpu1")
    assert plan.groups["actor_gpu0"].node_indices == (0, 2, 4)
    assert plan.groups["actor_gpu1"].node_indices == (1, 3)
    assert plan.groups["actor_gpu0"].env["CUDA_VISIBLE_DEVICES"] == "0"
    assert plan.groups["actor_gpu1"].env["CUDA_VISIBLE_DEVICES"] == "1"
    assert [plan.launch_group("actor", i) for i in range(5)] == [
        "actor_gpu0",
        "actor_gpu1",
        "actor_gpu0",
        "actor_gpu1",
        "actor_gpu0",
    ]
    assert plan.launch_group("learner", 0) == "learner"
    with pytest.raises(KeyError, match="no node 5"):
        plan.launch_group("actor", 5)


def test_round_robin_counts_only_the_nodes_on_each_gpu():
    ok = {
        "actor": req(5, device="gpu", gpus=[0, 1], gpu_distribution="round_robin", gpu_memory=0.3)
    }
    make_plan(ok, TWO_3080)  # GPU 0: 3 x 0.3 = 0.9
    bad = {
        "actor": req(5, device="gpu", gpus=[0, 1], gpu_distribution="round_robin", gpu_memory=0.4)
    }
    with pytest.raises(ConfigError, match=r"GPU 0:.*sum to 1\.2 .*actor nodes 0,2,4: 3 x 0\.4"):
        make_plan(bad, TWO_3080)


def test_round_robin_auto_spreads_over_all_gpus_up_to_node_count():
    plan = make_plan(
        {"actor": req(3, device="gpu", gpu_distribution="round_robin", gpu_memory="grow")},
        TWO_3080,
    )
    assert launch_groups(plan, "actor") == ("actor_gpu0", "actor_gpu1")
    single = make_plan(
        {"actor": req(1, device="gpu", gpu_distribution="round_robin", gpu_memory="grow")},
        TWO_3080,
    )
    assert launch_groups(single, "actor") == ("actor",)


def test_launch_group_name_collision_is_refused():
    with pytest.raises(ConfigError, match=r"'actor_gpu0'.*collides"):
        make_plan(
            {
                "actor_gpu0": req(),
                "actor": req(
                    2, device="gpu", gpus=[0, 1], gpu_distribution="round_robin", gpu_memory=0.1
                ),
            },
            TWO_3080,
        )


# --- rendering --------------------------------------------------------------------------


def test_cpu_actors_render_on_a_chosen_gpu_without_jax_on_it():
    plan = make_plan({"actor": req(2, device="cpu", render_gpu=1)}, TWO_3080)
    env = plan.groups["actor"].env
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["MUJOCO_EGL_DEVICE_ID"] == "0"
    assert env["MAGI_LP_TF_GPU"] == "0"


def test_cpu_groups_on_a_gpu_machine_see_no_gpu_and_raise_no_notice():
    plan = make_plan({"replay": req(), "actor": req(2)}, TWO_3080)
    assert plan.groups["actor"].env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.notices == ()


def test_render_gpu_that_does_not_exist_is_refused():
    with pytest.raises(ConfigError, match=r"render_gpu must be the id of a GPU .*got 5; "):
        make_plan({"actor": req(device="cpu", render_gpu=5)}, TWO_3080)
    with pytest.raises(ConfigError, match=r"resources\.actor\.render_gpu=0: no GPU was found"):
        make_plan({"actor": req(device="cpu", render_gpu=0)}, NO_GPU)


def test_render_gpu_outside_a_gpu_nodes_view_is_refused():
    with pytest.raises(ConfigError, match=r"resources\.learner\.render_gpu must be .*\[0\].*got 1"):
        make_plan({"learner": req(device="gpu", gpus=[0], render_gpu=1)}, TWO_3080)


# --- output -----------------------------------------------------------------------------


def _plan_for_output():
    return make_plan(
        {
            "learner": req(device="gpu", gpus=[1], gpu_memory=0.5, env={"FOO": "bar"}),
            "actor": req(
                3, device="gpu", gpus=[0, 1], gpu_distribution="round_robin", gpu_memory="grow"
            ),
            "replay": req(),
        },
        MIXED,
    )


def test_format_table_lists_groups_devices_memory_and_env():
    plan = _plan_for_output()
    table = plan.format_table()
    split, *lines = table.splitlines()
    # Above the table, the device split in Cleanba's notation: learner on GPU 1, actors 0,1.
    assert split.startswith("device split: a0,1-l1 ")
    header = lines[0].split()
    assert header[:3] == ["node", "group", "launch"]  # "node group", "launch group", ...
    for column in ("nodes", "device", "gpus", "GPU memory", "env"):
        assert column in lines[0]
    env_col = lines[0].index("env")
    learner_row = next(i for i, line in enumerate(lines) if line.startswith("learner"))
    assert f"1:{RTX3080}" in lines[learner_row]
    assert "0.5 prealloc" in lines[learner_row]
    # The learner's env is listed one variable per line, in the env column.
    learner_env = [lines[learner_row][env_col:]]
    for line in lines[learner_row + 1 :]:
        if line[:env_col].strip():  # the next row starts
            break
        learner_env.append(line[env_col:])
    assert "CUDA_VISIBLE_DEVICES=1" in learner_env and "FOO=bar" in learner_env
    # Every managed variable is accounted for: with its value in the row, or (set to the
    # empty string) named once in the footnote under the table.
    footnote = next(line for line in lines if line.startswith("set to ''"))
    shown = {entry.split("=", 1)[0] for entry in learner_env if entry}
    for name in MANAGED_VARIABLES:
        assert name in shown or name in footnote.split(": ", 1)[1].split(", "), name
    assert not any(entry.endswith("=") for entry in learner_env)
    actor_rows = [line for line in lines if line.startswith("actor")]
    assert any("actor_gpu0" in r and "2 (0,2)" in r and f"0:{RTX3060}" in r for r in actor_rows)
    assert any("actor_gpu1" in r and "1 (1)" in r and "on demand" in r for r in actor_rows)
    replay_row = next(line for line in lines if line.startswith("replay"))
    assert replay_row.split()[:4] == ["replay", "replay", "1", "(0)"]


def test_envs_are_copies_of_strings():
    plan = _plan_for_output()
    envs = plan.envs()
    assert set(envs) == {"learner", "actor_gpu0", "actor_gpu1", "replay"}
    envs["learner"]["FOO"] = "changed"
    assert plan.envs()["learner"]["FOO"] == "bar"
    assert all(isinstance(v, str) for env in plan.envs().values() for v in env.values())


def test_env_override_of_a_managed_variable_is_a_notice():
    plan = make_plan({"actor": req(env={"JAX_PLATFORMS": "cpu", "X": "1"})}, NO_GPU)
    assert plan.notices == (
        "actor: resources.actor.env overrides managed variable(s) JAX_PLATFORMS",
    )


# --- the JAX build ----------------------------------------------------------------------


def test_gpu_group_with_a_cpu_only_jaxlib_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        make_plan({"replay": req(), "learner": req(device="gpu")}, TWO_3080, CPU_ONLY)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("resources.learner.device='gpu': GPU 0:")
    assert "jaxlib 0.4.30, CPU only" in msg
    assert "`make setup JAX=cuda12`" in msg and "device='cpu'" in msg


def test_gpu_if_available_with_a_cpu_only_jaxlib_runs_on_the_cpu_with_a_notice():
    plan = make_plan(
        {"learner": req(device="gpu_if_available", gpu_memory=0.5), "actor": req(2)},
        TWO_3080,
        CPU_ONLY,
    )
    learner = plan.groups["learner"]
    assert (learner.device, learner.gpu_ids, learner.jax_backend) == ("cpu", (), "cpu")
    assert learner.env["JAX_PLATFORMS"] == "cpu" and learner.env["CUDA_VISIBLE_DEVICES"] == ""
    (notice,) = plan.notices
    assert notice.startswith("learner: GPU 0:") and "runs its 1 node(s) on the CPU" in notice
    assert "`make setup JAX=cuda12`" in notice


def test_cpu_groups_and_egl_render_gpus_need_no_cuda_jax():
    plan = make_plan({"replay": req(), "actor": req(2, render_gpu=1)}, TWO_3080, CPU_ONLY)
    assert plan.notices == ()
    assert plan.groups["actor"].env["CUDA_VISIBLE_DEVICES"] == "1"
    assert plan.groups["actor"].jax_backend == "cpu"


def test_jax_backend_column_and_build_line_in_the_table():
    plan = make_plan(
        {
            "learner": req(device="gpu", gpu_memory=0.5),
            "replay": req(),
            # The user's env wins, and the column says what JAX will really do.
            "evaluator": req(device="gpu", gpu_memory=0.1, env={"JAX_PLATFORMS": "cpu"}),
        },
        TWO_3080,
    )
    assert [p.jax_backend for p in plan.groups.values()] == ["cuda", "cpu", "cpu"]
    lines = plan.format_table().splitlines()[1:]  # under the device split
    column = lines[0].index("JAX backend")
    rows = {line.split()[0]: line for line in lines[2:] if line[:1].strip()}
    assert rows["learner"][column:].split()[0] == "cuda"
    assert rows["replay"][column:].split()[0] == "cpu"
    assert lines[-1] == "JAX build: jaxlib 0.4.30 + jax-cuda12-plugin 0.4.30"


def test_gpu_nodes_use_the_pinned_ptxas_when_its_wheel_is_installed():
    build = JaxBuild(CUDA12.jaxlib_version, CUDA12.cuda_plugins, "/venv/nvidia/cuda_nvcc")
    plan = make_plan(
        {
            "learner": req(device="gpu", cpu_threads=1, xla_flags="--xla_foo=1"),
            "evaluator": req(device="gpu", gpus=[1], env={"XLA_FLAGS": "--mine"}),
            "actor": req(),
        },
        TWO_3080,
        build,
    )
    flags = plan.groups["learner"].env["XLA_FLAGS"].split()
    assert flags[0] == "--xla_gpu_cuda_data_dir=/venv/nvidia/cuda_nvcc"
    threads = ["--xla_cpu_multi_thread_eigen=false"]
    assert flags[1:] == [*threads, "--xla_foo=1"]
    assert plan.groups["evaluator"].env["XLA_FLAGS"] == "--mine"  # the user's env wins
    assert plan.groups["actor"].env["XLA_FLAGS"] == ""  # CPU nodes compile no PTX
    assert (
        "cuda_data_dir"
        not in make_plan({"l": req(device="gpu")}, TWO_3080).envs()["l"]["XLA_FLAGS"]
    )


def test_plan_reads_the_installed_jax_build_when_none_is_given():
    plan = plan_module.make_plan({"actor": req()}, TWO_3080)
    assert plan.jax_build == detect_jax_build()
    if plan.jax_build.serves_cuda:
        pytest.skip("this Python has a CUDA plugin")
    with pytest.raises(ConfigError, match="cannot use it"):
        plan_module.make_plan({"learner": req(device="gpu")}, TWO_3080)


# --- the entry point, with a fake driver (NVML) and, where said, a fake CUDA plugin -----


def _lp_main(tmp_path, args, *, plugin):
    if detect_jax_build().serves_cuda and not plugin:
        pytest.skip("this Python has a real CUDA plugin")
    return lp_main_on_fake_gpus(tmp_path, args, plugin=plugin)


def test_entry_point_refuses_gpu_without_cuda_jax_before_spawning(tmp_path):
    result, workdir = _lp_main(tmp_path, ["--config.resources.learner.device=gpu"], plugin=False)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "resources.learner.device='gpu': GPU 0:NVIDIA H100 80GB HBM3 found" in errors[0]
    assert "make setup JAX=cuda12" in errors[0]
    assert not (workdir / "nodes").exists(), "a node process was started"


@pytest.mark.integration
def test_dry_run_falls_back_without_cuda_jax_and_plans_the_gpu_with_it(tmp_path):
    # A store that fits this host whichever stack runs it (without Reverb, no fallback).
    small = "--config.agent.replay_buffer_size=100000"
    without, _ = _lp_main(tmp_path, ["--dry_run", small], plugin=False)
    assert without.returncode == 0, without.stderr
    notices = [line for line in without.stdout.splitlines() if line.startswith("notice: ")]
    assert any(
        line.startswith("notice: learner: GPU 0:NVIDIA H100") and "on the CPU" in line
        for line in notices
    ), without.stdout
    learner = next(line for line in without.stdout.splitlines() if line.startswith("learner"))
    assert learner.split()[4:6] == ["cpu", "cpu"]  # device, JAX backend

    with_plugin, _ = _lp_main(tmp_path, ["--dry_run"], plugin=True)
    assert with_plugin.returncode == 0, with_plugin.stderr
    lines = with_plugin.stdout.splitlines()
    learner = next(line for line in lines if line.startswith("learner"))
    assert learner.split()[4:6] == ["gpu", "cuda"]
    assert "0:NVIDIA H100 80GB HBM3" in learner
    assert "JAX_PLATFORMS=cuda,cpu" in with_plugin.stdout
    actor = next(line for line in lines if line.startswith("actor "))
    assert actor.split()[4:6] == ["cpu", "cpu"]
    assert not any("learner:" in line for line in lines if line.startswith("notice: "))


# --- several devices per learner: data parallelism, the device split --------------------

FOUR_3080 = GpuInventory(tuple(gpu(i) for i in range(4)))


def test_a_batch_the_learner_devices_do_not_divide_is_refused_by_name():
    learner = GroupRequest(
        ResourceSpec.from_config("learner", {"device": "gpu", "gpus": [1, 2, 3]}),
        1,
        batch_size=256,
        batch_key="agent.batch_size",
    )
    with pytest.raises(ConfigError) as err:
        make_plan({"learner": learner}, FOUR_3080)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("agent.batch_size=256 does not split evenly over the 3 devices")
    assert "resources.learner.gpus=[1, 2, 3]" in msg and "multiple of 3 (e.g. 258)" in msg
    assert "or 2 device(s)" in msg  # the largest count below 3 that divides 256
    divisible = dataclasses.replace(learner, batch_size=255)
    assert make_plan({"learner": divisible}, FOUR_3080).groups["learner"].num_devices == 3


def test_a_cpu_learner_with_host_devices_gets_the_xla_flag_and_the_batch_check():
    spec = ResourceSpec.from_config("learner", {"cpu_devices": 2, "cpu_threads": 1})
    plan = make_plan({"learner": GroupRequest(spec, 1, batch_size=16)}, NO_GPU)
    learner = plan.groups["learner"]
    assert (learner.device, learner.num_devices, learner.device_names()) == ("cpu", 2, "cpu0,1")
    # After the thread flags, before the user's own xla_flags.
    assert learner.env["XLA_FLAGS"].endswith(" --xla_force_host_platform_device_count=2")
    with pytest.raises(ConfigError, match=r"batch_size=15 .*\(resources\.learner\.cpu_devices=2\)"):
        make_plan({"learner": GroupRequest(spec, 1, batch_size=15)}, NO_GPU)
    # A GPU learner's devices are its GPUs: cpu_devices applies only where it runs on the CPU.
    fallback = ResourceSpec.from_config("learner", {"device": "gpu_if_available", "cpu_devices": 2})
    assert make_plan({"learner": req_of(fallback)}, NO_GPU).groups["learner"].num_devices == 2
    assert make_plan({"learner": req_of(fallback)}, TWO_3080).groups["learner"].num_devices == 1


def req_of(spec, num_nodes=1):
    return GroupRequest(spec, num_nodes)


def test_cpu_devices_on_a_gpu_node_is_refused():
    with pytest.raises(
        ConfigError, match=r"resources\.learner\.cpu_devices must be 1 on a GPU node .*got 2"
    ):
        ResourceSpec.from_config("learner", {"device": "gpu", "cpu_devices": 2})
    with pytest.raises(
        ConfigError, match=r"resources\.learner\.cpu_devices must be an integer >= 1, got 0"
    ):
        ResourceSpec.from_config("learner", {"cpu_devices": 0})


def test_device_split_in_cleanba_notation():
    # Cleanba's 4-GPU layout without its third learner GPU: actors share GPU 0 with memory
    # fractions, the learner is data-parallel over GPUs 1 and 2.
    plan = make_plan(
        {
            "replay": req(),
            "learner": req(device="gpu", gpus=[1, 2], gpu_memory=0.9),
            "actor": req(4, device="gpu", gpus=[0], gpu_memory=0.2),
            "evaluator": req(device="gpu", gpus=[3], gpu_memory=0.3),
        },
        FOUR_3080,
    )
    assert plan.device_split() == "a0-l1,2"
    assert plan.format_table().splitlines()[0].startswith("device split: a0-l1,2 ")
    # One GPU shared by actors and learner, fractions checked; CPU actors; round-robin.
    shared = make_plan(
        {
            "learner": req(device="gpu", gpus=[0], gpu_memory=0.6),
            "actor": req(2, device="gpu", gpus=[0], gpu_memory=0.2),
        },
        TWO_3080,
    )
    assert shared.device_split() == "a0-l0"
    cpu = make_plan({"learner": req(cpu_devices=2), "actor": req(3)}, NO_GPU)
    assert cpu.device_split() == "acpu-lcpu0,1"
    spread = make_plan(
        {
            "learner": req(device="gpu", gpus=[3], gpu_memory=0.5),
            "actor": req(
                3, device="gpu", gpus=[0, 1], gpu_distribution="round_robin", gpu_memory=0.3
            ),
        },
        FOUR_3080,
    )
    assert spread.device_split() == "a0,1-l3"


def test_the_learner_batch_comes_from_the_agent_config():
    from magi_lp.runtime.config import experiment_defaults, make_placement_plan

    config = experiment_defaults()
    config.agent.batch_size = 30
    config.resources.learner.cpu_devices = 4
    with pytest.raises(ConfigError, match=r"^agent\.batch_size=30 does not split evenly over"):
        make_placement_plan(config, NO_GPU)
    config.agent.batch_size = 32
    assert make_placement_plan(config, NO_GPU).groups["learner"].num_devices == 4


def _layout(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_layouts", REPO / "configs" / "reacher_hard_gpu_layouts.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(name)


def test_shipped_gpu_layouts_plan_on_one_and_four_gpus():
    from magi_lp.runtime.config import (
        placement_requests,
        resolve_actor_counts,
        validate_experiment_config,
    )

    one = _layout("1gpu")
    validate_experiment_config(one)
    # Their actors are sized to the machine: on a 12 GB GPU it shares with the learner, a
    # quarter of it holds one of 8 environments (tests/test_actor_sizing.py sizes others).
    one, _ = resolve_actor_counts(one, GpuInventory((gpu(0),)), cores=16, jax_build=CUDA12)
    assert (one.num_actors, one.envs_per_actor) == (1, 8)
    plan = make_plan(placement_requests(one), GpuInventory((gpu(0),)))
    assert plan.device_split() == "a0-l0"
    four, _ = resolve_actor_counts(_layout("4gpu"), FOUR_3080, cores=16, jax_build=CUDA12)
    plan = make_plan(placement_requests(four), FOUR_3080)
    assert plan.device_split() == "a0-l1,2"
    assert plan.groups["learner"].num_devices == 2
    # Cleanba's learner on 1,2,3: the paper's batch of 256 does not split three ways.
    four.resources.learner.gpus = [1, 2, 3]
    with pytest.raises(ConfigError, match=r"^agent\.batch_size=256 does not split evenly"):
        make_plan(placement_requests(four), FOUR_3080)
    # A learner on GPUs of two models is refused (pmap's rule, kept for the sharded update).
    mixed = GpuInventory((gpu(0), gpu(1, RTX3060), gpu(2), gpu(3)))
    four.resources.learner.gpus = [1, 2]
    with pytest.raises(
        ConfigError, match=r"resources\.learner\.gpus must be ids of one GPU model .*got \[1, 2\]"
    ):
        make_plan(placement_requests(four), mixed)


@pytest.mark.integration
def test_dry_run_shows_the_split_of_the_four_gpu_layout(tmp_path):
    result, _ = lp_main_on_fake_gpus(
        tmp_path, ["--dry_run"], gpus=4, config="configs/reacher_hard_gpu_layouts.py:4gpu"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Above the table, after the plan's notices and warnings.
    split = next(i for i, line in enumerate(lines) if line.startswith("device split: "))
    assert lines[split].startswith("device split: a0-l1,2 "), result.stdout
    assert lines[split + 1].startswith("node group"), result.stdout
    learner = next(line for line in lines if line.startswith("learner"))
    assert "1:NVIDIA H100 80GB HBM3, 2:NVIDIA H100 80GB HBM3" in learner


def test_the_memory_fraction_is_read_as_the_installed_jaxlib_reads_it():
    from magi_lp.placement.jax_build import memory_fraction_in

    old, new = JaxBuild(jaxlib_version="0.4.30"), JaxBuild(jaxlib_version="0.11.2")
    both = {"XLA_CLIENT_MEM_FRACTION": "0.3", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.6"}
    assert memory_fraction_in(both, old) == 0.6  # 0.4.30 knows only the old name
    assert memory_fraction_in(both, new) == 0.3  # 0.11 reads the new one first
    assert memory_fraction_in({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.6"}, new) == 0.6
    # "" is unset (the plan gives a CPU node that), not a number to fail on.
    assert memory_fraction_in({"XLA_PYTHON_CLIENT_MEM_FRACTION": ""}, old) is None
    assert memory_fraction_in({"XLA_CLIENT_MEM_FRACTION": "0.3"}, old) is None
