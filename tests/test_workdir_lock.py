"""`magi_lp.launch.workdir_lock`: one launch per workdir, and no false refusal where the file
system cannot lock."""

from __future__ import annotations

import errno
import fcntl
import subprocess
import sys

import pytest

from magi_lp.errors import ConfigError
from magi_lp.launch import workdir_lock


def test_a_lock_held_by_another_process_is_refused_and_one_that_cannot_be_taken_is_not(
    tmp_path, monkeypatch
):
    path = tmp_path / "run.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\n"
         f"f = open({str(path)!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX)\n"
         "f.write('{\"pid\": 1, \"started\": \"then\", \"command\": \"main.py\"}'); f.flush()\n"
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        for attempt in (workdir_lock.check_free, lambda p, w: workdir_lock.hold(p, w, "x")):
            with pytest.raises(ConfigError) as refused:
                attempt(path, tmp_path)
            assert str(refused.value).startswith(
                f"--workdir {tmp_path} is in use: another launch runs in it (pid 1, started "
                "then: main.py)"
            )
    finally:
        holder.kill()
        holder.wait()
    workdir_lock.check_free(path, tmp_path)  # its holder is gone: free again

    def no_locks(fd, operation):  # NFS without lockd
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    other = tmp_path / "other.lock"
    said = workdir_lock.hold(other, tmp_path, "x")
    assert said == (
        f"{other} cannot be locked here (No locks available): a second launch of this "
        "workdir while this one runs would not be refused"
    )
