"""The data-parallel learner and device-check mode.

Several devices need a process started with XLA's host device count (JAX reads it once), so
the multi-device cases run tests/multi_device_probe.py in a fresh process with two forced CPU
devices, as the plan starts a learner with `resources.learner.cpu_devices=2`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from magi_lp.agent.actor import GenericActor
from magi_lp.agent.actor_core import ActorCore
from magi_lp.agent.data_parallel import local_data_parallel
from magi_lp.agent.device_check import DeviceCheck, DeviceMismatchError
from tests.e2e_utils import run_on_host_devices

REPO = Path(__file__).resolve().parents[1]


@functools.cache  # one process per probe, whatever reads it
def _probe(name: str, devices: int = 2) -> dict:
    run_probe = 'import runpy; runpy.run_path("tests/multi_device_probe.py", run_name="__main__")'
    return run_on_host_devices(run_probe, name, devices=devices)


@pytest.mark.integration
@pytest.mark.parametrize("agent", ["drq", "td3"])
def test_two_device_update_equals_one_device_update(agent):
    found = _probe(agent)
    assert found["devices"] == 2
    # The batch is split, one half per device...
    assert len(found["batch_shard_rows"]) == 2 and len(set(found["batch_shard_rows"])) == 1
    # ...and after 3 updates state and metrics equal the one-device run's to float32
    # tolerance, with the parameters and optimizer state identical on both devices.
    for part in ("state", "metrics"):
        assert found[part]["allclose"], found[part]
        assert found[part]["replicas_identical"], found[part]
        assert found[part]["devices_per_leaf"] == [2], found[part]
    # Gradients are averaged across devices (all-reduce); nothing gathers a whole batch back.
    assert found["collectives"]["all-reduce"] > 0
    assert found["collectives"]["all-gather"] == 0, found["collectives"]


@pytest.mark.integration
def test_the_learner_goes_data_parallel_by_itself_and_restores_replicated():
    learner = _probe("td3")["learner"]
    assert learner["data_parallel_devices"] == 2
    assert learner["devices_per_leaf"] == [2]  # also after restore()
    assert learner["steps"] == 3


def test_one_device_runs_the_update_as_given():
    assert len(jax.local_devices()) == 1
    assert local_data_parallel() is None


@pytest.mark.integration  # a Python process of its own that imports a framework
def test_device_check_catches_misplaced_arrays_on_two_devices():
    found = _probe("device_check")
    assert found["actor"] == (
        "device check: actor 0: select_action input params['w'] is on cpu:1, but actor 0 is "
        "declared on cpu:0 (JAX_PLATFORMS=cpu)"
    )
    assert found["learner_ok_steps"] == "1"
    assert found["learner"].startswith(
        "device check: learner: update input batch.observation is on cpu:0, but learner is "
        "declared on {cpu:0, cpu:1}"
    )


class _Pulled:
    """A variable client whose pulls hand back `params` as they are."""

    def __init__(self, params):
        self.params = params

    def update(self, wait=False):
        del wait


def _core():
    return ActorCore(
        init=lambda key: key,
        select_action=lambda params, observation, key: (params["w"] * observation, key),
    )


def test_device_check_passes_device_params_and_host_observations():
    check = DeviceCheck.for_node("actor 0", all_devices=False)
    actor = GenericActor(
        _core(), jax.random.PRNGKey(0), _Pulled({"w": jnp.ones(3)}), device_check=check
    )
    action = actor.select_action(np.ones(3, np.float32))
    np.testing.assert_array_equal(action, np.ones(3))


def test_device_check_catches_host_params_copied_at_every_call():
    check = DeviceCheck.for_node("actor 2", all_devices=False)
    actor = GenericActor(
        _core(), jax.random.PRNGKey(0), _Pulled({"w": np.ones(3)}), device_check=check
    )
    with pytest.raises(DeviceMismatchError) as error:
        actor.select_action(np.ones(3, np.float32))
    assert str(error.value) == (
        "device check: actor 2: select_action input params['w'] is on the host (numpy), but "
        f"actor 2 is declared on cpu:0 ({check.declared})"
    )
