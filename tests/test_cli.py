"""Bad input to the entry points: one line naming the key and the fix, exit 2, nothing spawned."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from magi_lp import cli
from magi_lp.errors import ConfigError
from magi_lp.placement.jax_build import JaxBuild, detect_jax_build
from tests.e2e_utils import REPO, marked_processes, run_entry_point

CONFIG = "configs/td3_cartpole.py"
SCRIPT = "projects/td3/lp_main.py"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # The example is the entry script's own (TD3's docstring runs td3_cartpole.py).
        ([], "--config is required; e.g. --config configs/td3_cartpole.py"),
        (
            ["--config.max_actor_steps=300"],
            "--config.max_actor_steps: it overrides a key of the config file, and no --config "
            "was given; give the file too, e.g. --config configs/td3_cartpole.py "
            "--config.max_actor_steps=...",
        ),
        (["--config", "configs/no_such_config.py"], "no such file; pick one from configs/"),
        (
            ["--config", "configs/reacher_hard_distribted.py"],
            "no such file; did you mean configs/reacher_hard_distributed.py?",
        ),
        (
            ["--config", CONFIG, "--config.num_actor=3"],
            "no config key num_actor; did you mean num_actors?",
        ),
        # What the flag parser cannot read as the key's kind: what it takes, and an example
        # (before: "invalid literal for int() with base 10: 'abc'. See --helpfull.").
        (
            ["--config", CONFIG, "--config.seed=abc"],
            "seed must be an integer, got 'abc'; e.g. --config.seed=0 (the config",
        ),
        # 'auto' or a number: any other word is refused by the config's checks.
        (
            ["--config", CONFIG, "--config.num_actors=abc"],
            "num_actors must be 'auto' (sized to the machine) or an integer >= 1, got 'abc'; "
            "e.g. --config.num_actors=1 (the default)",
        ),
        (
            ["--config", CONFIG, "--config.logging.csv=maybe"],
            "logging.csv must be True or False, got 'maybe'; e.g. --config.logging.csv=True",
        ),
        (
            ["--config", CONFIG, "--config.resources.learner=cpu"],
            "resources.learner must be a section, set one key at a time, got 'cpu'; e.g. "
            "--config.resources.learner.device=...",
        ),
        (["--config", CONFIG, "--config.num_actors=0"], "num_actors must be 'auto' (sized to"),
        (["--config", CONFIG, "--config.isolation=maybe"], "isolation must be"),
        (["--config", CONFIG, "--config.resources.actor.cpu_threads=0"], "resources.actor"),
        (["--config", CONFIG, "--config.resources.learner.device=gpu"], "no GPU was found"),
        (["--config", CONFIG, "--config.resources.learner.device=tpu"], "resources.learner"),
        (
            ["--config", CONFIG, "--config.resources.actor.gpu_memroy=0.5"],
            "did you mean resources.actor.gpu_memory?",
        ),
        (["--config", CONFIG, "--config.env.no_such_key=1"], "env has no key 'no_such_key'"),
        # Said in absl's words: "('Non-boolean argument to boolean flag', 'maybe')".
        (
            ["--config", CONFIG, "--dry_run=maybe"],
            "--dry_run=maybe: it is a switch; give --dry_run alone (or --nodry_run)",
        ),
        (["--config", "configs"], "--config configs: a folder, not a file"),
        (
            ["--config", CONFIG, "--config.resources.learner.device=GPU"],
            "got 'GPU'; did you mean 'gpu'? (lower case)",
        ),
        # An empty mapping: the fix offered a key of it ("its keys: "), and then that refused.
        (
            ["--config", CONFIG, "--config.resources.actor.env=A=1"],
            "resources.actor.env must be a mapping set in the config file, got 'A=1'; set it "
            "there, e.g. config.resources.actor.env = {'NAME': 'value'}",
        ),
        # ml_collections joined them: networks of (32, 32, 16, 16), without a word.
        (
            [
                "--config",
                CONFIG,
                "--config.agent.hidden_sizes=(32,32)",
                "--config.agent.hidden_sizes=(16,16)",
            ],
            "--config.agent.hidden_sizes is given 2 times ((32,32), then (16,16)): the values of "
            "a sequence are joined, not replaced (it would be (32, 32, 16, 16)); give it once",
        ),
        # DrQ-v2's config given to TD3: "agent.action_clamp_eps is not a known config key".
        (
            ["--config", "configs/reacher_hard_distributed.py", "--dry_run"],
            "keys are not this project's (action_clamp_eps, adam_eps, augmentation_pad, "
            "critic_target_tau, ...): its keys are actor_steps_per_update, batch_size,",
        ),
        (["--config", CONFIG, "--workdir", "/etc/hostname"], "--workdir"),
        # Found only after the isolated re-run and the heavy imports before.
        (
            ["--config", CONFIG, "--workdir", "/etc/hostname/run"],
            "--workdir /etc/hostname/run cannot be created: /etc/hostname is a file",
        ),
        (["--config", CONFIG, "--workdir", ""], "--workdir is empty; name a folder"),
        (["--config", CONFIG, "--no_such_flag"], "no_such_flag"),
        # nan turned the status lines off; a negative number was taken as it came
        (["--config", CONFIG, "--status_every=nan"], "--status_every=nan: must be a number"),
        (["--config", "configs/reacher_hard.py:foo"], "'foo' is not a mode"),
        # The agent's own checks (ISSUE 11: these crashed or misled the learner after start).
        (["--config", CONFIG, "--config.agent.batch_size=0"], "agent.batch_size must be"),
        (["--config", CONFIG, "--config.agent.discount=1.5"], "agent.discount must be"),
        (["--config", CONFIG, "--config.agent.n_step=0"], "agent.n_step must be"),
        (["--config", CONFIG, "--config.agent.learning_rate=-1"], "agent.learning_rate must"),
        (["--config", CONFIG, "--config.agent.hidden_sizes=(0,)"], "agent.hidden_sizes must"),
        (["--config", CONFIG, "--config.env.domain=foo"], "is not a dm_control suite task"),
        (
            ["--config", "configs/reacher_hard_distributed.py:distributed"],
            "get_config() takes no argument",
        ),
        (["--config", CONFIG, "--config.envs_per_actor=0"], "envs_per_actor must be 'auto' (sized"),
        (
            ["--config", CONFIG, "--config.debug.check_device=True"],
            "did you mean debug.check_devices?",
        ),
        (
            ["--config", CONFIG, "--config.resources.learner.cpu_devices=3"],
            "agent.batch_size=256 does not split evenly over the 3 devices of learner",
        ),
        # Checked by the installed jaxlib before anything starts (it aborted a node 25 s in).
        (
            ["--config", CONFIG, "--config.resources.actor.xla_flags=--xla_bogus_flag=1"],
            "resources.actor.xla_flags: the installed jaxlib does not know the XLA flag "
            "--xla_bogus_flag=1",
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
    assert "Traceback" not in result.stderr and "isolated" not in result.stderr
    assert not (tmp_path / "run").exists(), "a refused run created its workdir"
    assert not marked_processes(mark)


@pytest.mark.parametrize(
    ("script", "env", "args", "expected"),
    [
        # dm_control's import raised it in the project's checks: a traceback, dry run included.
        (SCRIPT, {"MUJOCO_GL": "EGL"}, ["--dry_run"], "MUJOCO_GL='EGL' (in the environment): "
         "not a MuJoCo rendering backend; use egl, osmesa or glfw"),
        ("projects/td3/main.py", {"MUJOCO_GL": "EGL"}, [], "MUJOCO_GL='EGL'"),
        # main.py's JAX reads it (lp_main.py sets each node's): a traceback after the workdir.
        ("projects/td3/main.py", {"JAX_PLATFORMS": "tpu"}, [],
         "JAX_PLATFORMS=tpu (in the environment): magi_lp runs JAX on cuda or cpu; unset it"),
        # A CPU JAX ignores these: main.py trained without a word, and would misread them on
        # a GPU (a memory fraction over 1, every GPU hidden).
        ("projects/td3/main.py", {"XLA_PYTHON_CLIENT_MEM_FRACTION": "half"}, [],
         "XLA_PYTHON_CLIENT_MEM_FRACTION=half (in the environment): JAX takes a positive "
         "fraction of each GPU's memory"),
        ("projects/td3/main.py", {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda"}, [],
         "XLA_PYTHON_CLIENT_ALLOCATOR='cuda' (in the environment): this jaxlib takes default, "),
        ("projects/td3/main.py", {"CUDA_VISIBLE_DEVICES": "0,abc"}, [],
         "CUDA_VISIBLE_DEVICES=0,abc (in the environment): 'abc' is no GPU index or UUID"),
    ],
)  # fmt: skip
def test_a_bad_environment_variable_gets_one_line(tmp_path, script, env, args, expected):
    args = ["--config", CONFIG, "--workdir", str(tmp_path / "run"), *args]
    result = run_entry_point(script, args, timeout=60, env=env)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists(), "a refused run created its workdir"


@pytest.mark.parametrize(
    "env",
    [
        {"XLA_PYTHON_CLIENT_MEM_FRACTION": "2"},  # above 1: unified memory
        {"XLA_CLIENT_MEM_FRACTION": ".5", "XLA_PYTHON_CLIENT_MEM_FRACTION": ""},
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "Platform"},  # jaxlib lowers it
        {"CUDA_VISIBLE_DEVICES": "NoDevFiles"},  # SLURM's, for a job without GPU files
        {"CUDA_VISIBLE_DEVICES": "-1"},
        {"CUDA_VISIBLE_DEVICES": "0,-1"},  # GPU 0 only: -1 ends the list
        {"CUDA_VISIBLE_DEVICES": ""},
        {"CUDA_VISIBLE_DEVICES": "1,0"},
        {"CUDA_VISIBLE_DEVICES": "GPU-8a7c2b1e-0000-1111-2222-333344445555,MIG-1"},
    ],
)
def test_gpu_settings_main_py_takes_from_its_environment(env):
    cli.checks._check_jax_memory_env(env, detect_jax_build())


@pytest.mark.parametrize("value", ["inf", "1e999", "0", "-0.5", "nan"])
def test_a_memory_fraction_that_is_no_positive_number_is_refused(value):
    with pytest.raises(ConfigError, match="JAX takes a positive fraction"):
        cli.checks._check_jax_memory_env(
            {"XLA_PYTHON_CLIENT_MEM_FRACTION": value}, detect_jax_build()
        )


def test_both_memory_fraction_names_are_refused_where_jaxlib_reads_both():
    both = {"XLA_CLIENT_MEM_FRACTION": "0.5", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.4"}
    with pytest.raises(ConfigError, match="unset XLA_PYTHON_CLIENT_MEM_FRACTION"):
        cli.checks._check_jax_memory_env(both, JaxBuild(jaxlib_version="0.11.2"))
    cli.checks._check_jax_memory_env(
        both, JaxBuild(jaxlib_version="0.4.30")
    )  # reads only the second


def test_an_empty_allocator_is_refused_as_jaxlib_would():
    with pytest.raises(ConfigError, match=r"XLA_PYTHON_CLIENT_ALLOCATOR='' .* this jaxlib takes"):
        cli.checks._check_jax_memory_env({"XLA_PYTHON_CLIENT_ALLOCATOR": ""}, detect_jax_build())


@pytest.mark.skipif(detect_jax_build().serves_cuda, reason="this JAX can start CUDA")
def test_jax_platforms_cuda_where_jax_cannot_start_it_is_one_line(tmp_path):
    args = ["--config", CONFIG, "--workdir", str(tmp_path / "run")]
    result = run_entry_point(
        "projects/td3/main.py", args, timeout=60, env={"JAX_PLATFORMS": "cuda"}
    )
    assert result.returncode == 2, result.stderr
    assert (
        "error: JAX_PLATFORMS=cuda (in the environment): JAX in this Python is CPU only ("
        in (result.stderr)
        and "Traceback" not in result.stderr
    ), result.stderr
    assert not (tmp_path / "run").exists()


def test_a_workdir_that_exists_and_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """A read-only mount refuses even root (the user here, for whom no mode bit does): the
    check asks `os.access`, faked for this folder alone."""
    from magi_lp import cli
    from magi_lp.errors import ConfigError

    workdir = tmp_path / "run"
    workdir.mkdir()
    real = cli.checks.os.access
    monkeypatch.setattr(cli.checks.os, "access", lambda p, m: Path(p) != workdir and real(p, m))
    with pytest.raises(ConfigError, match=r"cannot be written: .* is not writable by this user"):
        cli.checks._check_workdir_can_be_made(workdir)
    cli.checks._check_workdir_can_be_made(tmp_path / "other")  # its parent can be written


def test_a_dry_run_of_an_engine_this_stack_lacks_is_refused_as_its_launch_is(tmp_path):
    """The dry run planned it (Launchpad's Reverb replay on a stack without either)."""
    from magi_lp import engines

    other = next((e for e in engines.REGISTRY.values() if e.missing()), None)
    if other is None:
        pytest.skip("every engine can run here")
    args = ["--config", CONFIG, "--dry_run", "--launcher", other.name]
    result = run_entry_point(SCRIPT, [*args, "--workdir", str(tmp_path / "run")], timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"error: --launcher {other.name} (" in result.stderr and "not installed here" in (
        result.stderr
    ), result.stderr
    assert "engine:" not in result.stdout  # no plan printed


def test_a_sequence_given_in_a_flagfile_and_again_on_the_command_line_is_refused(tmp_path):
    flagfile = tmp_path / "flags.txt"
    flagfile.write_text("--config.agent.hidden_sizes=(8,8)\n")
    args = ["--config", CONFIG, "--dry_run", f"--flagfile={flagfile}"]
    args += ["--config.agent.hidden_sizes=(4,4)", "--workdir", str(tmp_path / "run")]
    result = run_entry_point(SCRIPT, args, timeout=60)
    assert result.returncode == 2, result.stdout[-2000:]
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: --config.agent.hidden_sizes is given 2 times ((8,8), then (4,4))")
    ), result.stderr[-2000:]


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
def test_a_run_that_cannot_train_is_refused_or_warned_before_it_starts(tmp_path):
    """A replay too small for the transitions the first update waits for is refused (the
    learner waited forever); a limit before the first update is allowed, with a warning."""
    drq = ["--config", "configs/reacher_hard_distributed.py", "--dry_run"]
    drq += ["--config.agent.min_replay_frames=3000000", "--workdir", str(tmp_path / "a")]
    refused = run_entry_point("projects/drq_v2/lp_main.py", drq, timeout=90)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: agent.replay_buffer_size must be >= the 1,500,000 transitions of "
        "agent.min_replay_frames=3000000 (at env.action_repeat=2), got 1000000; e.g. "
        "--config.agent.replay_buffer_size=1500000, or fewer min_replay_frames"
    )
    td3 = ["--config", CONFIG, "--dry_run", "--config.max_actor_steps=300"]
    planned = run_entry_point(SCRIPT, [*td3, "--workdir", str(tmp_path / "b")], timeout=90)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert (
        "warning: max_actor_steps=300 ends before the learner's first update (the replay holds "
        "1,000 items first, by the agent's settings)" in planned.stdout
    ), planned.stdout


