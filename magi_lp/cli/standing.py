"""Where a run folder stands: what its newest checkpoint saved, whether the run is finished and
evaluated there, and what the same command would do next (the launcher's last line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from magi_lp.errors import ConfigError
from magi_lp.runtime.workdir import Workdir


def _saved_counts(config: Any, workdir: Path) -> dict[str, Any]:
    """The counts a relaunch of `workdir` resumes from: its newest learner checkpoint's ({}
    for a new run, or one that saves no checkpoints)."""
    from magi_lp.runtime.checkpoint_metadata import saved_metadata

    if not config.checkpoint.enabled or not workdir.is_dir():
        return {}
    counts = saved_metadata(Workdir(workdir).learner_checkpoints).get("counts")
    return counts if isinstance(counts, dict) else {}


def _finished_line(config: Any, workdir: Path, *, single_process: bool) -> str | None:
    """Why a relaunch of `workdir` has nothing to do, or None: its checkpoint is at or past
    `max_actor_steps` and every evaluator's last evaluation, whole, is of those parameters
    (`_evaluated_at`, `_finally_evaluated`). Otherwise it is relaunched as before: the run
    makes the evaluation. A relaunch of a finished run would take a few more steps past the
    limit, save again and evaluate the same parameters once more."""
    limit = int(config.max_actor_steps)
    counts = _saved_counts(config, workdir)
    steps = counts.get("actor_steps")
    if not limit or steps is None or int(steps) < limit:
        return None
    if single_process:  # main.py runs one evaluator, whatever num_evaluators says
        evaluated = _evaluated_at(config, workdir, int(steps), min(1, int(config.num_evaluators)))
    else:
        evaluated = _finally_evaluated(config, workdir, int(steps))
    if not evaluated:
        return None
    return (
        f"the run in {workdir} has reached max_actor_steps={limit} (its newest "
        f"checkpoint: {int(steps)} actor steps, learner step "
        f"{int(counts.get('learner_steps', 0))}) and was evaluated there; raise "
        "--config.max_actor_steps to train on, or give a new --workdir"
    )


def _count_lag(config: Any) -> int:
    """How far the counted actor steps may trail a distributed run's truth: its actors report
    every DISTRIBUTED_COUNT_EVERY steps, per environment."""
    from magi_lp.runtime.config import DISTRIBUTED_COUNT_EVERY, resolve_actor_counts

    try:
        config, _ = resolve_actor_counts(config)  # 'auto': as this machine sizes it
    except ConfigError:
        return DISTRIBUTED_COUNT_EVERY  # the launch refuses this config in its own words
    return DISTRIBUTED_COUNT_EVERY * int(config.num_actors) * int(config.envs_per_actor)


def _evaluated_at(config: Any, workdir: Path, steps: int, evaluators: int) -> bool:
    """Whether each evaluator's log ends with a whole evaluation (`evaluation.episodes` rows)
    at or past `max_actor_steps`, the last row within the counts' reporting lag of the
    checkpoint's `steps`: not one cut short by a stop, nor an earlier launch's (a run first
    trained to the limit, then past it and stopped, has parameters no evaluation saw). For
    main.py's runs, whose evaluations come at exact step counts (distributed runs:
    `_finally_evaluated`)."""
    import csv

    limit, episodes = int(config.max_actor_steps), int(config.evaluation.episodes)
    lag = _count_lag(config)
    for index in range(evaluators):
        try:
            with open(Workdir(workdir).log_csv(f"evaluator_{index}"), newline="") as file:
                rows = [row for row in csv.DictReader(file) if row.get("episode_return")]
            last = [float(row.get("actor_steps") or "nan") for row in rows[-episodes:]]
        except (OSError, ValueError, csv.Error):
            return False
        whole = len(last) == episodes and all(at >= limit for at in last)
        if not whole or last[-1] < steps - lag:
            return False
    return True


def _finally_evaluated(config: Any, workdir: Path, steps: int) -> bool:
    """Whether every evaluator of a distributed run made its evaluation at `max_actor_steps`
    whole (`Workdir.final_evaluation`, written when it is), within the counts' reporting lag
    of the checkpoint's `steps`. Its log rows cannot tell: a periodic evaluation that the
    actors overtook at the limit logs counts at the limit too, and a stop in the evaluation
    after it left rows that read as one whole evaluation there. A run from before these
    records is relaunched: it evaluates its parameters once more."""
    import json

    limit = int(config.max_actor_steps)
    lag = _count_lag(config)
    for index in range(int(config.num_evaluators)):
        try:
            record = json.loads(Workdir(workdir).final_evaluation(f"evaluator_{index}").read_text())
            at = int(record["actor_steps"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if at < limit or at < steps - lag:
            return False
    return True


def _resume_line(config: Any, workdir: Path) -> str | None:
    """What a relaunch of `workdir` resumes from (its newest learner checkpoint's counts), in
    the launcher's terminal: the learner's node log says it too, but later and out of sight."""
    counts = _saved_counts(config, workdir)
    if not counts:
        return None
    return f"resuming from the workdir's newest checkpoint: {_checkpoint_text(config, counts)}"


def _checkpoint_text(config: Any, counts: dict[str, Any]) -> str:
    """A checkpoint's saved counts as the launcher says them."""
    return (
        f"learner step {int(counts.get('learner_steps', 0))}, "
        f"{int(counts.get('actor_steps', 0))} "
        f"actor steps (max_actor_steps={config.max_actor_steps})"
    )


def _where_it_stands(config: Any, workdir: Path, *, single_process: bool) -> str:
    """What the same command would do next, read from the workdir once the run has ended:
    the launcher's last line (the nodes' own lines say what each saved, out of sight), and
    main.py's after a stop."""
    finished = _finished_line(config, workdir, single_process=single_process)
    if finished:
        return f"done: {finished}"
    if not config.checkpoint.enabled:
        return (
            "checkpoints are off (checkpoint.enabled=False): the same command starts again "
            "from step 0"
        )
    counts = _saved_counts(config, workdir)
    if not counts:
        return "no learner checkpoint was saved: the same command starts again from step 0"
    return (
        f"the same command resumes from the newest checkpoint: {_checkpoint_text(config, counts)}"
    )
