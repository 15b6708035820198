"""A builder that breaks the protocol is told which method and what it must return
(`magi_lp.agent.contract`, `cli.checks._make`), not a traceback from deep in the toolkit."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from magi_lp import cli
from magi_lp.agent import contract
from magi_lp.agent.actor_core import ActorCore
from magi_lp.errors import ConfigError


class NewBuilder:
    """Only its name is read by the checks."""


class ServesOtherNames:
    """A learner with the JaxLearner surface whose variables lack the policy's."""

    state = {"actor": 1, "critic": 2}

    def step(self):
        pass

    def get_variables(self, names):
        return [self.state[name] for name in names]

    def save(self):
        return self.state

    def restore(self, state):
        pass

    def variables(self, state):
        return state


def test_a_learner_that_is_none_or_serves_no_policy_is_named():
    with pytest.raises(TypeError) as none:
        contract.check_learner(NewBuilder(), None)
    assert str(none.value).startswith(
        "NewBuilder.make_learner returned None, which has no step, get_variables, save, "
        "restore(): return a learner (magi_lp.agent.learner.JaxLearner"
    )
    with pytest.raises(TypeError) as other:
        contract.check_learner(NewBuilder(), ServesOtherNames())
    assert str(other.value).startswith(
        "NewBuilder.make_learner's learner serves the variables ['actor', 'critic'], not "
        "'policy': every actor pulls 'policy'"
    )
    served = ServesOtherNames()
    served.state = {"policy": 1}
    contract.check_learner(NewBuilder(), served)


def test_a_policy_that_is_no_actor_core_and_a_result_that_is_no_pair_are_named():
    with pytest.raises(TypeError, match=r"NewBuilder.make_policy returned None: return a "):
        contract.check_policy(NewBuilder(), None)
    contract.check_policy(NewBuilder(), ActorCore(init=lambda key: (), select_action=None))
    with pytest.raises(TypeError) as single:
        contract.check_pair(3.0, "the policy's select_action", "action", "new state")
    assert str(single.value) == (
        "the policy's select_action returned a float: it must return the pair (action, new state)"
    )
    with pytest.raises(TypeError, match="returned a tuple of 3: it must return the pair"):
        contract.check_pair((1, 2, 3), "JaxLearner's update", "new state", "metrics")
    contract.check_pair((1, 2), "JaxLearner's update", "new state", "metrics")


def test_make_experiment_must_return_an_experiment_of_the_whole_config(tmp_path: Path):
    from configs import td3_cartpole
    from projects.td3.experiment import make_experiment

    config = td3_cartpole.get_config()
    assert cli.checks._make(make_experiment, config, tmp_path).config is config
    # A partial (or any callable) has no __name__: it ran before the checks, and still does.
    assert cli.checks._make(functools.partial(make_experiment), config, tmp_path).config is config

    def refusal(make) -> str:
        """What the checks say of a `make_experiment` that breaks the contract."""
        with pytest.raises(ConfigError) as refused:
            cli.checks._make(make, config, tmp_path)
        return str(refused.value)

    def returns_nothing(config):
        make_experiment(config)

    assert "returns_nothing returned NoneType: the toolkit runs a magi_lp.runtime." in refusal(
        returns_nothing
    )

    def drops_evaluation(config):
        experiment = make_experiment(config)
        experiment.environment_factory = lambda domain, task, seed: None
        return experiment

    assert refusal(drops_evaluation).endswith(
        "drops_evaluation: Experiment.environment_factory cannot be called as "
        "environment_factory(seed, evaluation) (missing a required argument: 'seed'): the "
        "toolkit calls it so in every node; take exactly those arguments (functools.partial "
        "binds the others, as projects/td3/experiment.py does)"
    )

    def gives_a_section(config):
        experiment = make_experiment(config)
        experiment.config = config.agent
        return experiment

    assert refusal(gives_a_section).endswith(
        "gives_a_section: Experiment.config has no checkpoint, replay, evaluation, logging, "
        "debug, resources, env, agent: it is the run's whole config, the toolkit's sections "
        "and the project's; pass the config make_experiment was given (config=config), not a "
        "section"
    )
