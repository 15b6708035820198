"""Tests for magi_lp.launch.launcher.

The integration tests start real Launchpad local multi-processing programs with a real
Reverb server (tests/launcher_nodes.py), each through `tests/launch_programs.py` in its own
process so Launchpad's signal handlers never touch the pytest process. Every launcher run
gets a private TMPDIR (to see whether Launchpad's job folders are left behind, unaffected by
other programs on the machine) and a random LAUNCHER_TEST_TOKEN in its environment, which
every process of the program inherits: finding that token in any process afterwards means
something was left running.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from unittest import mock

import launchpad as lp
import psutil
import pytest

from magi_lp.errors import ConfigError
from magi_lp.launch import (
    exit_report,
    launcher,
    node_lifetime,
    processes,
    run_folders,
    supervisor,
)
from tests.e2e_utils import BackgroundRun

_TESTS = Path(__file__).resolve().parent
_LAUNCH_SCRIPT = _TESTS / "launch_programs.py"
sys.path.insert(0, str(_TESTS))
import launcher_nodes  # noqa: E402

STARTUP_TIMEOUT_SECS = 120
ALL_REPORTS = ["replay_0", "learner_0"] + [f"actor_{i}" for i in range(launcher_nodes.NUM_ACTORS)]


# ---------------------------------------------------------------- without processes


def _program() -> lp.Program:
    program = lp.Program("validation")
    with program.group("learner"):
        program.add_node(lp.PyNode(print))
    with program.group("actor"):
        program.add_node(lp.PyNode(print))
    return program


@pytest.fixture
def no_spawn(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("lp.launch must not be reached")

    monkeypatch.setattr(launcher.lp, "launch", refuse)


@pytest.mark.parametrize(
    ("envs", "message"),
    [
        ({"evaluator": {"A": "1"}}, r"envs\[.evaluator.\] names no node group"),
        ({"actor": {"N": 1}}, "must be a string"),
        ({"actor": {"N": 0.5}}, "'0.5'"),
        ({"actor": {1: "x"}}, "variable name of envs.*must be a non-empty string"),
        ({"actor": {"A=B": "x"}}, "got .A=B."),
        ({"actor": ["A"]}, "must be a dict"),
        ({"actor": {launcher.LAUNCH_ID_VAR: "x"}}, "set by the launcher"),
        ([("actor", {})], "envs must be a dict from group label"),
    ],
)
def test_bad_envs_raise_config_error_before_spawning(tmp_path, no_spawn, envs, message):
    with pytest.raises(ConfigError, match=message):
        launcher.launch(_program(), envs, log_dir=tmp_path)


@pytest.mark.parametrize("notice", [-1, float("nan"), "10", True])
def test_bad_termination_notice_raises_config_error(tmp_path, no_spawn, notice):
    with pytest.raises(ConfigError, match="termination_notice_secs"):
        launcher.launch(_program(), {}, log_dir=tmp_path, termination_notice_secs=notice)


def test_exit_report_names_node_status_and_log_tail(tmp_path):
    log = tmp_path / "actor" / "1"
    log.parent.mkdir()
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    node = exit_report.NodeExit("actor", 1, 4242, -signal.SIGKILL, log)

    report = exit_report.format_exit_report(node)

    assert report.splitlines()[0] == (
        "node actor/1 (group 'actor', pid 4242) died: killed by signal SIGKILL (9)"
    )
    assert "line 79" not in report
    assert [f"    line {i}" for i in range(80, 100)] == report.splitlines()[-20:]


def test_a_node_that_aborts_in_native_code_is_reported_by_its_reason(tmp_path):
    """A real native abort (the installed jaxlib refusing an XLA flag, with Python's
    faulthandler dumping its module list after it): the report leads with XLA's line."""
    log = tmp_path / "actor" / "1"
    log.parent.mkdir()
    env = dict(os.environ, XLA_FLAGS="--xla_bogus_flag=1", JAX_PLATFORMS="cpu")
    with open(log, "wb") as out:
        returncode = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", "import jax; jax.devices()"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120,
        ).returncode
    assert returncode == -signal.SIGABRT
    node = exit_report.NodeExit("actor", 1, 4242, returncode, log)
    lines = exit_report.format_exit_report(node).splitlines()
    assert lines[0] == "node actor/1 (group 'actor', pid 4242) died: killed by signal SIGABRT (6)"
    assert lines[1].startswith("cause: ") and "Unknown flags in XLA_FLAGS" in lines[1]
    assert "--xla_bogus_flag=1" in lines[1]


