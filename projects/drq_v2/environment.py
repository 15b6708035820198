"""DeepMind Control Suite tasks from pixels, as DrQ-v2 sees them.

`make_environment` returns a `dm_env.Environment` whose
- observation is uint8 [image_size, image_size, 3*frame_stack], the last `frame_stack`
  rendered RGB frames along channels, OLDEST FIRST (the newest frame is channels [-3:]);
  at reset every slot holds the first frame (the official `FrameStackWrapper`, in HWC).
  This layout is a contract with the replay;
- action is float32 [A] in [-1, 1]; one agent step repeats it for `action_repeat` physics
  control steps and sums the rewards (the official `ActionRepeatWrapper`);
- reward and discount are float32 (None at the first step, as dm_env has it).

Rendering needs a GL backend chosen before dm_control is imported (MUJOCO_GL=egl without
a display); magi_lp sets it per node from the resource spec.
"""

from __future__ import annotations

import collections
from typing import Any

import dm_env
import numpy as np
from dm_env import specs

from projects.drq_v2.config import default_camera_id


class _Wrapper(dm_env.Environment):
    """Forwards everything it does not override to the wrapped environment."""

    def __init__(self, env: dm_env.Environment):
        self._env = env

    def reset(self) -> dm_env.TimeStep:
        return self._env.reset()

    def step(self, action) -> dm_env.TimeStep:
        return self._env.step(action)

    def observation_spec(self):
        return self._env.observation_spec()

    def action_spec(self):
        return self._env.action_spec()

    def reward_spec(self):
        return self._env.reward_spec()

    def discount_spec(self):
        return self._env.discount_spec()

    def close(self) -> None:
        self._env.close()

    def __getattr__(self, name: str) -> Any:
        if name == "_env":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._env, name)


class ActionRepeat(_Wrapper):
    """Repeats each action `num_repeats` times; rewards add up (discount-weighted, as the
    official wrapper; the suite's discount is 1 until the end) and discounts multiply."""

    def __init__(self, env: dm_env.Environment, num_repeats: int):
        super().__init__(env)
        self._num_repeats = num_repeats

    def step(self, action) -> dm_env.TimeStep:
        reward = 0.0
        discount = 1.0
        for _ in range(self._num_repeats):
            time_step = self._env.step(action)
            reward += (time_step.reward or 0.0) * discount
            discount *= time_step.discount
            if time_step.last():
                break
        return time_step._replace(reward=reward, discount=discount)


class PixelFrameStack(_Wrapper):
    """Turns {'pixels': [H, W, 3]} observations into a uint8 [H, W, 3*num_frames] stack,
    oldest first, and makes action/reward/discount float32."""

    def __init__(self, env: dm_env.Environment, num_frames: int, pixels_key: str = "pixels"):
        super().__init__(env)
        self._num_frames = num_frames
        self._pixels_key = pixels_key
        self._frames: collections.deque = collections.deque(maxlen=num_frames)
        height, width, channels = env.observation_spec()[pixels_key].shape
        self._observation_spec = specs.BoundedArray(
            (height, width, channels * num_frames), np.uint8, 0, 255, name="pixels"
        )
        inner = env.action_spec()
        self._inner_action_dtype = inner.dtype
        self._action_spec = specs.BoundedArray(
            inner.shape,
            np.float32,
            np.asarray(inner.minimum, np.float32),
            np.asarray(inner.maximum, np.float32),
            name="action",
        )

    def _observation(self) -> np.ndarray:
        return np.concatenate(list(self._frames), axis=-1)

    def _finish(self, time_step: dm_env.TimeStep) -> dm_env.TimeStep:
        reward = None if time_step.reward is None else np.float32(time_step.reward)
        discount = None if time_step.discount is None else np.float32(time_step.discount)
        return time_step._replace(observation=self._observation(), reward=reward, discount=discount)

    def reset(self) -> dm_env.TimeStep:
        time_step = self._env.reset()
        pixels = np.asarray(time_step.observation[self._pixels_key], np.uint8)
        for _ in range(self._num_frames):
            self._frames.append(pixels)
        return self._finish(time_step)

    def step(self, action) -> dm_env.TimeStep:
        action = np.asarray(action, self._inner_action_dtype)
        time_step = self._env.step(action)
        self._frames.append(np.asarray(time_step.observation[self._pixels_key], np.uint8))
        return self._finish(time_step)

    def observation_spec(self) -> specs.BoundedArray:
        return self._observation_spec

    def action_spec(self) -> specs.BoundedArray:
        return self._action_spec

    def reward_spec(self) -> specs.Array:
        return specs.Array((), np.float32, name="reward")

    def discount_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray((), np.float32, 0.0, 1.0, name="discount")


def make_environment(
    domain: str,
    task: str,
    *,
    seed: int,
    image_size: int = 84,
    action_repeat: int = 2,
    frame_stack: int = 3,
    camera_id: int | None = None,
    render_shadows: bool = True,
) -> dm_env.Environment:
    """A pixels-only dm_control suite task with DrQ-v2's action repeat and frame stacking.

    Args:
        domain, task: a suite task, e.g. ('reacher', 'hard').
        seed: seeds the task's randomness; the same seed gives the same episodes.
        image_size: rendered frames are image_size x image_size.
        action_repeat: physics control steps per agent step.
        frame_stack: frames per observation.
        camera_id: render camera; None = the paper's (2 for quadruped, 0 otherwise).
        render_shadows: False renders without MuJoCo's shadow pass. The paper's frames
            have shadows. Without a GPU the pass is most of a frame's cost: Mesa's llvmpipe
            draws each frame's shadow map (cartpole's is 2048x2048) in software: a
            cartpole frame at 32x32 or 84x84 took about 22 ms with shadows and 4.6 ms
            without on this project's 2-core CPU machine (2026-11-28, beside other work).

    The names and sizes are checked once, by `projects.drq_v2.config.validate_config`
    (`config.env`), before any process starts.
    """
    from dm_control import suite
    from dm_control.suite.wrappers import action_scale, pixels

    if camera_id is None:
        camera_id = default_camera_id(domain)
    env = suite.load(domain, task, task_kwargs={"random": seed}, visualize_reward=False)
    spec = env.action_spec()
    if not (np.all(spec.minimum == -1.0) and np.all(spec.maximum == 1.0)):
        env = action_scale.Wrapper(env, minimum=-1.0, maximum=1.0)
    env = ActionRepeat(env, action_repeat)
    render_kwargs: dict[str, object] = {
        "height": image_size, "width": image_size, "camera_id": camera_id
    }  # fmt: skip
    if not render_shadows:
        render_kwargs["render_flag_overrides"] = {"shadow": False}
    env = pixels.Wrapper(env, pixels_only=True, render_kwargs=render_kwargs)
    return PixelFrameStack(env, frame_stack)
