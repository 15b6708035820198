"""The Ray engine's promises in its faults (issue 66) that are Ray's own: a node Ray cannot
reach for a moment gets a grace period; a node's crash is named with its signal. (Those every
engine keeps, a start Ray cannot place and what nodes leave running among them, are the fault
table's: tests/test_fault_table.py.)

The integration tests run the engine (`ray_engine.run`) on a real embedded Ray with
tests/ray_toys.py's nodes; the grace's unit tests hand `_Driver._ended` Ray's errors through
its seam (`_ready`, `_result`), as an unreachable actor is not something one machine makes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is the current stack's engine (.venv312)")

import ray

from magi_lp.engines import ray_driver, ray_engine, ray_nodes
from magi_lp.runtime.graph import NodeSpec
from tests.ray_blips import lossy_client
from tests.test_ray_engine import _toy_launch

# --- a node Ray cannot reach for a moment (unit) ------------------------------------------------

UNAVAILABLE = (
    "The actor is temporarily unavailable: RpcError: RPC error: Socket closed rpc_code: 14"
)
NODE_DIED = (
    "The actor died unexpectedly before finishing this task.\n"
    "The actor died because its node has died. Node Id: 9c1e"
)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Calls:
    """The fake actor's calls: each `.remote()` is a token whose answer the test sets."""

    def __init__(self) -> None:
        self.answers: dict[str, object] = {}
        self.made: list[str] = []

    def __getattr__(self, method: str):
        calls = self

        class _Method:
            @staticmethod
            def remote(*args, **kwargs) -> str:
                token = f"{method}#{len(calls.made)}"
                calls.made.append(token)
                return token

        return _Method


def _unavailable() -> ray.exceptions.ActorUnavailableError:
    return ray.exceptions.ActorUnavailableError(UNAVAILABLE, None)


@pytest.fixture
def grace(tmp_path, monkeypatch):
    """A driver, one node of it whose `run` call failed with ActorUnavailableError, a clock,
    and the answers `_ended` will read (token -> value or Ray's error; missing: not ready)."""
    clock = _Clock()
    monkeypatch.setattr(ray_driver, "time", clock)
    answers: dict[str, object] = {}
    monkeypatch.setattr(ray_driver, "_ready", lambda ref: ref in answers)

    def result(ref):
        if isinstance(answers[ref], BaseException):
            raise answers[ref]
        return answers[ref]

    monkeypatch.setattr(ray_driver, "_result", result)
    launch = types.SimpleNamespace(graph=None, workdir=tmp_path / "work")
    driver = ray_driver._Driver(launch, signals=None)
    said: list[str] = []
    driver.say = said.append
    calls = _Calls()
    spec = NodeSpec("actor", 0, "actor", object)
    node = ray_driver._NodeProcess(spec, calls, 4242, tmp_path / "log", "10.0.0.2")
    node.run_ref = "run#0"
    answers["run#0"] = _unavailable()
    return types.SimpleNamespace(
        driver=driver, node=node, clock=clock, answers=answers, said=said, calls=calls
    )


def test_a_node_unreachable_for_a_moment_is_not_dead_and_its_outcome_is_asked_again(grace):
    driver, node, answers = grace.driver, grace.node, grace.answers
    assert driver._ended(node) is None  # not dead: the grace begins
    assert grace.said == [
        f"node actor_0: Ray cannot reach it (10.0.0.2); waiting up to "
        f"{ray_nodes.UNAVAILABLE_GRACE_S:g} s for it to answer again"
    ]
    assert grace.calls.made == ["outcome#0", "where#1"]  # its run's outcome, and a probe
    grace.clock.now = 0.5
    answers["where#1"] = (4242, "10.0.0.2", True)  # it answers again
    assert driver._ended(node) is None
    assert grace.said[-1] == "node actor_0 answers again after 0.5 s"
    grace.clock.now = 10 * ray_nodes.UNAVAILABLE_GRACE_S
    assert driver._ended(node) is None  # running: no grace runs out
    answers["outcome#0"] = 0
    assert driver._ended(node) == 0  # and its run's end is still seen


def test_a_node_unreachable_past_its_grace_is_dead_and_named(grace):
    driver, node, answers = grace.driver, grace.node, grace.answers
    assert driver._ended(node) is None
    answers["outcome#0"] = answers["where#1"] = _unavailable()
    grace.clock.now = 0.5
    assert driver._ended(node) is None and len(grace.calls.made) == 2  # asked again each 1 s
    grace.clock.now = ray_nodes.UNAVAILABLE_GRACE_S - 0.1
    assert driver._ended(node) is None and grace.calls.made[-2:] == ["outcome#2", "where#3"]
    answers["outcome#2"] = _unavailable()
    grace.clock.now = ray_nodes.UNAVAILABLE_GRACE_S
    assert driver._ended(node) == -signal.SIGKILL
    assert "Ray lost the connection to it and no word came from its machine (10.0.0.2)" in (
        node.known_cause
    )


