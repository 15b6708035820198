"""The GPU check (benchmarks/gpu_check/). This machine has no GPU: the check's no-GPU path
runs for real; its GPU paths run with an injected one-GPU inventory, a fake NVML process list
and the workers' JAX on the CPU (fakes for the GPU only; the plan, the worker processes and
their DrQ-v2 workloads are real).

The two tests that run the check's workers end to end run in `make test`'s current-stack leg
(.venv312), the stack the GPU machine has; the rest run in both legs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import cli, parts, settings
from magi_lp.placement import jax_build as jax_build_module
from magi_lp.placement import plan as plan_module
from magi_lp.placement.gpu_inventory import GpuInfo, GpuInventory
from magi_lp.placement.jax_build import CudaPlugin, JaxBuild
from tests.e2e_utils import CURRENT_STACK_LEG, run_python
from tests.fake_nvidia import env_with, write_fake_pynvml

REPO = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"
BLOCKED = ("tensorflow", "reverb", "launchpad", "acme", "dm_env", "dm_control")

# A meta-path hook that makes the packages a GPU machine lacks unimportable.
_BLOCKER = f"""
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is blocked: the GPU machine does not have it")
        return None
sys.meta_path.insert(0, _Blocker())
"""


@CURRENT_STACK_LEG  # the GPU machine's stack: Python 3.12 without TF/Reverb/Launchpad
@pytest.mark.integration  # a fresh interpreter runs the check's workloads, ~25 s
def test_check_and_its_workloads_run_without_tf_reverb_launchpad_acme(tmp_path):
    """Everything gpu_check imports loads with those packages blocked, and the learner and
    actor workloads (the real DrQ-v2 update and policy, paper-sized networks, tiny images)
    run on the CPU."""
    code = (
        _BLOCKER
        + f"""
import json
from benchmarks.gpu_check import cli, parts, workloads
from benchmarks.gpu_check import plan as check_plan
from magi_lp.placement.gpu_inventory import GpuInfo, GpuInventory
inventory = GpuInventory((GpuInfo(0, "0:1", "{H100}", 80 * 2**30, 0, 0.0),), "", "560.35.03", 12060)
plan = check_plan.make_plan(check_plan.load_config(num_actors=2), inventory)
learner = workloads.run_learner({str(tmp_path / "l.json")!r}, 2, 16, 0.2)
actor = workloads.run_actor({str(tmp_path / "a.json")!r}, 16, 0.2)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
print(json.dumps({{"groups": list(plan.groups), "learner": learner, "actor": actor,
                  "loaded": loaded}}))
