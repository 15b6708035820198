"""The layout of a run's workdir, stated once: `Workdir(root)` names every path in it.

A run writes these under its `--workdir`, and a relaunch with the same workdir reads them
back (checkpoints, appended logs), so a path here never changes: a run written before must
still resume. README's "What a run leaves in its workdir" shows this tree (tests/test_workdir.py
keeps the two equal):

    <workdir>/
      logs/<label>/logs.csv         one CSV per label (learner, actor_0, ..., evaluator_0),
                                    appended on resume
      logs/evaluator_<i>/final_evaluation.json
                                    its evaluation at max_actor_steps was whole (distributed
                                    runs; each launch removes it): what tells a relaunch that
                                    the run is finished
      logs/evaluator_<i>/evaluation_due.json
                                    the evaluation point a distributed evaluator is at, while
                                    its episodes run: one a stop cut is evaluated again first
                                    by the relaunch
      tensorboard/<label>/          TensorBoard event files
      wandb/                        Weights & Biases files (logging.wandb)
      checkpoints/learner/<step>/   orbax checkpoints: parameters, optimizer state, step counts
      checkpoints/replay/           Reverb's own checkpoint (config.checkpoint.reverb=True)
      checkpoints/replay_store/     the device replay store at the learner's steps
                                    (config.checkpoint.replay=True)
      nodes/launcher.log            what the launcher said, dated, launch after launch (a dead
                                    node's cause, each stop's stages, any SIGKILL)
      nodes/<group>/<index>         each node's stdout/stderr (distributed runs; on Kubernetes,
                                    `kubectl logs`); an earlier launch's logs are kept as
                                    nodes/<group>/<index>.<n> (n: the launch; on several
                                    hosts, each node counts its own earlier logs)
      status.csv                    the launcher's status samples (distributed runs)
      videos/                       evaluation episodes as GIFs (DrQ-v2)
      cluster/                      several hosts: the rendered job files, and the pickled
                                    program in cluster/job/ (docs/cluster.md)
      run.lock                      held by the launch running in it (who: pid, start,
                                    command); a second launch while it runs is refused

A label names one logging stream (`magi_lp.runtime.loggers`); a node's group and index are
its place in the program graph (`magi_lp.runtime.graph`). Plain paths only: this module
imports nothing else, so every layer above the runtime (and benchmarks, tests) can use it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

LOG_CSV = "logs.csv"
"""The file name of a label's CSV log, inside `Workdir.logs(label)`."""


@dataclasses.dataclass(frozen=True)
class Workdir:
    """A run's workdir: one property or method per path in it (the module docstring's tree).

    `root` may be given as a string or any path-like; it is kept as a `Path`.
    """

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(os.fspath(self.root)))

    # Logs of each label (magi_lp.runtime.loggers).

    @property
    def logs_folder(self) -> Path:
        """`<workdir>/logs`: one folder per label."""
        return self.root / "logs"

    def logs(self, label: str) -> Path:
        """`<workdir>/logs/<label>`: the CSV logger's folder of one label."""
        return self.logs_folder / label

    def log_csv(self, label: str) -> Path:
        """`<workdir>/logs/<label>/logs.csv`: one row per write of that label."""
        return self.logs(label) / LOG_CSV

    def log_csvs(self, labels: str = "*") -> list[Path]:
        """The CSV logs that exist of the labels matching the glob `labels`, sorted
        (`"evaluator_*"`: every evaluator's)."""
        return sorted(self.logs_folder.glob(f"{labels}/{LOG_CSV}"))

    def final_evaluation(self, label: str) -> Path:
        """`<workdir>/logs/<label>/final_evaluation.json`: written by a distributed evaluator
        when its evaluation at `max_actor_steps` is whole (the actor steps it began at and the
        limit), removed when a launch makes the evaluator: what tells a finished run from one
        stopped in that evaluation (with the checkpoint's counts: `cli._finally_evaluated`)."""
        return self.logs(label) / "final_evaluation.json"

    def evaluation_due(self, label: str) -> Path:
        """`<workdir>/logs/<label>/evaluation_due.json`: the evaluation point (a multiple of
        `evaluation.every_actor_steps`) a distributed evaluator is evaluating, written before
        its episodes and removed once they are whole; left by a stop (or a kill) in them, it
        tells the relaunch's evaluator to evaluate that point first."""
        return self.logs(label) / "evaluation_due.json"

    def tensorboard(self, label: str) -> Path:
        """`<workdir>/tensorboard/<label>`: TensorBoard event files of one label."""
        return self.root / "tensorboard" / label

    @property
    def wandb(self) -> Path:
        """`<workdir>/wandb`: Weights & Biases files and each label's run id."""
        return self.root / "wandb"

    # Checkpoints, read back on relaunch.

    @property
    def learner_checkpoints(self) -> Path:
        """`<workdir>/checkpoints/learner`: the learner's orbax checkpoints, one per step."""
        return self.root / "checkpoints" / "learner"

    @property
    def replay_checkpoints(self) -> Path:
        """`<workdir>/checkpoints/replay`: the Reverb replay node's own checkpoint."""
        return self.root / "checkpoints" / "replay"

    @property
    def replay_store_checkpoints(self) -> Path:
        """`<workdir>/checkpoints/replay_store`: the device replay store's checkpoint."""
        return self.root / "checkpoints" / "replay_store"

    # What the launcher writes (distributed runs).

    @property
    def nodes(self) -> Path:
        """`<workdir>/nodes`: every node's output (the engines' and the cluster's `log_dir`)."""
        return self.root / "nodes"

    def node_log(self, group: str, index: int | str) -> Path:
        """`<workdir>/nodes/<group>/<index>`: one node's stdout and stderr."""
        return self.nodes / group / str(index)

    @property
    def launcher_log(self) -> Path:
        """`<workdir>/nodes/launcher.log` (`magi_lp.launch.run_folders.LAUNCHER_LOG`)."""
        return self.nodes / "launcher.log"

    @property
    def status_csv(self) -> Path:
        """`<workdir>/status.csv`: the launcher's status samples."""
        return self.root / "status.csv"

    # What agents and the cluster add.

    @property
    def videos(self) -> Path:
        """`<workdir>/videos`: evaluation episodes as GIFs (DrQ-v2's evaluation video)."""
        return self.root / "videos"

    @property
    def cluster(self) -> Path:
        """`<workdir>/cluster`: a several-hosts job's rendered files."""
        return self.root / "cluster"

    @property
    def lock(self) -> Path:
        """`<workdir>/run.lock`: held by the launch running in it (`launch.workdir_lock`)."""
        return self.root / "run.lock"

    @property
    def cluster_job(self) -> Path:
        """`<workdir>/cluster/job`: the pickled program every host loads."""
        return self.cluster / "job"
