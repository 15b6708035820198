"""The Ray engine's driver: starts the graph's nodes as actors, wave by wave (honouring a stop
signal, and ending after the start timeout where Ray places a node nowhere), and supervises
them by the one stop's rules (`magi_lp.launch.stop_machine`) with Ray's verbs: a node's
`stop()`, `ray.kill`, and its run's result."""

from __future__ import annotations

import collections
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from magi_lp.config_schema import fact_refusal
from magi_lp.engines import ray_seam
from magi_lp.engines.base import HOST_RESOURCE_PREFIX, Launch, saves_at_stop, stop_tier
from magi_lp.engines.ray_nodes import (
    _POLL_S,
    _REASK_S,
    UNAVAILABLE_GRACE_S,
    NodeClient,
    NodeExitError,
    _NodeActor,
    _ProgramControl,
)
from magi_lp.errors import ConfigError
from magi_lp.launch import node_lifetime, run_folders
from magi_lp.launch.exit_report import NodeExit, format_exit_report, read_tail
from magi_lp.launch.stop_machine import (
    Action,
    Event,
    Fault,
    Node,
    NodeEnded,
    StopAsked,
    StopMachine,
    StopSignal,
    StopWords,
    Tick,
    carry_out,
)
from magi_lp.launch.supervisor import (
    LAUNCH_ID_VAR,
    StopSignals,
    describe_node_end,
)
from magi_lp.runtime.graph import NodeSpec, ProgramGraph
from magi_lp.runtime.workdir import Workdir

START_TIMEOUT_S = 300.0
"""How long a node may wait for Ray to start its process (a machine with the resources it asks
for: GPUs, its host's resource) before the run ends, naming what the cluster lacks. Longer than
an autoscaler takes to add a machine; a fixed cluster that lacks them never places it, and the
start waited for ever. `START_TIMEOUT_VAR` in the environment overrides it (seconds)."""

START_TIMEOUT_VAR = "MAGI_LP_RAY_START_TIMEOUT_S"

_KEEP_CUDA_VAR = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


class _NodeProcess:
    """What the status view reads of a node: its pid and, once ended, its return code."""

    def __init__(self, spec: NodeSpec, actor: Any, pid: int, log: Path, address: str):
        self.spec = spec
        self.actor = actor
        self.pid = pid
        self.log = log
        self.address = address
        self.returncode: int | None = None
        self.run_ref: Any = None
        self.known_cause: str | None = None  # Ray's word on its death (its machine died)
        self.unreachable_since: float | None = None  # `_Driver._ended`'s grace
        self.asked_at = -math.inf  # when its outcome was last asked again
        self.probe: Any = None  # a call that tells whether it answers again

    def exit_of(self, returncode: int) -> NodeExit:
        return NodeExit(
            self.spec.role, self.spec.index, self.pid, returncode, self.log, self.known_cause
        )


NODE_TMP = "node_tmp"
"""The nodes' temp folder (TMPDIR) in the run's Ray folder on the driver's machine, removed
with it: what libraries leave in a temp folder (wandb-core's folder and socket, which it never
removes: wandb/wandb#11518) goes too, as on Launchpad, whose nodes get the launch's private
temp folder. Not set for a cluster of several machines (RAY_ADDRESS): the folder is on this
one only."""


def _node_env(
    launch: Launch, spec: NodeSpec, node_tmp: str | None = None, launch_id: str | None = None
) -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1", _KEEP_CUDA_VAR: "1", **launch.plan.envs().get(spec.group, {})}
    if node_tmp is not None:
        env["TMPDIR"] = node_tmp
    if launch_id is not None:
        # Inherited by whatever the node starts: the end of the run sweeps what is left.
        env[LAUNCH_ID_VAR] = launch_id
    # The node imports the project (its classes are pickled by reference).
    paths = [str(Path(__file__).resolve().parents[2]), *sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p and Path(p).is_dir()))
    return {k: str(v) for k, v in env.items()}


def _gpus_of(env: dict[str, str]) -> list[str]:
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return [g.strip() for g in visible.split(",") if g.strip()]