class _StateBuilder:
    """What `checks._check_replay_can_fill` reads of a builder whose replay the toolkit serves."""

    def __init__(self, capacity: int, min_replay_size: int):
        self.capacity, self.min_replay_size = capacity, min_replay_size

    def frame_replay(self, environment_spec):
        return None

    def transition_replay(self, environment_spec):
        from magi_lp.replay.spec import TransitionReplaySpec

        return TransitionReplaySpec(self.capacity, batch_size=8, n_step=1, discount=0.99)

    def replay_schedule(self):
        from magi_lp.replay.schedule import ReplaySchedule

        return ReplaySchedule(self.min_replay_size, actor_steps_per_update=1.0, batch_size=8)


def test_a_served_replay_smaller_than_the_first_update_waits_for_is_refused():
    """For any agent (a new one without its own settings check): its distributed run waited
    forever at 0 updates/s."""
    from magi_lp import cli
    from magi_lp.errors import ConfigError

    cli.checks._check_replay_can_fill(_StateBuilder(capacity=100, min_replay_size=100))
    with pytest.raises(ConfigError) as refused:
        cli.checks._check_replay_can_fill(_StateBuilder(capacity=50, min_replay_size=100))
    assert str(refused.value) == (
        "the agent's replay holds 50 transitions (TransitionReplaySpec.capacity): its "
        "learner's first update waits for 100 (replay_schedule().min_replay_size), which it "
        "can never hold; raise the agent's replay size to at least that, or lower the items "
        "its first update waits for"
    )


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
def test_an_entry_point_without_validate_config_warns_that_the_projects_keys_go_unchecked(
    tmp_path,
):
    """A new project's lp_main.py that leaves validate_config out: a misspelt agent key was
    taken without a word."""
    script = tmp_path / "lp_main.py"
    script.write_text(
        "from magi_lp.cli import distributed_main\n"
        "from projects.td3.experiment import make_experiment\n"
        "distributed_main(make_experiment)\n"
    )
    args = ["--config", CONFIG, "--dry_run", "--workdir", str(tmp_path / "run")]
    result = run_entry_point(str(script), args, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "warning: this entry point passes no validate_config: the project's own keys ("
        in result.stderr
        and "are not checked; pass validate_config= to distributed_main" in result.stderr
    ), result.stderr[-2000:]


