"""`num_actors='auto'` / `envs_per_actor='auto'`: actors sized to injected machines (cores, GPUs,
RAM), given numbers kept or refused, and where the numbers are settled (lp_main, main.py)."""

import importlib.util
from pathlib import Path

import pytest

from magi_lp.errors import ConfigError
from magi_lp.placement import actor_sizing
from magi_lp.placement.gpu_inventory import GpuInventory
from magi_lp.runtime.config import (
    capacity_warnings,
    placement_requests,
    resolve_actor_counts,
    single_process_counts,
    validate_experiment_config,
)
from tests.fake_nvidia import CUDA12, H100, NO_GPU, gpu

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30

ONE_H100 = GpuInventory((gpu(0, H100, total_gib=80),))
FOUR_H100 = GpuInventory(tuple(gpu(i, H100, total_gib=80) for i in range(4)))
MACHINES = {"no GPU": NO_GPU, "1 GPU": ONE_H100, "4 GPUs": FOUR_H100}
RAM_GIB = {2: 16, 16: 128, 64: 512}
"""Each injected box's RAM (enough that the cores bound the actors)."""


def _config(path, argument=None):
    spec = importlib.util.spec_from_file_location("sized_config", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config() if argument is None else module.get_config(argument)
    validate_experiment_config(config)
    return config


def _distributed():
    return _config("configs/reacher_hard_distributed.py")


def _sized(config, inventory, cores, memory_gib=None):
    return resolve_actor_counts(
        config,
        inventory,
        cores=cores,
        memory_gib=memory_gib or RAM_GIB.get(cores, 64),
        jax_build=CUDA12,
    )


def test_the_distributed_configs_size_their_actors():
    config = _distributed()
    assert (config.num_actors, config.envs_per_actor) == ("auto", "auto")
    assert _config("configs/cartpole_balance.py", "distributed").num_actors == "auto"
    single = _config("configs/cartpole_balance.py")
    assert (single.num_actors, single.envs_per_actor) == (1, 1)
    for layout in ("1gpu", "4gpu"):
        layouts = _config("configs/reacher_hard_gpu_layouts.py", layout)
        assert (layouts.num_actors, layouts.envs_per_actor) == ("auto", "auto")


def test_a_two_core_cpu_box_gets_one_actor():
    resolved, line = _sized(_distributed(), NO_GPU, 2)
    assert (resolved.num_actors, resolved.envs_per_actor) == (1, 1)
    assert line == (
        "actors: auto -> 1 x 1 env (2 cores: none left after learner 2, replay 1, evaluator 1, "
        "counter 1; at least 1 actor, 1 thread each)"
    )


@pytest.mark.parametrize("machine", list(MACHINES))
def test_a_sixteen_core_box_gets_the_cores_the_others_leave(machine):
    resolved, line = _sized(_distributed(), MACHINES[machine], 16)
    # CPU actors: the GPUs (the learner's) do not change their count.
    assert (resolved.num_actors, resolved.envs_per_actor) == (11, 1)
    assert line == (
        "actors: auto -> 11 x 1 env (16 cores: 11 left after learner 2, replay 1, evaluator 1, "
        "counter 1; 1 thread each)"
    )


def test_a_sixty_four_core_box():
    resolved, _ = _sized(_distributed(), FOUR_H100, 64)
    assert (resolved.num_actors, resolved.envs_per_actor) == (59, 1)
    # Its RAM bounds them where it is small: half of what the others leave, 0.8 GiB each.
    resolved, line = _sized(_distributed(), FOUR_H100, 64, memory_gib=32)
    assert resolved.num_actors == 17 and line.endswith("RAM bounds it)"), line  # 14.2 / 0.8


def test_the_gpu_layouts_act_on_a_gpu_with_eight_environments_each():
    one = _config("configs/reacher_hard_gpu_layouts.py", "1gpu")
    resolved, line = _sized(one, ONE_H100, 16)
    assert (resolved.num_actors, resolved.envs_per_actor) == (11, 8)
    # Each: a CUDA context, the policy's pool and 8 GL contexts; the learner shares the GPU
    # with memory reckoned later, so the actors get a quarter of it.
    assert "GPU 0:NVIDIA H100 80GB HBM3: 1.6 GB each, room for 13 in 21.3 GB" in line, line
    four = _config("configs/reacher_hard_gpu_layouts.py", "4gpu")
    resolved, line = _sized(four, FOUR_H100, 16)
    assert (resolved.num_actors, resolved.envs_per_actor) == (11, 8)
    assert "room for 53 in 85.9 GB" in line, line  # GPU 0 is the actors' alone
    resolved, line = _sized(four, FOUR_H100, 64)
    assert resolved.num_actors == 53 and line.endswith("; GPU memory bounds it)"), line
    resolved, _ = _sized(four, FOUR_H100, 2)
    assert (resolved.num_actors, resolved.envs_per_actor) == (1, 8)
    # The plan made from the numbers places them.
    assert placement_requests(resolved)["actor"].num_nodes == 1


def test_a_small_gpu_bounds_the_actors_and_a_given_number_that_does_not_fit_is_refused():
    small = GpuInventory((gpu(0, H100, total_gib=8),))
    one = _config("configs/reacher_hard_gpu_layouts.py", "1gpu")
    resolved, line = _sized(one, small, 64)
    assert resolved.num_actors == 1 and "GPU memory bounds it" in line, line
    one.num_actors = 9
    with pytest.raises(ConfigError) as refused:
        _sized(one, small, 64)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("num_actors=9: 9 actor process(es) of 1 env need 9.2 GB"), message
    assert "lower num_actors (at most 7 fit, or 'auto')" in message, message
    # Given numbers that fit are kept; 'auto' environments are lowered to fit them.
    one.num_actors = 6
    resolved, line = _sized(one, small, 64)
    assert (resolved.num_actors, resolved.envs_per_actor) == (6, 4)
    assert line == "actors: 6 (given) x 4 envs (auto)"
    # Both given: kept as they are; the plan's reckoning (gpu_memory='auto') checks the GPU.
    one.envs_per_actor = 8
    assert _sized(one, small, 64) == (one, None)


def test_given_numbers_are_kept_as_they_are():
    config = _distributed()
    config.num_actors, config.envs_per_actor = 3, 2
    resolved, line = _sized(config, NO_GPU, 64)
    assert resolved is config and line is None
    config.envs_per_actor = "auto"
    resolved, line = _sized(config, NO_GPU, 64)
    assert (resolved.num_actors, resolved.envs_per_actor) == (3, 1)
    assert config.envs_per_actor == "auto"  # the config given is not changed


def test_a_data_parallel_learner_gets_a_writer_per_device():
    config = _distributed()
    config.resources.learner.cpu_devices = 4
    resolved, _ = _sized(config, NO_GPU, 2)
    assert resolved.num_actors * resolved.envs_per_actor >= 4
    assert (resolved.num_actors, resolved.envs_per_actor) == (1, 4)


def test_the_threads_each_node_takes_count():
    config = _distributed()
    config.resources.actor.cpu_threads = 2
    config.resources.learner.cpu_threads = 4
    config.num_evaluators = 2
    resolved, line = _sized(config, NO_GPU, 16)
    assert resolved.num_actors == 4  # (16 - 4 - 1 - 2 - 1) // 2
    assert "16 cores: 8 left after learner 4, replay 1, evaluator 2, counter 1; 2 threads" in line
    # The capacity warning counts the threads the sizing counts.
    assert capacity_warnings(resolved, cores=16, memory_gib=128) == []  # sized to fit
    resolved.num_actors = 5  # one actor (2 threads) past the 8 cores the others leave
    (warning,) = capacity_warnings(resolved, cores=16, memory_gib=128)
    assert warning.startswith(
        "the busy nodes need 18 threads (learner 4, replay 1, evaluator 2, counter 1, actor 10) "
        "but this machine has 16 cores"
    ), warning


def test_auto_is_a_number_only_after_it_is_sized():
    with pytest.raises(ConfigError, match=r"^num_actors='auto' is not sized here: .*give "):
        placement_requests(_distributed())


def test_main_py_runs_one_actor_of_one_environment():
    from magi_lp.cli.checks import _ignored_by_single_process

    config = _distributed()
    assert _ignored_by_single_process(config, []) is None
    single = single_process_counts(config)
    assert (single.num_actors, single.envs_per_actor) == (1, 1)
    config.num_actors = 4
    assert "num_actors=4" in _ignored_by_single_process(config, [])


@pytest.mark.parametrize("config_file", ["reacher_hard.py", "reacher_hard_distributed.py"])
def test_the_command_line_gives_auto_or_a_number(config_file):
    from absl import flags
    from ml_collections import config_flags

    path = REPO / "configs" / config_file
    for given, expected in (("auto", "auto"), ("5", 5)):
        argv = ["prog", f"--config={path}", f"--config.num_actors={given}"]
        argv.append(f"--config.envs_per_actor={given}")
        values = flags.FlagValues()
        config_flags.DEFINE_config_file(
            "config", None, flag_values=values, lock_config=True, sys_argv=argv
        )
        values(argv)
        assert values.config.num_actors == expected
        assert values.config.envs_per_actor == expected


def test_the_sizing_arithmetic_alone():
    busy = {"learner": 2, "replay": 1, "evaluator": 1, "counter": 1}
    site = actor_sizing.ActingSite(threads=1, rss_bytes=GiB)
    sizing = actor_sizing.size_actors("auto", "auto", cores=8, busy=busy, site=site)
    assert (sizing.num_actors, sizing.envs_per_actor) == (3, 1)
    gpus = actor_sizing.ActorGpus("0:X", True, 2, free_bytes=4 * GiB, auto_bytes=3 * GiB)
    assert gpus.process_bytes(8) == (512 + 384 + 8 * 80) << 20
    assert gpus.fits(3 * GiB, 8) == 2 * 2  # two per GPU, round robin over two
    sizing = actor_sizing.size_actors(
        "auto", "auto", cores=64, busy=busy, site=actor_sizing.ActingSite(1, GiB, gpus)
    )
    assert (sizing.num_actors, sizing.envs_per_actor) == (4, 8)
