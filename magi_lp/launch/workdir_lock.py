"""One launch per workdir: the launching process holds an exclusive lock on its lock file
(`<workdir>/run.lock`, `Workdir.lock`).

Two launches of one workdir at once wrote into each other's run: the second rotated the
first's node logs, started a second learner and replay, and saved its checkpoints into the
first's folder. `hold(path, workdir, command)` takes the lock (`flock`, released by the kernel when
the process ends, however it ends: a killed launch never leaves a stale lock), writes who
holds it into the file, and refuses in one line when another live process holds it. The lock
is this process's for its lifetime: the nodes it starts do not inherit it (Python opens files
non-inheritable), and a relaunch after it ended takes it again.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import IO

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError

_held: dict[Path, IO[str]] = {}  # lock file -> it, open: kept open while this process runs


def hold(path: Path, workdir: Path, command: str) -> str | None:
    """Takes the lock file `path` of `workdir` for this process (once), or refuses: another
    launch runs in that workdir. A file system that cannot lock (NFS without lockd, Lustre
    without `flock`) or a lock file this user cannot open is no refusal: the warning
    returned says that a second launch would not be refused there."""
    path = path.absolute()
    if path in _held:
        return None
    try:
        lock = open(path, "a+")  # noqa: SIM115  (held open for the process's life)
    except OSError as error:
        return f"{path} cannot be opened ({error.strerror}): {_UNGUARDED}"
    try:
        cannot = _lock(lock, workdir)
    except ConfigError:
        lock.close()
        raise
    if cannot:
        lock.close()
        return f"{path} cannot be locked here ({cannot}): {_UNGUARDED}"
    lock.seek(0)
    lock.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    lock.write(json.dumps({"pid": os.getpid(), "started": started, "command": command}) + "\n")
    lock.flush()
    _held[path] = lock
    return None


def check_free(path: Path, workdir: Path) -> None:
    """Refuses at once, before anything is started or planned, when another launch holds
    `path` (a probe: the lock is taken and let go; `hold` takes it for the run)."""
    if not path.is_file():
        return
    try:
        with open(path) as probe:
            if not _lock(probe, workdir):  # else it cannot lock here: `hold` says so
                fcntl.flock(probe.fileno(), fcntl.LOCK_UN)
    except OSError:
        return


def _lock(file: IO[str], workdir: Path) -> str | None:
    """Locks `file` without waiting: None once locked, why where this file system cannot
    lock it; refuses when another process holds it (naming the holder it wrote)."""
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        raise _in_use(workdir, _holder(file.read())) from None
    except OSError as error:
        return str(error.strerror)
    return None


_UNGUARDED = "a second launch of this workdir while this one runs would not be refused"


def _in_use(workdir: Path, holder: str) -> ConfigError:
    return ConfigError(
        fact_refusal(
            f"--workdir {workdir} is in use",
            f"another launch runs in it ({holder}); two would write into one run",
            "stop that one first (Ctrl-C or SIGTERM saves it), or pick another --workdir",
        )
    )


def _holder(text: str) -> str:
    """Who holds the lock, in words, from what it wrote ('pid N, started T: command')."""
    try:
        found = json.loads(text)
        return f"pid {found['pid']}, started {found['started']}: {found['command']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not said who it is yet"
