"""Figure 1: DrQ-v2 learner updates per second, compile time reported apart.

The jitted update of `projects.drq_v2.learning.make_update_fn` (random-shift augmentation of
observation and next observation, critic + encoder Adam step, actor Adam step, soft target
update) with the paper's networks (4 conv layers of 32 channels, feature 50, hidden 1024),
fed a numpy batch every call as the replay iterator does (so a GPU run pays the host-to-device
copy): the replay's `FrameTransition` (each transition's 6 unique frames, stacked inside the
update). Two sizes: the paper's (batch 256, 84x84x9) and a small one (batch 32, 32x32x9,
same network widths). Runs on JAX's default backend: the CPU here, the GPU on a machine with
one.

Before / after: at the paper size the figure also times the update as commit 457c3a9 ran it
("before"): host-stacked observations in an `acme.types.Transition`, and the bilinear
random shift on float images (`augmentations.shift_images`, what `random_shift` called
then). Same process, same load, alternated, so the ratio compares like with like.

Comparison: the DrQ-v2 paper trains at about 96 frames/s on one V100; at action repeat 2 and
one update every 2 agent steps that is 96 / 2 / 2 = 24 updates/s. Different hardware: the
ratio says how far this machine is from the paper's, not how good the code is.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import figure_main, fmt, process_cpu_seconds, progress, ratio

TITLE = "DrQ-v2 learner updates per second"
PAPER_FRAMES_PER_SECOND = 96.0  # Yarats et al. 2021: ~3.3 h per 1M frames on one V100
PAPER_UPDATES_PER_SECOND = PAPER_FRAMES_PER_SECOND / 2 / 2  # action repeat 2, update every 2


def subprocess_env() -> dict[str, str]:
    # The default backend: the GPU when there is one. MuJoCo is not used.
    return {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _sizes(quick: bool) -> list[dict]:
    """The sizes, in groups timed together: a group's variants alternate update by update."""
    paper = {
        "batch_size": 256,
        "image_size": 84,
        "min_updates": 2 if quick else 5,
        "min_seconds": 3.0 if quick else 20.0,
    }
    small = {
        "batch_size": 32,
        "image_size": 32,
        "min_updates": 10 if quick else 30,
        "min_seconds": 3.0 if quick else 15.0,
    }
    return [
        [{"name": "paper", **paper}, {"name": "paper_before", **paper, "before": True}],
        [{"name": "small", **small}],
    ]


def _before_random_shift(key: Any, images: Any, pad: int = 4) -> Any:
    """The augmentation as commit 457c3a9's update ran it: bilinear taps on float images."""
    import jax
    import jax.numpy as jnp

    from projects.drq_v2.augmentations import shift_images

    shifts = jax.random.randint(key, (images.shape[0], 2), 0, 2 * pad + 1)
    return shift_images(images.astype(jnp.float32), shifts.astype(jnp.float32), pad)


def _batch(batch_size: int, image_size: int, before: bool) -> Any:
    """A replay batch: the frame window (now), or host-stacked observations (before)."""
    import numpy as np
    from acme import types

    from magi_lp.replay.frame_window import FrameTransition, window_observations

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (batch_size, 3 + 3, image_size, image_size, 3), np.uint8)
    common = {
        "action": rng.uniform(-1, 1, (batch_size, 2)).astype(np.float32),
        "reward": rng.uniform(0, 1, (batch_size,)).astype(np.float32),
        "discount": np.full((batch_size,), 0.99**3, np.float32),
    }
    if not before:
        return FrameTransition(frames=frames, **common)
    observation, next_observation = window_observations(frames, 3)  # numpy: on the host
    return types.Transition(
        observation=np.ascontiguousarray(observation),
        next_observation=np.ascontiguousarray(next_observation),
        **common,
    )