def test_a_node_whose_machine_ray_marks_dead_during_the_grace_is_named_with_it(grace):
    driver, node, answers = grace.driver, grace.node, grace.answers
    assert driver._ended(node) is None
    answers["outcome#0"] = ray.exceptions.RayActorError(None, NODE_DIED)
    grace.clock.now = 5.0
    assert driver._ended(node) == -signal.SIGKILL
    assert node.known_cause.startswith("the machine it ran on (10.0.0.2) died")


def test_a_call_to_a_node_unreachable_for_a_moment_is_asked_again(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(ray_nodes, "time", clock)
    tries = []

    def ask():
        tries.append(clock.now)
        if len(tries) < 3:
            raise _unavailable()
        return "params"

    assert ray_nodes.answer_through_blips(ask) == "params"
    assert tries == [0.0, 1.0, 2.0]

    def never():
        raise _unavailable()

    with pytest.raises(ray.exceptions.ActorUnavailableError):
        ray_nodes.answer_through_blips(never, grace_s=5.0)
    assert clock.now == pytest.approx(7.0)  # 2 s before, then the 5 s grace


def test_an_increment_asked_again_counts_once(monkeypatch):
    """An actor's Acme counter over the counter node's Ray client: Ray loses the answer of an
    increment that ran (a blip); the client asks again, and the node counts it once. The
    steps decide when the run stops and what a resume counts from."""
    from magi_lp.acme_api import counting
    from magi_lp.runtime.control_nodes import CounterNode, counter_parent

    node = CounterNode()
    client, made = lossy_client(
        monkeypatch, node, ["increment", "increment_once", "get_counts"], {"increment_once": {2}}
    )
    counter = counting.Counter(counter_parent(client), prefix="actor", time_delta=0.0)
    for _ in range(3):
        counter.increment(steps=256)
    assert made == {"increment_once": 4}  # the lost one asked again
    assert node.get_counts() == {"actor_steps": 768}

    # Asked again while the first asking still runs, and from another sender: each once.
    calls = [
        threading.Thread(target=node.increment_once, args=("b", 1, {"actor_steps": 10}))
        for _ in range(4)
    ]
    for call in calls:
        call.start()
    for call in calls:
        call.join(10)
    assert node.increment_once("b", 2, {"actor_steps": 1}) == {"actor_steps": 779}


# --- on a real embedded Ray ---------------------------------------------------------------------


def _run(tmp_path: Path, capfd, launch, **env: str) -> tuple[int, str, float]:
    """ray_engine.run(launch) with HOME a folder of its own (left empty) and `env`; (exit
    code, what it said, the monotonic time it returned)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        patch.delenv("RAY_ADDRESS", raising=False)
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        for key, value in env.items():
            patch.setenv(key, value)
        code = ray_engine.run(launch)
    ended = time.monotonic()
    output = capfd.readouterr()
    assert not any(home.iterdir())
    return code, output.out + output.err, ended


def _when(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_node_that_segfaults_is_named_with_its_signal(tmp_path, capfd):
    """SIGSEGV of a node's process: Ray's word on it is the same as for a SIGKILL ("its worker
    process has died ... SYSTEM_ERROR"); the report names the signal and the fatal line its
    log got, not "another process killed it"."""
    import ray_toys

    launch = _toy_launch(tmp_path)
    folder = tmp_path / "reports"
    launch.graph.nodes[:] = [
        NodeSpec("learner", 0, "learner", ray_toys.Reporter, (str(folder), "learner_0")),
        NodeSpec("actor", 0, "actor", ray_toys.Stubborn, (str(folder), "actor_0")),
    ]
    killed: list[float] = []

    def segfault() -> None:
        _when(lambda: (folder / "actor_0.json").exists())
        pid = json.loads((folder / "actor_0.json").read_text())["pid"]
        killed.append(time.monotonic())
        os.kill(pid, signal.SIGSEGV)

    threading.Thread(target=segfault, daemon=True).start()
    code, said, ended = _run(tmp_path, capfd, launch)
    assert killed, said
    assert code == 1, said
    assert re.search(
        r"node actor/0 \(group 'actor', pid \d+\) died: killed by signal SIGSEGV \(11\)", said
    ), said
    assert "cause: Fatal Python error: Segmentation fault" in said, said
    assert "another process killed it" not in said
    print(f"SIGSEGV of a node: the run ended {ended - killed[0]:.1f} s later")
