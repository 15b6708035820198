"""Bad input to the entry points: one line naming the key and the fix, exit 2, nothing spawned."""

from __future__ import annotations

import pytest

from tests.e2e_utils import marked_processes, run_entry_point

CONFIG = "configs/td3_cartpole.py"
SCRIPT = "projects/td3/lp_main.py"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "--config is required"),
        (["--config", "configs/no_such_config.py"], "no such file"),
        (["--config", CONFIG, "--config.num_actor=3"], "Did you mean num_actors?"),
        (["--config", CONFIG, "--config.num_actors=abc"], "--config.num_actors=abc"),
        (["--config", CONFIG, "--config.num_actors=0"], "num_actors must be an integer >= 1"),
        (["--config", CONFIG, "--config.isolation=maybe"], "isolation must be"),
        (["--config", CONFIG, "--config.resources.actor.cpu_threads=0"], "resources.actor"),
        (["--config", CONFIG, "--config.resources.learner.device=gpu"], "no GPU was found"),
        (["--config", CONFIG, "--config.resources.learner.device=tpu"], "resources.learner"),
        (
            ["--config", CONFIG, "--config.resources.actor.gpu_memroy=0.5"],
            "Did you mean resources.actor.gpu_memory?",
        ),
        (["--config", CONFIG, "--config.env.no_such_key=1"], "env has no key 'no_such_key'"),
        (["--config", CONFIG, "--workdir", "/etc/hostname"], "--workdir"),
        (["--config", CONFIG, "--no_such_flag"], "no_such_flag"),
        (["--config", "configs/reacher_hard.py:foo"], "'foo' is not a mode"),
        (["--config", CONFIG, "--config.envs_per_actor=0"], "envs_per_actor must be an integer"),
        (
            ["--config", CONFIG, "--config.debug.check_device=True"],
            "Did you mean debug.check_devices?",
        ),
        (
            ["--config", CONFIG, "--config.resources.learner.cpu_devices=3"],
            "agent.batch_size=256 does not split evenly over the 3 devices of learner",
        ),
    ],
)
def test_bad_input_gets_one_clear_line(args, expected, tmp_path):
    mark = "cli-errors"
    if "--workdir" not in args and args:
        args = [*args, "--workdir", str(tmp_path / "run")]
    result = run_entry_point(SCRIPT, args, timeout=60, mark=mark)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "nodes").exists(), "a process was started"
    assert not marked_processes(mark)


def test_dry_run_prints_the_plan_and_spawns_nothing(tmp_path):
    result = run_entry_point(
        SCRIPT,
        ["--config", CONFIG, "--workdir", str(tmp_path), "--dry_run", "--config.num_actors=3"],
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    for group in ("replay", "counter", "learner", "actor", "evaluator", "coordinator"):
        assert group in result.stdout
    assert "3 (0-2)" in result.stdout or "3 (0,1,2)" in result.stdout, result.stdout
    assert "JAX_PLATFORMS=cpu" in result.stdout
    assert "network isolation:" in result.stdout
    assert "device split: acpu-lcpu " in result.stdout
    assert not (tmp_path / "nodes").exists()


def test_every_resource_key_is_overridable_in_every_project(tmp_path):
    """TD3's config lists every ResourceSpec field (the toolkit's defaults), so any
    resource key can be set from the command line; the plan shows the result."""
    result = run_entry_point(
        SCRIPT,
        [
            "--config",
            CONFIG,
            "--workdir",
            str(tmp_path),
            "--dry_run",
            "--config.resources.learner.cpu_threads=3",
            "--config.resources.actor.xla_flags=--xla_dump_to=/tmp/x",
        ],
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "OMP_NUM_THREADS=3" in result.stdout
    assert "--xla_dump_to=/tmp/x" in result.stdout
