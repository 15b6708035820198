"""The actor loop through Ray's served path against the same loop writing to a local store, at
k = 1 and 8 environments per actor, and the host CPU per environment step spent outside the
environment and the policy (issue 67, item 4).

One embedded Ray on this machine (the current stack, .venv312), three nodes as the Ray engine
makes them, each in its own process and served as `magi_lp.engines.ray_nodes` serves a node
(`call`, and `call_shared` for the learner's parameters):
- replay: the served `StepQueue` (`replay.queue_steps`);
- learner: serves DrQ-v2's policy parameters (`get_variables`, put into the object store once
  per version) and drains the queue on a thread as the learner's `StepDrainer` does
  (`ServedStepSource`, takes of up to `SERVED_TAKE_STEPS`), the steps touched and dropped;
- counter: Acme's counter, as the counter node.
This process is the actor: `ActingLoop` over reacher_hard from pixels (84x84, action repeat 2,
frame stack 3) with DrQ-v2's jitted behaviour policy at the tiny sizes (projects/drq_v2/tiny.py:
the question is the transport's cost per step, so the policy only has to be real), one XLA
thread. Ray is started before this process initialises JAX.

Variants, each for the same environment steps, in rotating order, several rounds:
  bare k     the k environments stepped with the policy's actions, nothing else: the
             environment and the policy alone.
  local k    what one process runs: `ActingLoop`, the adders writing into a `DeviceFrameStore`
             in this process (`StoreAdder`), parameters pulled from an in-process source,
             counted in this process.
  served k   what a Ray actor node runs: `ActingLoop`, the store's served adders
             (`DeviceStore.make_adders`: one `StepSender` for the k environments, the
             default `replay.send_steps` / `send_secs`) calling the replay node, parameters
             pulled from the learner node by reference, counts reported to the counter node
             with each call (far from the step limit, as an actor node counts).

CPU per environment step outside the environment and the policy: this process's CPU seconds
(all its threads, Ray's included) over a sample, less those spent inside its environment steps
and resets and its action choices (each call timed with the process's CPU clock), per step;
for the served path every Ray process's CPU per step besides (the three nodes, and Ray's
raylet, GCS, agents and idle workers: every process this one started). Ray's processes cost
CPU at rest too (their threads, per second rather than per step): their CPU a second while
the bare variant runs, nothing sent, is reported, and the served path's cost less that, per
step, as the part that comes with the steps. As a cross-check that needs no per-call
attribution: the variant's CPU per step less the bare variant's in the same round (median
over rounds), plus Ray's processes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import platform
import subprocess
import tempfile
import threading
import time
from typing import Any

from benchmarks import common
from benchmarks.common import fmt

TITLE = "Served acting: the actor loop through Ray's served path vs a local store, k = 1 and 8"
ENVS = (1, 8)
GOAL_RATIO = 0.95
GOAL_OUTSIDE_MS = 0.3
LOCAL_CAPACITY = 10_000  # the local store's transitions: its writes cost as a full store's
RAY_STACK_PYTHON = ".venv312/bin/python"
POLICY_SIZES = ("feature_dim", "hidden_dim", "encoder_channels")  # DrQ-v2's, at the tiny sizes
RAY_ROLES = ("replay", "learner", "counter", "daemons")  # Ray's processes besides the actor


def subprocess_env() -> dict[str, str]:
    return {**common.cpu_only_env(), **common.single_thread_env()}


class _Served:
    """A node served as the Ray engine's node actor serves one (`_NodeActor.call` and
    `call_shared`), made in its own process by `make()`."""

    def __init__(self, make: Any):
        self._node = make()
        self._shared: dict = {}
        self._shared_lock = threading.Lock()

    def pid(self) -> int:
        return os.getpid()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._node, method)(*args, **kwargs)

    def call_shared(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from magi_lp.engines.ray_nodes import _NodeActor

        return _NodeActor.call_shared(self, method, *args, **kwargs)


class _DrainingLearner:
    """The learner's part here: its policy parameters, and a drain thread taking the queue's
    steps as `StepDrainer` does (through `ServedStepSource`), touched and dropped."""

    def __init__(self, replay: Any, params: Any):
        import numpy as np

        from magi_lp.replay.step_queue import SERVED_TAKE_STEPS, ServedStepSource

        self._values = {"policy": params}
        self._source = ServedStepSource(replay)
        self.steps = 0

        def drain() -> None:
            while True:
                for step in self._source.take(SERVED_TAKE_STEPS):
                    np.asarray(step["frame"]).sum(dtype=np.int64)
                    self.steps += 1

        threading.Thread(target=drain, daemon=True).start()

    def get_variables(self, names):
        return [self._values[name] for name in names]

    def taken(self) -> int:
        return self.steps


# The nodes' makers, by name from this module: a closure over a module that the driver imported
# through magi_lp.acme_api would make the node's process import Acme's package (and Launchpad).
def _step_queue(frame_spec: Any, queue_steps: int) -> Any:
    from magi_lp.replay.served_queue import StepQueue

    return StepQueue(frame_spec, queue_steps)


def _counter() -> Any:
    from magi_lp.runtime.control_nodes import CounterNode

    return CounterNode()


def _policy_params(experiment: Any, spec: Any) -> Any:
    networks, source = common.policy_source(experiment, spec)
    return networks, source.get_variables(["policy"])[0]


def _experiment() -> Any:
    """make run's reacher_hard experiment (84x84 pixels, action repeat 2, frame stack 3) with
    DrQ-v2's networks at the tiny sizes (`projects.drq_v2.tiny`): the figure asks what the
    transport costs per step, so the policy only has to be real, not the paper's size."""
    from projects.drq_v2 import tiny
    from projects.drq_v2.experiment import make_experiment
    from projects.drq_v2.tasks import make_config

    config = make_config("reacher_hard", distributed=True)
    config.agent.min_replay_frames = 0  # as common.steady_state_experiment
    for key in POLICY_SIZES:
        config.agent[key] = tiny.OVERRIDES[f"agent.{key}"]
    return make_experiment(config)