def _gpu_requests(envs: list[dict[str, str]]) -> list[float]:
    """Ray's GPU count for each node: a GPU that several nodes see (the 1-GPU layout's learner
    and actors on GPU 0) is shared out between them, a whole GPU to each would leave the second
    pending for ever. Shares are floored to Ray's 1/10000 so those of one GPU sum to at most
    1, and a count above 1 is whole, as Ray requires; Ray sets no CUDA_VISIBLE_DEVICES here
    (the plan's is kept), so this is bookkeeping that agrees with the plan."""
    seen = [_gpus_of(env) for env in envs]
    sharers = collections.Counter(gpu for gpus in seen for gpu in gpus)
    requests = []
    for gpus in seen:
        share = sum(1 / sharers[gpu] for gpu in gpus)
        requests.append(math.floor(share) if share >= 1 else math.floor(share * 1e4) / 1e4)
    return requests


class _Driver:
    """Starts the graph's nodes as actors, supervises them and stops them in tiers."""

    def __init__(
        self,
        launch: Launch,
        signals: StopSignals,
        node_tmp: str | None = None,
        launch_id: str | None = None,
    ):
        self._launch = launch
        self._node_tmp = node_tmp
        self._launch_id = launch_id  # every node's marker (`_node_env`)
        self._graph: ProgramGraph = launch.graph
        self._signals = signals
        self._nodes: list[_NodeProcess] = []
        self._failure: NodeExit | None = None
        self._control: Any = None
        self._workdir = Workdir(launch.workdir)
        self._ray_daemons: dict[int, tuple[Any, str]] = {}  # `watch_ray`
        self._lost_ray: str | None = None
        self.end_line: str | None = None  # the run's last line, said after the sweep (`run`)
        self.start_failure: str | None = None  # why the start stopped short (`_start_failed`)
        self._stopper: StopMachine | None = None  # the stop's rules, from `supervise` on
        self._by_name: dict[str, _NodeProcess] = {}
        self._before_stop: Callable[[], None] = lambda: None
        # On the terminal, and dated in <workdir>/nodes/launcher.log, as a Launchpad launch's.
        self._workdir.nodes.mkdir(parents=True, exist_ok=True)
        self.say: Callable[[str], None] = run_folders.reporter(None, self._workdir.launcher_log)

    def start(self) -> None:
        graph = self._graph
        # On the driver's machine: on a cluster of several, a control actor elsewhere would
        # die with that machine and take the driver's supervision with it.
        here = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False
        )
        self._control = (
            ray.remote(_ProgramControl).options(num_cpus=0, scheduling_strategy=here).remote()
        )
        concurrency = 2 * (sum(1 for n in graph.nodes if n.role in ("actor", "evaluator"))) + 8
        actor_class = ray.remote(_NodeActor)
        clients: dict[str, NodeClient] = {}
        workdir = self._workdir
        kept = run_folders.keep_earlier_logs(workdir.nodes)  # the nodes append to new files
        if kept:
            self.say(f"logs of the earlier launch kept as {workdir.nodes}/<group>/<index>.{kept}")
        envs = [
            _node_env(self._launch, spec, self._node_tmp, self._launch_id) for spec in graph.nodes
        ]
        gpus = _gpu_requests(envs)
        for short in _check_the_cluster_has(
            gpus, [self._launch.group_resources.get(spec.group, {}) for spec in graph.nodes]
        ):
            self.say(f"warning: {short}")
        pending = list(zip(graph.nodes, envs, gpus, strict=True))
        while pending and self._failure is None and self.start_failure is None:
            if self._signals.received:
                break  # a stop while starting: the nodes made so far are stopped as usual
            # The nodes whose handles are all made are made together (the actors and the
            # evaluators, each a worker's start and a policy compile): one after another
            # they took a core each in turn.
            wave = [p for p in pending if all(ref in clients for ref in p[0].refs)]
            wave = wave or pending[:1]  # (a handle of no node: its resolve names it)
            pending = [p for p in pending if all(p is not w for w in wave)]
            making = []
            for spec, env, num_gpus in wave:
                args, kwargs = spec.resolved(clients.__getitem__)
                log = workdir.node_log(spec.group, spec.index)
                actor = actor_class.options(
                    name=spec.name,
                    num_cpus=0,
                    num_gpus=num_gpus,
                    max_concurrency=concurrency,
                    runtime_env={"env_vars": env},
                    resources=dict(self._launch.group_resources.get(spec.group, {})),
                    max_restarts=0,
                ).remote(spec, args, kwargs, self._control, str(log))
                wants = {"GPU": num_gpus, **self._launch.group_resources.get(spec.group, {})}
                asked = [actor.where.remote(), actor.methods.remote()]
                making.append((spec, log, actor, asked, wants))
            answered = self._wait_for_wave(making)
            for (spec, log, actor, asked, _), came in zip(making, answered, strict=True):
                if not came:  # a stop, or the start's timeout, came first: never made
                    with contextlib.suppress(Exception):
                        ray.kill(actor)
                    continue
                try:
                    (pid, address, made), methods = ray.get(asked)
                except ray.exceptions.RayError as error:  # its process died while made
                    if self._failure is None:
                        self._start_failed(spec, log, None, error)
                    continue
                if not made:
                    if self._failure is None:
                        self._start_failed(spec, log, pid)
                    ray.kill(actor)
                    continue
                clients[spec.name] = NodeClient(actor, methods)
                node = _NodeProcess(spec, actor, pid, log, address)
                # It runs at once, as a Launchpad node does: the learner builds (and compiles
                # its update) while the nodes after it are made. Not an actor: its steps
                # would run ahead of the evaluators still being made, whose first look would
                # then be past 0 and skip the evaluation there.
                if spec.role != "actor":
                    node.run_ref = actor.run.remote()
                self._nodes.append(node)
        for node in self._nodes:
            if node.run_ref is None:
                node.run_ref = node.actor.run.remote()
        self.clients = clients
        if not self._nodes:  # a stop before the first node: run() says so
            return
        counts = {}
        for node in self._nodes:
            counts[node.spec.role] = counts.get(node.spec.role, 0) + 1
        of = f" of {len(graph.nodes)}" if len(self._nodes) < len(graph.nodes) else ""
        self.say(
            f"started {len(self._nodes)}{of} nodes on Ray "
            f"({', '.join(f'{r} x{c}' for r, c in counts.items())}); logs in "
            f"{workdir.nodes}/<group>/<index>"
        )

    def _wait_for_wave(self, making: list[tuple]) -> list[bool]:
        """Waits until every node of a wave is made (or could not be), polling: a stop signal
        ends the wait within a poll, and a node Ray has not placed (started no process for)
        within the start's timeout ends the start (`_start_timed_out`). For each node of
        `making` ((spec, log, actor, asked, wants)): whether its answers came."""
        refs = [ref for *_, asked, _ in making for ref in asked]
        timeout = start_timeout_s()
        began = time.monotonic()
        placed: set[str] = set()
        asking: Any = None  # the pending question to the control actor
        while True:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_POLL_S)
            if len(ready) == len(refs):
                return [True] * len(making)
            done = set(ready)
            answered = [all(ref in done for ref in asked) for *_, asked, _ in making]
            if self._signals.received:
                return answered
            if asking is None:
                asking = self._control.placed_nodes.remote()
            if ray.wait([asking], timeout=0)[0]:
                placed.update(ray.get(asking))
                asking = None
            unplaced = [
                m
                for m, came in zip(making, answered, strict=True)
                if not came and m[0].name not in placed
            ]
            if unplaced and time.monotonic() - began >= timeout:
                self._start_timed_out(unplaced, timeout)
                return answered

    def _start_timed_out(self, unplaced: list[tuple], timeout: float) -> None:
        """Nodes Ray placed nowhere within the start's timeout: one line naming the first and
        what the cluster lacks for it; the start stops (those made are stopped as usual) and
        the run ends with exit code 1."""
        spec, *_, wants = unplaced[0]
        more = f" (and {len(unplaced) - 1} more nodes)" if len(unplaced) > 1 else ""
        self.say(
            f"node {spec.name}{more} could not be scheduled for {timeout:g} s: "
            f"{_shortfall(wants)}; give the cluster what it lacks (an autoscaler adds it, a "
            f"fixed cluster never does), or set {START_TIMEOUT_VAR} to wait longer"
        )
        self.start_failure = f"node {spec.name} could not be scheduled for {timeout:g} s"
        self._lost_ray = self.start_failure  # the run cannot go on (`_ray_gone`): exit 1

    def _start_failed(
        self, spec: NodeSpec, log: Path, pid: int | None, error: BaseException | None = None
    ) -> None:
        """A node that could not be made: reported as a dead node (its log's end says why;
        Ray's word where its process died, naming a dead Ray daemon first), and no later
        ones are started (those made beside it are); `supervise` then stops those that
        were."""
        cause = None
        if error is not None:
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            named = ray_seam.death_of(error, "", read_tail(log))[1]
            cause = (
                self._ray_gone() or named or f"its process died while it was made (Ray: {first})"
            )
        self._failure = NodeExit(spec.group, spec.index, pid or 0, 1, log, cause)
        self.say(format_exit_report(self._failure))
        self.start_failure = f"node {spec.name} died"

    def status_nodes(self) -> list[tuple[str, int, Any]]:
        return [(n.spec.group, n.spec.index, n) for n in self._nodes]

    def _ended(self, node: _NodeProcess) -> int | None:
        """The node's run result once it ended: 0, or its failure's return code (minus the
        signal when Ray's error or the node's log says which; Ray's reason in
        `node.known_cause`). A node Ray cannot reach is given `UNAVAILABLE_GRACE_S`."""
        if not _ready(node.run_ref):
            self._back_in_reach(node)
            return None
        try:
            return int(_result(node.run_ref))
        except NodeExitError as error:
            return error.code
        except ray.exceptions.RayTaskError as error:
            cause = error.as_instanceof_cause()
            if isinstance(cause, NodeExitError):
                return cause.code
            return 1
        except ray.exceptions.ActorUnavailableError as error:
            if self._still_in_grace(node):
                return None
            node.known_cause = ray_seam.lost_machine(error, node.address)
            return -signal.SIGKILL
        except ray.exceptions.RayError as error:  # its process died (Ray's memory monitor...)
            code, node.known_cause = ray_seam.death_of(error, node.address, read_tail(node.log))
            return code

    def _still_in_grace(self, node: _NodeProcess) -> bool:
        """Whether a node Ray cannot reach (its `run` call failed with ActorUnavailableError)
        is still within its grace; if so, its run's outcome is asked for again (at most every
        `_REASK_S`), with a probe that tells when it answers again."""
        now = time.monotonic()
        if node.unreachable_since is None:
            node.unreachable_since = now
            self.say(
                f"node {node.spec.name}: Ray cannot reach it ({node.address}); waiting up to "
                f"{UNAVAILABLE_GRACE_S:g} s for it to answer again"
            )
        if now - node.unreachable_since >= UNAVAILABLE_GRACE_S:
            return False
        if now - node.asked_at >= _REASK_S:
            node.asked_at = now
            node.run_ref = node.actor.outcome.remote()
            node.probe = node.actor.where.remote()
        return True

    def _back_in_reach(self, node: _NodeProcess) -> None:
        """Ends a node's grace once its probe answered."""
        if node.probe is None or not _ready(node.probe):
            return
        probe, node.probe = node.probe, None
        try:
            _result(probe)
        except ray.exceptions.RayError:
            return  # not yet: its outcome call fails too, and the grace goes on
        if node.unreachable_since is not None:
            self.say(
                f"node {node.spec.name} answers again after "
                f"{time.monotonic() - node.unreachable_since:.1f} s"
            )
        node.unreachable_since = None

    def watch_ray(self) -> None:
        """Watches the embedded Ray's GCS and raylet; either one dying ends the run at once,
        named (`_ray_gone`)."""
        self._ray_daemons = ray_seam.embedded_ray_daemons()

    def _ray_gone(self) -> str | None:
        """Why the run cannot go on when a process of the embedded Ray died, else None.

        Without its GCS (killed) the nodes went on for 60 s, then the driver's own Ray client
        gave up with a C++ error and exited, without the learner's final save (seen
        2026-11-29); stopped now, in tiers, the nodes still reach each other and the learner
        saves. Without its raylet every node dies with it, and each was reported as
        SIGKILLed with no word of why; the raylet is named first when both are gone.

        A start that timed out (`_start_timed_out`) is such a cause too: the nodes made are
        stopped, and the run exits 1 naming the node Ray could not place."""
        dead = [
            (pid, name)
            for pid, (process, name) in self._ray_daemons.items()
            if not ray_seam.daemon_running(process)
        ]
        if not dead:
            return self._lost_ray
        pid, name = max(dead, key=lambda found: found[1] == "raylet")
        self._lost_ray = f"Ray's {name} (pid {pid}) died"
        return f"{self._lost_ray}, and every node with it" if name == "raylet" else self._lost_ray

    def supervise(self, before_stop: Callable[[], None]) -> int:
        """Watches the nodes until the program ends and stops them in tiers: the rules are
        `StopMachine`'s, as on Launchpad; the verbs here are an actor's `stop()`, `ray.kill`
        and `_ended`."""
        self._by_name = {node.spec.name: node for node in self._nodes}
        self._before_stop = before_stop
        self._stopper = machine = StopMachine(
            [
                Node(n.spec.name, stop_tier(n.spec.role), saves_at_stop(n.spec.role))
                for n in self._nodes
            ],
            self._launch.termination_notice_secs,
            time.monotonic(),
            StopWords(stop="stop", kill="kill"),
        )
        if self.start_failure is not None:
            died = None if self._failure is None else self._failure.name
            self._feed(StopAsked(self.start_failure, died=died))
        handled = 0
        asked: Any = None  # the pending question to the control actor: never waited on
        while not machine.over:
            self._feed(Tick(time.monotonic()))
            gone = self._ray_gone()
            if gone is not None:
                self._feed(Fault(self._lost_ray or gone, reason=gone))
            if not machine.stopping:
                if asked is None:
                    asked = self._control.stop_requested.remote()
                if ray.wait([asked], timeout=0)[0]:
                    if ray.get(asked):
                        self._feed(StopAsked(node_lifetime.LIMIT_REACHED))
                    asked = None
            for node in self._nodes:
                code = None if node.returncode is not None else self._ended(node)
                if code is not None:
                    node.returncode = code
                    self._feed(NodeEnded(node.spec.name, code))
            for sig in self._signals.received[handled:]:
                self._feed(StopSignal(sig))
            handled = len(self._signals.received)
            if not machine.over:
                time.sleep(_POLL_S)
        if self._ray_gone() is not None:  # a raylet that died with the last node is named too
            self._feed(Fault(self._lost_ray or ""))
        done = machine.finish(time.monotonic())
        for node in self._nodes:
            with contextlib.suppress(Exception):
                ray.kill(node.actor)
        *lines, self.end_line = done.lines
        for line in lines:
            self.say(line)
        return done.code

    def _feed(self, event: Event) -> None:
        """Carries out what the stop machine answers to `event`."""
        assert self._stopper is not None
        carry_out(self._stopper.handle(event), self)

    # -- the stop machine's verbs (`stop_machine.StopVerbs`; `say` is an attribute) --------
    def report_exit(self, name: str, code: int, *, stopping: bool) -> None:
        self.say(describe_node_end(self._by_name[name].exit_of(code), stopping=stopping))

    def before_stop(self) -> None:
        self._before_stop()

    def kill_nodes(self, names: tuple[str, ...], *, sweep: bool) -> list[Action]:
        """Kills the nodes' actors: ended at once, so the machine hears of each now (Ray
        leaves nothing to sweep)."""
        del sweep
        assert self._stopper is not None
        follow: list[Action] = []
        for name in names:
            node = self._by_name[name]
            node.returncode = -signal.SIGKILL
            with contextlib.suppress(Exception):
                ray.kill(node.actor)
            follow += self._stopper.handle(NodeEnded(name, -signal.SIGKILL))
        return follow

    def stop_nodes(self, names: tuple[str, ...]) -> None:
        """Tells a stage's nodes to stop; the actors of the stages before it, ended, go."""
        stage = stop_tier(self._by_name[names[0]].spec.role)
        for node in self._nodes:
            with contextlib.suppress(Exception):
                if node.spec.name in names:
                    node.actor.stop.remote()
                elif node.returncode is not None and stop_tier(node.spec.role) < stage:
                    ray.kill(node.actor)