class Variant:
    """One size and update variant: compiled by the first call, then timed update by update."""

    def __init__(
        self,
        name: str,
        batch_size: int,
        image_size: int,
        min_updates: int,
        min_seconds: float,
        before: bool = False,
    ):
        import jax
        import numpy as np
        from dm_env import specs

        from projects.drq_v2 import learning
        from projects.drq_v2.config import get_agent_config, replay_schedule
        from projects.drq_v2.networks import encoder_repr_dim, make_networks

        config = get_agent_config("reacher", "hard")
        config.batch_size = batch_size
        action_spec = specs.BoundedArray((2,), np.float32, -1.0, 1.0)  # reacher: 2 joints
        networks = make_networks(action_spec, config)
        channels = 3 * 3  # RGB x frame stack 3
        obs_example = np.zeros((image_size, image_size, channels), np.uint8)
        self.state = learning.init_training_state(
            networks, config, jax.random.PRNGKey(0), obs_example
        )
        schedule = replay_schedule(config, action_repeat=2)
        self.update = learning.make_update_fn(networks, config, schedule)
        self.batch = _batch(batch_size, image_size, before)
        self.name, self.min_updates, self.min_seconds = name, min_updates, min_seconds
        self.durations: list[float] = []
        self.cpu_seconds = 0.0
        current_shift = learning.random_shift
        if before:  # the first call traces the update: with the old augmentation
            learning.random_shift = _before_random_shift
        try:
            self.first_call_s = self._one()[0]
        finally:
            learning.random_shift = current_shift
        self.info = {
            "batch_size": batch_size,
            "observation": f"{image_size}x{image_size}x{channels} uint8",
            "batch": "Transition, stacked on the host" if before else "FrameTransition window",
            "augmentation": "bilinear on floats (457c3a9)" if before else "uint8 crop",
            "repr_dim": encoder_repr_dim((image_size, image_size), config),
            "parameters": int(sum(x.size for x in jax.tree_util.tree_leaves(self.state.params))),
            "min_updates": min_updates,
            "min_seconds": min_seconds,
        }

    def _one(self) -> tuple[float, float]:
        import jax

        start, start_cpu = time.perf_counter(), process_cpu_seconds()
        self.state, self.metrics = self.update(self.state, self.batch)
        jax.block_until_ready(self.state)
        return time.perf_counter() - start, process_cpu_seconds() - start_cpu

    def step(self) -> None:
        """One timed update."""
        wall, cpu = self._one()
        self.durations.append(wall)
        self.cpu_seconds += cpu

    @property
    def done(self) -> bool:
        return len(self.durations) >= self.min_updates and sum(self.durations) >= self.min_seconds

    def result(self) -> dict:
        import numpy as np

        if not np.isfinite(float(self.metrics["critic_loss"])):
            raise RuntimeError(f"{self.name}: the update produced a non-finite critic loss")
        per_update = float(np.median(self.durations))
        return {
            **self.info,
            "updates_timed": len(self.durations),
            "updates_per_second": len(self.durations) / sum(self.durations),
            "median_update_ms": per_update * 1e3,
            # Core-seconds per update: what a loaded machine inflates least.
            "cpu_seconds_per_update": self.cpu_seconds / len(self.durations),
            "first_call_s": self.first_call_s,
            "compile_s": max(self.first_call_s - per_update, 0.0),
        }


def measure(quick: bool) -> dict:
    import jax

    device = jax.devices()[0]
    results: dict[str, Any] = {
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "devices": len(jax.devices()),
        "sizes": {},
    }
    for group in _sizes(quick):
        variants = []
        for size in group:
            progress(f"learner update, {size['name']}: compiling")
            variants.append(Variant(**size))
        while not all(variant.done for variant in variants):  # alternate: same load for each
            for variant in variants:
                if not variant.done:
                    variant.step()
        for variant in variants:
            results["sizes"][variant.name] = variant.result()
            rate = results["sizes"][variant.name]["updates_per_second"]
            progress(f"  {variant.name}: {rate:.2f} updates/s")
    return results


def _cores_busy(size: dict) -> str:
    cpu, wall = size.get("cpu_seconds_per_update"), size.get("median_update_ms")
    if not cpu or not wall:
        return ""
    return (
        f"XLA may use every core; CPU-s / wall time per update = {cpu / (wall / 1e3):.1f} "
        "cores kept busy at the paper size."
    )


def _where(result: dict) -> str:
    backend, device = result["backend"].upper(), result["device"]
    return backend if device.upper() == backend else f"{backend} ({device})"


