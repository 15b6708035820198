"""`projects/drq_v2/main.py` as the learn check runs it: the same agent, replay and runner,
with two things around them that only the check needs.

    python -m benchmarks.learn_check.ours_main --config=... --workdir=... [main.py's flags]

- Every CSV row gets `wall_time` (seconds since the epoch, when the row is written) and
  `cpu_time` (the process's CPU seconds then), so this agent's training frames/s are timed
  from the same event as the official agent's: the row written when a training episode ends
  (runs.py, `episode_windows`).
- `MAGI_LP_LEARN_CHECK_BREAK=critic_target_sign` (tests only: the negative control in
  tests/test_learn_check.py) negates the critic's TD target, an update that cannot learn.

Nothing here changes the agent or the replay: it patches the logger's row. SIGTERM stops the
run the way Ctrl-C does (a final checkpoint; the same command resumes) because main.py itself
does so (magi_lp/cli.py, `_stop_on_sigterm`).
"""

from __future__ import annotations

import os
import sys
import time

from benchmarks.learn_check.official import tree_cpu_seconds

BREAK_ENV = "MAGI_LP_LEARN_CHECK_BREAK"
BREAKS = ("critic_target_sign",)


def _stamp_rows() -> None:
    from magi_lp.runtime import loggers

    write = loggers.CsvLogger.write

    def write_with_time(self, data):
        return write(self, {**data, "wall_time": time.time(), "cpu_time": tree_cpu_seconds()})

    loggers.CsvLogger.write = write_with_time


def _break_update(kind: str) -> None:
    if kind not in BREAKS:
        raise SystemExit(f"{BREAK_ENV}={kind!r}: choose from {', '.join(BREAKS)}")
    from projects.drq_v2 import learning

    target = learning.clipped_double_q_target

    def negated(reward, discount, target_q1, target_q2):
        return -target(reward, discount, target_q1, target_q2)

    learning.clipped_double_q_target = negated  # read at trace time from the module


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    _stamp_rows()
    if os.environ.get(BREAK_ENV):
        _break_update(os.environ[BREAK_ENV])
    from magi_lp import single_process_main
    from projects.drq_v2.config import validate_config
    from projects.drq_v2.main import make_experiment

    single_process_main(make_experiment, validate_config=validate_config)


if __name__ == "__main__":
    main()
