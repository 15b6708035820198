"""TD3 hyperparameters (the `config.agent` part of an experiment).

Defaults follow the paper (Fujimoto et al. 2018, "Addressing Function Approximation Error in
Actor-Critic Methods", Table 3) and its reference code (sfujim/TD3), except where a small
proprioceptive dm_control task on a 2-core CPU learns faster otherwise: a shorter warm-up
(`random_action_steps`, `min_replay_size`) and 3-step TD targets (`n_step`; set it to 1 for
the paper's algorithm). Units: an *agent step* is one call of the policy
(`env.action_repeat` frames); actions are in [-1, 1] (the environment is wrapped to that
range), so the noise scales below are fractions of the action range's half-width, as
`max_action`-scaled noise is in the paper.
"""

from __future__ import annotations

import ml_collections

from magi_lp import ConfigChecker, ConfigError


def get_agent_config() -> ml_collections.ConfigDict:
    """TD3 hyperparameters, every one named; override with `--config.agent.<key>=value`."""
    config = ml_collections.ConfigDict()

    # --- optimisation -------------------------------------------------------------------
    config.learning_rate = 3e-4  # Adam step size, actor and critic alike (reference code)
    config.batch_size = 256  # transitions per update (reference code; the paper used 100)
    config.discount = 0.99  # gamma, per agent step
    # TD targets over n agent steps. The paper's TD3 is 1-step; 3 (as in DrQ-v2; D4PG uses 5)
    # propagates value faster: on cartpole/balance it reached evaluation returns ~990 by 25k
    # agent steps where 1-step was at ~500 after 40k (one seed each, see the project report).
    config.n_step = 3
    config.tau = 0.005  # soft target update: target <- tau * online + (1 - tau) * target

    # --- target policy smoothing and delayed updates ---------------------------------------
    config.policy_noise = 0.2  # stddev of the Gaussian noise added to target actions
    config.noise_clip = 0.5  # that noise is clipped to [-noise_clip, noise_clip]
    config.policy_delay = 2  # critic updates per actor (and target network) update

    # --- exploration ----------------------------------------------------------------------
    config.exploration_noise = 0.1  # stddev of the Gaussian noise added when acting
    # Agent steps of uniformly random actions at the start of each actor (the paper's
    # `start_timesteps`, there 25k for MuJoCo; small tasks learn faster with fewer).
    config.random_action_steps = 1_000

    # --- networks -------------------------------------------------------------------------
    config.hidden_sizes = (256, 256)  # ReLU hidden layers of the actor and of each critic

    # --- replay ---------------------------------------------------------------------------
    config.min_replay_size = 1_000  # transitions in replay before the first update
    config.actor_steps_per_update = 1.0  # agent steps per update (1 = the paper's ratio)
    config.replay_size = 1_000_000  # transitions kept (FIFO): the paper keeps all of training
    # Parallel Reverb readers of the learner's dataset: enough to keep up with a
    # 256-transition batch on a CPU without spawning a thread per core of a large machine.
    config.dataset_num_parallel_calls = 2
    return config


def validate_agent_config(agent: ml_collections.ConfigDict) -> None:
    """Refuses out-of-range TD3 hyperparameters, one line naming `agent.<key>` and the fix.

    Run by both entry points before any process starts (`TD3Builder.validate_config`).
    """
    check = ConfigChecker(agent, defaults=get_agent_config())
    check.number("learning_rate", above=0)
    check.integer("batch_size", minimum=1)
    check.number("discount", above=0, maximum=1)
    check.integer("n_step", minimum=1)
    check.number("tau", above=0, maximum=1)
    check.number("policy_noise", minimum=0)
    check.number("noise_clip", minimum=0)
    check.integer("policy_delay", minimum=1)
    check.number("exploration_noise", minimum=0)
    check.integer("random_action_steps", minimum=0)
    check.sizes("hidden_sizes")
    check.integer("min_replay_size", minimum=1)
    check.number("actor_steps_per_update", above=0)
    check.integer("replay_size", minimum=1)
    check.at_least("replay_size", "batch_size")
    check.at_least("replay_size", "min_replay_size")
    check.integer("dataset_num_parallel_calls", minimum=1)


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks `config.agent` and `config.env` before any process starts (both entry points)."""
    validate_agent_config(config.agent)
    ConfigChecker(config.env, section="env").integer("action_repeat", minimum=1)
    from dm_control import suite  # here: only a run that passed every other check pays

    if (config.env.domain, config.env.task) not in suite.ALL_TASKS:
        raise ConfigError(
            f"env.domain/env.task={config.env.domain}/{config.env.task} is not a dm_control "
            "suite task; e.g. cartpole/balance, cartpole/swingup, pendulum/swingup, walker/walk"
        )
