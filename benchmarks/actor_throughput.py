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

from typing import Any

from benchmarks.common import (
    StepCounting,
    acting_runner,
    cpu_only_env,
    figure_main,
    fmt,
    pin_to_one_core,
    policy_source,
    progress,
    rates_against_raw,
    rates_table,
    raw_runner,
    single_thread_env,
    steady_state_replay,
    timed_rounds,
)

TITLE = "Actor loop frames/s vs the raw environment (one core)"
VARIANTS = ("raw", "random_core", "drq", "drq_replay")
GOAL = 0.9


def subprocess_env() -> dict[str, str]:
    return {**cpu_only_env(), **single_thread_env()}


def _random_core(action_dim: int):
    import jax
    import jax.numpy as jnp

    from magi_lp.agent.actor_core import ActorCore

    def select_action(params, observation, key):
        del params, observation
        key, sub = jax.random.split(key)
        return jax.random.uniform(sub, (action_dim,), jnp.float32, -1.0, 1.0), key

    return ActorCore(init=lambda key: key, select_action=select_action)


def _runner(name: str, experiment: Any, spec: Any, replay_client: Any) -> tuple[Any, list[int]]:
    """(run(agent steps) function, env step counter) for one variant."""
    import jax

    from magi_lp.agent.actor import GenericActor
    from magi_lp.agent.variable_client import VariableClient
    from magi_lp.replay.stores import resolve_store

    config = experiment.config
    builder = experiment.builder
    count = [0]
    env = StepCounting(experiment.environment_factory(config.seed, False), count)
    if name == "raw":
        return raw_runner(env, spec.actions.shape, count)

    networks, source = policy_source(experiment, spec)
    if name == "random_core":
        policy = _random_core(spec.actions.shape[0])
    else:
        policy = builder.make_policy(networks, spec, False)
    adder = (
        resolve_store(experiment.builder, experiment.config).make_adder(spec, replay_client, 0)
        if name == "drq_replay"
        else None
    )
    client = VariableClient(source, "policy", update_period=config.variable_update_period)
    actor = GenericActor(policy, jax.random.PRNGKey(1), client, adder)
    return acting_runner([env], actor, count, int(config.env.action_repeat))


def measure(quick: bool) -> dict:
    from magi_lp.replay.stores.reverb_frames import FRAME_TABLE

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
        run, count = _runner(name, experiment, spec, client)
        run(warmup)  # compiles the policy, first parameter pull, first Reverb writes
        runners[name] = (run, count)

    samples = timed_rounds(runners, steps, rounds, repeat)
    items = int(client.server_info()[FRAME_TABLE].current_size)
    server.stop()
    return {
        "core": core,
        "steps_per_sample": steps,
        "rounds": rounds,
        "action_repeat": repeat,
        "image_size": int(config.env.image_size),
        "variable_update_period": int(config.variable_update_period),
        "variants": rates_against_raw(samples),
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
        *rates_table((label, variants[name]) for name, label in _LABELS.items()),
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
