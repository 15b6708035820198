"""The Acme seam (magi_lp.acme_api) on the stack it runs on: Acme's own types, and
`SinglePrecisionWrapper` converting float64 observations under NumPy 1 and 2 alike."""

from __future__ import annotations

import importlib.util

import dm_env
import numpy as np
import pytest

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


def test_close_reverb_adder_flushes_and_closes_the_writer_acme_keeps_open():
    """Acme's `reset()` keeps a writer younger than 60 s open; a Reverb server waits 5 s
    for a connected writer before it stops (every single-process run ended that late)."""
    pytest.importorskip("reverb", reason="Reverb: the Launchpad stack only")
    import reverb
    from acme.adders import reverb as adders_reverb

    environment = acme_api.wrappers.SinglePrecisionWrapper(_Float64Environment())
    spec = acme_api.specs.make_environment_spec(environment)
    table = reverb.Table(
        adders_reverb.DEFAULT_PRIORITY_TABLE,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=100,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=adders_reverb.NStepTransitionAdder.signature(spec),
    )
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        adder = adders_reverb.NStepTransitionAdder(client, n_step=1, discount=1.0)
        adder.add_first(environment.reset())
        for _ in range(3):
            adder.add(np.zeros(1, np.float32), environment.step(np.zeros(1)))
        assert acme_api.close_reverb_adder(adder)
        # Flushed: the episode's transitions are in the table, and no writer is left open.
        size = client.server_info()[adders_reverb.DEFAULT_PRIORITY_TABLE].current_size
        assert size == 3
        assert getattr(adder, acme_api._REVERB_ADDER_WRITER) is None
        # Still usable: the next episode opens a new writer.
        adder.add_first(environment.reset())
        adder.add(np.zeros(1, np.float32), environment.step(np.zeros(1)))
        assert acme_api.close_reverb_adder(adder)
        assert client.server_info()[adders_reverb.DEFAULT_PRIORITY_TABLE].current_size == 4
    finally:
        server.stop()
    assert not acme_api.close_reverb_adder(object())  # not an Acme Reverb adder