@pytest.mark.parametrize(
    ("log_text", "returncode", "cause"),
    [
        (
            'I1123 starting\nTraceback (most recent call last):\n  File "x.py", line 1\n'
            "    boom()\nValueError: the replay table is missing\nshutting down\n",
            1,
            "ValueError: the replay table is missing",
        ),
        (
            "W0000 something\nF1123 12:00:00.1 1 table.cc:42] Check failed: size > 0\n"
            "Fatal Python error: Aborted\n\nExtension modules: numpy, jax (total: 84)\n",
            -signal.SIGABRT,
            "table.cc:42] Check failed: size > 0",  # the reason, not just "Aborted"
        ),
        (
            "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call):\n",
            -signal.SIGSEGV,
            "Fatal Python error: Segmentation fault",
        ),
        ("all fine\n", -signal.SIGKILL, "most often the kernel's out-of-memory killer"),
        ("all fine\n", 3, None),
    ],
)
def test_death_cause_reads_the_log(tmp_path, monkeypatch, log_text, returncode, cause):
    monkeypatch.setattr(exit_report, "_read_kernel_log", lambda: None)  # as without permission
    log = tmp_path / "log"
    log.write_text(log_text)
    found = exit_report.death_cause(exit_report.NodeExit("learner", 0, 1, returncode, log))
    if cause is None:
        assert found is None
    else:
        assert found is not None and cause in found, found
    # At a stop, a SIGKILL is the launcher's own: no out-of-memory guess.
    stopping = exit_report.death_cause(
        exit_report.NodeExit("learner", 0, 1, returncode, log), stopping=True
    )
    assert (stopping is None) == (cause is None or "out-of-memory" in cause)


@pytest.mark.parametrize(
    ("kernel_log", "cause"),
    [
        (
            [
                "[ 9.1] python invoked oom-killer: gfp_mask=0x140cca, order=0",
                "[ 9.2] oom-kill:constraint=CONSTRAINT_NONE,task=python,pid=4242,uid=0",
                "[ 9.3] Out of memory: Killed process 4242 (python) total-vm:9000000kB",
            ],
            "killed by the kernel's out-of-memory killer (kernel log: [ 9.3] Out of memory: "
            "Killed process 4242",
        ),
        (
            ["[ 9.3] Out of memory: Killed process 42420 (python) total-vm:9000000kB"],
            "the kernel log names no out-of-memory kill of pid 4242: another process killed it",
        ),
    ],
)
def test_a_sigkill_outside_a_stop_is_named_from_the_kernel_log(
    tmp_path, monkeypatch, kernel_log, cause
):
    monkeypatch.setattr(exit_report, "_read_kernel_log", lambda: kernel_log)
    log = tmp_path / "log"
    log.write_text("all fine\n")
    node = exit_report.NodeExit("actor", 1, 4242, -signal.SIGKILL, log)
    assert cause in exit_report.format_exit_report(node).splitlines()[1]
    assert exit_report.death_cause(node, stopping=True) is None  # the launcher's own kill


def test_describe_returncode():
    assert exit_report.describe_returncode(3) == "exit code 3"
    assert exit_report.describe_returncode(-15) == "killed by signal SIGTERM (15)"


def test_exit_report_without_log(tmp_path):
    node = exit_report.NodeExit("learner", 0, 1, 2, tmp_path / "missing")
    assert "exit code 2" in exit_report.format_exit_report(node)
    assert "is empty" in exit_report.format_exit_report(node)


# ---------------------------------------------------------------- real programs


