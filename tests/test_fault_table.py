"""The fault table (issue 66): the same promises on every engine, tested once.

One toy program graph (tests/fault_toys.py: a counter, a replay, a learner that 'saves' for
`SAVE_S` at its stop, an actor; no JAX) runs through the real engine, `local` (Launchpad) on
the Launchpad stack and `ray` on the current one, in a process of its own started as a
terminal's job would be (its own process group, its output to a file). For each fault the
same promise is asserted on both: the exit code, the lines that matter (the stop line, the
end line with its cause), that nothing is left (no process with the launch's marker
`MAGI_LP_LAUNCH_ID` or the test's own, no folder in the run's TMPDIR, nothing in HOME), and
the time from the fault to the exit under a bound that only catches a hang (`HANG_BOUND_S`:
the suite runs on a busy 2-core machine; timing goals live in benchmarks/).

Node names are the engines' own: `learner/0` in Launchpad's lines, `learner_0` in Ray's.
Each test prints one `fault table:` line (what the user saw last, the seconds, what was left).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from magi_lp.launch import processes, run_folders
from magi_lp.launch.supervisor import LAUNCH_ID_VAR as LAUNCH_ID
from magi_lp.stack import stack_here

pytestmark = pytest.mark.integration

_TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(_TESTS))
import fault_toys  # noqa: E402

NOTICE_S = 15.0
"""The termination notice: longer than the learner's save (`fault_toys.SAVE_S`)."""
STAGES = 3  # actors, then the learner, then replay and counter
HANG_BOUND_S = NOTICE_S * STAGES + 30
"""From a fault to the exit: only a hang takes longer, however busy the machine."""
START_TIMEOUT_S = 20  # the Ray start's timeout in the start-phase row
START_TIMEOUT_VAR = "MAGI_LP_RAY_START_TIMEOUT_S"
STARTUP_S = 240.0
MARK_VAR = "MAGI_LP_TEST_MARK"
LAUNCH_ID_VAR = LAUNCH_ID  # every process a launch starts carries it
NODES = ("counter_0", "replay_0", "learner_0", "actor_0")

ENGINES = [
    pytest.param(
        "local",
        marks=pytest.mark.skipif(
            stack_here() != "launchpad",
            reason="--launcher local is the Launchpad stack's engine (.venv, Python 3.10)",
        ),
    ),
    pytest.param(
        "ray",
        marks=pytest.mark.skipif(
            stack_here() != "ray",
            reason="--launcher ray is the current stack's engine (.venv312, Python 3.12)",
        ),
    ),
]
START_HANG_ENGINES = [
    pytest.param(
        "local",
        marks=pytest.mark.skip(
            reason="no start phase can hang on Launchpad: it starts every node at once as a "
            "local process of its own; nothing schedules them, so no node waits to be placed"
        ),
    ),
    ENGINES[1],
]


def node(engine: str, name: str) -> str:
    """A node as the engine's lines name it: `learner/0` (Launchpad), `learner_0` (Ray)."""
    return name.replace("_", "/") if engine == "local" else name