def measure(quick: bool) -> dict:
    if importlib.util.find_spec("ray") is None:  # the Launchpad stack (.venv): Ray's is .venv312
        return _measure_on_ray_stack(quick)
    # Ray first: its processes are started before this one initialises JAX (a process that
    # forked after JAX's threads started sat in its first `jax.random.PRNGKey`).
    common.progress("starting Ray")
    with common.embedded_ray("magi_lp_served_acting_", num_cpus=4) as ray:
        return _measure(quick, ray)


def _measure_on_ray_stack(quick: bool) -> dict:
    """This figure run by the current stack's Python (.venv312), its result read back: the
    page's runner may run on the Launchpad stack, which has no Ray."""
    python = common.REPO / RAY_STACK_PYTHON
    with tempfile.TemporaryDirectory(prefix="magi_lp_served_acting_") as folder:
        out = os.path.join(folder, "result.json")
        command = [str(python), "-m", "benchmarks.served_acting", "--out", out]
        common.progress(f"running on {RAY_STACK_PYTHON}")
        process = subprocess.run(command + (["--quick"] if quick else []), cwd=common.REPO)
        try:
            with open(out) as result_file:
                result = json.load(result_file)
        except (OSError, ValueError):
            message = f"{RAY_STACK_PYTHON} wrote no result (exit {process.returncode})"
            raise RuntimeError(message) from None
    if result.get("status") != "ok":
        raise RuntimeError(f"on {RAY_STACK_PYTHON}: {result.get('error')}")
    return {k: v for k, v in result.items() if k not in ("status", "seconds")}


