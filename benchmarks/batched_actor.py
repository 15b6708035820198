"""Figure 8: one actor process stepping k environments (`envs_per_actor`) against the raw
environment, on the same single core.

rlstructures' advice for acting: one process with N environments and batched inference, since
every extra process costs (a CUDA context of 300-700 MB on a GPU, a copy of the policy and
the libraries everywhere) and a device runs one call after another anyway. The toolkit's
`ActingLoop` steps k environments one after the other and a `BatchedActor` chooses their k
actions in one jitted, vmapped call. Everything runs in one process pinned to one core with
one compute thread (the plan's actor env), as in figure 2. Variants, each for the same number of
environment steps, in rotating order, several rounds:

  raw          reacher_hard from pixels (dm_control step x2, one 84x84 render, frame stacking),
               random numpy actions, no policy, no toolkit: figure 2's baseline.
  k=1          the actor as `envs_per_actor=1` runs it: `ActingLoop` + `GenericActor`, DrQ-v2's
               behaviour policy (the paper's network sizes, one observation per call), and the
               FrameStackAdder writing every step to a Reverb server in this process.
  k=4, 8, 16   the actor as `envs_per_actor=k` runs it: `ActingLoop` + `BatchedActor`
               (one policy call for k observations), one FrameStackAdder per environment.

frames/s = environment steps x action repeat (2) / wall seconds; since other processes may
share the core, frames per CPU-second of this process (all its threads: renderer, Reverb, the
variable client) is given too, and is the better guide on a loaded machine. "per core" below
means that: the process never uses more than its one core.
"""

from __future__ import annotations

from typing import Any

from benchmarks import common
from benchmarks.common import fmt

TITLE = "Batched actor: frames/s of one actor process with k environments vs the raw environment"
ENVS = (1, 4, 8, 16)
GOAL = 0.95  # of raw frames/s per core, with k >= 4


def subprocess_env() -> dict[str, str]:
    return {**common.cpu_only_env(), **common.single_thread_env()}


def _runner(k: int, experiment: Any, spec: Any, replay_client: Any) -> tuple[Any, list[int]]:
    """(run(env steps) function, env step counter) for raw (k=0) or an actor of k envs."""
    import jax

    from magi_lp.agent.actor import BatchedActor, GenericActor
    from magi_lp.agent.variable_client import VariableClient
    from magi_lp.replay.stores import resolve_store
    from magi_lp.runtime.seeding import node_seed

    config = experiment.config
    builder = experiment.builder
    count = [0]
    environments = [
        common.StepCounting(
            experiment.environment_factory(node_seed(config.seed, "actor", 0, j), False), count
        )
        for j in range(max(k, 1))
    ]
    if k == 0:
        return common.raw_runner(environments[0], spec.actions.shape, count)

    networks, source = common.policy_source(experiment, spec)
    policy = builder.make_policy(networks, spec, False)
    period = max(1, round(config.variable_update_period / k))
    client = VariableClient(source, "policy", update_period=period)
    repeat = int(config.env.action_repeat)
    store = resolve_store(experiment.builder, experiment.config)
    if k == 1:
        actor = GenericActor(
            policy,
            jax.random.PRNGKey(1),
            client,
            store.make_adder(spec, replay_client, 0),
        )
    else:
        actor = BatchedActor(
            policy,
            list(jax.random.split(jax.random.PRNGKey(1), k)),
            client,
            [store.make_adder(spec, replay_client, j) for j in range(k)],
        )
    return common.acting_runner(environments, actor, count, repeat)


def _name(k: int) -> str:
    return "raw" if k == 0 else f"k={k}"


def _label(k: int) -> str:
    if k == 0:
        return "raw environment (random numpy actions)"
    return f"actor, {k} environment(s), DrQ-v2 policy + replay writes"


def measure(quick: bool) -> dict:
    core = common.pin_to_one_core()
    experiment, spec, server, client = common.steady_state_replay()
    config = experiment.config
    repeat = int(config.env.action_repeat)

    steps = 64 if quick else 320  # environment steps per sample; a multiple of every k
    rounds = 1 if quick else 3
    variants = (0, *ENVS)
    runners = {}
    for k in variants:
        common.progress(f"building and warming up {_name(k)}")
        run, count = _runner(k, experiment, spec, client)
        run(2 * max(k, 8))  # compiles the policy, first parameter pull, first Reverb writes
        runners[_name(k)] = (run, count)

    rates = common.rates_against_raw(
        common.timed_rounds(runners, steps, rounds, repeat, "env_steps")
    )
    server.stop()
    return {
        "core": core,
        "env_steps_per_sample": steps,
        "rounds": rounds,
        "action_repeat": repeat,
        "image_size": int(config.env.image_size),
        "variable_update_period": int(config.variable_update_period),
        "variants": {_name(k): {"envs": k, **rates[_name(k)]} for k in variants},
        "goal_ratio": GOAL,
    }


def _best_batched(result: dict) -> tuple[str, dict]:
    batched = {n: v for n, v in result["variants"].items() if v["envs"] >= 4}
    name = max(batched, key=lambda n: batched[n]["cpu_ratio_to_raw"] or 0.0)
    return name, batched[name]


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    v = result["variants"]
    per = " / ".join(fmt(v[_name(k)]["frames_per_cpu_second"]) for k in ENVS)
    return (
        f"{per} frames per CPU-s with k = {', '.join(map(str, ENVS))} environments per actor",
        f"raw env: {fmt(v['raw']['frames_per_cpu_second'])} per CPU-s; goal >= {GOAL} with k >= 4",
        " / ".join(fmt(v[_name(k)]["cpu_ratio_to_raw"], 3) for k in ENVS)
        + f" (wall: {' / '.join(fmt(v[_name(k)]['ratio_to_raw'], 3) for k in ENVS)})",
    )


def report(result: dict) -> str:
    variants = result["variants"]
    name, best = _best_batched(result)
    met = (best["cpu_ratio_to_raw"] or 0.0) >= result["goal_ratio"]
    lines = [
        f"Per core, an actor process with {name.split('=')[1]} environments reaches "
        f"**{fmt(best['cpu_ratio_to_raw'], 3)}** of the raw environment's frames per CPU-second "
        f"(k=1: **{fmt(variants['k=1']['cpu_ratio_to_raw'], 3)}**). Goal >= "
        f"{result['goal_ratio']} with k >= 4: **{'met' if met else 'missed'}**.",
        "",
        *common.rates_table((_label(v["envs"]), v) for v in variants.values()),
        "",
        f"How: one process pinned to core {result['core']}, one XLA/BLAS/TF thread (the actor "
        f"node's plan env), reacher_hard at {result['image_size']}x{result['image_size']}, "
        f"action repeat {result['action_repeat']}, frame stack 3. Each variant runs "
        f"{result['env_steps_per_sample']} environment steps per round after a warm-up "
        f"(compile, first parameter pull, first Reverb writes), {result['rounds']} round(s) in "
        "rotating order; medians shown. k=1 is `ActingLoop` + `GenericActor` (what "
        "`envs_per_actor=1` runs), k>1 `ActingLoop` + `BatchedActor`; both with "
        "DrQ-v2's jitted behaviour policy at the paper's sizes, parameters from an in-process "
        "source (pulled every "
        f"{result['variable_update_period']} environment steps) and one FrameStackAdder per "
        "environment writing to a Reverb server in the same process. Environments are stepped "
        "one after the other: the process has one core, and stepping (physics, software "
        "rendering) is the work.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    common.figure_main(measure)