class _LauncherRun(BackgroundRun):
    """`python tests/launch_programs.py <scenario> ...` with its own TMPDIR and token."""

    def __init__(self, scenario: str, tmp_path: Path, notice_secs: float):
        self.out_dir = tmp_path / "out"
        self.system_tmp = tmp_path / "systmp"
        self.system_tmp.mkdir()
        self.token = uuid.uuid4().hex
        self.log = tmp_path / "launcher.out"
        env = dict(os.environ, TMPDIR=str(self.system_tmp), LAUNCHER_TEST_TOKEN=self.token)
        # The replay group gets no overrides, so it sees what the launcher inherited: make
        # that independent of variables other test modules set in this pytest process.
        for name in launcher_nodes.PROBED_VARS:
            if name != "PYTHONUNBUFFERED":
                env.pop(name, None)
        command = [sys.executable, str(_LAUNCH_SCRIPT), scenario, str(self.out_dir)]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [*command, str(notice_secs)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=_TESTS.parent,
            )

    def wait_for_reports(self, names: list[str]) -> dict[str, dict]:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECS
        folder = launcher_nodes.reports_dir(self.out_dir)
        while not all((folder / f"{n}.json").exists() for n in names):
            if self.process.poll() is not None:
                pytest.fail(f"launcher exited early ({self.process.returncode}):\n{self.output()}")
            if time.monotonic() > deadline:
                self.kill_everything()
                pytest.fail(f"nodes did not report within {STARTUP_TIMEOUT_SECS} s")
            time.sleep(0.1)
        return self.reports()

    def reports(self) -> dict[str, dict]:
        folder = launcher_nodes.reports_dir(self.out_dir)
        return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}

    def processes_with_token(self) -> list[psutil.Process]:
        return processes.processes_marked("LAUNCHER_TEST_TOKEN", self.token)

    def kill_everything(self) -> list[str]:
        """Cleanup after a failed test, so that it does not spill into the next one."""
        killed = processes.kill_processes(self.processes_with_token())
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        return killed

    def assert_nothing_left(self, pids: list[int]) -> None:
        left = self.processes_with_token()
        if left:
            self.kill_everything()
        assert not left, f"processes of the program still running: {left}"
        for pid in pids:
            assert not _alive(pid), f"pid {pid} still running"
        children = [
            _describe(c) for c in psutil.Process().children(recursive=True) if _alive(c.pid)
        ]
        assert not children, f"the test process still has children: {children}"
        assert not list(self.system_tmp.glob("tmp*/job.pkl"))
        assert not list(self.system_tmp.glob("magi_lp_launch_*"))

    def assert_job_files_are_private(self, pid: int) -> None:
        """The node's job file lies in the launcher's private folder in TMPDIR."""
        cmdline = psutil.Process(pid).cmdline()
        data_file = Path(cmdline[cmdline.index("--data_file") + 1])
        assert data_file.name == "job.pkl"
        assert data_file.parent.parent.parent == self.system_tmp
        assert data_file.parent.parent.name.startswith("magi_lp_launch_")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _line_time(output: str, text: str) -> float:
    """The epoch time in the `[magi_lp.launcher HH:MM:SS.mmm]` prefix of the line with text."""
    match = re.search(r"\[magi_lp\.launcher (\d\d:\d\d:\d\d\.\d{3})\] " + re.escape(text), output)
    assert match, f"no launcher line with {text!r} in:\n{output}"
    clock = datetime.datetime.strptime(match.group(1), "%H:%M:%S.%f").time()
    return datetime.datetime.combine(datetime.date.today(), clock).timestamp()


def _stop_secs(output: str) -> float:
    """How long the nodes took to end once the launcher began stopping them."""
    match = re.search(r"nodes ended ([\d.]+) s after the stop began", output)
    assert match, output
    return float(match.group(1))


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {proc.status()} {proc.cmdline()}"
    except psutil.Error:
        return f"{proc.pid} (gone)"


