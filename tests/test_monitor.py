"""The launcher's status view: rates, ETA, node states, plain lines and the CSV."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

from magi_lp.formatting import format_duration
from magi_lp.launch.monitor import StatusMonitor
from magi_lp.runtime.probe import last_csv_value


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rates_eta_estimate_plain_lines_and_csv(tmp_path):
    clock = _Clock()
    numbers = {}
    out = io.StringIO()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    done = subprocess.Popen([sys.executable, "-c", ""])
    done.wait()
    try:
        monitor = StatusMonitor(
            lambda: numbers,
            max_actor_steps=10_000,
            frames_per_step=2,
            csv_path=tmp_path / "status.csv",
            period_s=3600,  # samples are taken by hand below
            plain_every_s=20,
            live=False,
            stream=out,
            clock=clock,
        )
        monitor.start([("actor", 0, sleeper), ("learner", 0, done)])
        first = monitor.sample()  # nothing counted yet: blanks, no rates
        assert first["program"]["frames"] is None and first["program"]["eta_s"] is None
        assert first["nodes"]["actor/0"]["state"] == "starting"  # alive, no port open
        assert first["nodes"]["learner/0"]["state"] == "finished"
        assert first["nodes"]["actor/0"]["rss_mib"] > 1

        clock.now = 10.0
        numbers.update(actor_steps=1000, learner_steps=0, replay_size=900, replay_inserts=900)
        monitor.sample()
        clock.now = 20.0
        numbers.update(actor_steps=2000, learner_steps=250, replay_inserts=1900, eval_return=7.5)
        row = monitor.sample()["program"]
        assert row["frames"] == 4000
        assert row["frames_per_s"] == 200.0  # (2000 - 1000) steps / 10 s * 2 frames
        assert row["updates_per_s"] == 25.0
        assert row["inserts_per_s"] == 100.0
        assert row["eta_s"] == 80.0  # 8000 steps left at 100 steps/s
        monitor.stop()
    finally:
        sleeper.kill()
        sleeper.wait()

    lines = out.getvalue().splitlines()
    # t=0 and t=20 (every 20 s), plus the one estimate once the learner moved.
    status_lines = [line for line in lines if "frames/s;" in line]
    assert len(status_lines) == 2, lines
    assert "frames 4000; 200.0 frames/s; 25.00 updates/s; replay 900" in status_lines[1]
    assert "eval return 7.5; ETA 1m20s" in status_lines[1]
    estimate = [line for line in lines if "at the measured rate" in line]
    assert len(estimate) == 1 and "in about 1m20s" in estimate[0], lines

    with open(tmp_path / "status.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    assert rows[-1]["frames"] == "4000" and rows[-1]["learner/0:state"] == "finished"
    assert float(rows[-1]["actor/0:rss_mib"]) > 1


def test_a_failing_probe_blanks_the_numbers_but_not_the_view(tmp_path):
    def probe():
        raise TimeoutError("counter gone")

    monitor = StatusMonitor(probe, max_actor_steps=10, live=False, stream=io.StringIO())
    monitor.start([])
    assert monitor.sample()["program"]["frames"] is None
    monitor.stop()


def test_format_duration_and_last_csv_value(tmp_path):
    assert [format_duration(s) for s in (5, 125, 7500, 3 * 86400 + 7200)] == [
        "5s",
        "2m05s",
        "2h05m",
        "3d02h",
    ]
    log = tmp_path / "logs.csv"
    log.write_text("episode_return,steps\n" + "".join(f"{i},{i}\n" for i in range(50)) + ",51\n")
    assert last_csv_value(log, "episode_return") == 49.0
    assert last_csv_value(tmp_path / "missing.csv", "episode_return") is None


def test_without_rich_a_terminal_gets_the_plain_lines(monkeypatch):
    monkeypatch.setitem(sys.modules, "rich", None)  # `import rich...` raises ImportError
    out = io.StringIO()
    monitor = StatusMonitor(lambda: {}, max_actor_steps=10, live=True, stream=out)
    monitor.start([])
    monitor.sample()
    monitor.stop()
    lines = out.getvalue().splitlines()
    assert any("no live status table" in line for line in lines), lines
    assert any("frames/s;" in line for line in lines), lines


_ON_A_TERMINAL = """
import time
from magi_lp.launch.monitor import StatusMonitor
numbers = {"actor_steps": 0}
monitor = StatusMonitor(lambda: numbers, max_actor_steps=1000, period_s=3600)
monitor.start([])
monitor.sample()
numbers["actor_steps"] = 500
time.sleep(0.2)
monitor.sample()
monitor.stop()
print("monitor done")
"""


def test_the_live_table_on_a_terminal():
    # A launcher whose stdout and stderr are a terminal draws the table (rich), as a user's
    # does; both stacks' venvs must have what it needs.
    import os
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", _ON_A_TERMINAL],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert process.wait(timeout=60) == 0, output.decode(errors="replace")[-3000:]
    text = output.decode(errors="replace")
    assert "monitor done" in text and "Traceback" not in text, text[-3000:]
    assert "no live status table" not in text, text[-3000:]
    assert "actor steps" in text or "frames" in text, text[-3000:]
