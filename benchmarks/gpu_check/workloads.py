"""What each worker process of the GPU check runs: the learner update, the actor policy,
EGL rendering; each reports through a JSON status file and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import time
from typing import Any, NamedTuple

from magi_lp.launch.files import write_text_atomically

# The inline MuJoCo scene the render worker draws (dm_control's suites are not needed).
SCENE = """
<mujoco>
  <worldbody>
    <light pos="0 0 3" dir="0 0 -1"/>
    <geom type="plane" size="2 2 0.1" rgba=".8 .8 .8 1"/>
    <body name="arm" pos="0 0 0.5">
      <freejoint/>
      <geom type="capsule" size=".05 .2" rgba="1 0 0 1"/>
      <geom type="box" pos="0 0 .3" size=".1 .1 .1" rgba="0 0 1 1"/>
    </body>
    <camera name="cam" pos="0 -1.5 1" xyaxes="1 0 0 0 0.55 0.83"/>
  </worldbody>
</mujoco>
"""


class _ActionSpec(NamedTuple):
    """What `make_networks` reads of an action spec (dm_env is not needed for it)."""

    shape: tuple[int, ...]
    dtype: Any
    minimum: float
    maximum: float


_STOP = False


def _on_sigterm(signum: int, frame: Any) -> None:
    del signum, frame
    global _STOP
    _STOP = True


def _write_status(path: str, **fields: Any) -> None:
    write_text_atomically(path, json.dumps(fields))  # the parent never reads half a file


def _jax_facts() -> dict[str, Any]:
    import jax

    device = jax.devices()[0]
    return {
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "jax": jax.__version__,
    }


def _drq_networks(image: int, tiny_net: bool):
    import jax
    import numpy as np

    from projects.drq_v2.config import get_agent_config
    from projects.drq_v2.networks import make_networks

    config = get_agent_config("reacher", "hard")
    if tiny_net:  # smoke tests only: compiles in seconds on a CPU; never the figure
        config.encoder_channels, config.encoder_num_layers = 4, 1
        config.feature_dim, config.hidden_dim = 8, 16
    networks = make_networks(_ActionSpec((2,), np.float32, -1.0, 1.0), config)  # reacher: 2 joints
    obs = np.zeros((image, image, 9), np.uint8)  # RGB x frame stack 3
    return jax, np, config, networks, obs


def run_learner(
    status: str, batch_size: int, image: int, seconds: float, tiny_net: bool = False
) -> dict:
    """The jitted DrQ-v2 update fed as the learner node feeds it, then two variants apart.

    The batch is what the frame replay yields: a `FrameTransition` whose `frames` hold each
    item's frame_stack + n_step unique 84x84x3 frames, stacked inside the update. Three
    timings, each over a third of `seconds` (the first runs until told to stop when the
    others would not fit):
      - `updates_per_second`: fresh numpy batches through `DevicePrefetcher` (a background
        thread copies the next batches to the device while the update runs), as
        `JaxLearner` does: the rate a learner reaches when sampling keeps up;
      - `device_batch_per_second`: one batch already on the device: the update alone;
      - `host_batch_per_second`: a numpy batch handed to each call, copy and update one
        after the other (the learner without prefetch).
    """
    import itertools

    jax, np, config, networks, obs = _drq_networks(image, tiny_net)
    from magi_lp.agent.prefetch import DevicePrefetcher
    from magi_lp.replay.frame_window import FrameTransition
    from projects.drq_v2.config import replay_schedule
    from projects.drq_v2.learning import init_training_state, make_update_fn

    config.batch_size = batch_size
    state = init_training_state(networks, config, jax.random.PRNGKey(0), obs)
    update = make_update_fn(networks, config, replay_schedule(config, action_repeat=2))
    rng = np.random.default_rng(0)
    frame_stack = obs.shape[-1] // 3  # RGB frames in the observation
    window = frame_stack + int(config.n_step)

    def host_batch() -> FrameTransition:
        return FrameTransition(
            frames=rng.integers(0, 256, (batch_size, window, image, image, 3), dtype=np.uint8),
            action=rng.uniform(-1, 1, (batch_size, 2)).astype(np.float32),
            reward=rng.uniform(0, 1, (batch_size,)).astype(np.float32),
            discount=np.full((batch_size,), 0.99**3, np.float32),
        )

    pool = [host_batch() for _ in range(4)]  # distinct numpy batches, as replay hands them
    start = time.perf_counter()
    state, metrics = update(state, pool[0])
    jax.block_until_ready((state, metrics))
    first_call = time.perf_counter() - start
    facts = _jax_facts()
    _write_status(status, state="ready", first_call_s=first_call, **facts)

    def timed(batches: Any, window_s: float) -> tuple[list[float], float]:
        nonlocal state, metrics
        durations: list[float] = []
        began = time.perf_counter()
        # At least two timed updates, even when told to stop early: a median needs them.
        while len(durations) < 2 or (not _STOP and time.perf_counter() - began < window_s):
            t = time.perf_counter()
            state, metrics = update(state, next(batches))
            jax.block_until_ready(state)
            durations.append(time.perf_counter() - t)
        return durations, time.perf_counter() - began

    prefetcher = DevicePrefetcher(itertools.cycle(pool), size=2)
    durations, elapsed = timed(prefetcher, seconds / 3)
    prefetcher.close()
    loss = float(metrics["critic_loss"])
    if not math.isfinite(loss):
        raise RuntimeError(f"the update produced a non-finite critic loss ({loss})")
    median = sorted(durations)[len(durations) // 2]
    result = {
        **facts,
        "batch_size": batch_size,
        "observation": f"{image}x{image}x{3 * frame_stack} uint8",
        "batch": f"FrameTransition: {window} frames of {image}x{image}x3 uint8 per item",
        "updates_timed": len(durations),
        "updates_per_second": len(durations) / elapsed,
        "median_update_ms": median * 1e3,
        "first_call_s": first_call,
        "compile_s": max(first_call - median, 0.0),
        "batch_wait_s": prefetcher.wait_seconds,
    }
    on_device = jax.device_put(pool[0])
    variants = {
        "device_batch": itertools.repeat(on_device),
        "host_batch": itertools.cycle(pool),
    }
    for name, batches in variants.items():
        if _STOP:
            break
        durations, elapsed = timed(batches, seconds / 3)
        result[f"{name}_per_second"] = len(durations) / elapsed
    return result


def run_actor(
    status: str, image: int, seconds: float, tiny_net: bool = False, envs: int = 1
) -> dict:
    """The jitted DrQ-v2 behaviour policy, one observation per step (as an actor acts), or
    with `envs` > 1 one call for that many observations, vmapped as `BatchedActor` does (the
    toolkit's class needs Acme, which a bare GPU machine lacks)."""
    jax, np, config, networks, obs = _drq_networks(image, tiny_net)
    from projects.drq_v2.acting import make_actor_core

    params = networks.init(jax.random.PRNGKey(0), obs)
    policy_params = {"encoder": params["encoder"], "actor": params["actor"]}
    core = make_actor_core(networks, config)
    if envs > 1:
        select = jax.jit(jax.vmap(core.select_action, in_axes=(None, 0, 0)))
        actor_state = jax.vmap(core.init)(jax.random.split(jax.random.PRNGKey(1), envs))
        obs = np.zeros((envs, *obs.shape), obs.dtype)
    else:
        select = jax.jit(core.select_action)
        actor_state = core.init(jax.random.PRNGKey(1))
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    action, actor_state = select(policy_params, obs, actor_state)
    jax.block_until_ready(action)
    first_call = time.perf_counter() - start
    facts = _jax_facts()
    _write_status(status, state="ready", first_call_s=first_call, **facts)
    steps = 0
    start = time.perf_counter()
    while steps < 2 or (not _STOP and time.perf_counter() - start < seconds):
        observation = rng.integers(0, 256, obs.shape, dtype=np.uint8)
        action, actor_state = select(policy_params, observation, actor_state)
        jax.block_until_ready(action)
        steps += 1
    elapsed = time.perf_counter() - start
    return {
        **facts,
        "envs": envs,
        "steps_per_second": steps / elapsed,
        "actions_per_second": steps * envs / elapsed,
        "first_call_s": first_call,
    }


def run_render(status: str, size: int, seconds: float) -> dict:
    """MuJoCo's own renderer (MUJOCO_GL from the env: egl) on a small scene."""
    import mujoco
    import numpy as np

    model = mujoco.MjModel.from_xml_string(SCENE)
    data = mujoco.MjData(model)
    renderer = mujoco.Renderer(model, height=size, width=size)
    gl = {}
    with contextlib.suppress(Exception):  # PyOpenGL is optional: it only names the renderer
        from OpenGL import GL

        gl = {
            "gl_vendor": GL.glGetString(GL.GL_VENDOR).decode(),
            "gl_renderer": GL.glGetString(GL.GL_RENDERER).decode(),
        }
    for _ in range(20):  # warm-up
        mujoco.mj_step(model, data)
        renderer.update_scene(data, camera="cam")
        first = renderer.render()
    _write_status(status, state="ready", mujoco=mujoco.__version__, **gl)
    frames = 0
    start = time.perf_counter()
    while frames < 10 or (not _STOP and time.perf_counter() - start < seconds):
        mujoco.mj_step(model, data)
        renderer.update_scene(data, camera="cam")
        pixels = renderer.render()
        frames += 1
    elapsed = time.perf_counter() - start
    renderer.close()
    return {
        "mujoco": mujoco.__version__,
        "mujoco_gl": os.environ.get("MUJOCO_GL", ""),
        **gl,
        "frame": f"{size}x{size}x3",
        "frames": frames,
        "frames_per_second": frames / elapsed,
        "pixels_changed": bool(np.any(pixels != first)),
    }


def worker_main(args: argparse.Namespace) -> int:
    """A worker process: runs one workload, reports through `--status`."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if args.worker == "learner":
            result = run_learner(args.status, args.batch, args.image, args.seconds, args.tiny_net)
        elif args.worker == "actor":
            result = run_actor(args.status, args.image, args.seconds, args.tiny_net, args.envs)
        else:
            result = run_render(args.status, args.image, args.seconds)
    except Exception as error:  # reported to the parent, which records it as a result
        text = " ".join(str(error).split())[-600:]
        _write_status(args.status, state="failed", error=f"{type(error).__name__}: {text}")
        return 1
    _write_status(args.status, state="done", **result)
    return 0
