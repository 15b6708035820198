"""The workdir's layout (magi_lp/runtime/workdir.py): its paths are today's, the code writes
and reads them, and README shows its tree."""

from __future__ import annotations

import ast
import dataclasses
import os
import textwrap
from pathlib import Path

import pytest

from magi_lp.launch import run_folders
from magi_lp.runtime import workdir as workdir_module
from magi_lp.runtime.loggers import make_logger
from magi_lp.runtime.probe import ProgramProbe
from magi_lp.runtime.workdir import Workdir

ROOT = Path(__file__).resolve().parents[1]


def test_the_paths_are_the_ones_runs_wrote_before_so_old_workdirs_resume():
    # Spelled out on purpose: a run written before this module must still resume and plot.
    w = Workdir("/runs/a")
    assert w.root == Path("/runs/a")
    assert str(w.logs_folder) == "/runs/a/logs"
    assert str(w.logs("actor_3")) == "/runs/a/logs/actor_3"
    assert str(w.log_csv("learner")) == "/runs/a/logs/learner/logs.csv"
    assert str(w.tensorboard("evaluator_0")) == "/runs/a/tensorboard/evaluator_0"
    assert str(w.wandb) == "/runs/a/wandb"
    assert str(w.learner_checkpoints) == "/runs/a/checkpoints/learner"
    assert str(w.replay_checkpoints) == "/runs/a/checkpoints/replay"
    assert str(w.replay_store_checkpoints) == "/runs/a/checkpoints/replay_store"
    assert str(w.nodes) == "/runs/a/nodes"
    assert str(w.node_log("actor", 1)) == "/runs/a/nodes/actor/1"
    assert str(w.node_log("actor@cpu1", "2")) == "/runs/a/nodes/actor@cpu1/2"
    assert str(w.launcher_log) == "/runs/a/nodes/launcher.log"
    assert str(w.status_csv) == "/runs/a/status.csv"
    assert str(w.videos) == "/runs/a/videos"
    assert str(w.cluster) == "/runs/a/cluster"
    assert str(w.cluster_job) == "/runs/a/cluster/job"


def test_a_workdir_is_a_frozen_value_from_any_path_like():
    assert Workdir("runs/a") == Workdir(Path("runs/a"))
    assert isinstance(Workdir("runs/a").root, Path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Workdir("runs/a").root = Path("elsewhere")  # type: ignore[misc]


def test_the_launcher_log_is_where_the_launcher_writes_it():
    # magi_lp.launch sits below the runtime and cannot import the layout: one name, checked.
    assert Workdir("w").launcher_log == Workdir("w").nodes / run_folders.LAUNCHER_LOG


def test_the_loggers_write_under_the_workdirs_logs_of_their_label(tmp_path):
    logger = make_logger("actor_0", tmp_path, tensorboard=False, terminal=False, time_delta=0)
    logger.write({"actor_steps": 5, "episode_return": 1.5})
    logger.close()
    w = Workdir(tmp_path)
    assert w.log_csv("actor_0").read_text().splitlines() == ["actor_steps,episode_return", "5,1.5"]
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()] == [
        "logs/actor_0/logs.csv"
    ]


def test_log_csvs_finds_the_labels_that_logged_in_order(tmp_path):
    w = Workdir(tmp_path)
    for label in ("evaluator_1", "evaluator_0", "actor_0"):
        w.logs(label).mkdir(parents=True)
        w.log_csv(label).write_text("episode_return\n1\n")
    w.logs("evaluator_2").mkdir()  # no CSV yet: not a log
    assert w.log_csvs("evaluator_*") == [w.log_csv("evaluator_0"), w.log_csv("evaluator_1")]
    assert w.log_csvs() == [w.log_csv(x) for x in ("actor_0", "evaluator_0", "evaluator_1")]


def test_the_status_view_reads_the_evaluators_logs_of_the_layout(tmp_path):
    w = Workdir(tmp_path)
    for label, value in (("evaluator_0", 10.0), ("evaluator_1", 20.0)):
        w.logs(label).mkdir(parents=True)
        w.log_csv(label).write_text(f"evaluator_steps,episode_return\n1,0\n2,{value}\n")

    def unreachable():
        raise ConnectionError("no counter in this test")

    probe = ProgramProbe(unreachable, None, str(tmp_path))
    assert probe()["eval_return"] == 15.0


def _docstring_tree() -> str:
    lines = ast.get_docstring(ast.parse(Path(workdir_module.__file__).read_text())).splitlines()
    start = lines.index("    <workdir>/")
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return textwrap.dedent("\n".join(lines[start:end]))


def test_readme_shows_the_modules_tree():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### What a run leaves in its workdir") :]
    block = section[section.index("```\n") + 4 :]
    assert block[: block.index("```")].rstrip("\n") == _docstring_tree(), (
        "README's 'What a run leaves in its workdir' tree differs from magi_lp/runtime/"
        "workdir.py's docstring: change both"
    )


def test_the_tree_names_every_top_level_path_of_the_layout():
    tree = _docstring_tree()
    w = Workdir("W")
    for path in (
        w.log_csv("<label>"),
        w.tensorboard("<label>"),
        w.wandb,
        w.learner_checkpoints,
        w.replay_checkpoints,
        w.replay_store_checkpoints,
        w.launcher_log,
        w.node_log("<group>", "<index>"),
        w.status_csv,
        w.videos,
        w.cluster,
        w.cluster_job,
    ):
        assert path.relative_to("W").as_posix() in tree, path


def test_a_private_temp_is_this_process_temp_folder_while_it_lasts(tmp_path, monkeypatch):
    """main.py's temp folder: a stale one of a dead run is swept, its own is removed after."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    stale = tmp_path / f"{run_folders.RUN_TMP_PREFIX}dead"
    stale.mkdir()
    (stale / run_folders.OWNER_FILE).write_text("999999999")  # no such process
    with run_folders.private_temp() as run_tmp:
        assert not stale.exists()
        assert Path(run_tmp).parent == tmp_path and tempfile.gettempdir() == run_tmp
        with tempfile.NamedTemporaryFile(delete=False) as left_behind:
            assert Path(left_behind.name).parent == Path(run_tmp)
    assert not Path(run_tmp).exists() and list(tmp_path.iterdir()) == []
    assert tempfile.tempdir is None and os.environ["TMPDIR"] == str(tmp_path)
