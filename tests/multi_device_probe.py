"""Runs in a process with several forced host devices; prints one JSON line of findings.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \\
        python tests/multi_device_probe.py drq|td3|device_check

JAX reads the host device count once, when it starts, so tests/test_data_parallel.py runs
this file in a fresh process instead of changing the pytest process's JAX. Each probe runs
the same update on the same batch twice, on one device (the agent's own jitted update) and
data-parallel over every device (`magi_lp.agent.data_parallel`), and reports how far apart
the results are; the test decides what passes.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import jax
import numpy as np
from acme import specs, types

from magi_lp.agent.data_parallel import DataParallel, compiled_collectives

UPDATES = 3
# float32 tolerance: the data-parallel program sums gradients in another order.
RTOL, ATOL = 1e-5, 1e-6


def _compare(one: Any, many: Any) -> dict:
    """Largest absolute and relative leaf differences, and whether replicas are identical."""
    worst_abs, worst_rel, close = 0.0, 0.0, True
    for a, b in zip(jax.tree_util.tree_leaves(one), jax.tree_util.tree_leaves(many), strict=True):
        a = np.asarray(a, np.float64)
        b = np.asarray(b, np.float64)
        diff = np.abs(a - b)
        worst_abs = max(worst_abs, float(diff.max(initial=0.0)))
        worst_rel = max(worst_rel, float((diff / (np.abs(a) + 1e-6)).max(initial=0.0)))
        close = close and bool(np.allclose(b, a, rtol=RTOL, atol=ATOL))
    identical = all(
        all(
            np.array_equal(np.asarray(s.data), np.asarray(leaf.addressable_shards[0].data))
            for s in leaf.addressable_shards
        )
        for leaf in jax.tree_util.tree_leaves(many)
    )
    devices = {
        len(leaf.devices()) for leaf in jax.tree_util.tree_leaves(many) if hasattr(leaf, "devices")
    }
    return {
        "allclose": close,
        "max_abs_diff": worst_abs,
        "max_rel_diff": worst_rel,
        "replicas_identical": identical,
        "devices_per_leaf": sorted(devices),
    }


def _run_both(update: Any, state: Any, batch: Any) -> dict:
    one_state = state
    for _ in range(UPDATES):
        one_state, one_metrics = update(one_state, batch)
    parallel = DataParallel(jax.devices())
    parallel_update = parallel.wrap(update)
    many_state = parallel.put_state(state)
    for _ in range(UPDATES):
        many_state, many_metrics = parallel_update(many_state, batch)
    return {
        "devices": parallel.num_devices,
        "state": _compare(one_state, many_state),
        "metrics": _compare(one_metrics, many_metrics),
        "collectives": compiled_collectives(
            parallel_update.compiled, many_state, parallel.put_batch(batch)
        ),
        "batch_shard_rows": [
            int(s.data.shape[0]) for s in parallel.put_batch(batch).observation.addressable_shards
        ],
    }


def probe_drq() -> dict:
    from projects.drq_v2.config import get_agent_config, replay_schedule
    from projects.drq_v2.learning import init_training_state, make_update_fn
    from projects.drq_v2.networks import make_networks

    config = get_agent_config("reacher", "hard")
    config.batch_size, config.feature_dim, config.hidden_dim = 8, 8, 32
    config.encoder_channels = 8
    networks = make_networks(specs.BoundedArray((2,), np.float32, -1.0, 1.0), config)
    size, channels = 32, 9
    state = init_training_state(
        networks, config, jax.random.PRNGKey(0), np.zeros((size, size, channels), np.uint8)
    )
    update = make_update_fn(networks, config, replay_schedule(config, action_repeat=2))
    rng = np.random.default_rng(0)
    shape = (config.batch_size, size, size, channels)
    batch = types.Transition(
        observation=rng.integers(0, 256, shape, dtype=np.uint8),
        action=rng.uniform(-1, 1, (config.batch_size, 2)).astype(np.float32),
        reward=rng.uniform(0, 1, (config.batch_size,)).astype(np.float32),
        discount=np.full((config.batch_size,), 0.97, np.float32),
        next_observation=rng.integers(0, 256, shape, dtype=np.uint8),
    )
    return _run_both(update, state, batch)


def _td3_parts():
    from projects.td3.config import get_agent_config
    from projects.td3.networks import make_networks

    config = get_agent_config()
    config.hidden_sizes, config.batch_size, config.policy_delay = (32, 32), 16, 2
    spec = specs.EnvironmentSpec(
        observations=specs.Array((5,), np.float32),
        actions=specs.BoundedArray((1,), np.float32, -1.0, 1.0),
        rewards=specs.Array((), np.float32),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
    )
    networks = make_networks(spec, config.hidden_sizes)
    rng = np.random.default_rng(0)
    size = config.batch_size
    batch = types.Transition(
        observation=rng.normal(size=(size, 5)).astype(np.float32),
        action=rng.uniform(-1, 1, (size, 1)).astype(np.float32),
        reward=rng.uniform(0, 1, (size,)).astype(np.float32),
        discount=np.ones((size,), np.float32),
        next_observation=rng.normal(size=(size, 5)).astype(np.float32),
    )
    return config, networks, batch


def probe_td3() -> dict:
    from projects.td3.learning import TD3Learner, init_training_state, make_update_fn

    config, networks, batch = _td3_parts()
    state = init_training_state(networks, config, jax.random.PRNGKey(0))
    result = _run_both(make_update_fn(networks, config), state, batch)

    # The toolkit's learner does the same by itself: it sees 2 devices and splits batches.
    learner = TD3Learner(networks, config, iter([batch] * 4), jax.random.PRNGKey(0))
    learner.check_devices()
    for _ in range(2):
        learner.step()
    saved = jax.device_get(learner.save())
    learner.restore(saved)
    learner.step()
    result["learner"] = {
        "data_parallel_devices": learner.data_parallel.num_devices,
        "devices_per_leaf": sorted(
            {len(x.devices()) for x in jax.tree_util.tree_leaves(learner.state)}
        ),
        "steps": int(learner.state.steps),
    }
    return result


def probe_device_check() -> dict:
    """A deliberately misplaced array is caught by an actor's and a learner's check."""
    import jax.numpy as jnp

    from magi_lp.agent.actor import GenericActor
    from magi_lp.agent.actor_core import ActorCore
    from magi_lp.agent.device_check import DeviceCheck, DeviceMismatchError
    from projects.td3.learning import TD3Learner

    first, second = jax.devices()[:2]

    core = ActorCore(
        init=lambda key: key,
        select_action=lambda params, observation, key: (params["w"] * observation, key),
    )
    check = DeviceCheck.for_node("actor 0", all_devices=False)
    found: dict[str, str] = {}

    class MisplacedAfterPull:
        """The client's pull puts params on the actor's device; this one moves them away."""

        params = {"w": jax.device_put(jnp.ones((3,)), second)}

        def update(self, wait=False):
            del wait

    actor = GenericActor(
        core, jax.device_put(jax.random.PRNGKey(0), first), None, None, device_check=check
    )
    actor._client = MisplacedAfterPull()  # as if a pull had put them on the wrong device
    try:
        actor.select_action(np.ones((3,), np.float32))
        found["actor"] = ""
    except DeviceMismatchError as error:
        found["actor"] = str(error)

    config, networks, batch = _td3_parts()
    learner = TD3Learner(networks, config, iter([batch] * 4), jax.random.PRNGKey(0))
    learner.check_devices()
    learner.step()  # numpy batch, replicated state: passes
    found["learner_ok_steps"] = str(int(learner.state.steps))
    # A prefetcher that put the batch on the first device only:
    on_one = jax.device_put(batch, first)
    learner._iterator = iter([on_one])
    try:
        learner.step()
        found["learner"] = ""
    except DeviceMismatchError as error:
        found["learner"] = str(error)
    return found


if __name__ == "__main__":
    probes = {"drq": probe_drq, "td3": probe_td3, "device_check": probe_device_check}
    print(json.dumps(probes[sys.argv[1]](), default=str))
