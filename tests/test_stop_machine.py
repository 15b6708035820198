"""The tiered stop's rules (`magi_lp.launch.stop_machine`), one transition at a time, on a
fake clock: no process, no signal, no sleep. The engines' tests check their verbs."""

from __future__ import annotations

import signal

import pytest

from magi_lp.launch.stop_machine import (
    Done,
    Fault,
    KillNodes,
    Node,
    NodeEnded,
    ReportExit,
    Say,
    StopAsked,
    StopBegun,
    StopMachine,
    StopNodes,
    StopSignal,
    StopWords,
    Tick,
    stop_outcome,
)

NOTICE = 10.0
KILL = -signal.SIGKILL

# The program of a one-machine run: actors first, then the learner (saves), then the rest.
PROGRAM = [
    Node("actor/0", 0),
    Node("actor/1", 0),
    Node("learner/0", 1, saves=True),
    Node("replay/0", 2),
    Node("counter/0", 2),
]


class Run:
    """A machine on a clock the test moves; what it said, in order."""

    def __init__(self, nodes=PROGRAM, words: StopWords | None = None):
        self.now = 100.0
        self.machine = StopMachine(nodes, NOTICE, self.now, words or StopWords())
        self.actions: list = []

    def feed(self, event) -> list:
        actions = self.machine.handle(event)
        self.actions += actions
        return actions

    def at(self, seconds: float) -> list:
        """The clock moves `seconds` on: a tick."""
        self.now += seconds
        return self.feed(Tick(self.now))

    def signal(self, sig: int, asked: str | None = None) -> list:
        return self.feed(StopSignal(sig, asked))

    def end(self, name: str, code: int = 0) -> list:
        return self.feed(NodeEnded(name, code))

    def end_all(self, *names: str) -> None:
        """Each of `names` ends with 0, in order."""
        for name in names:
            self.end(name)

    def said(self) -> list[str]:
        return [a.line for a in self.actions if isinstance(a, Say)]

    def finish(self) -> Done:
        return self.machine.finish(self.now)


def _stopped(actions: list) -> list[tuple[str, ...]]:
    return [a.names for a in actions if isinstance(a, StopNodes)]


def _killed(actions: list) -> list[KillNodes]:
    return [a for a in actions if isinstance(a, KillNodes)]


def test_a_plain_stop_tells_the_stages_in_order_and_ends_with_exit_code_0():
    run = Run()
    first = run.signal(signal.SIGINT)
    assert first[0] == StopBegun("received SIGINT")  # the last look, before any node is told
    assert run.said() == [
        "received SIGINT: stopping 5 nodes in 3 stages (each: SIGTERM, SIGKILL after 10 s)"
    ]
    assert _stopped(first) == [("actor/0", "actor/1")]
    run.at(1.0)
    assert _stopped(run.end("actor/0")) == []  # the stage is not over yet
    assert _stopped(run.end("actor/1")) == [("learner/0",)]
    run.at(2.0)
    assert _stopped(run.end("learner/0")) == [("replay/0", "counter/0")]
    run.at(0.5)
    run.end_all("counter/0", "replay/0")
    assert run.machine.over
    done = run.finish()
    assert done.code == 0
    assert done.lines == (
        "all 5 nodes ended 3.5 s after the stop began (stages: 1.0 + 2.0 + 0.5 s); exit code 0",
    )
    assert not _killed(run.actions)


def test_one_stage_is_said_as_one_and_the_engines_words_are_used():
    run = Run([Node("actor_0"), Node("actor_1")], StopWords("stop", "kill"))
    run.signal(signal.SIGTERM)
    assert run.said() == ["received SIGTERM: stopping 2 nodes (stop now, kill after 10 s)"]


def test_a_stage_with_no_node_left_is_skipped():
    run = Run()
    run.end("learner/0")  # finished by itself before the stop: reported, the program goes on
    assert run.said() == ["node learner/0 finished (exit code 0)"]
    assert not run.machine.stopping
    run.signal(signal.SIGINT)
    assert "stopping 4 nodes in 2 stages" in run.said()[-1]
    run.end("actor/0")
    assert _stopped(run.end("actor/1")) == [("replay/0", "counter/0")]