def _ready(ref: Any) -> bool:
    """Whether a call's answer (or Ray's error instead) is there."""
    return bool(ray.wait([ref], timeout=0)[0])


def _result(ref: Any) -> Any:
    """A ready call's answer; raises its error."""
    return ray.get(ref)


def _probe(driver: _Driver, workdir: Path) -> Any:
    from magi_lp.runtime.probe import CALL_TIMEOUT_S as PROBE_TIMEOUT_S
    from magi_lp.runtime.probe import ProgramProbe

    clients = driver.clients

    def client(name: str) -> Callable[[], Any]:
        return lambda: clients[name].with_timeout(PROBE_TIMEOUT_S)

    return ProgramProbe(client("counter_0"), client("replay_0"), workdir, client("learner_0"))


def _check_the_cluster_has(
    gpus: Sequence[float], resources: Sequence[Mapping[str, float]]
) -> list[str]:
    """Refuses, before any node is made, nodes that ask for a machine's resource
    (`magi_lp_host_<host>`) the cluster does not offer (its machines started by hand without
    it): Ray would keep them pending, and the start would wait for ever. GPUs it has too
    few of now are a warning: an autoscaling cluster adds them once asked."""
    wanted: collections.Counter[str] = collections.Counter()
    for count, asked in zip(gpus, resources, strict=True):
        wanted["GPU"] += count
        wanted.update(asked)
    has = ray.cluster_resources()
    warnings = []
    for key, amount in sorted(wanted.items()):
        if amount <= has.get(key, 0.0) + 1e-6:
            continue
        facts = f"the program's nodes ask for {amount:g}"
        if not key.startswith(HOST_RESOURCE_PREFIX):
            warnings.append(
                f"the Ray cluster has {has.get(key, 0.0):g} {key} now and {facts}: they wait "
                "until it has them (an autoscaler adds them; a fixed cluster never does)"
            )
            continue
        raise ConfigError(
            fact_refusal(
                f"the Ray cluster has no {key}",
                f"{facts}: Ray would keep them waiting for ever",
                f"start that machine with ray start --resources='{{\"{key}\": 1}}' "
                "(docs/cluster.md), or leave hosts out of the config to run anywhere",
            )
        )
    return warnings


