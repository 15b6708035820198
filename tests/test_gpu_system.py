"""`make gpu-system` (benchmarks/gpu_system.py): the whole distributed DrQ-v2 on Ray, as it runs
on a GPU machine, here at its tiny size on the CPU (the same code path: the plan and its memory
reckoning, the update alone in the learner's env, lp_main.py --launcher ray for a while, SIGINT
to the driver, the run's files read), and the reading of a result on its own.

The tiny run is an integration test of the current stack (.venv312: Ray); HOME is a folder of
the test's own, where nothing may appear (Ray >= 2.59 would write ~/.ray), and every process
the run starts carries a marker, so that leftovers are found.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import uuid
from types import SimpleNamespace

import pytest

from benchmarks import gpu_system
from benchmarks import run as bench_run
from magi_lp.engines import ray_paths
from tests.e2e_utils import MARK_VAR, REPO, assert_no_leftovers, read_csv

# Every field the result must hold, dotted; None is a value only where the tiny run has no GPU.
FIELDS = (
    "status",
    "measured_at",
    "commit",
    "machine.gpu",
    "machine.driver",
    "machine.jax",
    "machine.jaxlib",
    "machine.torch",
    "machine.ray",
    "machine.python",
    "machine.stamp",
    "on",
    "settings.task",
    "settings.image_size",
    "settings.batch_size",
    "settings.replay_buffer_size",
    "settings.num_actors",
    "settings.envs_per_actor",
    "reckoning.state",
    "reckoning.table",
    "reckoning.groups",
    "update_alone.state",
    "update_alone.device_batch_per_second",
    "update_alone.updates_per_second",
    "update_alone.first_call_s",
    "update_alone.on",
    "driver.entry_point",
    "driver.egl_without_gpus.renders",
    "run.command",
    "run.exit_code",
    "run.up_s",
    "run.learning_began_s",
    "run.ran_s",
    "run.stop_s",
    "run.leftovers_killed",
    "run.ray_home_created",
    "run.nvml",
    "system.frames",
    "system.frames_per_s",
    "system.frames_per_s_whole_run",
    "system.updates_per_s",
    "system.actor_steps_per_s",
    "system.updates_allowed_per_s",
    "system.window_s",
    "system.nodes",
    "system.on",
    "learner.batch_wait_fraction_median",
    "where_time_goes.fed",
    "where_time_goes.verdict",
    "where_time_goes.why",
    "memory",
    "evaluations",
    "official_frames_per_s",
    "seconds",
)


def _field(result: dict, dotted: str):
    node = result
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, f"the result has no {dotted}"
        node = node[part]
    return node


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_tiny_run_measures_the_whole_system_and_leaves_nothing(tmp_path):
    pytest.importorskip("ray", reason="Ray is the current stack's engine (.venv312)")
    home = tmp_path / "home"
    home.mkdir()
    mark = uuid.uuid4().hex
    env = dict(os.environ, HOME=str(home), PYTHONUNBUFFERED="1", **{MARK_VAR: mark})
    env.pop("RAY_ADDRESS", None)
    out, workdir = tmp_path / "gpu_system.json", tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_system", "--tiny", "--out", str(out),
         "--workdir", str(workdir), "--driver", "wrapper"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    print(output[-2500:])
    result = json.loads(out.read_text())
    for dotted in FIELDS:
        _field(result, dotted)
    assert result["status"] == "tiny" and result["settings"]["mode"] == "tiny"
    # The driver a GPU machine without Mesa's EGL gets (lp_main.py itself is
    # tests/test_ray_engine.py's); the check of EGL with the GPUs hidden ran.
    assert result["driver"]["entry_point"] == "benchmarks/gpu_system_lp_main.py"
    assert "gpu_system_lp_main.py" in result["run"]["command"]
    assert isinstance(result["driver"]["egl_without_gpus"]["renders"], bool)
    # The update alone ran, and so did the whole system, with the learner updating.
    assert result["update_alone"]["state"] == "done", result["update_alone"]
    assert result["update_alone"]["device_batch_per_second"] > 0
    system = result["system"]
    assert system["state"] == "done", system
    assert (
        system["frames"] > 0 and system["frames_per_s"] > 0 and system["frames_per_s_whole_run"] > 0
    )
    assert system["learner_steps"] >= 1 and system["updates_per_s"] > 0, system
    learner_rows = read_csv(workdir / "logs" / "learner" / "logs.csv")
    assert learner_rows and math.isfinite(float(learner_rows[-1]["critic_loss"]))
    assert set(system["nodes"]) >= {"learner/0", "actor/0", "evaluator/0", "replay/0"}
    assert result["where_time_goes"]["fed"] > 0 and result["where_time_goes"]["why"]
    # Evaluations were read and set beside the official curve.
    assert result["evaluations"], "no evaluation was read"
    assert all("official_mean" in e for e in result["evaluations"])
    # The stop: SIGINT ended the run by its tiers, nothing was left, nothing written to HOME.
    run = result["run"]
    assert run["exit_code"] == 0 and not run["killed_after_notice"], run["output_tail"]
    assert run["leftovers_killed"] == [] and run["ray_home_created"] is False
    assert "received SIGINT" in run["output_tail"]
    assert_no_leftovers(mark)
    assert not any(home.iterdir()), f"files in HOME: {list(home.rglob('*'))}"
    # Its reading renders (the page renders only a GPU result; the words are the same).
    assert "fed" in gpu_system.report(result) and "fed" in gpu_system.summary(result)[2]
    # And through the page, as a stored GPU result: the run's own block (its command, its
    # stop) is rendered, not the page's metadata of the same name.
    stored = tmp_path / "gpu_system_stored.json"
    stored.write_text(json.dumps({**result, "status": "ok"}))
    figure = bench_run.Figure("gpu_system", "benchmarks.gpu_system", 0, 0, stored=str(stored))
    section = bench_run._section(15, figure, bench_run.stored_result(figure))
    assert f"`{result['run']['command']}`" in section, section[:1500]
    assert f"stopped by SIGINT after {run['ran_s']:.0f} s" in section, section[:1500]


_CONFIG = SimpleNamespace(
    agent=SimpleNamespace(update_every_steps=2), env=SimpleNamespace(action_repeat=2)
)


@pytest.mark.parametrize(
    ("updates", "allowed", "wait", "verdict", "bound"),
    [
        (225.0, 300.0, 0.05, "fed", "the learner's update"),
        (100.0, 104.0, 0.80, "starved by the actors (replay ratio)", "the actors"),
        (60.0, 150.0, 0.70, "starved by replay sampling", "the relay"),
        (60.0, 150.0, 0.10, "slowed in the learner's own loop", "the learner's loop"),
    ],
)
def test_where_the_time_goes_names_what_holds_the_learner(updates, allowed, wait, verdict, bound):
    system = {"updates_per_s": updates, "updates_allowed_per_s": allowed,
              "actor_steps_per_s": 2 * allowed}  # fmt: skip
    learner = {"batch_wait_fraction_median": wait}
    where = gpu_system.where_time_goes(system, 230.0, learner, _CONFIG)
    assert where["verdict"] == verdict, where
    assert where["bound"].startswith(bound), where
    assert where["fed"] == pytest.approx(updates / 230.0)
    assert where["frames_per_s_to_feed"] == pytest.approx(230.0 * 2 * 2)


def test_memory_is_set_beside_the_reckoning_of_its_group():
    reckoning = {
        "groups": {
            "actor": {
                "with_context_bytes": 1100 * 2**20,
                "preallocated": False,
                "fraction": 0.02,
            }
        }
    }
    system = {"nodes": {"actor/0": {"gpu_peak_mib": 1000.0}, "counter/0": {"gpu_peak_mib": None}}}
    memory = gpu_system.memory_against_reckoning(reckoning, system)
    assert memory["actor/0"]["reckoned_over_measured"] == pytest.approx(0.10)
    assert memory["actor/0"]["within_goal"] is True
    assert "reckoned_mib" not in memory["counter/0"]


def test_render_contexts_count_where_a_node_renders_through_egl_on_a_gpu():
    from magi_lp.placement.gpu_inventory import GpuInventory
    from magi_lp.placement.memory import RENDER_CONTEXT_BYTES
    from magi_lp.placement.plan import GroupRequest, make_plan
    from magi_lp.placement.resources import ResourceSpec
    from tests.fake_nvidia import CUDA12, H100, gpu

    # The 1-GPU layout's shape on a fake H100: GPU actors rendering there, a CPU evaluator
    # rendering on GPU 0, CPU actors on Mesa's software EGL, a learner that renders nothing.
    requests = {
        "learner": GroupRequest(ResourceSpec(device="gpu", gpu_memory=0.5, render="none"), 1),
        "actor": GroupRequest(ResourceSpec(device="gpu", gpu_memory=0.1), 2, renders=8),
        "evaluator": GroupRequest(ResourceSpec(device="cpu", render_gpu=0), 1, renders=1),
        "mesa": GroupRequest(ResourceSpec(device="cpu"), 1, renders=8),
    }
    plan = make_plan(requests, GpuInventory((gpu(0, H100, total_gib=80),)), CUDA12)
    groups = plan.groups
    assert gpu_system.render_bytes(groups["actor"], 8) == 8 * RENDER_CONTEXT_BYTES
    assert gpu_system.render_bytes(groups["evaluator"], 1) == RENDER_CONTEXT_BYTES
    assert gpu_system.render_bytes(groups["mesa"], 8) == 0
    assert gpu_system.render_bytes(groups["learner"], 8) == 0


def test_the_config_is_the_papers_task_in_the_one_gpu_layout():
    config = gpu_system.get_config("gpu")
    layout = gpu_system._layout()
    assert (config.env.domain, config.env.task) == ("cartpole", "balance")
    assert config.env.image_size == 84 and config.agent.batch_size == 256
    assert config.agent.replay_buffer_size == 1_000_000
    assert config.num_actors == layout.num_actors and config.envs_per_actor == layout.envs_per_actor
    assert (
        config.resources.learner.device == "gpu" and config.resources.learner.gpu_memory == "auto"
    )
    assert config.resources.actor.to_dict() == layout.resources.actor.to_dict()
    tiny = gpu_system.get_config("tiny")
    assert tiny.env.image_size == 32 and tiny.resources.learner.device == "gpu_if_available"


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_one_gpu_layouts_nodes_all_get_a_place_on_ray(tmp_path):
    """On one GPU the learner and both actors see GPU 0: the Ray engine gives each a share
    of it (a whole GPU each left the first actor pending for ever, before any node was up);
    an embedded Ray with one GPU places them all."""
    pytest.importorskip("ray", reason="Ray is the current stack's engine (.venv312)")
    from magi_lp.engines import ray_driver
    from magi_lp.placement.gpu_inventory import GpuInventory
    from magi_lp.placement.plan import make_plan
    from magi_lp.runtime.config import placement_requests
    from tests.fake_nvidia import CUDA12, H100, gpu

    config = gpu_system.get_config("gpu")
    # Figure 15's counts (the layout's 'auto' is sized per machine: the shares' rule is the
    # same for any count).
    config.num_actors, config.envs_per_actor = gpu_system.FIGURE_15_ACTORS
    inventory = GpuInventory((gpu(0, H100, total_gib=80),), driver_version="580.159.04")
    plan = make_plan(placement_requests(config), inventory, CUDA12)
    envs = [
        plan.envs()[plan.launch_group(group, index)]
        for group, count in (("learner", 1), ("actor", config.num_actors), ("evaluator", 1))
        for index in range(count)
    ]
    shares = ray_driver._gpu_requests(envs)
    # The evaluator acts on the CPU and renders on GPU 0 (EGL): a fourth sharer.
    assert shares == [0.25] * (2 + config.num_actors), shares
    home = tmp_path / "home"
    home.mkdir()
    session = ray_paths.run_temp_folder("gs_ray_")  # Ray's socket paths must stay short
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PLACE_ON_RAY, session, *map(str, shares)],
            cwd=REPO, env=dict(os.environ, HOME=str(home)), capture_output=True, text=True,
            timeout=240,
        )  # fmt: skip
    finally:
        shutil.rmtree(session, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == f"placed={len(shares)}", done.stdout[-2000:]
    assert not any(home.iterdir()), list(home.rglob("*"))
    assert ray_driver._gpu_requests([{"CUDA_VISIBLE_DEVICES": "1,2"}, {}]) == [2, 0]


_PLACE_ON_RAY = """
import sys, ray
from magi_lp.engines import ray_seam
ray_seam.use_run_token()  # as the engine does: no ~/.ray/auth_token
ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, _temp_dir=sys.argv[1],
         _node_ip_address="127.0.0.1", configure_logging=False, log_to_driver=False)