def test_the_stop_says_whether_the_program_asked_for_it():
    """lp.stop() is a SIGTERM with a reason; any other signal is named."""
    asked = "the coordinator reached max_actor_steps"
    run = Run()
    run.signal(signal.SIGTERM, asked)
    assert run.said()[0].startswith(f"{asked}: stopping 5 nodes")
    other = Run()
    other.signal(signal.SIGINT, asked)  # a Ctrl-C: whatever a node wrote
    assert other.said()[0].startswith("received SIGINT: stopping 5 nodes")
    limit = Run()
    assert limit.feed(StopAsked("the step limit"))[0] == StopBegun("the step limit")
    assert limit.said()[0].startswith("the step limit: stopping 5 nodes")


def test_nodes_past_their_notice_are_killed_and_named_once():
    run = Run()
    run.signal(signal.SIGHUP)
    run.end("actor/0")
    assert run.at(NOTICE - 0.1) == []
    late = run.at(0.1)
    assert late == [
        Say(
            "nodes still running after 10 s: actor/1; killing them (a fault: a node should end "
            "by itself; see the end of its log)"
        ),
        KillNodes(("actor/1",), sweep=False),
    ]
    assert run.at(1.0) == []  # killed, not seen ended yet: not again
    assert _stopped(run.end("actor/1", KILL)) == [("learner/0",)]
    run.at(0.2)
    run.end_all("learner/0", "replay/0", "counter/0")
    done = run.finish()
    assert done.code == 1
    assert done.lines[-1].endswith("exit code 1 (actor/1 SIGKILLed after the 10 s notice)")


def test_the_notice_and_the_outcome_use_the_engines_words_for_the_kill():
    """Several hosts: the coordinator cannot kill a node; the node exits at its own notice."""
    words = StopWords("stop", "exit", killing="they exit now", killed="made to exit")
    run = Run([Node("actor/0"), Node("learner/0", 1)], words)
    run.signal(signal.SIGTERM)
    assert (
        run.said()[-1]
        == "received SIGTERM: stopping 2 nodes in 2 stages (each: stop, exit after 10 s)"
    )
    late = run.at(NOTICE)
    assert late[0] == Say(
        "nodes still running after 10 s: actor/0; they exit now (a fault: a node should end by "
        "itself; see the end of its log)"
    )
    run.end("actor/0")  # its own exit
    run.end("learner/0")
    assert (
        run.finish().lines[-1].endswith("exit code 1 (actor/0 made to exit after the 10 s notice)")
    )


def test_the_end_names_its_cause_apart_from_its_lines():
    clean = Run([Node("actor/0")])
    clean.signal(signal.SIGTERM)
    clean.end("actor/0")
    assert clean.finish().cause == ""
    failed = Run([Node("actor/0"), Node("learner/0", 1)])
    failed.signal(signal.SIGTERM)
    failed.end("actor/0", 2)
    failed.end("learner/0")
    assert failed.finish().cause == "actor/0 failed while stopping; see above"
    lost = Run([Node("actor/0")])
    lost.feed(Fault("Ray's gcs_server (pid 7) died"))
    lost.end("actor/0")
    assert lost.finish().cause == "Ray's gcs_server (pid 7) died"


def test_each_stage_has_its_own_notice():
    run = Run()
    run.signal(signal.SIGINT)
    run.at(9.0)
    run.end_all("actor/0", "actor/1")
    assert run.at(9.0) == []  # 18 s after the stop, 9 s after the learner was told
    assert _killed(run.at(1.0)) == [KillNodes(("learner/0",))]


def test_a_second_ctrl_c_kills_the_stages_before_the_saver_and_waits_for_its_save():
    run = Run()
    run.signal(signal.SIGINT)
    run.at(3.0)
    hurried = run.signal(signal.SIGINT)
    assert hurried == [
        Say(
            "asked again to stop: killing the nodes that do not save; waiting up to 10 s for "
            "learner/0 to write its final checkpoint (Ctrl-C once more kills it without saving)"
        ),
        KillNodes(("actor/0", "actor/1")),
    ]
    run.end("actor/0", KILL)
    assert _stopped(run.end("actor/1", KILL)) == [("learner/0",)]
    # The saver keeps its notice, counted from its own stage's start.
    assert run.at(NOTICE - 1) == []
    run.end_all("learner/0", "replay/0", "counter/0")
    assert run.finish().code == 0  # killed on request: not a fault