def _before_after(result: dict) -> tuple[float | None, float | None]:
    """(updates/s after / before, CPU-s per update after / before) at the paper size."""
    after, before = result["sizes"]["paper"], result["sizes"].get("paper_before")
    if not before:
        return None, None
    return (
        ratio(after["updates_per_second"], before["updates_per_second"]),
        ratio(after["cpu_seconds_per_update"], before["cpu_seconds_per_update"]),
    )


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    paper = result["sizes"]["paper"]
    rate = paper["updates_per_second"]
    before = result["sizes"].get("paper_before", {})
    speed, cpu = _before_after(result)
    return (
        f"{fmt(rate, 2)} updates/s, {fmt(paper['cpu_seconds_per_update'], 2)} CPU-s/update "
        f"(batch 256, 84x84x9, {result['backend']})",
        f"before (457c3a9's update): {fmt(before.get('updates_per_second'), 2)} updates/s, "
        f"{fmt(before.get('cpu_seconds_per_update'), 2)} CPU-s; paper's V100: "
        f"{PAPER_UPDATES_PER_SECOND:.0f} updates/s",
        f"{fmt(speed, 2)} updates/s, {fmt(cpu, 2)} CPU-s vs before; "
        f"{fmt(ratio(rate, PAPER_UPDATES_PER_SECOND), 3)} vs V100",
    )


def report(result: dict) -> str:
    paper = result["sizes"].get("paper", {})
    rate = paper.get("updates_per_second")
    speed, cpu = _before_after(result)
    lines = [
        f"**{fmt(rate, 2)} updates/s** at batch 256, 84x84x9 on {_where(result)}, against "
        f"the paper's implied **{PAPER_UPDATES_PER_SECOND:.0f} "
        f"updates/s** on one V100: ratio **{fmt(ratio(rate, PAPER_UPDATES_PER_SECOND), 3)}**. "
        "Different hardware: this says how far this machine is from the paper's GPU, not "
        "how efficient the code is. Against the update as commit 457c3a9 ran it "
        f"(paper_before, timed alternately with it): **{fmt(speed, 2)}x** the updates/s, "
        f"**{fmt(cpu, 2)}x** the CPU-seconds per update.",
        "",
        "| size | batch | observation | replay batch / augmentation | updates/s "
        "| median update | CPU-s per update | compile (first call) | vs 24/s (V100) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, size in result["sizes"].items():
        lines.append(
            f"| {name} | {size['batch_size']} | {size['observation']} "
            f"| {size.get('batch', '-')} / {size.get('augmentation', '-')} "
            f"| {fmt(size['updates_per_second'], 2)} | {fmt(size['median_update_ms'], 1)} ms "
            f"| {fmt(size.get('cpu_seconds_per_update'), 2)} "
            f"| {fmt(size['compile_s'], 1)} s ({fmt(size['first_call_s'], 1)} s) "
            f"| {fmt(ratio(size['updates_per_second'], PAPER_UPDATES_PER_SECOND), 3)} |"
        )
    lines += [
        "",
        "How: `make_update_fn` jitted, the paper's network widths (encoder 4x conv 32, "
        "feature 50, hidden 1024; "
        f"{fmt(paper.get('parameters'))} parameters at 84x84), a fresh numpy batch handed to "
        "every call as the replay iterator does; compile time = first call minus one "
        "steady update, excluded from the rate; CPU-s per update = this process's CPU time "
        "over the timed updates / updates (all threads; what a loaded machine inflates "
        "least, and /cores gives the best wall time to expect); the rate is updates / wall "
        "time over at "
        f"least {paper.get('min_updates')} updates and {fmt(paper.get('min_seconds'), 0)} s "
        "(paper size), each update waited for; paper and paper_before alternate update by "
        "update, so both see the same load. Replay sampling is not included (the "
        "replay sampling figure times it). "
        "The paper's rate: ~96 frames/s "
        "(~3.3 h per 1M frames) / action repeat 2 / one update per 2 agent steps = 24 "
        f"updates/s. {_cores_busy(paper)}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    figure_main(measure)