def test_missing_config_example_survives_optimize_2():
    """`python -OO` drops the entry script's docstring; the example is read from its source."""
    result = run_entry_point(SCRIPT, [], timeout=60, env={"PYTHONOPTIMIZE": "2"})
    assert result.returncode == 2, result.stderr
    assert "e.g. --config configs/td3_cartpole.py" in result.stderr, result.stderr


GET_CONFIG = "def get_config():\n    return None\n"


@pytest.mark.parametrize(
    ("body", "overrides", "expected"),
    [
        ("def make():\n    return 1\n", [], "defines no get_config()"),
        (
            "def get_config():\n    raise ValueError('bad thing')\n",
            [],
            "get_config() raised ValueError: bad thing at line 2; fix the file",
        ),
        # The file fails while it loads: a traceback before, or blamed on the override.
        (
            "import no_such_module_xyz\n" + GET_CONFIG,
            [],
            "the file raised ModuleNotFoundError at line 1: No module named",
        ),
        ("x = undefined_name\n" + GET_CONFIG, [], "the file raised NameError at line 1"),
        # Named by its path, as the other refusals of the file are (it said "--config:").
        ("x = (\n" + GET_CONFIG, [], "my_config.py: the config file has a syntax error at line"),
        (
            "import sys, pathlib\n"
            "pathlib.Path(__file__).with_name('broken_mod.py').write_text('y = )\\n')\n"
            "sys.path.insert(0, str(pathlib.Path(__file__).parent))\n"
            "import broken_mod\n" + GET_CONFIG,
            [],
            "broken_mod.py, which it imports, has a syntax error at line 1",
        ),
        ("x = eval('1 +')\n" + GET_CONFIG, [], "reading the config raised SyntaxError: "),
        (
            "x = {}['missing']\n" + GET_CONFIG,
            ["--config.seed=1"],
            "the file raised KeyError at line 1: 'missing'; fix the file",
        ),
        ("x = int('abc')\n" + GET_CONFIG, [], "the file raised ValueError: invalid literal"),
        # get_config() returns what is no config (a traceback from the checks before).
        (GET_CONFIG, [], "get_config() returned NoneType; return an ml_collections.ConfigDict"),
        (GET_CONFIG, ["--config.seed=1"], "get_config() returned NoneType"),
        ("def get_config():\n    return {'seed': 1}\n", [], "get_config() returned dict"),
        # An OSError in the file: ml_collections hands it over as a placeholder config.
        (
            "def get_config():\n    return open('/no_such_dir/x.json')\n",
            [],
            "cannot load the config file: [Errno 2] No such file or directory",
        ),
        # A toolkit helper or setting given a bad value by the file: its refusal, at the
        # file's line (it names no config key).
        (
            "from magi_lp import resource_spec\n"
            "def get_config():\n    return resource_spec(env=['A=1'])\n",
            [],
            "my_config.py (line 3): resource_spec(env=...) must be a mapping of variable names",
        ),
        (
            "from magi_lp import ResourceSpec\n"
            "def get_config():\n    return ResourceSpec(cpu_threads=0)\n",
            [],
            "my_config.py (line 3): ResourceSpec.cpu_threads must be an integer >= 1, or None",
        ),
        # Raised while the file handled another exception: the refused call's line.
        (
            "from magi_lp import ResourceSpec\n"
            "def get_config():\n    try:\n        {}['x']\n    except KeyError:\n"
            "        return ResourceSpec(cpu_threads=0)\n",
            [],
            "my_config.py (line 6): ResourceSpec.cpu_threads must be",
        ),
        # A file whose get_config takes an argument, given none (no fix was said).
        (
            "from ml_collections import ConfigDict\n"
            "def get_config(mode):\n    return ConfigDict({'seed': 1})\n",
            [],
            "get_config() takes an argument ('mode'); give it after a colon: --config ",
        ),
    ],
)
def test_config_file_problems_get_one_line(tmp_path, body, overrides, expected):
    config = tmp_path / "my_config.py"
    config.write_text(body)
    result = run_entry_point(SCRIPT, ["--config", str(config), *overrides], timeout=60)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "did you forget a return statement" not in result.stderr  # said once, by us


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "num_actors=0",
            "num_actors must be 'auto' (sized to the machine) or an integer >= 1, got 0; e.g. "
            "--config.num_actors=1",
        ),
        # inf took no checkpoint before the stop
        ("checkpoint.every_minutes=inf", "e.g. --config.checkpoint.every_minutes=10.0"),
        ("replay.queue_steps=0", "e.g. --config.replay.queue_steps=500 (the default)"),
        ("logging.time_delta=-1", "e.g. --config.logging.time_delta=1.0 (the default)"),
        ("evaluation.episodes=0", "e.g. --config.evaluation.episodes=5 (the default)"),
        ("isolation=maybe", "e.g. --config.isolation='auto' (the default)"),
    ],
)
def test_a_refused_toolkit_key_comes_with_its_default_as_the_fix(tmp_path, override, expected):
    args = ["--config", CONFIG, "--workdir", str(tmp_path / "run"), f"--config.{override}"]
    result = run_entry_point(SCRIPT, args, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and expected in lines[0], result.stderr


@pytest.mark.parametrize("where", ["x = ", "def get_config():\n    return "])
def test_a_toolkit_bug_met_while_a_config_file_loads_keeps_its_traceback(tmp_path, where):
    # Not the file's mistake: one line saying "fix the file" would hide where the bug is.
    config = tmp_path / "my_config.py"
    body = "from magi_lp.config_schema import is_one_of\n" + where + "is_one_of(1, None)\n"
    config.write_text(body + ("" if "get_config" in where else GET_CONFIG))
    result = run_entry_point(SCRIPT, ["--config", str(config)], timeout=60)
    assert result.returncode == 1, result.stderr
    assert "Traceback" in result.stderr and "magi_lp/config_schema.py" in result.stderr


@pytest.mark.parametrize(
    ("script", "config", "expected"),
    [
        ("projects/drq_v2/lp_main.py", "configs/reacher_hard_distributed.py", "hidden_dim"),
        ("projects/drq_v2/main.py", "configs/reacher_hard.py", "batch_size"),
    ],
)
def test_drq_agent_values_are_refused_by_both_entry_points(tmp_path, script, config, expected):
    result = run_entry_point(
        script,
        ["--config", config, "--workdir", str(tmp_path / "run"), f"--config.agent.{expected}=0"],
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert f"error: agent.{expected} must be an integer >= 1, got 0; e.g." in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("script", "config", "override", "expected"),
    [
        # Both failed only after the launch before (the camera: a traceback in every actor;
        # the image: the agent acted on empty features and never learned).
        (
            "projects/drq_v2/lp_main.py",
            "configs/reacher_hard_distributed.py",
            "env.camera_id=7",
            "env.camera_id must be below 2 (reacher hard has 2 fixed cameras, 0-1), got 7; "
            "e.g. --config.env.camera_id=0",
        ),
        (
            "projects/drq_v2/main.py",
            "configs/reacher_hard.py",
            "env.image_size=8",
            "env.image_size must be at least 15 for agent.encoder_num_layers=4 3x3 convs (the "
            "first of stride 2), got 8; e.g. --config.env.image_size=84",
        ),
        (
            "projects/drq_v2/lp_main.py",
            "configs/reacher_hard_distributed.py",
            "agent.encoder_num_layers=50",
            "env.image_size must be at least 199 for agent.encoder_num_layers=50",
        ),
        (  # the smallest size is worked out, not searched for
            "projects/drq_v2/main.py",
            "configs/reacher_hard.py",
            "agent.encoder_kernel_size=100001",
            "env.image_size must be at least 700001 for agent.encoder_num_layers=4",
        ),
    ],
)
def test_a_task_the_drq_agent_cannot_see_is_refused_before_the_launch(
    tmp_path, script, config, override, expected
):
    result = run_entry_point(
        script,
        ["--config", config, "--workdir", str(tmp_path / "run"), f"--config.{override}"],
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


# Run an entry point in this interpreter, then list the heavy libraries it had imported.
_HEAVY_AFTER_REFUSAL = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as stop:
    heavy = {"jax", "jaxlib", "tensorflow", "reverb", "launchpad", "acme", "haiku", "mujoco"}
    print("exit", stop.code, sorted({m.split(".")[0] for m in sys.modules} & heavy))
"""


@pytest.mark.parametrize(
    ("script", "config", "key"),
    [
        ("projects/td3/lp_main.py", CONFIG, "batch_size"),
        ("projects/td3/main.py", CONFIG, "n_step"),
        ("projects/drq_v2/lp_main.py", "configs/reacher_hard_distributed.py", "hidden_dim"),
        ("projects/drq_v2/main.py", "configs/reacher_hard.py", "batch_size"),
    ],
)
def test_a_bad_agent_key_is_refused_once_before_any_heavy_import(tmp_path, script, config, key):
    # The project's validate_config is wired once (its entry point passes it) and runs once,
    # right after the toolkit's checks: before JAX, TensorFlow, Reverb or Launchpad load.
    args = ["--config", config, "--workdir", str(tmp_path / "run"), f"--config.agent.{key}=0"]
    result = subprocess.run(
        [sys.executable, "-c", _HEAVY_AFTER_REFUSAL, script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip().splitlines()[-1] == "exit 2 []", result.stdout + result.stderr
    assert result.stderr.count(f"error: agent.{key} must be an integer >= 1, got 0") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
@pytest.mark.parametrize(
    ("flag", "notice"),
    [
        (
            "checkpoint.replay=True",
            "notice: checkpoint.replay=True saves nothing in this run: its replay (the agent's "
            "own Reverb tables) is saved by checkpoint.reverb=True",
        ),
        ("checkpoint.reverb=True", None),  # what saves TD3's Reverb tables
    ],
)
def test_a_replay_checkpoint_flag_that_saves_nothing_is_said(tmp_path, flag, notice):
    # Taken silently before: the run went on without the replay it was asked to keep.
    args = ["--config", CONFIG, "--workdir", str(tmp_path / "run"), "--dry_run", f"--config.{flag}"]
    result = run_entry_point(SCRIPT, args, timeout=120)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if "saves nothing" in line]
    assert said == ([notice] if notice else []), result.stdout


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
def test_dry_run_warns_about_cores_memory_and_ignored_gpus(tmp_path):
    result = run_entry_point(
        SCRIPT,
        [
            "--config",
            CONFIG,
            "--dry_run",
            "--config.num_actors=64",
            "--config.resources.actor.gpus=1",
        ],
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "warning: the busy nodes need 69 threads "
        "(learner 2, replay 1, evaluator 1, counter 1, actor 64)" in result.stdout
    )
    assert "resources.actor.gpus=1 is ignored: resources.actor.device='cpu'" in result.stdout


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
def test_dry_run_warns_of_the_compilation_cache_where_jaxlib_crashed_with_it(tmp_path):
    cache = str(tmp_path / "jax_cache")
    result = run_entry_point(
        SCRIPT,
        ["--config", CONFIG, "--dry_run"],
        timeout=60,
        env={"JAX_COMPILATION_CACHE_DIR": cache},
    )
    assert result.returncode == 0, result.stderr
    warned = "warning: JAX_COMPILATION_CACHE_DIR is set (the environment): with jaxlib 0.4.30"
    # The Launchpad stack's jaxlib 0.4.30 crashed with it; the current stack's does not.
    assert (warned in result.stdout) == (not detect_jax_build().compilation_cache_safe)
    assert not Path(cache).exists()


@pytest.mark.integration  # runs main.py, the entry point, ~13 s
def test_main_py_says_which_distributed_settings_it_ignores(tmp_path):
    result = run_entry_point(
        "projects/td3/main.py",
        [
            "--config",
            CONFIG,
            "--workdir",
            str(tmp_path / "run"),
            "--config.num_actors=4",
            "--config.max_actor_steps=50",
            "--config.agent.min_replay_size=10",
            "--config.agent.batch_size=8",
            "--config.num_evaluators=0",
        ],
        timeout=120,
        # A fresh cache: this one process only writes to it (the crash was on reading back).
        env={"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "notice: main.py runs one actor" in result.stderr
    assert "ignores num_actors=4" in result.stderr
    warned = "warning: JAX_COMPILATION_CACHE_DIR is set (the environment): with jaxlib"
    assert (warned in result.stderr) == (not detect_jax_build().compilation_cache_safe)


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
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


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
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


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
@pytest.mark.parametrize("script", ["projects/td3/lp_main.py", "projects/td3/main.py"])
def test_an_exported_unknown_xla_flag_is_refused_before_anything_starts(
    tmp_path, monkeypatch, script
):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false --xla_no_such_flag=2")
    result = run_entry_point(
        script, ["--config", CONFIG, "--workdir", str(tmp_path / "run")], timeout=60
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [
        "error: the exported XLA_FLAGS: the installed jaxlib does not know the XLA flag "
        "--xla_no_such_flag=2 (XLA would abort every node given it at start-up); remove it "
        "or correct its name"
    ], result.stderr
    assert not (tmp_path / "run").exists()


def test_a_ctrl_c_inside_a_ctypes_call_counts_as_an_interrupt():
    """A SIGINT during a ctypes call's argument conversion (PyOpenGL's EGL lookups while
    dm_control imports) reaches Python as `ctypes.ArgumentError`, the KeyboardInterrupt named
    in its message only: the entry point still says one line, not a traceback."""
    import ctypes

    from magi_lp.cli.dispatch import _interrupted

    class Interrupted:
        @classmethod
        def from_param(cls, value):
            raise KeyboardInterrupt

    class Refused:
        @classmethod
        def from_param(cls, value):
            raise TypeError("not a pointer")

    errors = {}
    for kind in (Interrupted, Refused):
        abs_ = ctypes.CDLL(None).abs  # any C function: the conversion fails before the call
        abs_.argtypes = [kind]
        with pytest.raises(ctypes.ArgumentError) as caught:
            abs_(1)
        errors[kind.__name__] = caught.value
    assert _interrupted(errors["Interrupted"])
    assert not _interrupted(errors["Refused"])  # a real ctypes error still shows
    assert not _interrupted(ValueError("KeyboardInterrupt"))


def test_a_cluster_address_where_nothing_answers_is_refused_in_one_line(monkeypatch):
    import socket

    from magi_lp.engines import engine
    from magi_lp.errors import ConfigError

    ray = engine("ray")
    # `local` is Ray's "start one here": the run's own embedded Ray, as with no address.
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert ray.cluster_address() is None
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        # (`auto` is Ray's to resolve: tests/test_ray_engine.py)
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
            monkeypatch.setenv("RAY_ADDRESS", address)
            ray.check_cluster()  # answers, or starts Ray here
    # The port is closed now: Ray's client would retry for minutes.
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConfigError) as refused:
        ray.check_cluster()
    assert str(refused.value).startswith(
        f"RAY_ADDRESS=127.0.0.1:{port}: nothing answers at 127.0.0.1:{port} (Connection refused)"
        "; start the cluster there first, or unset RAY_ADDRESS"
    )
    monkeypatch.setenv("RAY_ADDRESS", "headnode")
    with pytest.raises(ConfigError, match="RAY_ADDRESS=headnode: it is not host:port"):
        ray.check_cluster()


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
def test_a_dry_run_does_not_check_the_workdir_it_never_writes(tmp_path):
    # A plan made on one machine for a workdir on another (a cluster's shared folder).
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = ["--config", CONFIG, "--dry_run", "--workdir", str(blocker / "run")]
    result = run_entry_point(SCRIPT, args, timeout=60)
    assert result.returncode == 0, result.stderr
    # The same workdir for a run is refused, before anything starts.
    result = run_entry_point(SCRIPT, args[:-3] + args[-2:], timeout=60)
    assert result.returncode == 2 and "a_file is a file, not a folder" in result.stderr


def test_an_ipv6_cluster_address_is_tried_as_ray_reads_it(monkeypatch):
    import socket

    from magi_lp.engines import engine

    try:
        server = socket.socket(socket.AF_INET6)
        server.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with server:
        server.listen()
        monkeypatch.setenv("RAY_ADDRESS", f"[::1]:{server.getsockname()[1]}")
        engine("ray").check_cluster()


HOSTS_CONFIG = """
from configs import td3_cartpole
from magi_lp.cluster.config import hosts_defaults, machine


def get_config():
    config = td3_cartpole.get_config()
    config.hosts = hosts_defaults()
    config.hosts.machines.main = machine(cpus=2)
    return config
"""


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
@pytest.mark.parametrize(
    ("mode", "hosts", "fix"),
    [
        ("one", False, "set --config.replay.store=device"),
        ("many", False, "run it on the current stack (.venv312, make setup312)"),
        ("many", True, "run it on the current stack (.venv312, make setup312)"),
    ],
    ids=["main", "lp_main", "lp_main-hosts"],
)
def test_a_state_agent_without_reverb_tables_is_refused_before_anything_starts(
    tmp_path, mode, hosts, fix
):
    # Its builder gives transition_replay only; with Reverb installed its replay would be its
    # own tables, which it does not make (a NotImplementedError once the nodes ran).
    pytest.importorskip("reverb", reason="the agent's own tables are Reverb's")
    mark = "cli-state-only"
    config = CONFIG
    if hosts:  # Launchpad on several hosts: refused before the job's files are written
        config = str(tmp_path / "hosts.py")
        Path(config).write_text(HOSTS_CONFIG)
    args = [mode, "--config", config, "--workdir", str(tmp_path / "run")]
    args += ["--launcher", "hosts"] if hosts else []
    result = run_entry_point("tests/state_only_entry.py", args, timeout=120, mark=mark)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    assert "StateOnlyBuilder does not implement make_replay_tables, make_adder" in lines[0]
    assert fix in lines[0] and "projects/td3/builder.py" in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists(), "a refused run created its workdir"
    assert not marked_processes(mark)


@pytest.mark.integration  # runs an entry point: a process of its own importing JAX, ~1-2 s
@pytest.mark.parametrize("mode", ["one", "many"], ids=["main", "lp_main"])
def test_a_ctrl_c_that_a_library_swallowed_still_stops_the_run_before_it_starts(tmp_path, mode):
    mark = "cli-swallowed-ctrl-c"
    args = [mode, "--config", CONFIG, "--workdir", str(tmp_path / "run")]
    result = run_entry_point("tests/swallowed_ctrl_c_entry.py", args, timeout=120, mark=mark)
    output = result.stdout + result.stderr
    assert result.returncode == 130, output[-3000:]
    assert "interrupted before the run started; nothing was launched or written" in output
    assert "Traceback" not in output, output[-3000:]
    assert not (tmp_path / "run").exists(), "an interrupted run created its workdir"
    assert not marked_processes(mark)


def _finish_config():
    """A run's config as the 'finished' checks read it: limit 1000, 2 episodes an evaluation,
    2 evaluators, 1 actor of 1 environment (a reporting lag of 20 actor steps)."""
    import ml_collections

    return ml_collections.ConfigDict(
        {
            "max_actor_steps": 1000,
            "evaluation": {"episodes": 2},
            "num_actors": 1,
            "envs_per_actor": 1,
            "num_evaluators": 2,
        }
    )


def _final_evaluation(workdir: Path, index: int, at: int) -> None:
    record = workdir / f"logs/evaluator_{index}/final_evaluation.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"actor_steps": at, "max_actor_steps": 1000}))


@pytest.mark.parametrize(
    ("records", "logs", "steps", "done"),
    [
        ({0: 1010, 1: 1020}, {}, 1030, True),  # both evaluators' at the limit, counts lagging
        ({0: 1000}, {}, 1030, False),  # evaluator 1 was stopped in its evaluation at the limit
        # A periodic evaluation overtaken at the limit, then a stop in the one at the limit:
        # the rows read as a whole evaluation there, and the run is not finished.
        ({}, {0: [990, 1000, 1000], 1: [1000, 1000]}, 1000, False),
        ({0: 1000, 1: 1000}, {}, 1500, False),  # an earlier launch's: these parameters unseen
        ({0: 800, 1: 1000}, {}, 1000, False),  # a record of a lower limit, raised since
    ],
)
def test_a_finished_distributed_run_is_one_whose_evaluators_recorded_the_final_evaluation(
    tmp_path, records, logs, steps, done
):
    from magi_lp import cli

    config = _finish_config()
    for index, at in records.items():
        _final_evaluation(tmp_path, index, at)
    for index, rows in logs.items():
        _evaluator_log(tmp_path, index, rows)
    assert cli.standing._finally_evaluated(config, tmp_path, steps) is done


def test_the_line_after_a_run_says_what_the_same_command_does_next(tmp_path):
    """`_where_it_stands`: read from the workdir once the run has ended (the launcher's last
    line; main.py's after a stop)."""
    from magi_lp import cli
    from magi_lp.runtime.checkpoint_metadata import metadata_path

    config = _finish_config()
    config.checkpoint = {"enabled": True}
    stands = cli.standing._where_it_stands(config, tmp_path, single_process=False)
    assert stands == "no learner checkpoint was saved: the same command starts again from step 0"
    # A stop before the learner's first update: saved by a learner before the fix had no
    # learner count (CI, on a busy machine), yet the relaunch resumes its actor steps.
    early = Path(metadata_path(tmp_path / "checkpoints" / "learner", 0))
    early.parent.mkdir(parents=True)
    early.write_text(json.dumps({"counts": {"actor_steps": 120}}))
    assert cli.standing._where_it_stands(config, tmp_path, single_process=False) == (
        "the same command resumes from the newest checkpoint: learner step 0, 120 actor steps "
        "(max_actor_steps=1000)"
    )
    path = Path(metadata_path(tmp_path / "checkpoints" / "learner", 37))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"counts": {"learner_steps": 37, "actor_steps": 455}}))
    assert cli.standing._where_it_stands(config, tmp_path, single_process=False) == (
        "the same command resumes from the newest checkpoint: learner step 37, 455 actor steps "
        "(max_actor_steps=1000)"
    )
    config.checkpoint.enabled = False  # what was saved is not read: a relaunch starts at 0
    assert "checkpoints are off (checkpoint.enabled=False)" in cli.standing._where_it_stands(
        config, tmp_path, single_process=True
    )
    config.checkpoint.enabled = True
    path.write_text(json.dumps({"counts": {"learner_steps": 90, "actor_steps": 1010}}))
    for index in (0, 1):
        _final_evaluation(tmp_path, index, 1010)
    assert cli.standing._where_it_stands(config, tmp_path, single_process=False).startswith(
        f"done: the run in {tmp_path} has reached max_actor_steps=1000"
    )