"""
    )
    out = run_python(code, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert result["groups"] == ["replay", "counter", "learner", "actor", "evaluator", "coordinator"]
    assert result["learner"]["backend"] == "cpu" and result["learner"]["updates_timed"] >= 2
    assert result["learner"]["updates_per_second"] > 0
    assert result["actor"]["steps_per_second"] > 0
    assert json.loads((tmp_path / "l.json").read_text())["state"] == "ready"


def _run_check(tmp_path, *args, nvml=None, via_make=False):
    nvml_dir = write_fake_pynvml(tmp_path / "nvml", **(nvml or {"init_error": "Driver Not Loaded"}))
    env = env_with(pythonpath=[nvml_dir, REPO])
    out = tmp_path / "gpu_check.json"
    if via_make:
        command = [
            "make", "-s", "gpu-check", f"GPU_CHECK_PYTHON={sys.executable}",
            f"GPU_CHECK_ARGS=--out {out} {' '.join(args)}",
        ]  # fmt: skip
    else:
        command = [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(out), *args]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return result, out


def test_make_gpu_check_without_a_gpu_says_so_in_one_line_and_exits_0(tmp_path):
    result, out = _run_check(tmp_path, via_make=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == (
        "gpu_check: no GPU (NVML is unavailable: Driver Not Loaded (no NVIDIA driver here?)); "
        f"nothing to measure here (wrote {out})"
    )
    saved = json.loads(out.read_text())
    assert saved["status"] == "skipped" and saved["reason"].startswith("no GPU (NVML")
    assert saved["machine"]["gpu"] == "none"


def test_a_measured_result_is_never_replaced_by_a_skipped_one(tmp_path):
    out = tmp_path / "gpu_check.json"
    out.write_text(json.dumps({"status": "ok", "measured": "on a GPU"}))
    result, _ = _run_check(tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip().endswith(f"(kept the measured result in {out})")
    assert json.loads(out.read_text()) == {"status": "ok", "measured": "on a GPU"}


@pytest.mark.skipif(jax_build_module.detect_jax_build().serves_cuda, reason="CUDA JAX here")
def test_a_gpu_with_cpu_only_jax_is_one_line_and_exit_1(tmp_path):
    result, out = _run_check(tmp_path, nvml={"gpus": [(H100, 80)]})
    assert result.returncode == 1
    (line,) = result.stdout.strip().splitlines()
    assert line.startswith(f"gpu_check: GPU 0:{H100} found, but this Python's JAX cannot use it")
    assert "make setup JAX=cuda12" in line
    assert json.loads(out.read_text())["status"] == "error"


def test_actor_counts_and_fits():
    assert parts.actor_counts(8) == [1, 2, 4, 8]
    assert parts.actor_counts(6) == [1, 2, 4, 6]
    assert parts.actor_counts(1) == [1]
    assert parts.largest_fit(10_000, 300) == 33
    assert parts.largest_fit(100, 300) == 0
    assert parts.largest_fit(10_000, 0.0) is None  # CPU actors: no GPU limit


class _FakeProcesses:
    """NVML's process list for a machine without a GPU: a worker 'holds' the MiB its env
    says (FAKE_GPU_MIB, set by the test's env hook from what the plan gave it)."""

    def __init__(self, used_mib):
        self.used = used_mib

    def by_pid(self):
        usage = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for item in environ:
                if item.startswith(b"FAKE_GPU_MIB="):
                    usage[int(entry.name)] = float(item.split(b"=", 1)[1])
        return usage

    def used_mib(self):
        return [self.used]

    def close(self):
        pass


def _on_the_cpu(env, role):
    """What the fake GPU 'sees' in a worker: the plan's JAX platform (JAX_PLATFORMS unset:
    JAX's default, the GPU); the worker itself then runs on this machine's CPU."""
    wants_gpu = env.get("JAX_PLATFORMS", "") in ("", "cuda,cpu")
    renders_on_gpu = role == "render" and env.get("CUDA_VISIBLE_DEVICES")
    mib = {"learner": 1500.0, "render": 40.0}.get(role, 300.0)
    if wants_gpu or renders_on_gpu:
        env["FAKE_GPU_MIB"] = str(mib)
    env["JAX_PLATFORMS"] = "cpu"
    env["MUJOCO_GL"], env["PYOPENGL_PLATFORM"] = "egl", "egl"
    return env


@CURRENT_STACK_LEG  # the GPU machine's stack; the slowest test here, ~150 s on a busy 2 cores
@pytest.mark.integration  # the check's worker processes, each importing JAX
def test_gpu_paths_with_an_injected_gpu(tmp_path, monkeypatch):
    cuda12 = JaxBuild("0.4.30", (CudaPlugin("jax_plugins.xla_cuda12", 12, "0.4.30"),))
    monkeypatch.setattr(plan_module, "detect_jax_build", lambda: cuda12)
    monkeypatch.setattr(jax_build_module, "detect_jax_build", lambda: cuda12)
    gpu = GpuInfo(0, "00000000:01:00.0", H100, 80 * 1024**3, 500 * 1024**2, 0.0)
    inventory = GpuInventory((gpu,), "", "560.35.03", 12060)
    sizes = {
        "batch": 2, "image": 16, "render_size": 16, "max_actors": 1, "tiny_net": True,
        "learner_seconds": 0.5, "render_seconds": 0.5, "sample_every_s": 0.05,
    }  # fmt: skip
    result = parts.run_check(
        settings.PARTS, sizes, inventory, _FakeProcesses(500.0), _on_the_cpu, tmp_path
    )
    # The plan of configs/reacher_hard_distributed.py on one H100 with CUDA JAX.
    groups = result["plan"]["groups"]
    assert groups["learner"]["device"] == "gpu" and groups["learner"]["jax_backend"] == "cuda"
    assert groups["actor"]["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "JAX build: jaxlib 0.4.30 + jax-cuda12-plugin 0.4.30" in result["plan"]["table"]
    assert result["inventory"]["driver"] == "560.35.03"

    learner = result["learner"]
    assert learner["state"] == "done" and learner["updates_per_second"] > 0
    assert learner["env"]["JAX_PLATFORMS"] == "cuda,cpu" and learner["gpu_mib"] == 1500.0
    node = result["cpu_node"]
    assert node["state"] == "done" and node["device"] == "cpu"
    assert node["gpu_mib"] == 0.0 and node["listed_by_nvml"] is False

    memory = result["memory"]
    planned, defaults, gpu_actors = (memory[v] for v in settings.VARIANTS)
    assert planned["env"]["actor"]["JAX_PLATFORMS"] == "cpu" and defaults["env"]["actor"] is None
    assert [s["actors"] for s in planned["steps"]] == [0, 1]
    assert planned["steps"][-1]["actor_mib"] == [0.0] and planned["largest_n_ran"] == 1
    assert planned["largest_n_computed"] is None  # CPU actors: no GPU memory limit
    assert [step["learner_mib"] for step in defaults["steps"]] == [1500.0, 1500.0]
    assert defaults["per_actor_mib"] == 300.0 and defaults["learner_mib"] == 1500.0
    free = 80 * 1024 - 500.0 - 1500.0
    assert defaults["free_after_learner_mib"] == free
    assert defaults["largest_n_computed"] == int(free // 300.0)
    assert gpu_actors["env"]["actor"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.05"
    assert gpu_actors["env"]["actor"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert gpu_actors["plan_admits"] == 10  # (1 - 0.5) / 0.05
    assert all(run["failure"] is None for run in (planned, defaults, gpu_actors))

    render = result["render"]
    assert render["state"] == "done" and render["frames"] >= 10 and render["pixels_changed"]
    assert render["env"]["CUDA_VISIBLE_DEVICES"] == "0" and render["env"]["JAX_PLATFORMS"] == "cpu"
    assert render["gpu_mib"] == 40.0

    # The 1-GPU shared layout: learner and two batched GPU actors at once, the plan's envs.
    shared = result["shared"]
    assert shared["device_split"] == "a0-l0" and shared["envs_per_actor"] == 8
    # gpu_memory='auto', sized from the compiled programs as lp_main sizes it.
    assert 0.25 < shared["fractions"]["learner"] < 0.35  # mostly the 21.9 GB store
    assert 0 < shared["fractions"]["actor"] < 0.01
    assert shared["learner"]["state"] == "done" and shared["learner"]["updates_per_second"] > 0
    assert len(shared["actors"]) == 1  # the layout's 2 actors, capped by max_actors
    for actor in shared["actors"]:
        assert actor["state"] == "done" and actor["envs"] == 8
        assert actor["actions_per_second"] == pytest.approx(8 * actor["steps_per_second"])
        assert actor["gpu_mib"] == 300.0  # the fake NVML: it was planned on the GPU

    page = gpu_check.report(
        {"status": "ok", "machine": cli.machine_facts(inventory), "measured_at": "now",
         "commit": "abc", **result}
    )  # fmt: skip
    assert "largest N the GPU holds (computed" in page
    assert "| defaults | 1 | 1,500 | 300 | yes |" in page
    assert "the plan's fractions admit 10" in page
    assert "**1-GPU shared layout** (`configs/reacher_hard_gpu_layouts.py:1gpu`, `a0-l0`)" in page


def test_benchmarks_page_says_not_measured_without_a_gpu_result(tmp_path):
    from benchmarks import run

    missing = dataclasses.replace(run.BY_NAME["gpu_check"], stored=str(tmp_path / "none.json"))
    result = run.stored_result(missing)
    assert result["status"] == "skipped"
    assert result["reason"] == "not measured: no GPU machine was available"
    section = run._section(7, missing, result)
    assert section.endswith("**not measured: no GPU machine was available**")


# --- the reckoning part: gpu_memory='auto' against the measured peaks ----------------------


def test_reckoning_report_says_reckoned_against_measured_per_process():
    from benchmarks.gpu_check import reckoning

    row = {
        "ran": True,
        "error": None,
        "reckoned_bytes": 24.4e9,
        "reckoned_with_context_bytes": 24.9e9,
        "fraction": 0.29,
        "nvml_peak_bytes": 23.0e9,
        "jax_peak_bytes": 22.4e9,
        "above_nvml": 24.9 / 23.0 - 1,
        "above_jax": 24.4 / 22.4 - 1,
        "how": "learner: ...",
    }
    result = {
        "state": "done",
        "goal_above": 0.15,
        "layouts": {
            "make_run": {"state": "done", "store": None, "groups": {"learner": row}},
            "1gpu": {"state": "refused", "error": "GPU 0 ... lower it with ..."},
        },
    }
    lines = reckoning.report_lines(result)
    assert lines[0].startswith("**Memory reckoning**")
    assert lines[1] == (
        "- make_run, learner: ran at 0.29; reckoned 24.90 GB, NVML peak 23.00 GB (+8%); "
        "JAX peak 22.40 GB (+9%)"
    )
    assert lines[2].startswith("- 1gpu: refused: ")
    assert reckoning.report_lines({"state": "skipped", "reason": "needs a real GPU"}) == [
        "**Memory reckoning**: needs a real GPU"
    ]


@pytest.mark.integration
def test_reckoning_worker_runs_the_learner_on_its_store_on_the_cpu(tmp_path):
    """The worker's real work (a device store sized as the plan sizes it, the learner's
    updates through the builder) at tiny sizes, on the CPU."""
    status = tmp_path / "learner.json"
    tiny = {
        "env.image_size": 32,
        "agent.batch_size": 16,
        "agent.feature_dim": 8,
        "agent.hidden_dim": 32,
        "agent.encoder_channels": 8,
        "agent.replay_buffer_size": 1000,
    }
    sets = [arg for key, value in tiny.items() for arg in ("--set", f"{key}={value}")]
    env = env_with({**os.environ, "JAX_PLATFORMS": "cpu", "MUJOCO_GL": "egl"}, pythonpath=[REPO])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check.reckoning",
            "--worker",
            "learner",
            "make_run",
            str(status),
            "0",
            *sets,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(status.read_text())["state"] == "done"
