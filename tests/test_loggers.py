"""Loggers write real CSV and TensorBoard files that read back; helpers format and measure."""

from __future__ import annotations

import csv
import glob
import importlib.util
import io
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp
import numpy as np
import pytest

from magi_lp.errors import ConfigError
from magi_lp.formatting import format_duration, format_ranges
from magi_lp.runtime import loggers
from magi_lp.runtime.loggers import (
    LoggerFactory,
    ProgressBar,
    ThroughputTracker,
    format_terminal_line,
    make_logger,
)
from tests.e2e_utils import run_python

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_csv(workdir, label):
    path = os.path.join(workdir, "logs", label, "logs.csv")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def read_tensorboard(workdir, label):
    """{tag: [(step, value), ...]} from every event file of the label."""
    import tensorflow as tf

    found: dict[str, list[tuple[int, float]]] = {}
    files = sorted(glob.glob(os.path.join(workdir, "tensorboard", label, "events.out.tfevents.*")))
    assert files, f"no event file for {label}"
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor))
                found.setdefault(value.tag, []).append((event.step, number))
    return found


def csv_only(workdir, label, **kwargs):
    kwargs = {"tensorboard": False, "terminal": False, "time_delta": 0, **kwargs}
    return make_logger(label, workdir, **kwargs)


# ---------------------------------------------------------------------------------------
# CSV.


def test_csv_rows_and_columns(tmp_path):
    logger = csv_only(tmp_path, "learner")
    logger.write({"learner_steps": 1, "critic_loss": jnp.asarray(0.25), "note": "warmup"})
    logger.write({"learner_steps": 2, "critic_loss": np.float32(0.5), "note": None})
    logger.close()

    fields, rows = read_csv(tmp_path, "learner")
    assert sorted(fields) == ["critic_loss", "learner_steps", "note"]
    assert [r["learner_steps"] for r in rows] == ["1", "2"]
    assert [float(r["critic_loss"]) for r in rows] == [0.25, 0.5]
    assert [r["note"] for r in rows] == ["warmup", ""]  # None dropped -> empty cell.


def test_csv_appends_across_logger_instances_and_widens_header(tmp_path):
    first = csv_only(tmp_path, "actor_0")
    first.write({"actor_steps": 10, "episode_return": 1.5})
    first.write({"actor_steps": 20, "episode_return": 2.5})
    first.close()

    # A relaunch: same label, same workdir, keys in another order.
    second = csv_only(tmp_path, "actor_0")
    second.write({"episode_return": 3.5, "actor_steps": 30})
    second.write({"episode_return": 4.5, "actor_steps": 40, "fps": 120.0})  # New column.
    second.close()

    fields, rows = read_csv(tmp_path, "actor_0")
    assert fields == ["actor_steps", "episode_return", "fps"]
    assert [int(r["actor_steps"]) for r in rows] == [10, 20, 30, 40]
    assert [float(r["episode_return"]) for r in rows] == [1.5, 2.5, 3.5, 4.5]
    assert [r["fps"] for r in rows] == ["", "", "", "120.0"]
    text = (tmp_path / "logs" / "actor_0" / "logs.csv").read_text()
    assert text.count("actor_steps") == 1  # One header, not one per run.


def test_csv_drops_a_row_cut_short_by_a_kill(tmp_path):
    directory = tmp_path / "logs" / "learner"
    directory.mkdir(parents=True)
    (directory / "logs.csv").write_text("a,b\r\n1,2\r\n3,")  # Killed mid-row.

    logger = csv_only(tmp_path, "learner")
    logger.write({"a": 5, "b": 6})
    logger.close()

    fields, rows = read_csv(tmp_path, "learner")
    assert fields == ["a", "b"]
    assert rows == [{"a": "1", "b": "2"}, {"a": "5", "b": "6"}]