class ToyRun:
    """`python tests/fault_toys.py <engine> ...` as a terminal's job: its own process group,
    a short TMPDIR of its own (Ray's socket paths must fit), HOME of its own and the test's
    marker, which every process of the run inherits."""

    def __init__(self, engine: str, tmp_path: Path, scenario: str = "plain", **env: str):
        self.engine = engine
        self.out = tmp_path / "out"
        self.reports = self.out / "reports"
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.tmp = Path(tempfile.mkdtemp(prefix="ft_", dir="/tmp"))
        self.mark = uuid.uuid4().hex
        self.log = tmp_path / "run.log"
        child_env = dict(os.environ, TMPDIR=str(self.tmp), HOME=str(self.home), **env)
        child_env.update(PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", **{MARK_VAR: self.mark})
        child_env.pop("RAY_ADDRESS", None)
        command = [sys.executable, fault_toys.__file__, engine, str(self.out), scenario]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [*command, f"{NOTICE_S:g}"],
                cwd=_TESTS.parent,
                env=child_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.ended_at: float | None = None

    # -- watching

    def output(self) -> str:
        return self.log.read_text()

    def said(self) -> list[str]:
        """The engine's lines (`[magi_lp.launcher hh:mm:ss.mmm] ...`), without the prefix."""
        return re.findall(r"^\[magi_lp\.launcher [\d:.]+\] (.*)$", self.output(), re.M)

    def report(self, name: str) -> dict:
        return json.loads((self.reports / f"{name}.json").read_text())

    def has(self, name: str) -> bool:
        return (self.reports / f"{name}.json").exists()

    def wait_for(self, names: tuple[str, ...], timeout: float = STARTUP_S) -> None:
        deadline = time.monotonic() + timeout
        while not all(self.has(n) for n in names):
            if self.process.poll() is not None:
                pytest.fail(f"exited ({self.process.returncode}) early:\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {names} within {timeout} s:\n{self.output()[-4000:]}")
            time.sleep(0.1)

    def wait(self, timeout: float = HANG_BOUND_S + 60) -> int:
        """Its exit code; `ended_at` its monotonic time (within a poll)."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                pytest.fail(f"still running after {timeout} s:\n{self.output()[-4000:]}")
            time.sleep(0.05)
        self.ended_at = time.monotonic()
        return self.process.returncode

    # -- acting

    def ctrl_c(self) -> float:
        """SIGINT to the run's process group, as Ctrl-C in its terminal; when it was sent."""
        sent = time.monotonic()
        os.killpg(self.process.pid, signal.SIGINT)
        return sent

    def signal(self, sig: int, pid: int | None = None) -> float:
        sent = time.monotonic()
        os.kill(self.process.pid if pid is None else pid, sig)
        return sent

    # -- what is left

    def launch_ids(self) -> set[str]:
        ids = {self.report(n).get("launch_id") for n in NODES if self.has(n)}
        assert None not in ids and len(ids) <= 1, ids
        return ids

    def left_running(self) -> list[psutil.Process]:
        found = processes.processes_marked(MARK_VAR, self.mark)
        for launch_id in self.launch_ids():
            found += processes.processes_marked(LAUNCH_ID_VAR, launch_id)
        return list({p.pid: p for p in found}.values())

    def wait_until_nothing_runs(self, timeout: float) -> float:
        """Waits for every process of the run to end; the monotonic time none was left."""
        deadline = time.monotonic() + timeout
        while left := self.left_running():
            if time.monotonic() > deadline:
                names = [_describe(p) for p in left]
                self.kill_everything()
                pytest.fail(f"left running {timeout} s later: {names}")
            time.sleep(0.1)
        return time.monotonic()

    def temp_left(self) -> list[str]:
        return sorted(p.name for p in self.tmp.iterdir())

    def assert_nothing_left(self) -> None:
        self.wait_until_nothing_runs(20.0)  # the engine waited for them: only their exits
        assert not self.temp_left(), f"left in TMPDIR: {self.temp_left()}"
        assert not any(self.home.iterdir()), f"files in HOME: {list(self.home.rglob('*'))}"

    def kill_everything(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        processes.kill_processes(self.left_running())
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} ({proc.name()})"
    except psutil.Error:
        return f"{proc.pid} (gone)"


@pytest.fixture
def runs(tmp_path):
    """Starts `ToyRun`s; whatever of them is still running at the test's end (a failed
    assertion) is killed, and their TMPDIRs removed."""
    started: list[ToyRun] = []

    def start(engine: str, scenario: str = "plain", **env: str) -> ToyRun:
        run = ToyRun(engine, tmp_path, scenario, **env)
        started.append(run)
        return run

    yield start
    for run in started:
        run.kill_everything()
        shutil.rmtree(run.tmp, ignore_errors=True)


def _end_line(code: int, cause: str = "") -> str:
    """The end line's pattern: `all 4 nodes ended ... ; exit code <code><cause>`."""
    return (
        r"all \d+ nodes ended [\d.]+ s after the stop began( \(stages: [^)]*\))?; "
        rf"exit code {code}{re.escape(cause)}"
    )


class EndLineNotLastError(AssertionError):
    """The end line is there, but a line follows it."""


def _assert_ends_with(run: ToyRun, code: int, cause: str = "") -> None:
    """The end line, with its cause, is there, and it is the engine's last line (the exit
    code is the last thing said: `stop_machine.Done`)."""
    said = run.said()
    ends = [i for i, line in enumerate(said) if re.fullmatch(_end_line(code, cause), line)]
    assert ends, run.output()[-3000:]
    if ends[-1] != len(said) - 1:
        raise EndLineNotLastError(f"after the end line: {said[ends[-1] + 1 :]}")


def _record(run: ToyRun, row: str, code: int, secs: float, left: str = "nothing") -> None:
    """The table's row, for the closing note (`pytest -rP` shows it)."""
    last = " | ".join(run.said()[-3:])
    print(f"fault table: {run.engine} | {row} | exit {code} | {secs:.1f} s | left: {left} | {last}")


def _stopped_by(run: ToyRun, how: str) -> tuple[int, float]:
    """Sends `how` (ctrl-c, sigterm) once every node is up; (exit code, seconds to the exit)."""
    run.wait_for(NODES)
    sent = run.ctrl_c() if how == "ctrl-c" else run.signal(signal.SIGTERM)
    code = run.wait()
    return code, run.ended_at - sent


@pytest.mark.timeout(420)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("how", "name"), [("ctrl-c", "SIGINT"), ("sigterm", "SIGTERM")], ids=["ctrl-c", "sigterm"]
)
def test_a_stop_signal_stops_the_nodes_in_stages_and_the_learner_saves(runs, engine, how, name):
    run = runs(engine)
    code, secs = _stopped_by(run, how)
    assert code == 0, run.output()[-3000:]
    said = run.said()
    assert any(line.startswith(f"received {name}: stopping 4 nodes in 3 stages") for line in said)
    assert not any("killing" in line for line in said), said
    assert run.has("saved"), run.output()[-3000:]  # the final save is whole
    _assert_ends_with(run, 0)
    # What the engine said is kept beside the node logs, dated.
    kept = (run.out / "work/nodes/launcher.log").read_text()
    assert f"received {name}: stopping" in kept and "exit code 0" in kept, kept
    assert secs < HANG_BOUND_S, secs
    run.assert_nothing_left()
    _record(run, how, code, secs)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("presses", [2, 3], ids=["second-ctrl-c", "third-ctrl-c"])