def _evaluator_log(workdir: Path, index: int, steps: list[int]) -> None:
    log = workdir / f"logs/evaluator_{index}/logs.csv"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("actor_steps,episode_return\n" + "".join(f"{s},1.0\n" for s in steps))


@pytest.mark.parametrize(
    ("logs", "steps", "done"),
    [
        ({0: [500, 500, 1000, 1000]}, 1000, True),  # the whole evaluation at the limit
        ({0: [1010, 1020], 1: [1005, 1030]}, 1030, True),  # two evaluators, counts lagging
        ({0: [500, 500, 1000]}, 1000, False),  # a stop cut the last evaluation short
        ({0: [1000, 1000], 1: [500, 500]}, 1000, False),  # one evaluator has not evaluated
        ({0: [1000, 1000]}, 1500, False),  # an earlier launch's: these parameters unseen
        ({0: []}, 1000, False),  # no evaluation logged
    ],
)
def test_a_finished_run_is_one_whose_last_evaluation_saw_its_checkpoint(
    tmp_path, logs, steps, done
):
    from magi_lp import cli

    config = _finish_config()
    for index, rows in logs.items():
        _evaluator_log(tmp_path, index, rows)
    assert cli.standing._evaluated_at(config, tmp_path, steps, len(logs)) is done


