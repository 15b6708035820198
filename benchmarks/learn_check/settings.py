"""What `make learn-check` runs: the settings both agents share, and where each run lives.

PREREGISTERED (candidates.md: what was measured before the choice, and why): these settings
and seeds 1, 2, 3 of each agent were fixed and committed before any run at them started;
the comparison counts those seeds only, and they are never grown after a miss.

Both agents are the paper's DrQ-v2 (networks, learning rate, stddev schedule, n-step 3,
action repeat 2, frame stack 3, random-shift augmentation pad 4, 4000 seed frames, one update
every 2 agent steps, batch 256) with two things reduced so that a run fits one CPU core in
about 2.3 hours when the core is free: the rendered image (48x48, not 84x84) and the replay
(100k transitions, not 1M: a run stores at most 30k, so nothing is evicted either way), for
60k frames (the paper's 10 seeds: 375 at 20k, 835 at 40k with one seed at 429, 985 at 60k
with the lowest at 963). Evaluation: 10 episodes at 0 and every 10k frames, as the paper's.
Amended once before any evaluation after frame 0 (candidates.md, "Erratum"): first 32x32,
chosen on a cost estimate that counted twice the updates a frame costs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from benchmarks import common

ACTION_REPEAT = 2
AGENTS = ("magi_lp", "official")
DEFAULT_TASKS = ("cartpole_balance",)
SEEDS = (1, 2, 3)
"""The preregistered seeds of each agent: the comparison counts these and no others."""
PREREGISTERED_AT = "e7dbb9a"
"""The commit that fixed `FULL` and `SEEDS` (2026-11-26); later commits to this file may not
change either (tests/test_learn_check.py checks it against that commit's file)."""
DEFAULT_SEEDS = SEEDS
OUT = common.REPO / "runs" / "learn_check"
"""Run folders (logs, checkpoints; git-ignored)."""
PAPER_OUT = common.REPO / "runs" / "learn_check_paper"
"""`--paper`'s run folders: the preregistered GPU comparison's runs made here."""
RESULT = "result.json"
"""Each finished run writes this into its folder; a folder without it is continued."""
FAILED = "failed"
"""Under the kept folder: one record per failed launch (exit code, last log lines)."""
PROGRESS = "progress"
"""Under the kept folder: each unfinished run's launches and evaluations so far, rewritten at
each launch's start and end. Its run folder lives in runs/, which a machine that comes up new
has lost: committed, the record outlives it."""
LOST = "lost"
"""Under the kept folder: the progress records of runs whose folder was lost with their
machine, set aside when the same run starts again from frame 0."""
ALLOCATOR = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "4294967295"}
"""glibc malloc settings for both agents' processes (CPU runs and `make gpu-learn`), from
2026-11-28 (launches record them as `allocator`): freed memory is kept for reuse instead of
each large tensor being a fresh mmap, faulted in page by page. The official update at 84x84,
batch 256, costs half the CPU with them (3.22 -> 1.55 CPU s), ours about the same, and both
agents' parameters after 5 seeded updates are bit for bit the same with and without
(`update_cost.py`'s params_sha256; candidates.md): they change the speed, not the numbers."""
KEPT = common.REPO / "benchmarks" / "learn_check" / "results"
"""Finished runs' results, committed: runs finish across sessions; only SEEDS count."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """The shared settings of one comparison (frames count environment frames)."""

    image_size: int = 48
    batch_size: int = 256
    frames: int = 60_000
    eval_every_frames: int = 10_000
    eval_episodes: int = 10
    seed_frames: int = 4_000
    replay_size: int = 100_000
    episode_frames: int = 0  # 0: the task's own (1000 frames); shorter only for checks (ours)
    checkpoint_minutes: float = 10.0  # ours: learner + replay saved (the official: each episode)

    def reduced(self) -> str:
        """What differs from the paper, in words (for the figure)."""
        return (
            f"{self.image_size}x{self.image_size} pixels (paper: 84x84), batch "
            f"{self.batch_size} (256), replay {self.replay_size:,} (1M), "
            f"{self.frames:,} frames"
        )


FULL = Settings()
TINY = Settings(
    image_size=32,
    batch_size=8,
    frames=2_400,
    eval_every_frames=1_200,
    eval_episodes=1,
    # The official replay samples finished episodes only (1000 frames each): updates start
    # once one is in.
    seed_frames=1_200,
    replay_size=5_000,
    episode_frames=200,
    checkpoint_minutes=0.05,  # every 3 s: the resume test kills a run after one
)
"""A check that the command works (tests): not a learning result."""


def run_dir(out: Path, agent: str, task: str, seed: int) -> Path:
    """The folder of one (agent, task, seed) run."""
    return Path(out) / agent / task / f"seed_{seed}"


def kept_result(kept: Path, agent: str, task: str, seed: int) -> Path:
    """Where a finished run's result is kept (committed with the figure)."""
    return Path(kept) / agent / task / f"seed_{seed}.json"


def failed_record(kept: Path, agent: str, task: str, seed: int, attempt: int) -> Path:
    """Where a launch that failed (a nonzero exit, not a stop) is kept, with its log's end."""
    return Path(kept) / FAILED / agent / task / f"seed_{seed}_attempt_{attempt}.json"


def progress_record(kept: Path, agent: str, task: str, seed: int) -> Path:
    """Where an unfinished run's launches and evaluations so far are kept (`PROGRESS`)."""
    return Path(kept) / PROGRESS / agent / task / f"seed_{seed}.json"


def lost_record(kept: Path, agent: str, task: str, seed: int, started_at: str) -> Path:
    """Where the progress record of a run lost with its machine is kept (`LOST`), named by
    its first launch's start."""
    stamp = "".join(c for c in started_at if c.isalnum())
    return Path(kept) / LOST / agent / task / f"seed_{seed}_started_{stamp}.json"
