"""What runs in a node's own process on Ray: the node actor that makes, serves and runs one
node of the graph, its lifetime, the replay node that serves the store's server, and the
client other nodes call it through (synchronous calls, as a Courier client makes, that ride
out an actor Ray calls temporarily unavailable)."""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from magi_lp.runtime.graph import NodeSpec

CALL_TIMEOUT_S = 600.0
"""A node gives up on another that does not answer within this time. Only a backstop: a call
to a node whose process died fails at once (Ray's RayActorError), and the driver names the
dead node. Longer than Courier's 120 s because an actor's first parameter pull waits for the
learner's build: measured on this 2-core machine at load 30, make run's learner took more
than 120 s and the pull's timeout ended the run."""

UNAVAILABLE_GRACE_S = 30.0
"""How long a node's actor may be unreachable (Ray's ActorUnavailableError: the connection to
it closed and its machine said nothing yet) before it counts as dead. A network blip between
machines heals within it; a dead machine is marked dead by Ray's health checks within it too
(then the node is named with its machine)."""


SHARED_ANSWERS = frozenset({"get_variables"})
"""Methods whose answer every caller shares (the learner's parameters): the node puts an
answer into Ray's object store once and hands callers its reference (`_NodeActor.call_shared`),
so N actors' pulls of one version are one serialization, and actors on one machine read one
copy from its object store, instead of the answer pickled into each call's reply."""

SHARED_FOR_S = 0.1
"""How long a shared answer is handed on before the node is asked again: the parameters of
one moment are one version for every actor that pulls within it. A learner updating hundreds
of times a second makes a new state each update; an actor pulls every
`variable_update_period` steps (about a second), so this adds at most a tenth of a second to
its parameters' age. An answer that is the same object as the last (a learner that has not
updated: `JaxLearner.get_variables`) keeps its reference however old."""

_POLL_S = 0.1
_REASK_S = 1.0  # how often an unreachable node is asked again for its run's outcome


class NodeExitError(Exception):
    """A node left with a non-zero code (e.g. its final save failed)."""

    def __init__(self, code: int):
        super().__init__(f"the node left with exit code {code}")
        self.code = code


class RayLifetime:
    """A node's lifetime on Ray: an event the driver's `stop()` call sets."""

    def __init__(self, control: Any):
        self._stopped = threading.Event()
        self._control = control

    def stopping(self) -> bool:
        return self._stopped.is_set()

    def wait_for_stop(self, seconds: float | None) -> bool:
        """Waits up to `seconds` (None or inf: until the stop)."""
        if seconds is not None and seconds == float("inf"):
            seconds = None
        return self._stopped.wait(seconds)

    def stop_program(self) -> None:
        self._control.request_stop.remote()

    def leave(self, code: int = 0) -> None:
        # The driver ends the actor once `run()` returns; a failure is its exception.
        if code:
            raise NodeExitError(code)

    def set(self) -> None:
        self._stopped.set()


class NodeClient:
    """A handle to a running node: `client.method(...)` calls it and waits for the result.

    Only the node's public methods are served (as Courier serves them), so `hasattr` tells
    what a node offers.
    """

    def __init__(self, actor: Any, methods: list[str], timeout: float = CALL_TIMEOUT_S):
        self._actor = actor
        self._methods = frozenset(methods)
        self._timeout = timeout

    def with_timeout(self, timeout: float) -> NodeClient:
        return NodeClient(self._actor, list(self._methods), timeout)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_") or method not in self._methods:
            raise AttributeError(method)
        actor, timeout = self._actor, self._timeout

        def call(*args: Any, **kwargs: Any) -> Any:
            return answer_through_blips(
                lambda: ray.get(actor.call.remote(method, *args, **kwargs), timeout=timeout)
            )

        def call_shared(*args: Any, **kwargs: Any) -> Any:
            # The reply holds the answer's reference (in a list: Ray resolves only top-level
            # references), read here from this machine's object store.
            (reference,) = answer_through_blips(
                lambda: ray.get(actor.call_shared.remote(method, *args, **kwargs), timeout=timeout)
            )
            return ray.get(reference, timeout=timeout)

        if method in SHARED_ANSWERS:
            call = call_shared

        call.__name__ = method
        return call

    def __reduce__(self) -> tuple[Any, ...]:
        return (NodeClient, (self._actor, sorted(self._methods), self._timeout))


def answer_through_blips(ask: Callable[[], Any], grace_s: float = UNAVAILABLE_GRACE_S) -> Any:
    """`ask()` (a node's call and `ray.get` of its answer), asked again while the node is
    unreachable (Ray's ActorUnavailableError) for up to `grace_s`; raised after that.

    Ray says such a call "may or may not have been executed", so a call asked again may run
    twice. The calls that move steps and counts take that into account: the replay's step
    queue takes a repeated insert's steps once and answers a repeated take the same steps
    (`magi_lp.replay.served_queue.StepQueue`: each call names its sender or taker and its
    place), and the counter node counts a repeated increment once
    (`magi_lp.runtime.control_nodes.CounterNode.increment_once`)."""
    since = None
    while True:
        try:
            return ask()
        except ray.exceptions.ActorUnavailableError:
            now = time.monotonic()
            since = now if since is None else since
            if now - since >= grace_s:
                raise
            time.sleep(min(_REASK_S, max(0.0, since + grace_s - now)))


