"""TD3's keys of an experiment config, each declared once: its hyperparameters
(`config.agent`, `TD3Settings`) and its task (`config.env`, `TD3EnvSettings`).

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

import dataclasses

import ml_collections

from magi_lp.agent.suite_tasks import check_suite_task
from magi_lp.config_schema import as_config, check, check_project_sections, in_range


@dataclasses.dataclass(frozen=True)
class TD3Settings:
    """TD3 hyperparameters (`config.agent`), every one named; override with
    `--config.agent.<key>=value`. Checked by `validate_config`, before any process starts."""

    # --- optimisation -------------------------------------------------------------------
    learning_rate: float = 3e-4  # Adam step size, actor and critic alike (reference code)
    batch_size: int = 256  # transitions per update (reference code; the paper used 100)
    discount: float = 0.99  # gamma, per agent step
    # TD targets over n agent steps. The paper's TD3 is 1-step; 3 (as in DrQ-v2; D4PG uses 5)
    # propagates value faster: on cartpole/balance it reached evaluation returns ~990 by 25k
    # agent steps where 1-step was at ~500 after 40k (one seed each, see the project report).
    n_step: int = 3
    tau: float = 0.005  # soft target update: target <- tau * online + (1 - tau) * target

    # --- target policy smoothing and delayed updates ---------------------------------------
    policy_noise: float = 0.2  # stddev of the Gaussian noise added to target actions
    noise_clip: float = 0.5  # that noise is clipped to [-noise_clip, noise_clip]
    policy_delay: int = 2  # critic updates per actor (and target network) update

    # --- exploration ----------------------------------------------------------------------
    exploration_noise: float = 0.1  # stddev of the Gaussian noise added when acting
    # Agent steps of uniformly random actions at the start of each actor (the paper's
    # `start_timesteps`, there 25k for MuJoCo; small tasks learn faster with fewer).
    random_action_steps: int = 1_000

    # --- networks -------------------------------------------------------------------------
    hidden_sizes: tuple[int, ...] = (256, 256)  # ReLU hidden layers of the actor and critics

    # --- replay ---------------------------------------------------------------------------
    min_replay_size: int = 1_000  # transitions in replay before the first update
    actor_steps_per_update: float = 1.0  # agent steps per update (1 = the paper's ratio)
    replay_size: int = 1_000_000  # transitions kept (FIFO): the paper keeps all of training
    # Parallel Reverb readers of the learner's dataset: enough to keep up with a
    # 256-transition batch on a CPU without spawning a thread per core of a large machine.
    dataset_num_parallel_calls: int = 2

    def __post_init__(self) -> None:
        in_range(self, "learning_rate", above=0)
        in_range(self, "batch_size", minimum=1)
        in_range(self, "discount", above=0, maximum=1)
        in_range(self, "n_step", minimum=1)
        in_range(self, "tau", above=0, maximum=1)
        for key in ("policy_noise", "noise_clip", "exploration_noise", "random_action_steps"):
            in_range(self, key, minimum=0)
        in_range(self, "policy_delay", minimum=1)
        in_range(self, "hidden_sizes", minimum=1)
        in_range(self, "min_replay_size", minimum=1)
        in_range(self, "actor_steps_per_update", above=0)
        for bound in ("batch_size", "min_replay_size"):
            limit = getattr(self, bound)
            check(self, "replay_size", self.replay_size >= limit, f">= agent.{bound} ({limit})")
        in_range(self, "dataset_num_parallel_calls", minimum=1)


@dataclasses.dataclass(frozen=True)
class TD3EnvSettings:
    """The task (`config.env`); checked by `validate_config`, so the environment trusts it."""

    domain: str = "cartpole"  # dm_control suite domain
    task: str = "balance"  # task of that domain
    action_repeat: int = 1  # physics control steps per agent step
    max_episode_steps: int = 0  # cut episodes after this many agent steps; 0: the task's limit

    def __post_init__(self) -> None:
        in_range(self, "action_repeat", minimum=1)
        in_range(self, "max_episode_steps", minimum=0)


def get_agent_config() -> ml_collections.ConfigDict:
    """TD3 hyperparameters (`TD3Settings`' defaults) as `config.agent`."""
    return as_config(TD3Settings())


def get_env_config() -> ml_collections.ConfigDict:
    """The task's keys (`TD3EnvSettings`' defaults) as `config.env`."""
    return as_config(TD3EnvSettings())


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks `config.agent` and `config.env` before any process starts (main.py and
    lp_main.py pass it to the toolkit's entry point, which runs it once, before anything
    heavy is imported): the one check of TD3's keys; the builder, learner and environment
    trust what passed it."""
    sections = {"agent": TD3Settings, "env": TD3EnvSettings}
    check_project_sections(config, sections, defaults_module=__name__)
    check_suite_task(config.env.domain, config.env.task)
