"""Evaluation videos: an evaluator observer that saves one episode as an animated GIF.

The evaluator calls `make()` for each entry of `Experiment.evaluation_observers` once, in
its own process, and then, for every evaluation episode, `observe_first(timestep)`,
`observe(timestep, action)` per step and `episode_done(episode_return)`
(`magi_lp.runtime.acting_loop.ActingLoop`). `EvaluationVideo` records the first episode of every
`every_evaluations`-th evaluation (an evaluation is `episodes_per_evaluation` episodes) and
writes it to `<directory>/<time>_evaluation<k>_return<R>.gif`.

The frames are what the agent sees: the newest frame of each stacked observation, at
`image_size` (upscale with `scale` for viewing). GIF because Pillow is installed everywhere
this runs and imageio/ffmpeg are not; files are written to a temporary name and renamed, so
a half-written video never appears.

Pass it as a picklable partial (Launchpad ships it to the evaluator):
`functools.partial(EvaluationVideo, directory=f"{workdir}/videos", ...)`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import dm_env
import numpy as np


class EvaluationVideo:
    """Saves the first episode of every `every_evaluations`-th evaluation as a GIF."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        episodes_per_evaluation: int,
        every_evaluations: int = 1,
        fps: float = 25.0,
        scale: int = 1,
        channels: int = 3,
        max_frames: int = 1_000,
    ):
        """Creates the recorder.

        Args:
          directory: where videos go (created on the first write).
          episodes_per_evaluation: evaluation episodes per evaluation
            (`config.evaluation.episodes`), to tell evaluations apart.
          every_evaluations: record one episode every this many evaluations (>= 1).
          fps: frames per second of the GIF; one frame per agent step, so 25 is real time
            for a 50 Hz task (e.g. reacher) at action repeat 2.
          scale: integer upscaling of each frame (nearest neighbour).
          channels: channels of one frame in the stacked observation (3: RGB).
          max_frames: frames kept per video at most (the rest of the episode is dropped).
        """
        for name, value in (
            ("episodes_per_evaluation", episodes_per_evaluation),
            ("every_evaluations", every_evaluations),
            ("scale", scale),
            ("channels", channels),
            ("max_frames", max_frames),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EvaluationVideo: {name} must be an integer >= 1, got {value!r}")
        if fps <= 0:
            raise ValueError(f"EvaluationVideo: fps must be > 0, got {fps!r}")
        self._directory = Path(directory)
        self._episodes_per_evaluation = episodes_per_evaluation
        self._every_evaluations = every_evaluations
        self._frame_ms = max(round(1000.0 / fps), 10)  # GIF timing is in 10 ms units
        self._scale = scale
        self._channels = channels
        self._max_frames = max_frames
        self._episodes = 0  # episodes started so far
        self._frames: list[np.ndarray] | None = None  # None: not recording this episode
        self.written: list[Path] = []

    def _evaluation_index(self) -> int:
        return self._episodes // self._episodes_per_evaluation

    def _frame(self, timestep: dm_env.TimeStep) -> np.ndarray:
        observation = np.asarray(timestep.observation)
        frame = observation[..., -self._channels :]
        if frame.shape[-1] == 1:
            frame = np.repeat(frame, 3, axis=-1)
        if self._scale > 1:
            frame = frame.repeat(self._scale, axis=0).repeat(self._scale, axis=1)
        return np.ascontiguousarray(frame.astype(np.uint8))

    def observe_first(self, timestep: dm_env.TimeStep) -> None:
        """Starts an episode; records it when it opens a recorded evaluation."""
        starts_evaluation = self._episodes % self._episodes_per_evaluation == 0
        recorded = self._evaluation_index() % self._every_evaluations == 0
        self._frames = [self._frame(timestep)] if starts_evaluation and recorded else None
        self._episodes += 1

    def observe(self, timestep: dm_env.TimeStep, action: Any) -> None:
        """Adds the frame of a step to the video being recorded."""
        del action
        if self._frames is not None and len(self._frames) < self._max_frames:
            self._frames.append(self._frame(timestep))

    def episode_done(self, episode_return: float) -> None:
        """Writes the recorded episode, if this one was recorded."""
        if self._frames is None:
            return
        frames, self._frames = self._frames, None
        evaluation = (self._episodes - 1) // self._episodes_per_evaluation
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{stamp}_evaluation{evaluation:04d}_return{episode_return:.0f}.gif"
        self.written.append(write_gif(self._directory / name, frames, self._frame_ms))

    def close(self) -> None:
        """Drops an unfinished recording."""
        self._frames = None


def write_gif(path: str | os.PathLike, frames: list[np.ndarray], frame_ms: int) -> Path:
    """Writes uint8 [H, W, 3] frames as a looping GIF at `path` (atomically); returns it.

    An existing file of that name is kept: the new one gets a numeric suffix.
    """
    from PIL import Image  # Only evaluators that record pay for Pillow.

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    final = path
    suffix = 1
    while final.exists():
        final = path.with_name(f"{path.stem}_{suffix}{path.suffix}")
        suffix += 1
    images = [Image.fromarray(frame) for frame in frames]
    temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    images[0].save(
        temporary,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=frame_ms,
        loop=0,
    )
    os.replace(temporary, final)
    return final
