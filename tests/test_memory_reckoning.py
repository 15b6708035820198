"""`gpu_memory='auto'`: each GPU node's memory reckoned from its compiled programs (XLA's memory
analysis on this CPU, applied to fake GPUs), the plan sized and checked GPU by GPU before
anything starts: a node that cannot fit is one line naming it, its need and the fix; a user's
fraction below the reckoning is a warning.

The compiles run at tiny sizes (32x32 frames, small networks) but for one entry-point test of
`make run`'s config on a fake 80 GB H100; a reckoning is kept per process, so tests that ask
for the same programs compile them once."""

from __future__ import annotations

import pytest

from magi_lp.errors import ConfigError
from magi_lp.placement import memory as memory_lib
from magi_lp.placement.gpu_inventory import GpuInventory
from magi_lp.placement.plan import GroupRequest, make_plan
from magi_lp.placement.resources import ResourceSpec
from magi_lp.replay.plan import plan_replay_store
from magi_lp.runtime.config import placement_requests
from magi_lp.runtime.memory_reckoning import compile_for_plan, needs_from, size_gpu_memory
from projects.drq_v2 import tiny
from projects.drq_v2.experiment import make_experiment
from projects.drq_v2.tasks import make_config
from tests.e2e_utils import CURRENT_STACK_LEG, REPO
from tests.fake_nvidia import CUDA12, H100, gpu, lp_main_on_fake_gpus

GIB = 1 << 30
H100_80 = GpuInventory((gpu(0, H100, total_gib=80),))


def _set(config, key, value):
    node = config
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = value


def tiny_config(**changes):
    """make run's config (reacher_hard, distributed) at tiny sizes, learner on GPU 0."""
    config = make_config("reacher_hard", distributed=True)
    for key, value in {**tiny.OVERRIDES, **changes}.items():
        _set(config, key, value)
    return config


def sized(config, inventory=H100_80):
    """The plan of `config` on `inventory`, its replay store chosen and its memory reckoned."""
    from magi_lp.placement.plan import make_plan

    plan = make_plan(placement_requests(config), inventory, CUDA12)
    experiment = make_experiment(config)
    store = plan_replay_store(config, experiment.builder, plan, reverb_available=True)
    return size_gpu_memory(experiment, plan, store), store


# --- the arithmetic (no compile) --------------------------------------------------------


def need(group="learner", **sizes):
    values = {"state": 0, "compiled": 0, "batches": 0, "store": 0, **sizes}
    return memory_lib.MemoryNeed(group=group, compiled_on="cpu", program="p", **values)