def test_more_ctrl_cs_during_the_stop_hurry_it_and_a_third_loses_the_save(runs, engine, presses):
    """A Ctrl-C, while the actor does not end at its stop (it would be killed only after the
    notice), then a second: it kills the nodes that do not save, and the learner is told to
    stop and finishes its save; a third during that save kills it: its save is lost, exit 1."""
    run = runs(engine, "stubborn")
    run.wait_for(NODES)
    first = run.ctrl_c()
    time.sleep(2.0)  # past a node's own stop budget (1 s on Launchpad): the actor is stuck
    assert not run.has("saving"), run.output()[-3000:]
    second = run.ctrl_c()
    if presses == 3:
        run.wait_for(("saving",), timeout=HANG_BOUND_S)
        # More than an echo apart (`interrupts.ECHO_SECS`: one Ctrl-C reaching it twice).
        time.sleep(max(0.0, second + 1.0 - time.monotonic()))
        run.ctrl_c()
    code = run.wait()
    secs = run.ended_at - first
    said = run.said()
    learner = node(engine, "learner_0")
    assert any(line.startswith("received SIGINT: stopping 4 nodes in 3 stages") for line in said)
    assert (
        "asked again to stop: killing the nodes that do not save; waiting up to "
        f"{NOTICE_S:g} s for {learner} to write its final checkpoint (Ctrl-C once more kills "
        "it without saving)"
    ) in said, said
    assert not any("still running after" in line for line in said), said  # not the notice
    assert run.has("saving"), run.output()[-3000:]  # the learner was told to stop, after it
    if presses == 2:
        assert code == 0, run.output()[-3000:]
        assert run.has("saved"), run.output()[-3000:]
        assert not any("final save is lost" in line for line in said), said
        _assert_ends_with(run, 0)
    else:
        assert code == 1, run.output()[-3000:]
        assert not run.has("saved"), run.output()[-3000:]
        assert (
            f"asked again to stop: killing the remaining nodes now ({learner}: its final save "
            "is lost)"
        ) in said, said
        _assert_ends_with(run, 1, f" ({learner} failed while stopping; see above)")
    assert secs < HANG_BOUND_S, secs
    run.assert_nothing_left()
    _record(run, f"{presses} ctrl-c", code, secs)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_sigkilled_node_is_named_as_died_and_the_program_stops(runs, engine):
    run = runs(engine)
    run.wait_for(NODES)
    victim = run.report("actor_0")["pid"]
    sent = run.signal(signal.SIGKILL, victim)
    code = run.wait()
    secs = run.ended_at - sent
    assert code == 1, run.output()[-3000:]
    actor = node(engine, "actor_0")
    output = run.output()
    died = f"node actor/0 (group 'actor', pid {victim}) died: killed by signal SIGKILL"
    assert died in output, output[-3000:]
    assert "actor is up" in output.split(died, 1)[1], output[-3000:]  # its log's last lines
    # Nothing in its log says why, and no stop was under way: the likely reason is named.
    assert "cause: killed by SIGKILL while no stop was in progress" in output, output[-3000:]
    said = run.said()
    assert any(line.startswith(f"node {actor} died: stopping 3 nodes") for line in said), said
    assert not any("killing" in line for line in said), said  # the others end by themselves
    assert run.has("saved"), output[-3000:]  # the others stopped in stages: the learner saved
    _assert_ends_with(run, 1, f" (node {actor} died)")
    assert secs < HANG_BOUND_S, secs
    run.assert_nothing_left()
    _record(run, "node SIGKILLed", code, secs)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("engine", ENGINES)