class ServedReplayNode:
    """The replay node on an engine without Reverb: serves the store's own server."""

    def __init__(self, replay: Any, *, lifetime: Any):
        from magi_lp.runtime.node_devices import prepare_node_process

        prepare_node_process()
        self._lifetime = lifetime
        self._server = replay.store.make_server(replay.environment_spec)
        if self._server is None:
            raise RuntimeError(f"{type(replay.store).__name__} serves nothing on this engine")

    def public_methods(self) -> list[str]:
        return [
            name
            for name in dir(self._server)
            if not name.startswith("_") and callable(getattr(self._server, name))
        ]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._server, name)

    def run(self) -> None:
        self._lifetime.wait_for_stop(None)
        self._server.close()


class _ProgramControl:
    """What nodes tell the driver: the coordinator's request to stop the program."""

    def __init__(self) -> None:
        self._stop = False
        self._placed: set[str] = set()

    def request_stop(self) -> None:
        self._stop = True

    def stop_requested(self) -> bool:
        return self._stop

    def placed(self, name: str) -> None:
        """Node `name`'s process started (Ray found it a machine): its making has begun."""
        self._placed.add(name)

    def placed_nodes(self) -> list[str]:
        return sorted(self._placed)


class _NodeActor:
    """One node in its own process: makes it, serves its methods, runs it."""

    def __init__(self, spec: NodeSpec, args: tuple, kwargs: dict, control: Any, log: str):
        control.placed.remote(spec.name)  # the start's timeout is for nodes never placed
        _send_output_to(log)
        self._lifetime = RayLifetime(control)
        # The node is made and run on one thread of its own: Ray runs a threaded actor's
        # constructor and its calls on different threads, and what a node makes can be bound
        # to the thread that made it (dm_control's EGL context is current on that thread only:
        # a pixel actor's first reset in run() failed with "already current on another thread").
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="node")
        self._shared: dict[tuple[str, str, str], tuple[float, Any, Any]] = {}
        self._shared_lock = threading.Lock()
        self.made = True
        try:
            self._node = self._thread.submit(self._make, spec, args, kwargs).result()
        except Exception:
            # Kept, not raised: raised, it went to the driver as Ray's error and out of the
            # launch as a traceback. Into the node's log instead, where the driver's exit
            # report reads its cause, as for a node that dies later.
            traceback.print_exc()
            sys.stderr.flush()
            self._node, self.made = None, False

    def _make(self, spec: NodeSpec, args: tuple, kwargs: dict) -> Any:
        if spec.role == "replay":
            return ServedReplayNode(spec.replay, lifetime=self._lifetime)
        return spec.make(*args, lifetime=self._lifetime, **kwargs)

    def where(self) -> tuple[int, str, bool]:
        """The node's process id, its machine's address and whether the node was made."""
        return os.getpid(), ray.util.get_node_ip_address(), self.made

    def methods(self) -> list[str]:
        node = self._node
        if node is None:  # it could not be made
            return []
        if isinstance(node, ServedReplayNode):
            return node.public_methods()
        return [
            name
            for name in dir(node)
            if not name.startswith("_") and name != "run" and callable(getattr(node, name))
        ]

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._node, method)(*args, **kwargs)

    def call_shared(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`call`, its answer put into Ray's object store once and shared by every caller
        (`SHARED_ANSWERS`, `SHARED_FOR_S`): [the answer's reference]."""
        key = (method, repr(args), repr(sorted(kwargs.items())))
        with self._shared_lock:  # one put per version, however many callers ask at once
            held = self._shared.get(key)
            if held is not None and time.monotonic() - held[0] < SHARED_FOR_S:
                return [held[2]]
            answer = getattr(self._node, method)(*args, **kwargs)
            if held is None or held[1] is not answer:
                held = (time.monotonic(), answer, ray.put(answer))
            else:  # the same object: the same version, its reference kept
                held = (time.monotonic(), answer, held[2])
            self._shared[key] = held
            return [held[2]]

    def run(self) -> int:
        self._running = self._thread.submit(self._run)
        return self._running.result()

    def outcome(self) -> int:
        """`run()`'s result, asked again by a driver whose `run` call was lost (the node
        was unreachable for a moment); waits for it."""
        while getattr(self, "_running", None) is None:
            time.sleep(_POLL_S)
        return self._running.result()

    def _run(self) -> int:
        run = getattr(self._node, "run", None)
        try:
            if run is None:  # a node that only answers calls (the counter)
                self._lifetime.wait_for_stop(None)
            else:
                run()
        except NodeExitError:
            raise
        except BaseException:
            # Into the node's log, where the exit report reads its cause.
            traceback.print_exc()
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        return 0

    def stop(self) -> None:
        self._lifetime.set()


def _send_output_to(log: str) -> None:
    """This process's stdout and stderr go to the node's log (this launch's: the driver kept
    an earlier launch's under another name before any node started)."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