def test_a_second_ctrl_c_with_no_saver_left_kills_everything():
    run = Run()
    run.signal(signal.SIGINT)
    for name in ("actor/0", "actor/1", "learner/0"):
        run.end(name)
    actions = run.signal(signal.SIGINT)
    assert actions == [
        Say("asked again to stop: killing the remaining nodes now"),
        KillNodes(("replay/0", "counter/0"), sweep=True),
    ]
    run.end("replay/0", KILL)
    run.end("counter/0", KILL)
    assert run.finish().code == 0


def test_a_third_ctrl_c_kills_the_saver_and_says_its_save_is_lost():
    run = Run()
    run.signal(signal.SIGINT)
    run.signal(signal.SIGINT)
    run.end("actor/0", KILL)
    run.end("actor/1", KILL)
    actions = run.signal(signal.SIGINT)
    assert actions == [
        Say(
            "asked again to stop: killing the remaining nodes now (learner/0: its final save "
            "is lost)"
        ),
        KillNodes(("learner/0", "replay/0", "counter/0"), sweep=True),
    ]
    assert run.at(2 * NOTICE) == []  # everything is killed: no notice kills after it
    for name in ("learner/0", "replay/0", "counter/0"):
        assert _stopped(run.end(name, KILL)) == []
    done = run.finish()
    assert done.code == 1
    assert done.lines == (
        "node learner/0 was killed by signal SIGKILL (9) before it finished its final save: "
        "what it had not saved is lost; a relaunch resumes from its last checkpoint",
        "all 5 nodes ended 20.0 s after the stop began (stages: 0.0 + 20.0 s); exit code 1 "
        "(learner/0 failed while stopping; see above)",
    )


@pytest.mark.parametrize("stopping", [False, True], ids=["before-the-stop", "while-stopping"])
def test_sigquit_kills_everything_at_once(stopping):
    run = Run()
    if stopping:
        run.signal(signal.SIGINT)
    actions = run.signal(signal.SIGQUIT)
    assert actions[:2] == [
        Say(
            "received SIGQUIT: killing the remaining nodes now (learner/0: its final save is lost)"
        ),
        KillNodes(tuple(n.name for n in PROGRAM), sweep=True),
    ]
    assert actions[2:] == ([] if stopping else [StopBegun("received SIGQUIT")])
    for node in PROGRAM:
        assert not [a for a in run.end(node.name, KILL) if isinstance(a, ReportExit)]
    assert not [line for line in run.said() if "died" in line]  # asked for: nobody died
    done = run.finish()
    assert done.code == 1 and done.lines[-1].endswith(
        "(learner/0 failed while stopping; see above)"
    )


def test_a_node_that_dies_before_the_stop_is_named_and_stops_the_program():
    run = Run()
    run.at(5.0)
    actions = run.end("actor/1", 1)
    assert actions[:2] == [ReportExit("actor/1", 1, stopping=False), StopBegun("node actor/1 died")]
    assert run.said() == [
        "node actor/1 died: stopping 4 nodes in 3 stages (each: SIGTERM, SIGKILL after 10 s)"
    ]
    assert _stopped(actions) == [("actor/0",)]
    for name in ("actor/0", "learner/0", "replay/0", "counter/0"):
        run.end(name)
    assert run.finish() == Done(
        1,
        (
            "all 5 nodes ended 0.0 s after the stop began (stages: 0.0 + 0.0 + 0.0 s); "
            "exit code 1 (node actor/1 died)",
        ),
        "node actor/1 died",
    )


def test_a_node_killed_by_a_signal_before_the_stop_died_too():
    run = Run()
    actions = run.end("learner/0", KILL)
    assert actions[0] == ReportExit("learner/0", KILL, stopping=False)
    assert run.machine.stopping


def test_every_node_finished_by_itself_is_exit_code_0_with_no_stop():
    run = Run([Node("evaluator/0"), Node("actor/0")])
    run.end_all("evaluator/0", "actor/0")
    assert run.machine.over and not run.machine.stopping
    assert run.said() == [
        "node evaluator/0 finished (exit code 0)",
        "node actor/0 finished (exit code 0)",
    ]
    assert run.finish() == Done(0, ("all 2 nodes ended; exit code 0",))