def test_a_rewrite_cut_by_a_kill_leaves_the_file_and_its_temporary_is_removed(tmp_path):
    """SIGKILL between the widened file's write and its rename: the log keeps its rows, and
    the next logger of the label removes the dead writer's temporary file."""
    directory = tmp_path / "logs" / "learner"
    code = f"""
        import os, signal
        from magi_lp.runtime.loggers import CsvLogger
        print(os.getpid(), flush=True)
        logger = CsvLogger({str(directory)!r})
        logger.write({{"a": 1}})
        os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # killed right there
        logger.write({{"a": 2, "b": 3}})  # a new key: the rewrite
        """
    proc = run_python(code, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    left = sorted(p.name for p in directory.iterdir())
    assert left == ["logs.csv", f"logs.csv.tmp-{proc.stdout.strip()}"]

    logger = loggers.CsvLogger(directory)
    assert sorted(p.name for p in directory.iterdir()) == ["logs.csv"]
    logger.write({"a": 4, "b": 5})
    logger.close()
    fields, rows = read_csv(tmp_path, "learner")
    assert fields == ["a", "b"] and rows == [{"a": "1", "b": ""}, {"a": "4", "b": "5"}]


def test_two_live_loggers_on_one_label_are_refused(tmp_path):
    logger = csv_only(tmp_path, "actor")
    with pytest.raises(RuntimeError, match="already being written"):
        csv_only(tmp_path, "actor")
    logger.close()
    csv_only(tmp_path, "actor").close()  # Free again once closed.


def test_array_values_stay_on_one_csv_line(tmp_path):
    logger = csv_only(tmp_path, "eval")
    logger.write({"step": 1, "returns": np.arange(40).reshape(4, 10)})
    logger.close()
    _, rows = read_csv(tmp_path, "eval")
    assert len(rows) == 1
    assert np.array_equal(np.array(eval(rows[0]["returns"])), np.arange(40).reshape(4, 10))


def test_time_delta_drops_rows_between_writes(tmp_path):
    logger = csv_only(tmp_path, "actor", time_delta=3600)
    for step in range(5):
        logger.write({"actor_steps": step})
    logger.close()
    _, rows = read_csv(tmp_path, "actor")
    assert [r["actor_steps"] for r in rows] == ["0"]


# ---------------------------------------------------------------------------------------
# TensorBoard.


def test_tensorboard_event_file_reads_back(tmp_path):
    logger = make_logger(
        "learner", tmp_path, csv=False, terminal=False, time_delta=0, steps_key="learner_steps"
    )
    logger.write({"learner_steps": 100, "critic_loss": 0.5, "actor_loss": jnp.asarray(-1.25)})
    logger.write({"learner_steps": 200, "critic_loss": 0.25, "phase": "train"})
    logger.close()

    scalars = read_tensorboard(tmp_path, "learner")
    assert scalars == {
        "critic_loss": [(100, 0.5), (200, 0.25)],
        "actor_loss": [(100, -1.25)],
    }  # The step key is the x axis, not a curve; the string is skipped.


def test_tensorboard_without_step_key_counts_writes(tmp_path):
    logger = make_logger("evaluator", tmp_path, csv=False, terminal=False, time_delta=0)
    for value in (1.0, 2.0, 3.0):
        logger.write({"episode_return": value})
    logger.close()
    assert read_tensorboard(tmp_path, "evaluator") == {
        "episode_return": [(0, 1.0), (1, 2.0), (2, 3.0)]
    }


@pytest.mark.integration  # a Python process of its own that imports a framework
def test_killed_process_keeps_every_written_row(tmp_path):
    """SIGKILL right after writing, without close(): CSV and TensorBoard hold every row."""
    code = f"""
        import os, signal
        from magi_lp.runtime.loggers import make_logger
        logger = make_logger("learner", {str(tmp_path)!r}, terminal=False, time_delta=0,
                             steps_key="learner_steps")
        for step in range(1, 6):
            logger.write({{"learner_steps": step, "loss": step / 2}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    proc = run_python(code, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]

    _, rows = read_csv(tmp_path, "learner")
    assert [(int(r["learner_steps"]), float(r["loss"])) for r in rows] == [
        (s, s / 2) for s in range(1, 6)
    ]
    assert read_tensorboard(tmp_path, "learner")["loss"] == [(s, s / 2) for s in range(1, 6)]


# ---------------------------------------------------------------------------------------
# Terminal lines, throughput, progress bar.


def test_terminal_line_is_compact_and_ordered(tmp_path, capsys):
    logger = make_logger(
        "actor_0", tmp_path, csv=False, tensorboard=False, time_delta=0, steps_key="actor_steps"
    )
    logger.write(
        {
            "zeta": 1,
            "episode_return": np.float32(12.5),
            "actor_steps": 1000,
            "eta_s": 3725.0,
            "fps": 243.123,
            "episode_length": 500,
            "skipped": None,
        }
    )
    logger.close()
    out = capsys.readouterr().out.strip()
    assert out == ("[actor_0] steps=1000 fps=243.1 return=12.5 eta=1h02m episode_length=500 zeta=1")


def test_format_helpers():
    assert format_duration(42) == "42s"
    assert format_duration(125) == "2m05s"
    assert format_duration(3725) == "1h02m"
    assert format_duration(float("inf")) == "?"
    assert format_ranges([5, 0, 1, 2, 3, 3]) == "0-3,5"
    assert format_ranges([]) == ""
    line = format_terminal_line("learner", {"loss": 0.000123456, "learner_steps": 7.0})
    assert line == "[learner] learner_steps=7 loss=0.0001235"


def test_throughput_tracker_fps_and_eta():
    now = [100.0]
    tracker = ThroughputTracker(
        "actor_steps", 10_000, frames_per_step=2, window_s=10.0, clock=lambda: now[0]
    )
    assert tracker({"actor_steps": 1000, "x": 1}) == {"actor_steps": 1000, "x": 1}  # One sample.

    now[0] = 105.0
    out = tracker({"actor_steps": 1500})
    assert out["fps"] == pytest.approx(200.0)  # 100 steps/s x 2 frames per step.
    assert out["eta_s"] == pytest.approx(85.0)  # 8500 steps left at 100 steps/s.

    # The window forgets old samples: a stall, then 110 steps/s over the last 10 s.
    now[0] = 120.0
    tracker.update(1600)
    now[0] = 121.0
    tracker.update(1700)
    now[0] = 130.0
    out = tracker.update(2700)
    assert out["fps"] == pytest.approx(2 * 110.0)  # (2700 - 1600) / (130 - 120), x 2.
    assert out["eta_s"] == pytest.approx(7300 / 110.0)

    now[0] = 131.0
    assert tracker.update(10_000)["eta_s"] == 0.0

    # The counter going back (a fresh run) restarts the measurement.
    now[0] = 132.0
    assert tracker.update(5) == {}


def test_progress_bar_shows_steps_return_and_rate():
    out = io.StringIO()
    with ProgressBar(1000, label="train", file=out, disable=False, mininterval=0) as bar:
        bar.update(200, episode_return=3.0)
        bar.update(450, episode_return=np.float32(12.5))
        bar.update(500)  # Keeps the last return.
    text = out.getvalue()
    assert "train" in text
    assert "500/1000" in text
    assert "return=12.5" in text
    assert "step/s" in text


# ---------------------------------------------------------------------------------------
# Factory and config.


def test_factory_survives_pickling_and_makes_loggers(tmp_path):
    cloudpickle = pytest.importorskip("cloudpickle")  # Launchpad's pickler (not on 3.12)
    factory = LoggerFactory(workdir=str(tmp_path), tensorboard=False, terminal=False, time_delta=0)
    for copy in (
        pickle.loads(pickle.dumps(factory)),
        cloudpickle.loads(cloudpickle.dumps(factory)),
    ):
        assert copy == factory
    logger = cloudpickle.loads(cloudpickle.dumps(factory))("actor", "actor_steps", 3)
    logger.write({"actor_steps": 1})
    logger.close()
    assert read_csv(tmp_path, "actor_3")[1] == [{"actor_steps": "1"}]


def test_factory_from_config_refuses_unknown_and_bad_keys(tmp_path):
    factory = LoggerFactory.from_config(tmp_path, {"csv": True, "tensorboard": False})
    assert factory == LoggerFactory(workdir=str(tmp_path), csv=True, tensorboard=False)
    with pytest.raises(ConfigError, match=r"logging\.tensorbord"):
        LoggerFactory.from_config(tmp_path, {"tensorbord": True})
    with pytest.raises(ConfigError, match=r"logging\.csv must be True or False"):
        LoggerFactory.from_config(tmp_path, {"csv": "yes"})
    with pytest.raises(ConfigError, match=r"logging\.time_delta"):
        LoggerFactory(workdir=str(tmp_path), time_delta=-1)


def test_wandb_on_but_missing_is_a_config_error(tmp_path, monkeypatch):
    # wandb is pinned in requirements.txt: make it look uninstalled.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "wandb" else real_find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match=r"logging\.wandb.*pip install wandb"):
        LoggerFactory(workdir=str(tmp_path), wandb=True)
    with pytest.raises(ConfigError, match=r"logging\.wandb.*pip install wandb"):
        make_logger("learner", tmp_path, wandb=True)
    assert "wandb" not in sys.modules  # Nothing imported it while it was off.


_WANDB_WRITER = """
import sys
from magi_lp.runtime.loggers import make_logger
workdir, value = sys.argv[1], float(sys.argv[2])
learner = make_logger("learner", workdir, csv=False, tensorboard=False, terminal=False,
                      time_delta=0, wandb=True, wandb_project="magi", steps_key="learner_steps")
learner.write({"learner_steps": value, "critic_loss": value / 10})
# A second label in the same process shares the run.
make_logger("evaluator", workdir, csv=False, tensorboard=False, terminal=False,
            wandb=True).write({"episode_return": 7.0})
learner.close()
"""


@pytest.mark.integration  # a Python process of its own that imports a framework
@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_real_wandb_offline_writes_in_the_workdir_and_a_relaunch_resumes_the_run(tmp_path):
    # The real package in its offline mode: no network, every file under <workdir>/wandb.
    # The writer's temp folder is its own, as a node's is (the launch's private one):
    # wandb-core leaves a folder and a socket there at every exit (wandb/wandb#11518).
    node_tmp = tmp_path / "node_tmp"
    node_tmp.mkdir()
    home = tmp_path / "home"  # wandb-core's debug logs went to ~/.cache/wandb before
    home.mkdir()
    env = dict(
        os.environ,
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        PYTHONPATH=str(REPO),
        TMPDIR=str(node_tmp),
        HOME=str(home),
    )
    for name in ("WANDB_API_KEY", "WANDB_CACHE_DIR", "XDG_CACHE_HOME"):
        env.pop(name, None)
    for value in ("1", "2"):
        subprocess.run(
            [sys.executable, "-c", _WANDB_WRITER, str(tmp_path), value],
            env=env,
            check=True,
            timeout=120,
            cwd=tmp_path,
        )
    run_id = (tmp_path / "wandb" / "learner.run_id").read_text().strip()
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(run.name.endswith(run_id) for run in runs), runs
    for run in runs:
        data = (run / f"run-{run_id}.wandb").read_bytes()
        assert b"learner/critic_loss" in data and b"evaluator/episode_return" in data
    assert not list(Path(tmp_path).glob("*.wandb")), "wandb wrote outside <workdir>/wandb"
    assert not list(home.rglob("*")), f"written in HOME: {list(home.rglob('*'))}"
    assert list((tmp_path / "wandb" / "cache").rglob("core-debug-*.log"))


def test_tensorboard_without_a_writer_is_off_with_one_notice(tmp_path, monkeypatch, capsys):
    """The current stack without tensorboardX: CSV goes on, one notice per process."""
    monkeypatch.setattr(loggers, "tensorboard_backend", lambda: None)
    monkeypatch.setattr(loggers, "_TENSORBOARD_NOTICE_SHOWN", False)
    for label in ("learner", "actor"):
        logger = loggers.make_logger(label, tmp_path, tensorboard=True, terminal=False)
        logger.write({"steps": 1, "loss": 0.5})
        logger.close()
    notices = [
        line for line in capsys.readouterr().err.splitlines() if "logging.tensorboard" in line
    ]
    assert len(notices) == 1 and "neither tensorflow nor tensorboardX" in notices[0], notices
    assert not (tmp_path / "tensorboard").exists()
    assert (tmp_path / "logs" / "learner" / "logs.csv").is_file()
