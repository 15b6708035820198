"""main.py's engine: every part of the agent in this one process (debugging, small machines).

The runner (`magi_lp.runtime.single_process`) acts, stores and learns in turn; a stop signal
(Ctrl-C, or SIGTERM as a scheduler sends it) ends it with the runner's final save, after which
the same command resumes. Nothing is left in the temp folder (the run's private one).
"""

from __future__ import annotations

import signal
from typing import Any

from magi_lp import console
from magi_lp.engines.base import Launch
from magi_lp.launch import interrupts, run_folders


def _stop_on_sigterm() -> None:
    """SIGTERM (`kill`, a scheduler's stop) ends a run in this process as Ctrl-C does: the
    runner's final save, then the same command resumes. Its default would end the process
    at once, and the steps since the last periodic checkpoint would be taken again. Once: a
    second SIGTERM while the save runs is ignored. One inherited as ignored stays so."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        return

    def stop(signum: int, frame: Any) -> None:
        del signum, frame
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def run(launch: Launch) -> int:
    """Runs the experiment in this process until its step limit or a stop; 0 either way."""
    from magi_lp.runtime import single_process

    _stop_on_sigterm()
    with run_folders.private_temp():
        result = single_process.run_single_process(
            launch.experiment, workdir=str(launch.workdir), logger_factory=launch.logger_factory
        )
        # Saved and closed: a stop now has nothing left to stop, and ends the process as
        # the signal's default does (raised, it would read as a Ctrl-C before the run).
        for signum in interrupts.STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
    if result.resumed_from_step is not None:
        console.say(f"resumed from learner step {result.resumed_from_step}")
    counts = (
        f"{result.actor_steps} actor steps, {result.learner_steps} learner steps, "
        f"{result.episodes} episodes"
    )
    if result.stopped_by_user:
        console.say(f"stopped at {counts}")
        if launch.standing is not None:
            console.say(launch.standing())
    else:
        console.say(f"done: {counts}")
    return 0
