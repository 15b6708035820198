"""DrQ-v2's pixel dm_control environment: specs, frame stacking, action repeat, seeding."""

import os

# Rendering backend must be chosen before dm_control is imported; EGL works without a GPU.
os.environ.setdefault("MUJOCO_GL", "egl")

import ml_collections
import numpy as np
import pytest

from magi_lp.errors import ConfigError
from projects.drq_v2.config import get_agent_config, get_env_config, validate_config
from projects.drq_v2.environment import make_environment

SIZE = 24  # tiny renders keep this fast


def _env(seed=0, **kwargs):
    kwargs.setdefault("image_size", SIZE)
    return make_environment("reacher", "easy", seed=seed, **kwargs)


def _render(env, size=SIZE, camera_id=0):
    return env.physics.render(height=size, width=size, camera_id=camera_id)


def test_specs_and_dtypes():
    env = _env()
    obs_spec = env.observation_spec()
    assert obs_spec.shape == (SIZE, SIZE, 9) and obs_spec.dtype == np.uint8
    action_spec = env.action_spec()
    assert action_spec.dtype == np.float32 and action_spec.shape == (2,)
    np.testing.assert_array_equal(action_spec.minimum, -1.0)
    np.testing.assert_array_equal(action_spec.maximum, 1.0)
    assert env.reward_spec().dtype == np.float32
    assert env.discount_spec().dtype == np.float32

    time_step = env.reset()
    assert time_step.first()
    assert isinstance(time_step.observation, np.ndarray)
    assert time_step.observation.shape == (SIZE, SIZE, 9)
    assert time_step.observation.dtype == np.uint8
    time_step = env.step(np.zeros(2, np.float32))
    assert time_step.observation.shape == (SIZE, SIZE, 9)
    assert time_step.reward.dtype == np.float32
    assert time_step.discount.dtype == np.float32


def test_frame_stack_is_oldest_first():
    env = _env()
    first = env.reset().observation
    frame0 = first[..., :3]
    np.testing.assert_array_equal(first[..., 3:6], frame0)  # reset: all frames equal
    np.testing.assert_array_equal(first[..., 6:], frame0)
    np.testing.assert_array_equal(frame0, _render(env))

    action = np.ones(2, np.float32)
    second = env.step(action).observation
    np.testing.assert_array_equal(second[..., 6:], _render(env))  # newest last
    np.testing.assert_array_equal(second[..., :6], first[..., 3:])  # the rest slide left
    assert not np.array_equal(second[..., 6:], frame0)  # the arm moved

    third = env.step(action).observation
    np.testing.assert_array_equal(third[..., :3], frame0)
    np.testing.assert_array_equal(third[..., 3:6], second[..., 6:])
    np.testing.assert_array_equal(third[..., 6:], _render(env))


def test_action_repeat_sums_rewards():
    # cartpole swingup has a dense reward, so the sums are not trivially zero.
    kwargs = {"seed": 3, "image_size": SIZE}
    repeated = make_environment("cartpole", "swingup", action_repeat=2, **kwargs)
    single = make_environment("cartpole", "swingup", action_repeat=1, **kwargs)
    repeated.reset()
    single.reset()
    rng = np.random.default_rng(0)
    for _ in range(3):
        action = rng.uniform(-1, 1, 1).astype(np.float32)
        step2 = repeated.step(action)
        total = single.step(action).reward + single.step(action).reward
        assert float(total) > 0.0
        assert float(step2.reward) == pytest.approx(float(total), rel=1e-6)
        np.testing.assert_array_equal(step2.observation[..., 6:], _render(single))
    assert repeated.physics.data.time == pytest.approx(single.physics.data.time)


def test_same_seed_same_first_observation():
    a = _env(seed=5).reset().observation
    b = _env(seed=5).reset().observation
    c = _env(seed=6).reset().observation
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)  # reacher's target position depends on the seed


def test_camera_defaults():
    assert get_env_config("quadruped", "walk").camera_id == 2
    assert get_env_config("reacher", "hard").camera_id == 0


@pytest.mark.parametrize(
    ("domain", "task", "key", "valid"),
    [("reachr", "easy", "env.domain", "reacher"), ("reacher", "medium", "env.task", "hard")],
)
def test_bad_task_is_a_config_error(domain, task, key, valid):
    config = ml_collections.ConfigDict(
        {"agent": get_agent_config(), "env": get_env_config(domain, task)}
    )
    with pytest.raises(ConfigError) as info:
        validate_config(config)  # the one check; make_environment trusts it
    assert key in str(info.value) and valid in str(info.value)


def test_render_shadows_false_draws_the_same_scene_without_shadows():
    from projects.drq_v2.experiment import environment_factory

    settings = {"domain": "cartpole", "task": "balance", "image_size": SIZE}
    shaded = make_environment(seed=1, **settings)
    flat = environment_factory(
        1, False, **settings, action_repeat=2, frame_stack=3, camera_id=0, render_shadows=False
    )  # the factory each node calls with `config.env`
    first = shaded.reset().observation
    np.testing.assert_array_equal(first[..., 6:], _render(shaded))
    unshaded = flat.reset().observation[..., 6:]
    without = shaded.physics.render(
        height=SIZE, width=SIZE, camera_id=0, render_flag_overrides={"shadow": False}
    )
    np.testing.assert_array_equal(unshaded, without)  # the same state, drawn without shadows
    assert not np.array_equal(unshaded, first[..., 6:])  # the cart's shadow is gone