def test_what_a_node_leaves_running_is_swept_and_named(runs, engine):
    """The actor starts `sleep` in a session of its own and leaves it running: neither the
    node's own end nor Ray's end of its worker reaches it; the end of the run kills it and
    says so."""
    run = runs(engine, "leave")
    code, secs = _stopped_by(run, "ctrl-c")
    assert code == 0, run.output()[-3000:]
    left = run.report("actor_0")["left"]
    swept = f"killed 1 processes that nodes had started and left running: {left} (sleep)"
    assert swept in run.said(), run.output()[-3000:]
    assert not psutil.pid_exists(left) or psutil.Process(left).status() == "zombie"
    assert secs < HANG_BOUND_S, secs
    run.assert_nothing_left()
    _record(run, "node leaves a child", code, secs)
    _assert_ends_with(run, 0)  # last: on Ray, the sweep's line comes after it


@pytest.mark.timeout(420)
@pytest.mark.parametrize("engine", ENGINES)
def test_the_nodes_do_not_outlive_a_sigkilled_driver(runs, engine):
    """SIGKILL of the process that runs the engine (Launchpad's launcher, Ray's driver): no
    stop runs, and nothing says so. Launchpad's nodes die with their parent (their
    parent-death signal); Ray's embedded cluster (its GCS, raylet and workers) ends with its
    driver. The run's temp folder stays, owned by the dead process: the next launch's sweep
    removes it."""
    run = runs(engine)
    run.wait_for(NODES)
    sent = run.signal(signal.SIGKILL)
    code = run.wait(30)
    assert code == -signal.SIGKILL
    gone = run.wait_until_nothing_runs(HANG_BOUND_S)
    secs = gone - sent
    left = run.temp_left()
    assert len(left) == 1 and left[0].startswith(run_folders.RUN_PREFIXES), left
    assert run_folders.sweep_stale_run_folders(str(run.tmp)), left  # the next launch's sweep
    run.assert_nothing_left()
    _record(run, "driver SIGKILLed", code, secs, left=f"{left[0]} (swept by the next launch)")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("engine", START_HANG_ENGINES)
def test_a_node_that_cannot_be_placed_ends_the_start_after_its_timeout(runs, engine):
    """The plan gives the learner a GPU this machine lacks (as a joined cluster short of the
    plan's GPUs): Ray keeps it pending; after the start's timeout one line names the node and
    the GPU, the nodes made beside it stop as in any stop, exit 1."""
    run = runs(engine, "unschedulable", **{START_TIMEOUT_VAR: str(START_TIMEOUT_S)})
    began = time.monotonic()
    code = run.wait(STARTUP_S + START_TIMEOUT_S + HANG_BOUND_S)
    assert code == 1, run.output()[-3000:]
    learner = node(engine, "learner_0")
    missing = f"node {learner} could not be scheduled for {START_TIMEOUT_S} s"
    said = run.said()
    assert (
        f"{missing}: the Ray cluster has 0 GPU and it asks for 1; "
        "give the cluster what it lacks (an autoscaler adds it, a fixed cluster never does), "
        f"or set {START_TIMEOUT_VAR} to wait longer"
    ) in said, said
    assert any(line.startswith("started 3 of 4 nodes") for line in said), said
    assert not run.has("learner_0")
    _assert_ends_with(run, 1, f" ({missing})")
    run.assert_nothing_left()
    _record(run, "start hang: timeout", code, run.ended_at - began, left="nothing")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("engine", START_HANG_ENGINES)
def test_a_ctrl_c_while_a_node_waits_to_be_placed_stops_the_run(runs, engine):
    """The same start with the default timeout (300 s): a Ctrl-C once the nodes beside the
    learner are made ends it, stopping them as any stop does."""
    run = runs(engine, "unschedulable")
    run.wait_for(("counter_0.made", "replay_0", "actor_0.made"))  # none runs: a wave's
    # nodes run once every one of them is made
    time.sleep(0.5)
    sent = run.ctrl_c()
    code = run.wait()
    secs = run.ended_at - sent
    assert code == 0, run.output()[-3000:]
    said = run.said()
    assert any(line.startswith("started 3 of 4 nodes") for line in said), said
    assert any(line.startswith("received SIGINT: stopping 3 nodes") for line in said), said
    assert not any("could not be scheduled" in line for line in said), said
    _assert_ends_with(run, 0)
    assert secs < HANG_BOUND_S, secs
    run.assert_nothing_left()
    _record(run, "start hang: ctrl-c", code, secs)