def _all_pids(reports: dict[str, dict]) -> list[int]:
    pids = [r["pid"] for r in reports.values()]
    pids += [r["child_pid"] for r in reports.values() if "child_pid" in r]
    return pids


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_lp_stop_ends_program_with_group_envs_and_nothing_left(tmp_path):
    # Actor 1 ends up blocked in a Courier RPC, in C++, where Launchpad's SIGTERM handler
    # never runs: the node's stop watcher leaves its process after its own budget (half the
    # notice here), so no node is SIGKILLed.
    notice_secs = 3
    run = _LauncherRun("stop", tmp_path, notice_secs)

    code = run.wait(timeout=STARTUP_TIMEOUT_SECS + notice_secs + 30)
    exited_wall = time.time()

    output = run.output()
    assert code == 0, output
    reports = run.reports()
    assert set(reports) == {*ALL_REPORTS, "stop_requested"}, output
    stop_wall = reports["stop_requested"]["time"]
    noticed_after = _line_time(output, "received SIGTERM") - stop_wall
    stop_secs = _stop_secs(output)
    print(
        f"lp.stop(): noticed after {noticed_after:.2f} s, nodes ended {stop_secs:.1f} s later "
        f"(notice {notice_secs} s), launcher exited {exited_wall - stop_wall:.1f} s after lp.stop()"
    )
    assert noticed_after < 2, output
    # What the stop takes: the blocked actor's budget, plus the other stages' exits. The
    # budget says what is measured: the node must leave before the launcher's notice.
    budget = supervisor.node_stop_secs(notice_secs)
    assert budget <= stop_secs < notice_secs, output
    assert reports["stop_requested"]["table_size"] >= launcher_nodes.NUM_ACTORS
    for name, expected in [
        ("actor_0", launcher_nodes.ACTOR_ENV),
        ("actor_1", launcher_nodes.ACTOR_ENV),
        ("learner_0", launcher_nodes.LEARNER_ENV),
    ]:
        seen = reports[name]["env"]
        assert {k: seen[k] for k in expected} == expected, name
        assert seen["PYTHONUNBUFFERED"] == "1"
        assert reports[name]["jax"]["platforms"] == ["cpu"], name
        assert reports[name]["jax"]["preallocate_seen"] == expected["XLA_PYTHON_CLIENT_PREALLOCATE"]
    # Both specs are CPU nodes (the learner's gpu_if_available fell back): no GPU visible,
    # no preallocation, JAX's default memory fraction.
    for name in ("actor_0", "learner_0"):
        assert reports[name]["env"]["CUDA_VISIBLE_DEVICES"] == "", name
        assert reports[name]["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false", name
        assert reports[name]["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "", name
    # The replay group has no entry in envs: none of the overridden variables reach it.
    assert reports["replay_0"]["env"]["LAUNCHER_TEST_GROUP"] is None
    assert reports["replay_0"]["env"]["JAX_PLATFORMS"] is None
    assert "received SIGTERM" in output
    assert "killing them" not in output
    # Actor 0's child ended with its node: the launcher's sweep found nothing to kill.
    assert "left running" not in output, output
    assert "leaving the process" in (run.out_dir / "logs" / "actor" / "1").read_text()
    for group, index in [("replay", 0), ("learner", 0), ("actor", 0), ("actor", 1)]:
        assert (run.out_dir / "logs" / group / str(index)).is_file()
    run.assert_nothing_left(_all_pids(reports))


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_sigkilled_node_is_reported_and_program_stopped(tmp_path):
    notice_secs = 5
    run = _LauncherRun("serve", tmp_path, notice_secs)
    reports = run.wait_for_reports(ALL_REPORTS)
    victim = reports["actor_1"]
    assert _alive(victim["child_pid"])
    run.assert_job_files_are_private(victim["pid"])

    os.kill(victim["pid"], signal.SIGKILL)
    killed_at, killed_wall = time.monotonic(), time.time()
    code = run.wait(timeout=notice_secs + 30)
    elapsed = time.monotonic() - killed_at

    output = run.output()
    died_line = f"node actor/1 (group 'actor', pid {victim['pid']}) died: killed by signal SIGKILL"
    noticed_after = _line_time(output, died_line) - killed_wall
    stop_secs = _stop_secs(output)
    print(
        f"SIGKILL of actor/1: noticed after {noticed_after:.2f} s, other nodes stopped in "
        f"{stop_secs:.1f} s, launcher process exited after {elapsed:.1f} s"
    )
    assert code == 1, output
    assert noticed_after < 2, output
    # What is measured: every other node ends by itself (its own stop budget, 1 s, or its
    # SIGTERM handler), so none needs the notice's SIGKILL, however loaded the machine.
    assert "killing them" not in output, output
    assert stop_secs < notice_secs, output
    # The launcher leaves once every node has ended (15 s: a process exit on a loaded machine).
    assert elapsed - stop_secs < 15, output
    assert "actor 1 is up" in output  # the tail of its log
    # Nothing in its log says why, and no stop was under way: the likely reason is named.
    assert "cause: killed by SIGKILL while no stop was in progress" in output
    assert "exit code 1 (node actor/1 died)" in output
    run.assert_nothing_left(_all_pids(reports))


def test_earlier_node_logs_are_kept_with_a_launch_number(tmp_path):

    assert run_folders.keep_earlier_logs(tmp_path) is None
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "0").write_text("first launch")
    assert run_folders.keep_earlier_logs(tmp_path) == 1
    (tmp_path / "learner" / "0").write_text("second launch")
    assert run_folders.keep_earlier_logs(tmp_path) == 2
    assert (tmp_path / "learner" / "0.1").read_text() == "first launch"
    assert (tmp_path / "learner" / "0.2").read_text() == "second launch"
    assert not (tmp_path / "learner" / "0").exists()


def test_a_node_keeps_its_own_earlier_log_with_its_own_launch_number(tmp_path):
    # A node of several hosts opens its own log in the shared folder (cluster/host_node.py).
    log = tmp_path / "actor" / "1"
    assert run_folders.keep_earlier_log(log) is None  # nothing there yet
    log.parent.mkdir()
    log.write_text("first launch")
    (tmp_path / "actor" / "0.5").write_text("another node's log")  # not this node's number
    assert run_folders.keep_earlier_log(log) == 1
    log.write_text("second launch")
    assert run_folders.keep_earlier_log(log) == 2
    assert (tmp_path / "actor" / "1.1").read_text() == "first launch"
    assert (tmp_path / "actor" / "1.2").read_text() == "second launch"
    assert not log.exists()


def test_run_folders_of_dead_launchers_are_swept_and_others_left(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    for name, owner in (
        ("magi_lp_launch_dead", dead.pid),
        ("magi_lp_ray_dead", dead.pid),  # a Ray run's folder, its driver SIGKILLed
        ("magi_lp_launch_live", os.getppid()),
        ("magi_lp_ray_live", os.getppid()),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "launcher.pid").write_text(str(owner))
    (tmp_path / "magi_lp_launch_foreign").mkdir()  # no owner file: not one of ours
    removed = run_folders.sweep_stale_run_folders(str(tmp_path))
    assert sorted(p.name for p in removed) == ["magi_lp_launch_dead", "magi_lp_ray_dead"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "magi_lp_launch_foreign",
        "magi_lp_launch_live",
        "magi_lp_ray_live",
    ]


@pytest.mark.integration  # launcher processes of its own, racing
def test_sweeps_of_one_temp_dir_at_once_do_not_fail_on_each_others_removals(tmp_path):
    """A resubmitted SLURM job's nodes start together on each host and sweep its temp dir
    of the cancelled job's folders: one removed a folder another was listing, and that node
    died of FileNotFoundError (a fresh-clone suite, test_slurm's resubmission)."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    for index in range(150):
        folder = tmp_path / f"magi_lp_launch_stale{index}"
        folder.mkdir()
        for name in range(30):
            (folder / f"f{name}").write_text("x")
        (folder / "launcher.pid").write_text(str(dead.pid))
    sweep = (
        "import sys; from magi_lp.launch import run_folders; "
        "run_folders.sweep_stale_run_folders(sys.argv[1])"
    )
    sweepers = [
        subprocess.Popen([sys.executable, "-c", sweep, str(tmp_path)], stderr=subprocess.PIPE)
        for _ in range(8)
    ]
    errors = [p.communicate(timeout=60)[1].decode() for p in sweepers]
    assert all(p.returncode == 0 for p in sweepers), errors
    assert not list(tmp_path.iterdir())


class _WrittenIntoAtItsRemoval(type(Path())):
    """A run folder that a thread of the leaving process writes into just as it is removed
    (a node leaving with os._exit past its notice while its main thread still runs)."""

    writes = 1

    def rmdir(self):
        if _WrittenIntoAtItsRemoval.writes:
            _WrittenIntoAtItsRemoval.writes -= 1
            (self / "autograph_late.py").write_text("x")
        super().rmdir()


def test_a_folder_written_into_while_it_is_removed_stays_owned_for_the_next_sweep(
    tmp_path, monkeypatch
):
    """A file written into a run folder just as it is removed: the owner file had gone
    first, and the folder stayed with no owner, where no sweep ever removes it."""
    import subprocess
    import sys

    monkeypatch.setattr(_WrittenIntoAtItsRemoval, "writes", 1)

    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    folder = _WrittenIntoAtItsRemoval(tmp_path / "magi_lp_launch_leaving")
    folder.mkdir()
    (folder / "tf_file").write_text("x")
    (folder / "launcher.pid").write_text(str(dead.pid))
    run_folders._remove_owned(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["autograph_late.py", "launcher.pid"]
    assert run_folders.sweep_stale_run_folders(str(tmp_path)) == [tmp_path / folder.name]
    assert not list(tmp_path.iterdir())

    # Written into at every pass: nothing more is tried, and the owner file stays.
    folder.mkdir()
    (folder / "launcher.pid").write_text(str(dead.pid))
    rmtree = run_folders.shutil.rmtree

    def rewritten(path, **kwargs):
        rmtree(path, **kwargs)
        Path(path).mkdir()

    (folder / "busy").mkdir()
    monkeypatch.setattr(run_folders.shutil, "rmtree", rewritten)
    run_folders._remove_owned(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["busy", "launcher.pid"]


def _stopped_node(
    log: Path, on_sigterm: str, group: str, notice_secs: float, **options
) -> tuple[int, subprocess.Popen, list[str]]:
    """A node whose SIGTERM handler is `on_sigterm` (Python), up, then a supervisor's stop of
    it: (its exit code, the node's process, what the supervisor said)."""
    code = f"import os, signal, time\nsignal.signal(signal.SIGTERM, {on_sigterm})\n"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", code + "print('up', flush=True)\ntime.sleep(60)"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while "up" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines: list[str] = []
    signals = supervisor.StopSignals()
    signals.received.append(signal.SIGTERM)
    watcher = supervisor.Supervisor(
        [supervisor.NodeProcess(group, 0, process, log)],
        signals,
        notice_secs,
        uuid.uuid4().hex,
        lines.append,
        **options,
    )
    return watcher.run(), process, lines


def test_a_node_killed_at_the_notice_is_a_fault_reported_once(tmp_path):
    """SIGKILL after the notice is the last resort: one line per stage, exit code 1."""
    code, process, lines = _stopped_node(tmp_path / "stubborn.log", "signal.SIG_IGN", "actor", 0.5)
    assert code == 1
    assert process.returncode == -signal.SIGKILL
    kills = [line for line in lines if "killing them" in line]
    assert len(kills) == 1 and "a fault" in kills[0], lines
    assert "actor/0 SIGKILLed after the 0.5 s notice" in lines[-1], lines


def test_a_saving_node_killed_by_someone_else_in_its_final_save_fails_the_stop(tmp_path):
    """It said the node's unsaved work was lost, and exited 0."""
    code, _, lines = _stopped_node(
        tmp_path / "learner.log",
        "lambda *_: os.kill(os.getpid(), signal.SIGKILL)",
        "learner",
        5.0,
        saves_at_stop=frozenset({"learner"}),
    )
    assert code == 1, lines
    assert any("before it finished its final save" in line for line in lines), lines
    assert lines[-1].endswith("exit code 1 (learner/0 failed while stopping; see above)"), lines


@pytest.mark.parametrize(
    ("sig", "asked", "said"),
    [
        # lp.stop() from the coordinator: a SIGTERM, with the run's marker made first.
        (signal.SIGTERM, True, "the coordinator reached max_actor_steps: stopping 1 nodes"),
        # A SIGTERM from outside, or a Ctrl-C (even with the marker there): the signal.
        (signal.SIGTERM, False, "received SIGTERM: stopping 1 nodes"),
        (signal.SIGINT, True, "received SIGINT: stopping 1 nodes"),
    ],
    ids=["lp-stop", "sigterm", "ctrl-c"],
)
def test_the_stop_says_whether_the_program_asked_for_it(tmp_path, sig, asked, said):
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    if asked:
        node_lifetime_env = {node_lifetime.RUN_TMP_VAR: str(tmp_path)}
        with mock.patch.dict(os.environ, node_lifetime_env):
            node_lifetime.note_stop_request()
    lines = []
    signals = supervisor.StopSignals()
    signals.received.append(sig)
    watcher = supervisor.Supervisor(
        [supervisor.NodeProcess("actor", 0, process, tmp_path / "actor.log")],
        signals,
        5.0,
        uuid.uuid4().hex,
        lines.append,
        requested_stop=functools.partial(node_lifetime.requested_stop, str(tmp_path)),
    )
    assert watcher.run() == 0, lines
    assert any(line.startswith(said) for line in lines), lines