def start_timeout_s() -> float:
    """`START_TIMEOUT_S`, or the seconds `START_TIMEOUT_VAR` gives."""
    given = os.environ.get(START_TIMEOUT_VAR, "").strip()
    if not given:
        return START_TIMEOUT_S
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(
            fact_refusal(
                f"{START_TIMEOUT_VAR}={given}",
                "it is not a number of seconds above 0",
                f"unset it for the default ({START_TIMEOUT_S:g} s), or give e.g. 600",
            )
        )
    return seconds


def _shortfall(wants: Mapping[str, float]) -> str:
    """What the Ray cluster lacks for a node that asks for `wants` (resource -> amount), in
    words: a resource it has too little of, else one that others hold now."""
    has, free = ray.cluster_resources(), ray.available_resources()
    asked = {key: amount for key, amount in sorted(wants.items()) if amount > 0}
    for key, amount in asked.items():
        if has.get(key, 0.0) + 1e-6 < amount:
            return f"the Ray cluster has {has.get(key, 0.0):g} {key} and it asks for {amount:g}"
    for key, amount in asked.items():
        if free.get(key, 0.0) + 1e-6 < amount:
            return (
                f"the Ray cluster's {has[key]:g} {key} are held by others "
                f"({free.get(key, 0.0):g} free) and it asks for {amount:g}"
            )
    what = ", ".join(f"{k} {v:g}" for k, v in asked.items()) or "nothing"
    return f"the Ray cluster has what it asks for ({what}), yet Ray started no process for it"