@ray.remote
class Node:
    def ping(self):
        return 1

nodes = [Node.options(num_cpus=0, num_gpus=float(s)).remote() for s in sys.argv[2:]]
ready, _ = ray.wait([n.ping.remote() for n in nodes], num_returns=len(nodes), timeout=120)
ray.shutdown()
print(f"placed={len(ready)}")
"""


def test_the_reckoning_compiles_the_learner_where_its_spec_can_render():
    """The reckoning compiles in the learner's env, whose MUJOCO_GL is 'off' (it renders
    nothing), but the throwaway environment that gives the spec renders once: it gets EGL."""
    from magi_lp.placement.gpu_inventory import GpuInventory
    from magi_lp.placement.plan import make_plan
    from magi_lp.runtime import memory_reckoning
    from magi_lp.runtime.config import placement_requests
    from tests.fake_nvidia import CUDA12, H100, gpu

    config = gpu_system.get_config("gpu")
    # Figure 15's counts (the layout's 'auto' is sized per machine: the shares' rule is the
    # same for any count).
    config.num_actors, config.envs_per_actor = gpu_system.FIGURE_15_ACTORS
    inventory = GpuInventory((gpu(0, H100, total_gib=80),), driver_version="580.159.04")
    plan = make_plan(placement_requests(config), inventory, CUDA12)
    learner = plan.launch_group("learner", 0)
    assert plan.envs()[learner]["MUJOCO_GL"] == "off"
    env = memory_reckoning._child_env(plan, learner)
    assert (env["MUJOCO_GL"], env["PYOPENGL_PLATFORM"]) == ("egl", "egl")
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
