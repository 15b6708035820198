"""`replay.store`: the device store is counted against the learner's memory before anything
starts, the compressed host store against the host's; 'auto' picks the device store where it
fits, the host store where that fits, and Reverb's frame replay elsewhere; a store that does
not fit is one line naming the key, the bytes and the fix."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from magi_lp.errors import ConfigError
from magi_lp.placement.gpu_inventory import GpuInventory
from magi_lp.placement.jax_build import JaxBuild
from magi_lp.placement.plan import make_plan
from magi_lp.replay.plan import plan_replay_store
from magi_lp.runtime.config import placement_requests
from projects.drq_v2.experiment import make_experiment
from projects.drq_v2.tasks import make_config
from tests.e2e_utils import marked_processes, run_entry_point
from tests.fake_nvidia import CUDA12, NO_GPU, gpu
from tests.fake_nvidia import H100 as H100_NAME

GIB = 1 << 30
H100 = GpuInventory((gpu(0, H100_NAME, total_gib=80),))
TWO_H100 = GpuInventory((gpu(0, H100_NAME, total_gib=80), gpu(1, H100_NAME, total_gib=80)))


def distributed(**changes):
    config = make_config("reacher_hard", distributed=True)
    for key, value in changes.items():
        node = config
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = value
    return config


def plan_for(config, inventory=NO_GPU, jax_build=None):
    return make_plan(placement_requests(config), inventory, jax_build or JaxBuild("0.4.30"))


def store_for(config, inventory=NO_GPU, jax_build=None, **options):
    builder = make_experiment(config).builder
    return plan_replay_store(config, builder, plan_for(config, inventory, jax_build), **options)


def test_auto_picks_reverb_on_launchpad_and_the_host_store_without_reverb_on_this_host():
    config = distributed()  # what make run launches: 1M transitions of 84x84 frames
    config.replay.store = "auto"
    kept = store_for(config, reverb_available=True)
    assert kept.store == "reverb" and config.replay.store == "reverb"
    assert kept.line.startswith(
        "replay: reverb frame replay in the replay node (1,000,000 transitions of 84x84x3 "
        "frames; auto: the device store needs 21.9 GB, "
    )
    # The current stack: no Reverb to fall back to.
    config.replay.store = "auto"
    store = store_for(config, reverb_available=False)
    assert store.store == "host" and config.replay.store == "host"
    assert 21.8e9 < store.nbytes < 22.0e9  # the device store's, which did not fit
    assert 5.0e9 < store.host_nbytes < 6.0e9  # < 8 KB a transition
    assert store.line.startswith(
        "replay: host store, zstd-compressed frames in the learner's host memory, about "
        "5.5 GB (1,000,000 transitions of 84x84x3 frames); room: "
    )
    assert "auto: the device store needs 21.9 GB" in store.line


def test_auto_falls_back_to_reverb_where_neither_fits(monkeypatch):
    import psutil

    small = psutil.virtual_memory()._replace(total=12 * GIB)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: small)
    store = store_for(distributed(), reverb_available=True)
    assert store.store == "reverb"
    assert "auto: the device store needs 21.9 GB" in store.line
    with pytest.raises(ConfigError, match="nothing fits"):
        store_for(distributed(), reverb_available=False)


def test_a_host_store_asked_for_that_does_not_fit_is_one_line(monkeypatch):
    import psutil

    small = psutil.virtual_memory()._replace(total=12 * GIB)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: small)
    with pytest.raises(ConfigError) as refused:
        store_for(distributed(**{"replay.store": "host"}), reverb_available=False)
    message = str(refused.value)
    assert message.startswith("replay.store=host: the compressed host store needs about 5.5 GB")
    assert "agent.replay_buffer_size=" in message


def test_auto_picks_the_device_store_where_it_fits():
    config = distributed(**{"agent.replay_buffer_size": 2000})
    store = store_for(config, reverb_available=True)
    assert store.store == "device" and config.replay.store == "device"
    # A small store reads in MB (placement.memory.gb), not as 0.0 GB.
    assert store.line.startswith("replay: device store on the learner's device, 44 MB (2,000 ")


def test_a_gpu_learner_counts_the_store_against_its_memory_fraction():
    config = distributed(**{"resources.learner.device": "gpu", "resources.learner.gpu_memory": 0.5})
    store = store_for(config, H100, CUDA12, reverb_available=True)
    assert store.store == "device"  # 21.9 GB of the 40 GB it may take
    assert "GPU 0 at resources.learner.gpu_memory=0.5 of 85.9 GB" in store.line

    config = distributed(
        **{
            "resources.learner.device": "gpu",
            "resources.learner.gpu_memory": 0.2,
            "replay.store": "device",
        }
    )
    with pytest.raises(ConfigError) as refused:
        store_for(config, H100, CUDA12, reverb_available=True)
    message = str(refused.value)
    assert message.startswith("replay.store=device: the device replay store needs 21.9 GB")
    assert "gpu_memory=0.2" in message and "agent.replay_buffer_size=" in message


def test_a_data_parallel_learner_keeps_one_shard_per_device():
    one = distributed(**{"resources.learner.device": "gpu", "resources.learner.gpus": 1})
    two = distributed(**{"resources.learner.device": "gpu", "resources.learner.gpus": 2})
    single = store_for(one, TWO_H100, CUDA12, reverb_available=True)
    double = store_for(two, TWO_H100, CUDA12, reverb_available=True)
    assert double.nbytes > 1.99 * single.nbytes  # each device holds a full shard
    assert double.budget > 1.99 * single.budget  # and each brings its own memory


def test_without_reverb_auto_means_the_device_store_or_the_host_store():
    config = distributed(**{"agent.replay_buffer_size": 2000})
    assert store_for(config, reverb_available=False).store == "device"
    assert store_for(distributed(), reverb_available=False).store == "host"
    with pytest.raises(ConfigError, match=r"or use replay.store=host \(about 5.5 GB"):
        store_for(distributed(**{"replay.store": "device"}), reverb_available=False)


def test_an_agent_with_its_own_tables_has_no_store_to_choose():
    from projects.td3 import experiment as td3

    spec = importlib.util.spec_from_file_location("td3_config", "configs/td3_cartpole.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    assert plan_replay_store(config, td3.make_experiment(config).builder, plan_for(config)) is None


@pytest.mark.integration
def test_the_entry_point_refuses_a_store_that_does_not_fit_before_starting(tmp_path: Path):
    mark = "replay-plan"
    result = run_entry_point(
        "projects/drq_v2/lp_main.py",
        [
            "--config",
            "configs/reacher_hard_distributed.py",
            "--config.replay.store=device",
            "--workdir",
            str(tmp_path / "run"),
        ],
        timeout=120,
        mark=mark,
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    assert "replay.store=device: the device replay store needs 21.9 GB" in lines[0]
    assert "agent.replay_buffer_size=" in lines[0]
    assert "or use replay.store=host (about 5.5 GB in host memory)" in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()
    assert not marked_processes(mark)

    dry = run_entry_point(
        "projects/drq_v2/lp_main.py",
        ["--config", "configs/reacher_hard_distributed.py", "--dry_run"],
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr
    # 'auto': Reverb where the engine carries it (the Launchpad stack), else the host store.
    from magi_lp.stack import stack_here

    expected = (
        "replay: reverb frame replay in the replay node (1,000,000 transitions"
        if stack_here() == "launchpad"
        else "replay: host store, zstd-compressed frames in the learner's host memory, about "
        "5.5 GB (1,000,000 transitions"
    )
    assert expected in dry.stdout


def test_main_py_on_a_gpu_counts_the_store_against_jax_s_memory_fraction(monkeypatch):
    """`main.py` (no plan): the store is counted against JAX's share of the first GPU. On the
    H200 `make gpu-learn` stopped here with "'method' object is not subscriptable"."""
    import magi_lp.placement.gpu_inventory as gpu_inventory
    import magi_lp.placement.jax_build as jax_build

    monkeypatch.setattr(gpu_inventory, "query_inventory", lambda: H100)
    monkeypatch.setattr(jax_build, "detect_jax_build", lambda: CUDA12)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.28")
    config = make_config("cartpole_balance")
    config.agent.replay_buffer_size = 100_000
    store = plan_replay_store(config, make_experiment(config).builder, None)
    assert store.store == "device"
    assert "GPU 0 at 0.28 of 85.9 GB" in store.line
    assert 0.2 * 85.9e9 < store.budget < 0.28 * 85.9e9  # less the headroom