def test_a_ctrl_c_that_escapes_after_the_run_started_is_not_called_before_the_start(
    tmp_path, capsys, monkeypatch
):
    """A KeyboardInterrupt that reaches the top in a run's last lines (past its own stop
    handling) says where to resume; only one before the workdir exists says nothing was
    written."""
    import signal

    from magi_lp import cli

    previous = signal.getsignal(signal.SIGINT)
    try:
        monkeypatch.setattr(cli.dispatch, "_STARTED_IN", [])
        assert cli.dispatch._interrupted_before_start() == 130
        assert "interrupted before the run started" in capsys.readouterr().err
        cli.dispatch._run_starts(tmp_path / "run")
        assert cli.dispatch._interrupted_before_start() == 130
        said = capsys.readouterr().err
        assert "before the run started" not in said
        assert f"resumes from the newest checkpoint in {tmp_path / 'run'}" in said
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_second_launch_of_a_running_workdir_is_refused_and_the_first_goes_on(tmp_path):
    """Two launches of one workdir at once wrote into one run: the second rotated the first's
    node logs, started a second learner and saved into the first's checkpoints."""
    from tests.e2e_utils import TD3_TINY, start_entry_point

    workdir = tmp_path / "run"
    args = ["--config", CONFIG, *TD3_TINY, "--config.max_actor_steps=1000000"]
    args += ["--workdir", str(workdir)]
    mark = "cli-second-launch"
    first = start_entry_point("projects/td3/main.py", args, mark=mark, log=tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 180
        learner_csv = workdir / "logs" / "learner" / "logs.csv"
        while not learner_csv.is_file():  # the first launch is training
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.5)
        for script in ("projects/td3/main.py", SCRIPT):
            second = run_entry_point(script, args, timeout=120, mark=mark)
            assert second.returncode == 2, second.stderr[-3000:]
            # Refused first: before the isolated re-run and the planning said anything.
            assert len(second.stderr.strip().splitlines()) == 1, second.stderr[-3000:]
            line = second.stderr.strip().splitlines()[-1]
            said = f"error: --workdir {workdir} is in use: another launch runs in it (pid "
            assert line.startswith(f"{said}{first.pid}, started "), line
            assert line.endswith(
                "two would write into one run; stop that one first (Ctrl-C or SIGTERM saves "
                "it), or pick another --workdir"
            ), line
        assert first.poll() is None  # the first went on
        assert not (workdir / "nodes").exists()  # the second rotated no logs, started nothing
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=120)
    again = run_entry_point(
        "projects/td3/main.py", [*args[:-3], "--config.max_actor_steps=1", *args[-2:]],
        timeout=120, mark=mark,
    )  # fmt: skip
    assert "is in use" not in again.stderr, again.stderr[-2000:]  # the lock ended with it
    assert not marked_processes(mark)
