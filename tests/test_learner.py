"""`JaxLearner.step()` dispatches the update and returns: in one process the environment
steps while the device updates; at most `MAX_UPDATES_IN_FLIGHT` updates are queued; metrics
are read only by the log rows that are kept, and are the update's own."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from magi_lp.agent.learner import MAX_UPDATES_IN_FLIGHT, JaxLearner
from tests.agent_harness import Rows

SIZE = 700


class MatmulLearner(JaxLearner):
    def variables(self, state):
        return {"x": state}


def _update(state, batch):
    x = state
    for _ in range(12):  # long enough that dispatch and execution can be told apart
        x = jnp.tanh(x @ x * 1e-3 + batch["b"])
    return x, {"mean": x.mean()}


def _async_cpu_dispatch() -> bool:
    version = tuple(int(part) for part in jax.__version__.split(".")[:3])
    return jax.default_backend() != "cpu" or version >= (0, 4, 32)


@pytest.mark.skipif(
    not _async_cpu_dispatch(),
    reason="jax < 0.4.32 runs CPU programs synchronously: nothing to overlap on this stack",
)
def test_step_returns_before_the_update_finishes_and_bounds_the_queue():
    batches = iter([{"b": np.float32(i)} for i in range(12)])
    logger = Rows()
    learner = MatmulLearner(
        jax.jit(_update), jnp.ones((SIZE, SIZE), jnp.float32), batches, logger=logger, prefetch=0
    )
    learner.step()  # compiles
    jax.block_until_ready(learner.state)
    start = time.perf_counter()
    jax.block_until_ready(jax.jit(_update)(learner.state, {"b": np.float32(0)}))
    update_s = time.perf_counter() - start

    returns = []
    for _ in range(MAX_UPDATES_IN_FLIGHT):
        start = time.perf_counter()
        learner.step()
        returns.append(time.perf_counter() - start)
    # Dispatched, not finished: the caller had the time back.
    assert max(returns) < 0.5 * update_s, (returns, update_s)
    start = time.perf_counter()
    for _ in range(4):
        learner.step()
    # Bounded: four more steps wait for about four updates, not zero.
    assert time.perf_counter() - start > 2 * update_s
    # The metrics logged are the update's own.
    expected_state = jnp.ones((SIZE, SIZE), jnp.float32)
    for i in range(len(logger.rows)):
        expected_state, metrics = _update(expected_state, {"b": np.float32(i)})
        np.testing.assert_allclose(
            float(np.asarray(logger.rows[i]["mean"])), float(metrics["mean"]), rtol=1e-5
        )


def test_logged_metrics_are_the_updates_own_on_any_stack():
    batches = iter([{"b": np.float32(i)} for i in range(3)])
    logger = Rows()
    learner = MatmulLearner(
        jax.jit(_update), jnp.ones((8, 8), jnp.float32), batches, logger=logger, prefetch=0
    )
    for _ in range(3):
        learner.step()
    state = jnp.ones((8, 8), jnp.float32)
    for i, row in enumerate(logger.rows):
        state, metrics = _update(state, {"b": np.float32(i)})
        assert float(np.asarray(row["mean"])) == pytest.approx(float(metrics["mean"]), rel=1e-5)
        assert row["steps"] == i + 1
