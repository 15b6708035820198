"""Figure 2: actor loop frames/s against the raw environment, on the same single core.

Everything runs in one process pinned to one core with one compute thread for XLA, BLAS and
TensorFlow (the env the placement plan gives an actor node: `cpu_threads=1`, EGL rendering,
no GPU). Variants, each run for the same number of agent steps, in rotating order, several
rounds:

  raw             reacher_hard from pixels as the project builds it (dm_control step x2 for
                  the action repeat, one 84x84 render, frame stacking), random numpy actions,
                  no policy, no toolkit.
  random_core     the real ActingLoop + GenericActor (VariableClient over the learner's
                  'policy' variables, as the runtime builds it) with a zero-cost jitted core
                  that draws a uniform action: the toolkit's own overhead.
  drq             the same with DrQ-v2's behaviour core (jitted CPU policy, the paper's
                  network sizes), parameters from an in-process variable source.
  drq_replay      drq plus the FrameStackAdder writing every step to a Reverb server in
                  this process (the table the builder makes).

frames/s = agent steps x action repeat (2) / wall seconds. Because other processes may share
the core, the figure also gives frames per CPU-second of this process (all its threads:
renderer, Reverb, the variable client), which a loaded machine inflates much less.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import (
    cpu_only_env,
    figure_main,
    fmt,
    median,
    pin_to_one_core,
    process_cpu_seconds,
    progress,
    ratio,
    single_thread_env,
    steady_state_replay,
)

TITLE = "Actor loop frames/s vs the raw environment (one core)"
VARIANTS = ("raw", "random_core", "drq", "drq_replay")
GOAL = 0.9


def subprocess_env() -> dict[str, str]:
    return {**cpu_only_env(), **single_thread_env()}


class _Steps:
    """Counts environment steps (the same thin wrapper for every variant)."""

    def __init__(self, env: Any):
        self._env = env
        self.count = 0

    def reset(self):
        return self._env.reset()

    def step(self, action):
        self.count += 1
        return self._env.step(action)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class _InProcessVariables:
    """A variable source in this process: the policy params with a global agent step past
    the random phase (so the behaviour policy acts with its network, as after warm-up)."""

    def __init__(self, policy_params: Any, global_agent_steps: int):
        import numpy as np

        from projects.drq_v2.acting import GLOBAL_AGENT_STEPS

        policy = {**policy_params, GLOBAL_AGENT_STEPS: np.int32(global_agent_steps)}
        self._values = {"policy": policy}

    def get_variables(self, names):
        return [self._values[name] for name in names]


def _random_core(action_dim: int):
    import jax
    import jax.numpy as jnp

    from magi_lp.agent.actor_core import ActorCore

    def select_action(params, observation, key):
        del params, observation
        key, sub = jax.random.split(key)
        return jax.random.uniform(sub, (action_dim,), jnp.float32, -1.0, 1.0), key

    return ActorCore(init=lambda key: key, select_action=select_action)


def _runner(name: str, experiment: Any, spec: Any, replay_client: Any) -> tuple[Any, Any]:
    """(step function running one agent step, step-counting env) for one variant."""
    import jax
    import numpy as np
    from acme.utils import counting, loggers

    from magi_lp.agent.actor import GenericActor
    from magi_lp.agent.variable_client import VariableClient
    from magi_lp.runtime import replay as replay_lib
    from magi_lp.runtime.acting_loop import ActingLoop

    config = experiment.config
    builder = experiment.builder
    env = _Steps(experiment.environment_factory(config.seed, False))
    if name == "raw":
        rng = np.random.default_rng(0)
        shape = spec.actions.shape
        state = {}

        def run(steps: int) -> None:
            # A fresh episode per call, as the actor loop starts one after each stop.
            state["timestep"] = env.reset()
            for _ in range(steps):
                if state["timestep"].last():
                    state["timestep"] = env.reset()
                action = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
                state["timestep"] = env.step(action)

        return run, env

    networks = experiment.network_factory(spec)
    params = networks.init(jax.random.PRNGKey(0), spec.observations.generate_value())
    source = _InProcessVariables(
        {"encoder": params["encoder"], "actor": params["actor"]}, global_agent_steps=200_000
    )
    if name == "random_core":
        policy = _random_core(spec.actions.shape[0])
    else:
        policy = builder.make_policy(networks, spec, False)
    adder = (
        replay_lib.make_adder(experiment, spec, replay_client, writer=0)
        if name == "drq_replay"
        else None
    )
    client = VariableClient(source, "policy", update_period=config.variable_update_period)
    actor = GenericActor(policy, jax.random.PRNGKey(1), client, adder)
    loop = ActingLoop(
        env,
        actor,
        counting.Counter(time_delta=0.0),
        loggers.NoOpLogger(),
        should_update=True,
        frames_per_step=int(config.env.action_repeat),
    )

    def run(steps: int) -> None:
        # The loop checks should_stop before every step: stop after `steps` more steps,
        # mid-episode if need be (the next call starts a fresh episode, as a node would).
        target = env.count + steps
        loop.run(should_stop=lambda: env.count >= target)

    return run, env


def measure(quick: bool) -> dict:
    from magi_lp.runtime import replay as replay_lib

    core = pin_to_one_core()
    experiment, spec, server, client = steady_state_replay()
    config = experiment.config
    repeat = int(config.env.action_repeat)

    steps = 60 if quick else 300
    rounds = 1 if quick else 3
    warmup = 10 if quick else 30
    runners = {}
    for name in VARIANTS:
        progress(f"building and warming up {name}")
        run, env = _runner(name, experiment, spec, client)
        run(warmup)  # compiles the policy, first parameter pull, first Reverb writes
        runners[name] = (run, env)

    samples: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for round_index in range(rounds):
        order = VARIANTS[round_index % len(VARIANTS) :] + VARIANTS[: round_index % len(VARIANTS)]
        for name in order:
            run, env = runners[name]
            before = env.count
            cpu = process_cpu_seconds()
            start = time.perf_counter()
            run(steps)
            wall = time.perf_counter() - start
            cpu = process_cpu_seconds() - cpu
            taken = env.count - before
            samples[name].append(
                {
                    "steps": taken,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "frames_per_second": taken * repeat / wall,
                    "frames_per_cpu_second": taken * repeat / max(cpu, 1e-9),
                }
            )
            progress(f"round {round_index + 1} {name}: {taken * repeat / wall:.1f} frames/s")

    items = int(client.server_info()[replay_lib.FRAME_TABLE].current_size)
    server.stop()

    variants = {}
    for name in VARIANTS:
        variants[name] = {
            "frames_per_second": median([s["frames_per_second"] for s in samples[name]]),
            "frames_per_cpu_second": median([s["frames_per_cpu_second"] for s in samples[name]]),
            "samples": samples[name],
        }
    raw = variants["raw"]
    for name in VARIANTS:
        variants[name]["ratio_to_raw"] = ratio(
            variants[name]["frames_per_second"], raw["frames_per_second"]
        )
        variants[name]["cpu_ratio_to_raw"] = ratio(
            variants[name]["frames_per_cpu_second"], raw["frames_per_cpu_second"]
        )
    return {
        "core": core,
        "steps_per_sample": steps,
        "rounds": rounds,
        "action_repeat": repeat,
        "image_size": int(config.env.image_size),
        "variable_update_period": int(config.variable_update_period),
        "variants": variants,
        "replay_items_written": items,
        "goal_ratio": GOAL,
    }


_LABELS = {
    "raw": "raw environment (random numpy actions)",
    "random_core": "actor loop, zero-cost jitted core",
    "drq": "actor loop, DrQ-v2 policy",
    "drq_replay": "actor loop, DrQ-v2 policy + FrameStackAdder -> Reverb",
}


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    v = result["variants"]
    return (
        f"{fmt(v['drq']['frames_per_second'])} frames/s actor loop with DrQ-v2 policy "
        f"({fmt(v['drq']['frames_per_cpu_second'])} per CPU-s)",
        f"{fmt(v['raw']['frames_per_second'])} frames/s raw env "
        f"({fmt(v['raw']['frames_per_cpu_second'])} per CPU-s); goal >= {GOAL}",
        f"{fmt(v['drq']['ratio_to_raw'], 3)} (CPU: {fmt(v['drq']['cpu_ratio_to_raw'], 3)}; "
        f"zero-cost policy {fmt(v['random_core']['ratio_to_raw'], 3)}, CPU "
        f"{fmt(v['random_core']['cpu_ratio_to_raw'], 3)})",
    )


def report(result: dict) -> str:
    variants = result["variants"]
    drq = variants["drq"]
    lines = [
        f"Actor/raw = **{fmt(drq['ratio_to_raw'], 3)}** with the DrQ-v2 policy "
        f"({fmt(drq['frames_per_second'])} vs {fmt(variants['raw']['frames_per_second'])} "
        f"frames/s), **{fmt(variants['drq_replay']['ratio_to_raw'], 3)}** with replay writes, "
        f"**{fmt(variants['random_core']['ratio_to_raw'], 3)}** with a zero-cost policy "
        f"(the toolkit's own overhead). Goal >= {result['goal_ratio']}.",
        "",
        "| variant | frames/s | ratio to raw | frames per CPU-second | CPU ratio to raw |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, label in _LABELS.items():
        v = variants[name]
        lines.append(
            f"| {label} | {fmt(v['frames_per_second'])} | {fmt(v['ratio_to_raw'], 3)} "
            f"| {fmt(v['frames_per_cpu_second'])} | {fmt(v['cpu_ratio_to_raw'], 3)} |"
        )
    lines += [
        "",
        f"How: one process pinned to core {result['core']}, one XLA/BLAS/TF thread (the "
        "actor node's plan env), reacher_hard at "
        f"{result['image_size']}x{result['image_size']}, action repeat "
        f"{result['action_repeat']}, frame stack 3. Each variant runs "
        f"{result['steps_per_sample']} agent steps per round after a warm-up (compile, first "
        f"parameter pull), {result['rounds']} round(s) in rotating order; medians shown. The "
        "actor variants are `ActingLoop` + `DrQBuilder.make_actor` (GenericActor, "
        "VariableClient pulling every "
        f"{result['variable_update_period']} steps from an in-process source), the policy "
        "being DrQ-v2's jitted behaviour core with the paper's network sizes, or a "
        "zero-cost core that draws a uniform action. Frames per CPU-second counts every "
        "thread of the process and is the better guide when other work shares the core.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    figure_main(measure)