def test_a_need_is_its_parts_plus_a_stated_margin_and_rounds_its_fraction_up():
    n = need(state=1 * GIB, compiled=2 * GIB, batches=GIB // 2, store=20 * GIB)
    assert n.subtotal == int(23.5 * GIB)
    assert n.margin == pytest.approx(memory_lib.MARGIN_FRACTION * n.subtotal, abs=1)
    assert need(state=1000).margin == memory_lib.MIN_MARGIN_BYTES  # the floor
    fraction = n.fraction_of(80 * GIB)
    assert fraction * 80 * GIB >= n.total > (fraction - memory_lib.FRACTION_STEP) * 80 * GIB
    assert "store 21.5 GB" in n.describe() and "margin 2.5 GB" in n.describe()


def test_make_plan_turns_auto_into_the_fraction_of_the_reckoning():
    requests = {"learner": GroupRequest(ResourceSpec(device="gpu", gpu_memory="auto"), 1)}
    unsized = make_plan(requests, H100_80, CUDA12)
    env = unsized.groups["learner"].env
    # Before a reckoning: on demand (never JAX's 75%), and said so.
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == ""
    assert any("'auto' was not reckoned" in n for n in unsized.notices)

    n = need(state=GIB, compiled=GIB, store=20 * GIB)
    plan = make_plan(requests, H100_80, CUDA12, memory={"learner": n})
    env = plan.groups["learner"].env
    assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == n.fraction_of(80 * GIB)
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    left = 80 * GIB - n.fraction_of(80 * GIB) * 80 * GIB - memory_lib.CUDA_CONTEXT_BYTES
    assert plan.memory_lines[0].endswith(f"left: {memory_lib.gb(left)}")
    assert "GPU memory, reckoned" in plan.format_table()

    with pytest.raises(ConfigError) as refused:  # more than the whole GPU
        make_plan(requests, H100_80, CUDA12, memory={"learner": need(store=90 * GIB)})
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith(
        "resources.learner.gpu_memory='auto': a learner node needs 106.3 GB of GPU memory"
    )
    assert "agent.replay_buffer_size" in str(refused.value)


def test_auto_keeps_the_store_off_a_gpu_that_fixed_fractions_fill():
    # Two GPU actors at 0.45 each leave 8.6 GB of the 85.9: not room for a 21.9 GB store.
    config = make_config("reacher_hard", distributed=True)
    config.num_actors = 2
    config.resources.learner.device = "gpu"
    config.resources.actor.device = "gpu"
    config.resources.actor.gpu_memory = 0.45
    config.resources.actor.preallocate = False
    plan = make_plan(placement_requests(config), H100_80, CUDA12)
    store = plan_replay_store(config, make_experiment(config).builder, plan, reverb_available=True)
    assert store.store == "reverb"
    assert "resources.learner.gpu_memory=auto (what the other nodes leave)" in store.line
    config.resources.actor.gpu_memory = 0.1  # 68.7 GB left: the device store fits
    config.replay.store = "auto"  # the first choice was written back
    plan = make_plan(placement_requests(config), H100_80, CUDA12)
    store = plan_replay_store(config, make_experiment(config).builder, plan, reverb_available=True)
    assert store.store == "device"


# --- reckoned from the programs, compiled on this CPU -------------------------------------


def shared_gpu_config(**changes):
    """Tiny, on one GPU: the learner 'auto', two GPU actors at a fraction far below their
    reckoning (0.001 of 80 GiB: 86 MB)."""
    config = tiny_config(**{"resources.learner.device": "gpu", **changes})
    config.num_actors = 2
    config.resources.actor.device = "gpu"
    config.resources.actor.gpus = [0]
    config.resources.actor.gpu_memory = 0.001
    config.resources.actor.preallocate = False
    return config


@pytest.fixture(scope="module")
def tiny_plan():
    return sized(shared_gpu_config())


@pytest.mark.integration
def test_the_learner_is_sized_from_its_compiled_update_and_its_store(tiny_plan):
    plan, store = tiny_plan
    learner = plan.memory["learner"]
    assert store.store == "device"
    # The store's bytes are FrameReplaySpec.nbytes (2 actors write), plus one staged insert.
    from magi_lp.replay.frame_store import staged_insert_bytes

    spec = make_experiment(tiny_config()).builder.frame_replay(None)
    staged = staged_insert_bytes(spec)
    assert learner.store == spec.nbytes(writers=2, shards=1) + staged == store.nbytes + staged
    assert learner.state > 0 and learner.compiled > 0 and learner.batches > 0
    assert learner.compiled_on.startswith("cpu, jax ")
    fraction = float(plan.groups["learner"].env["XLA_PYTHON_CLIENT_MEM_FRACTION"])
    assert fraction == learner.fraction_of(80 * GIB)
    assert plan.groups["learner"].memory_auto
    # The actors' policy step is compiled too: the parameters they pull, twice.
    actor = plan.memory["actor"]
    assert (
        actor.state > 0 and actor.compiled > 0 and actor.program == "policy step over 1 environment"
    )
    lines = plan.format_table().splitlines()
    at = lines.index(next(line for line in lines if line.startswith("GPU memory, reckoned")))
    assert lines[at + 1].startswith("  learner: ") and lines[at + 2].startswith("  actor: ")
    assert lines[at + 3].startswith("  GPU 0:NVIDIA H100 80GB HBM3: 85.9 GB; learner 1 x ")


@pytest.mark.integration
def test_a_fraction_below_the_reckoning_is_a_warning(tiny_plan):
    plan, _ = tiny_plan
    assert len(plan.warnings) == 1
    warning = plan.warnings[0]
    assert warning.startswith("resources.actor.gpu_memory=0.001 gives each actor node 86 MB")
    assert "below the" in warning and "gpu_memory='auto'" in warning
    assert plan.groups["actor"].env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.001"  # kept


@pytest.mark.integration
def test_the_reckoned_bytes_grow_with_the_batch(tiny_plan):
    small = tiny_plan[0].memory["learner"]
    big = sized(shared_gpu_config(**{"agent.batch_size": 64}))[0].memory["learner"]
    assert big.batches == 4 * small.batches  # batch 64 against tiny's 16
    assert big.compiled > small.compiled
    assert big.state == small.state and big.store == small.store

    # On a GPU smaller than that need by itself, the batch is refused in one line.
    config = shared_gpu_config(**{"agent.batch_size": 64})  # the same programs: no compile
    tiny_gpu = GpuInventory((gpu(0, H100, total_gib=0.25),))
    with pytest.raises(ConfigError) as refused:
        sized(config, tiny_gpu)
    message = str(refused.value)
    assert "\n" not in message
    # (Reverb serves the replay there: the need is the update's, without a store.)
    assert message.startswith("resources.learner.gpu_memory='auto': a learner node needs ")
    assert "(update at batch 64" in message
    assert "but GPU 0:NVIDIA H100 80GB HBM3 has 268 MB" in message
    assert "agent.batch_size" in message and "fewer nodes" not in message


def test_a_store_that_cannot_fit_beside_the_actors_is_refused_in_one_line():
    # A 20 GiB GPU, two GPU actors at 0.1 each: a 5M-transition store (16 GB) does not fit
    # what they leave; refused before any compile, naming the key and the fix.
    config = shared_gpu_config(**{"agent.replay_buffer_size": 5_000_000, "replay.store": "device"})
    config.resources.actor.gpu_memory = 0.1
    small_gpu = GpuInventory((gpu(0, H100, total_gib=20),))
    plan = make_plan(placement_requests(config), small_gpu, CUDA12)
    with pytest.raises(ConfigError) as refused:
        plan_replay_store(config, make_experiment(config).builder, plan, reverb_available=True)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("replay.store=device: the device replay store needs 16.0 GB")
    assert "gpu_memory=auto (what the other nodes leave)" in message
    assert "agent.replay_buffer_size=" in message


def test_environments_rendering_on_a_gpu_are_counted_in_what_is_left_of_it():
    # The 1-GPU layout's shape: the learner and two actors of 8 environments on GPU 0, the
    # actors rendering there through EGL, and a CPU evaluator rendering one environment on
    # it (render_gpu=0); a CPU actor group on Mesa's software EGL holds nothing there.
    requests = {
        "learner": GroupRequest(ResourceSpec(device="gpu", gpu_memory="auto", render="none"), 1),
        "actor": GroupRequest(ResourceSpec(device="gpu", gpu_memory="auto"), 2, renders=8),
        "evaluator": GroupRequest(ResourceSpec(device="cpu", render_gpu=0), 1, renders=1),
        "cpu_actor": GroupRequest(ResourceSpec(device="cpu"), 3, renders=8),
    }
    needs = {"learner": need(store=20 * GIB), "actor": need("actor", state=GIB // 4)}
    plan = make_plan(requests, H100_80, CUDA12, memory=needs)
    line = plan.memory_lines[0]
    renders = 17 * memory_lib.RENDER_CONTEXT_BYTES
    assert f"17 EGL render context(s) {memory_lib.gb(renders)}" in line, line
    fractions = needs["learner"].fraction_of(80 * GIB) + 2 * needs["actor"].fraction_of(80 * GIB)
    pools = fractions * 80 * GIB
    left = 80 * GIB - pools - 3 * memory_lib.CUDA_CONTEXT_BYTES - renders
    assert line.endswith(f"left: {memory_lib.gb(left)}"), line

    # They are counted in the fit too: a GPU that holds the pools and CUDA contexts but not
    # the render contexts is refused, naming them.
    tight = int(left) + memory_lib.RENDER_CONTEXT_BYTES  # used by other processes
    crowded = GpuInventory((gpu(0, H100, total_gib=80, used_gib=tight / GIB),))
    with pytest.raises(ConfigError) as refused:
        make_plan(requests, crowded, CUDA12, memory=needs)
    assert "17 EGL render context(s)" in str(refused.value)
    with pytest.raises(ValueError, match="renders"):
        GroupRequest(ResourceSpec(device="cpu"), 1, renders=-1)


@pytest.mark.integration
def test_nodes_that_do_not_fit_together_are_refused_naming_the_auto_node(tiny_plan):
    # The actors' fractions (0.49 each) pass the sum check beside the learner's 0.004, but
    # not with the reckoned learner and three CUDA contexts. The programs are tiny_plan's.
    config = shared_gpu_config()
    config.resources.actor.gpu_memory = 0.49
    plan = make_plan(placement_requests(config), H100_80, CUDA12)
    experiment = make_experiment(config)
    store = plan_replay_store(config, experiment.builder, plan, reverb_available=True)
    requests, result = compile_for_plan(make_experiment(shared_gpu_config()), plan)
    needs = needs_from(result, requests, experiment.builder, store)
    with pytest.raises(ConfigError) as refused:
        make_plan(placement_requests(config), H100_80, CUDA12, memory=needs)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("GPU 0:NVIDIA H100 80GB HBM3 has 85.9 GB but its nodes need 86.")
    assert "actor 2 x 42.1 GB, 3 CUDA context(s) 1.6 GB" in message
    learner = needs["learner"]
    assert f"learner node 0 needs {memory_lib.gb(learner.total)}" in message
    assert "fewer nodes on that GPU (num_actors, resources.actor.gpus)" in message


@pytest.mark.integration
def test_td3_is_reckoned_through_the_same_builder_protocol():
    import importlib.util

    from projects.td3 import experiment as td3

    spec = importlib.util.spec_from_file_location("td3_config", REPO / "configs/td3_cartpole.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.resources.learner.device = "gpu"
    config.resources.learner.gpu_memory = "auto"
    plan = make_plan(placement_requests(config), H100_80, CUDA12)
    plan = size_gpu_memory(td3.make_experiment(config), plan, None)
    learner = plan.memory["learner"]
    assert learner.store == 0 and learner.state > 0 and learner.compiled > 0
    # Host batches: the prefetch depth plus the updates in flight.
    assert learner.batches > 0
    assert plan.groups["learner"].env["XLA_PYTHON_CLIENT_MEM_FRACTION"] != ""


# --- the entry point: make run's config on a fake 80 GB H100 --------------------------------


# On the Launchpad stack the same command's lines are checked word for word against README's
# sample (tests/test_readme.py, `reckoning`): this leg alone saves a compile of the full update.
@CURRENT_STACK_LEG
@pytest.mark.integration
def test_dry_run_of_make_runs_config_shows_the_reckoning_on_a_fake_h100(tmp_path):
    result, workdir = lp_main_on_fake_gpus(tmp_path, ["--dry_run"], timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "replay: device store on the learner's device, 21.9 GB" in out
    lines = out.splitlines()
    learner_row = next(line for line in lines if line.startswith("learner"))
    assert "prealloc (auto)" in learner_row
    reckoned = next(line for line in lines if line.startswith("  learner: "))
    assert "store 21.9 GB" in reckoned and "update at batch 256" in reckoned
    total = float(reckoned.split()[1])
    assert 22.0 < total < 30.0  # the store, the update's working set, a 10% margin
    gpu_line = next(line for line in lines if line.startswith("  GPU 0:NVIDIA H100"))
    assert "left: " in gpu_line
    assert not workdir.exists()

    # A store bigger than the GPU leaves room for: one line, before anything starts.
    refused, _ = lp_main_on_fake_gpus(
        tmp_path,
        ["--config.replay.store=device", "--config.agent.replay_buffer_size=3000000"],
        timeout=300,
    )
    assert refused.returncode == 2, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "the device replay store needs 65.6 GB" in errors[0]
    assert "agent.replay_buffer_size=" in errors[0]
    assert not workdir.exists()