def _measure(quick: bool, ray: Any) -> dict:
    import jax
    import numpy as np

    from magi_lp.acme_api import counting, loggers
    from magi_lp.agent.actor import BatchedActor, GenericActor
    from magi_lp.agent.variable_client import VariableClient
    from magi_lp.engines.ray_nodes import NodeClient
    from magi_lp.replay.frame_store import DeviceFrameStore, StoreAdder
    from magi_lp.replay.step_queue import SEND_SECS, SEND_STEPS, SERVED_TAKE_STEPS
    from magi_lp.replay.stores.device import DeviceStore
    from magi_lp.runtime.acting_loop import ActingLoop
    from magi_lp.runtime.config import DISTRIBUTED_COUNT_EVERY
    from magi_lp.runtime.control_nodes import counter_parent
    from magi_lp.runtime.nodes import far_from_limit
    from magi_lp.runtime.seeding import node_seed

    common.progress("building the experiment and the policy")
    experiment = _experiment()
    config = experiment.config
    spec = experiment.get_environment_spec()
    builder = experiment.builder
    frame_spec = builder.frame_replay(spec)
    networks, params = _policy_params(experiment, spec)
    params = jax.tree_util.tree_map(np.asarray, params)  # to the nodes as NumPy
    repeat = int(config.env.action_repeat)

    node = ray.remote(_Served).options(max_concurrency=8, num_cpus=0)
    queue_steps = int(config.replay.queue_steps)
    replay_actor = node.remote(functools.partial(_step_queue, frame_spec, queue_steps))
    replay = NodeClient(
        replay_actor, ["insert_batch", "wait_for_room", "take_batch", "info", "close"]
    )
    learner_actor = node.remote(functools.partial(_DrainingLearner, replay, params))
    learner = NodeClient(learner_actor, ["get_variables", "taken"])
    counter_actor = node.remote(_counter)
    counter_node = NodeClient(counter_actor, ["increment", "increment_once", "get_counts"])
    common.progress("starting the replay, learner and counter nodes")
    pids = {
        "replay": ray.get(replay_actor.pid.remote()),
        "learner": ray.get(learner_actor.pid.remote()),
        "counter": ray.get(counter_actor.pid.remote()),
    }
    config.num_actors, config.envs_per_actor = 1, max(ENVS)
    store = DeviceStore(builder, config, transport="served")

    count = [0]
    inside = [0.0]  # this process's CPU seconds inside environment steps and policy calls
    runners: dict[str, tuple[Any, list[int]]] = {}
    for k in ENVS:
        period = max(1, round(config.variable_update_period / k))
        for how in ("bare", "local", "served"):
            common.progress(f"building {how} k={k}")
            environments = [
                _Timed(
                    experiment.environment_factory(node_seed(config.seed, "actor", 0, j), False),
                    count,
                    inside,
                )
                for j in range(k)
            ]
            policy = builder.make_policy(networks, spec, False)
            keys = list(jax.random.split(jax.random.PRNGKey(1), k))
            if how == "served":
                source = learner
                adders = store.make_adders(spec, replay, range(k))
                loop_counter = counting.Counter(
                    counter_parent(counter_node), prefix="actor", time_delta=0.0
                )
                count_every = DISTRIBUTED_COUNT_EVERY
                follow = far_from_limit(int(config.max_actor_steps), 1, k, SEND_STEPS)
            else:
                source = common._InProcessVariables(params, 200_000)
                source._values = {"policy": params}
                local = DeviceFrameStore(
                    dataclasses.replace(frame_spec, capacity=LOCAL_CAPACITY), writers=k
                )
                adders = [StoreAdder(local, j) for j in range(k)]
                loop_counter = counting.Counter(time_delta=0.0)
                count_every = 1
                follow = None
            client = VariableClient(source, "policy", update_period=period)
            if how == "bare":
                actor = BatchedActor(policy, keys, client, [None] * k)
                actor.select_actions = _timed(actor.select_actions, inside)
                runners[f"{how} k={k}"] = (_bare_runner(environments, actor), count)
                continue
            actor = (
                GenericActor(policy, keys[0], client, adders[0])
                if k == 1
                else BatchedActor(policy, keys, client, adders)
            )
            chosen = "select_action" if k == 1 else "select_actions"
            setattr(actor, chosen, _timed(getattr(actor, chosen), inside))
            loop = ActingLoop(
                environments,
                actor,
                loop_counter,
                loggers.NoOpLogger(),
                frames_per_step=repeat,
                count_every=count_every,
                counts_follow_sends=follow,
            )
            runners[f"{how} k={k}"] = (_loop_runner(loop, count), count)

    for name, (run, _) in runners.items():
        common.progress(f"warming up {name}")
        run(4 * max(ENVS))  # compiles, first pulls, first sends

    steps = 32 if quick else 320  # environment steps per sample; a multiple of every k
    rounds = 1 if quick else 9  # the k = 8 ratio moved 0.908-0.989 between quiet runs of 5
    samples = {name: [] for name in runners}
    names = list(runners)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            run, count = runners[name]
            before, inside_before = count[0], inside[0]
            ray_before = common.cpu_seconds_of(common.descendants())  # every Ray process
            cpu, start = time.process_time(), time.perf_counter()  # all threads, ns
            run(steps)
            wall = time.perf_counter() - start
            cpu = time.process_time() - cpu
            ray_after = common.cpu_seconds_of(common.descendants())
            taken = count[0] - before
            outside = cpu - (inside[0] - inside_before)
            sample = {
                "env_steps": taken,
                "wall_s": wall,
                "cpu_s": cpu,
                "frames_per_second": taken * repeat / wall,
                "frames_per_cpu_second": taken * repeat / max(cpu, 1e-9),
                "cpu_ms_per_step": 1000 * cpu / taken,
                "outside_ms_per_step": 1000 * outside / taken,
            }
            used = {pid: ray_after[pid] - ray_before.get(pid, 0.0) for pid in ray_after}
            for role, pid in pids.items():
                sample[f"{role}_cpu_ms_per_step"] = 1000 * used.get(pid, 0.0) / taken
            daemons = sum(v for pid, v in used.items() if pid not in pids.values())
            sample["daemons_cpu_ms_per_step"] = 1000 * daemons / taken
            sample["ray_cpu_ms_per_s"] = 1000 * sum(used.values()) / wall
            samples[name].append(sample)
            common.progress(
                f"round {round_index + 1} {name}: {taken * repeat / wall:.1f} frames/s, "
                f"{sample['cpu_ms_per_step']:.2f} CPU ms a step"
            )
    queue_info = replay.info()
    drained = learner.taken()

    variants = {}
    for name, runs in samples.items():
        variants[name] = {
            key: common.median([s[key] for s in runs])
            for key in runs[0]
            if key not in ("env_steps", "wall_s", "cpu_s")
        }
        variants[name]["samples"] = runs
    per_k = {}
    for k in ENVS:
        bare, local, served = (variants[f"{how} k={k}"] for how in ("bare", "local", "served"))
        ray_ms = {role: served[f"{role}_cpu_ms_per_step"] for role in RAY_ROLES}
        per_k[k] = {
            "ratio": _paired_ratio(served, local, "frames_per_second"),
            "cpu_ratio": _paired_ratio(served, local, "frames_per_cpu_second"),
            "served_outside_ms": _paired_excess(served, bare),
            "local_outside_ms": _paired_excess(local, bare),
            **{f"{role}_ms": ms for role, ms in ray_ms.items()},
            "host_outside_ms": _paired_excess(served, bare) + sum(ray_ms.values()),
            "served_direct_ms": served["outside_ms_per_step"],
            "local_direct_ms": local["outside_ms_per_step"],
            "bare_direct_ms": bare["outside_ms_per_step"],
            "host_direct_ms": served["outside_ms_per_step"] + sum(ray_ms.values()),
            "ray_at_rest_ms_per_s": bare["ray_cpu_ms_per_s"],
            "marginal_ms": _paired_marginal(served, bare),
        }
    return {
        "envs": list(ENVS),
        "env_steps_per_sample": steps,
        "rounds": rounds,
        "action_repeat": repeat,
        "image_size": int(config.env.image_size),
        "variable_update_period": int(config.variable_update_period),
        "send_steps": SEND_STEPS,
        "send_secs": SEND_SECS,
        "queue_steps": queue_steps,
        "count_every": DISTRIBUTED_COUNT_EVERY,
        "take_steps": SERVED_TAKE_STEPS,
        "counts_with_sends": True,
        "queue_inserted": queue_info["inserted"],
        "drained": drained,
        "variants": variants,
        "per_k": {str(k): v for k, v in per_k.items()},
        "goal_ratio": GOAL_RATIO,
        "goal_outside_ms": GOAL_OUTSIDE_MS,
        "ray": ray.__version__,
        "jax": jax.__version__,
        "python": platform.python_version(),
    }


