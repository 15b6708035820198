"""The Acme seam (magi_lp.acme_api) on the stack it runs on: Acme's own types, and
`SinglePrecisionWrapper` converting float64 observations under NumPy 1 and 2 alike."""

from __future__ import annotations

import importlib.util

import dm_env
import numpy as np

from magi_lp import acme_api


def test_acme_types_are_acmes_own_and_bare_only_without_launchpad():
    import acme.core
    import acme.specs

    assert acme_api.core.Actor is acme.core.Actor
    assert acme_api.specs.make_environment_spec is acme.specs.make_environment_spec
    assert (importlib.util.find_spec("launchpad") is None) == acme_api.BARE


class _Float64Environment(dm_env.Environment):
    def reset(self):
        return dm_env.restart(np.arange(3, dtype=np.float64))

    def step(self, action):
        return dm_env.transition(np.float64(1.5), np.ones(3, np.float64), np.float64(1.0))

    def observation_spec(self):
        return dm_env.specs.Array((3,), np.float64)

    def action_spec(self):
        return dm_env.specs.Array((1,), np.float64)


def test_single_precision_wrapper_converts_float64_on_this_numpy():
    environment = acme_api.wrappers.SinglePrecisionWrapper(_Float64Environment())
    first = environment.reset()
    assert first.observation.dtype == np.float32
    np.testing.assert_array_equal(first.observation, [0.0, 1.0, 2.0])
    step = environment.step(np.zeros(1))
    assert step.observation.dtype == np.float32 and step.reward.dtype == np.float32
    assert environment.observation_spec().dtype == np.float32