def test_a_node_that_fails_at_its_stop_fails_the_stop():
    run = Run()
    run.signal(signal.SIGTERM)
    run.end("actor/0")
    run.end("actor/1", -signal.SIGTERM)  # ended by the SIGTERM itself: not a failure
    actions = run.end("learner/0", 1)  # its final save failed
    assert actions[0] == ReportExit("learner/0", 1, stopping=True)
    run.end_all("replay/0", "counter/0")
    done = run.finish()
    assert done.code == 1
    assert done.lines[-1].endswith("exit code 1 (learner/0 failed while stopping; see above)")


def test_a_saver_sigkilled_by_someone_else_fails_the_stop():
    run = Run([Node("learner/0", 0, saves=True)])
    run.signal(signal.SIGTERM)
    assert run.end("learner/0", KILL) == []
    done = run.finish()
    assert done.code == 1
    assert "before it finished its final save" in done.lines[0]
    assert done.lines[-1].endswith("exit code 1 (learner/0 failed while stopping; see above)")


def test_a_saver_killed_at_its_notice_is_named_as_killed_not_as_failed():
    run = Run([Node("learner/0", 0, saves=True)])
    run.signal(signal.SIGTERM)
    run.at(NOTICE)
    run.end("learner/0", KILL)
    done = run.finish()
    assert "before it finished its final save" in done.lines[0]
    assert done.lines[-1].endswith("(learner/0 SIGKILLed after the 10 s notice)")


def test_the_first_death_is_the_cause_and_later_signals_only_hurry():
    run = Run()
    run.end("actor/0", 3)
    run.signal(signal.SIGTERM)  # during the stop: nothing new
    run.signal(signal.SIGHUP)
    assert [line for line in run.said() if "stopping" in line] == [run.said()[0]]
    run.end("actor/1", 1)  # failed at its stop
    assert run.actions[-2:-1] == [ReportExit("actor/1", 1, stopping=True)]
    for name in ("learner/0", "replay/0", "counter/0"):
        run.end(name)
    assert run.finish().lines[-1].endswith("exit code 1 (node actor/0 died)")


def test_a_start_that_failed_and_a_fault_name_their_cause():
    started = Run()
    started.feed(StopAsked("node actor_1 died", died="actor/1"))
    for node in PROGRAM:
        started.end(node.name)
    assert started.finish().lines[-1].endswith("exit code 1 (node actor/1 died)")
    lost = Run()
    lost.feed(Fault("Ray's gcs_server (pid 7) died"))
    assert lost.said()[0].startswith("Ray's gcs_server (pid 7) died: stopping 5 nodes")
    raylet = Run()
    raylet.feed(Fault("Ray's raylet (pid 8) died", reason="Ray's raylet (pid 8) died, and more"))
    assert raylet.said()[0].startswith("Ray's raylet (pid 8) died, and more: stopping 5 nodes")
    lost.feed(Fault("Ray's raylet (pid 8) died"))  # the latest word wins
    for node in PROGRAM:
        lost.end(node.name, KILL if node.saves else 0)
    assert lost.finish().lines[-1].endswith("exit code 1 (Ray's raylet (pid 8) died)")


def test_a_stop_with_no_node_running_says_only_the_end():
    run = Run([Node("actor/0")])
    run.end("actor/0")
    assert run.feed(StopAsked("the step limit")) == [StopBegun("the step limit")]
    assert run.finish().lines[-1] == "all 1 nodes ended 0.0 s after the stop began; exit code 0"


def test_an_unknown_or_repeated_end_is_ignored():
    run = Run()
    run.end("actor/0")
    assert run.end("actor/0", 1) == []
    assert run.end("nobody/0", 1) == []


def test_stop_outcome_names_the_first_cause():
    assert stop_outcome(None, [], [], 10) == (0, "")
    assert stop_outcome("actor/0", ["learner/0"], ["x/0"], 10) == (1, " (node actor/0 died)")
    assert stop_outcome(None, ["a/0", "b/0"], ["x/0"], 10) == (
        1,
        " (a/0, b/0 failed while stopping; see above)",
    )
    assert stop_outcome(None, [], ["x/0"], 2.5) == (1, " (x/0 SIGKILLed after the 2.5 s notice)")
    assert stop_outcome(None, [], ["x/0"], 10, "made to exit") == (
        1,
        " (x/0 made to exit after the 10 s notice)",
    )