class _Timed(common.StepCounting):
    """An environment whose steps and resets add this process's CPU time (all threads, the
    renderer's included) to `inside[0]`."""

    def __init__(self, env: Any, counter: list[int], inside: list[float]):
        super().__init__(env, counter)
        self._inside = inside

    def reset(self):
        start = time.process_time()
        try:
            return super().reset()
        finally:
            self._inside[0] += time.process_time() - start

    def step(self, action):
        start = time.process_time()
        try:
            return super().step(action)
        finally:
            self._inside[0] += time.process_time() - start


def _timed(choose: Any, inside: list[float]) -> Any:
    """The actor's action choice (the jitted policy, its actions back on the host), its
    process CPU time added to `inside[0]`."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return choose(*args, **kwargs)
        finally:
            inside[0] += time.process_time() - start

    return timed


def _paired_ratio(variant: dict, other: dict, key: str) -> float:
    """The median over rounds of the variant's `key` over the other's in the same round."""
    return common.median(
        [s[key] / o[key] for s, o in zip(variant["samples"], other["samples"], strict=True)]
    )


def _paired_excess(variant: dict, bare: dict) -> float:
    """The median over rounds of (the variant's CPU ms a step - the bare variant's in the same
    round): each pair ran back to back, under the same load."""
    return common.median(
        [
            s["cpu_ms_per_step"] - b["cpu_ms_per_step"]
            for s, b in zip(variant["samples"], bare["samples"], strict=True)
        ]
    )


def _host_ms(sample: dict) -> float:
    """A served sample's host CPU ms a step outside env and policy: the actor's, Ray's."""
    return sample["outside_ms_per_step"] + sum(
        sample[f"{role}_cpu_ms_per_step"] for role in RAY_ROLES
    )


def _paired_marginal(served: dict, bare: dict) -> float:
    """The median over rounds of the served sample's host CPU a step less what Ray's processes
    took per second at rest (the bare sample of the same round, nothing sent) over the served
    sample's time: the part that comes with the steps."""
    return common.median(
        [
            _host_ms(s) - b["ray_cpu_ms_per_s"] * s["wall_s"] / s["env_steps"]
            for s, b in zip(served["samples"], bare["samples"], strict=True)
        ]
    )


def _bare_runner(environments: list[Any], actor: Any) -> Any:
    """The environments stepped with the policy's actions: nothing but the two."""
    timesteps: list[Any] = []

    def run(steps: int) -> None:
        if not timesteps:
            timesteps.extend(environment.reset() for environment in environments)
        for _ in range(steps // len(environments)):
            actions = actor.select_actions([t.observation for t in timesteps])
            for i, environment in enumerate(environments):
                if timesteps[i].last():
                    timesteps[i] = environment.reset()
                else:
                    timesteps[i] = environment.step(actions[i])

    return run


def _loop_runner(loop: Any, count: list[int]) -> Any:
    def run(steps: int) -> None:
        target = count[0] + steps
        loop.run(should_stop=lambda: count[0] >= target)

    return run


def _verdict(met: bool) -> str:
    return "met" if met else "missed"


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    per_k, envs = result["per_k"], result["envs"]
    return (
        " / ".join(f"{fmt(per_k[str(k)]['host_direct_ms'], 3)}" for k in envs)
        + " host CPU ms a step outside env and policy, served (k = 1 / 8); "
        + " / ".join(f"{fmt(per_k[str(k)]['marginal_ms'], 3)}" for k in envs)
        + " of it with the steps",
        f"local store; goal >= {result['goal_ratio']}, <= {result['goal_outside_ms']} ms",
        " / ".join(fmt(per_k[str(k)]["ratio"], 3) for k in envs)
        + " (CPU: "
        + " / ".join(fmt(per_k[str(k)]["cpu_ratio"], 3) for k in envs)
        + ")",
    )


def report(result: dict) -> str:
    per_k, variants = result["per_k"], result["variants"]
    envs = result["envs"]
    ratios = [per_k[str(k)]["ratio"] or 0.0 for k in envs]
    host = [per_k[str(k)]["host_direct_ms"] for k in envs]
    marginal = [per_k[str(k)]["marginal_ms"] for k in envs]
    at_rest = common.median([per_k[str(k)]["ray_at_rest_ms_per_s"] for k in envs])
    goal = result["goal_outside_ms"]

    def each(key: str) -> str:
        return " / ".join(fmt(per_k[str(k)][key], 3) for k in envs)

    lines = [
        "Through Ray's served path the actor loop runs at **"
        + " / ".join(fmt(r, 3) for r in ratios)
        + f"** of the same loop writing to a local store ({' and '.join(f'k = {k}' for k in envs)}"
        f"; frames per wall second; per CPU-second of the actor process {each('cpu_ratio')}). "
        f"Goal >= {result['goal_ratio']}: **{_verdict(min(ratios) >= result['goal_ratio'])}**. "
        "Host CPU per environment step outside the environment and the policy on the served "
        "path, at this one actor's rate (the actor process's CPU outside its environment steps "
        "and policy calls, plus every Ray process: the replay node, the learner's drain, the "
        "counter node, and Ray's own raylet, GCS, agents and idle workers): **"
        + " / ".join(fmt(v, 3) for v in host)
        + f" ms**; goal <= {goal} ms: **{_verdict(max(host) <= goal)}**. Ray's processes take "
        f"{fmt(at_rest, 1)} ms of CPU a second at rest, whatever the steps (measured while the "
        "bare variant runs, nothing sent); the part that comes with the steps is **"
        + " / ".join(fmt(v, 3) for v in marginal)
        + f" ms** a step (goal <= {goal} ms: **{_verdict(max(marginal) <= goal)}**). "
        f"Local store: {each('local_direct_ms')} ms; bare loop: {each('bare_direct_ms')} ms."
        + (f" Machine: {result['run']['machine']}." if "run" in result else ""),
        "",
        "| variant | frames/s | frames per CPU-s | actor CPU ms a step | of which outside env "
        "and policy | replay node | learner drain | counter node | Ray's daemons |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, v in variants.items():
        lines.append(
            f"| {name} | {fmt(v['frames_per_second'])} | {fmt(v['frames_per_cpu_second'])} "
            f"| {fmt(v['cpu_ms_per_step'], 3)} | {fmt(v['outside_ms_per_step'], 3)} | "
            + " | ".join(fmt(v[f"{role}_cpu_ms_per_step"], 3) for role in RAY_ROLES)
            + " |"
        )
    lines += [
        "",
        "| k | served / local (wall) | (CPU) | outside env and policy, ms a step: actor served "
        "| actor local | replay node | learner drain | counter node | Ray's daemons | served, "
        "whole host | Ray at rest, ms a second | with the steps | cross-check: served - bare, "
        "whole host |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k in envs:
        p = per_k[str(k)]
        lines.append(
            f"| {k} | {fmt(p['ratio'], 3)} | {fmt(p['cpu_ratio'], 3)} "
            f"| {fmt(p['served_direct_ms'], 3)} | {fmt(p['local_direct_ms'], 3)} | "
            + " | ".join(fmt(p[f"{role}_ms"], 3) for role in RAY_ROLES)
            + f" | {fmt(p['host_direct_ms'], 3)} | {fmt(p['ray_at_rest_ms_per_s'], 1)} "
            f"| {fmt(p['marginal_ms'], 3)} | {fmt(p['host_outside_ms'], 3)} |"
        )
    lines += [
        "",
        f"How: one process (the actor, one XLA thread) runs every variant for "
        f"{result['env_steps_per_sample']} environment steps a round, {result['rounds']} "
        "rounds in rotating order after a warm-up; medians shown; the ratios are medians over "
        "rounds of served / local in the same round. reacher_hard at "
        f"{result['image_size']}x{result['image_size']}, action repeat "
        f"{result['action_repeat']}, frame stack 3 (rendered with shadows, as `make run`), "
        "DrQ-v2's jitted behaviour policy at the tiny sizes (`projects/drq_v2/tiny.py`: 8 conv "
        "channels, feature 8, hidden 32; the question is the transport's cost per step, so the "
        "policy only has to be real), "
        f"parameters pulled every {result['variable_update_period']} environment steps. "
        "bare: the environments and the policy alone. local: `ActingLoop` writing into a "
        f"`DeviceFrameStore` in this process ({LOCAL_CAPACITY:,} transitions), counted here. "
        "served: `ActingLoop` with the device store's served adders (one `StepSender` for the "
        f"k environments: {result['send_steps']} steps or {result['send_secs']} s a call"
        + (
            "), counts to a counter node with each call (far from the step limit, as an actor "
            "node counts: `runtime.nodes.far_from_limit`), "
            if result.get("counts_with_sends")  # before: every count_every loop steps
            else f", and at each count), counts to a counter node every {result['count_every']} "
            "loop steps, "
        )
        + "parameters from a learner node by reference (`call_shared`); an embedded Ray (Ray "
        f"{result['ray']}, JAX {result['jax']}, Python {result['python']}) with the replay node's "
        f"`StepQueue` ({result['queue_steps']} steps) and a learner node draining it in takes "
        f"of up to {result.get('take_steps', 64)} steps, each in its own process, started "
        "before the actor initialised JAX "
        f"({result['drained']:,} of {result['queue_inserted']:,} items drained by the end). "
        "CPU is each process's user + system seconds (all threads, Ray's included). 'Outside "
        "env and policy' for the actor: its process CPU over the sample less the process CPU "
        "spent inside its environment steps and resets and its action choices (each call "
        "timed with the process's CPU clock); CPU that Ray's threads spend while such a call "
        "runs counts as inside, so this can read low. The cross-check column needs no such "
        "attribution: the served variant's actor CPU a step less the bare variant's in the same "
        "round (median over rounds), plus Ray's processes; it is the difference of two numbers "
        "of about 25 ms and moves by a few ms with the load. Ray's processes are every process "
        "this one started (read from /proc); 'with the steps' is the served sample's whole "
        "host less Ray's CPU a second at rest (the same round's bare sample) over the served "
        "sample's seconds, per step (median over rounds). Steps travel in columns "
        "(`magi_lp.replay.step_batch`: an array of frames per call, not an object per step). "
        "The machine may run other work at the same time: wall-clock ratios move with its "
        "load, CPU per step less so.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    common.figure_main(measure)
