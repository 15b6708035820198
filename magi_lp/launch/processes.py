"""Find and end local processes: those whose environment carries a marker, a whole tree, or
this process's children; and tie this process's life to its parent's (`die_with_parent`).

A run that must leave nothing behind puts a marker variable (`NAME=<random id>`) into the
environment of what it starts. Every descendant inherits it, including one that was re-parented
to init after its parent died, so the marker finds what a process tree no longer shows. The
launcher marks its nodes with MAGI_LP_LAUNCH_ID; tests and benchmarks mark the commands they
run. A process that scrubs its own environment escapes; nothing in Launchpad or Acme does.

psutil is imported where it is used: `magi_lp.launch.isolation` imports this module for
`die_with_parent`, and may run on a Python without psutil.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, *, libc: Any = None) -> bool:
    """Asks the kernel to send `sig` to this process when its parent thread exits.

    Returns False where that is not possible (not Linux, no libc). `libc` is an already
    loaded `ctypes.CDLL(None, use_errno=True)`, for a caller between fork and exec that must
    make nothing but system calls. A parent that died before this call is not noticed: the
    caller compares `os.getppid()` with the parent it expects.
    """
    try:
        if libc is None:
            libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def end_children(
    *, grace_s: float | None = None, wait_s: float = 0.0, also: Iterable[psutil.Process] = ()
) -> list[str]:
    """Ends every process below this one, and those in `also`; returns `pid (name)` of each
    one it SIGKILLed.

    With `grace_s` (seconds) they get SIGTERM first, and only those still alive `grace_s`
    later get SIGKILL. With `wait_s` > 0, waits up to that long until the SIGKILLed are dead.
    Best effort: where the process table cannot be read (or psutil is missing), there is
    nothing to end.
    """
    try:
        import psutil
    except ImportError:
        return []
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(Exception):
        found.update({p.pid: p for p in psutil.Process().children(recursive=True)})
    found.update({p.pid: p for p in also})
    left = list(found.values())
    if not left:
        return []
    if grace_s is not None:
        for proc in left:
            with contextlib.suppress(Exception):
                proc.terminate()
        with contextlib.suppress(Exception):
            _, left = psutil.wait_procs(left, timeout=grace_s)
    return kill_processes(left, wait_s=wait_s)


def processes_marked(var: str, value: str) -> list[psutil.Process]:
    """Live processes (not zombies, not this one) whose environment holds `var=value`."""
    import psutil

    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(var) == value and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue  # gone, a zombie, or someone else's process: none of ours
    return found


def kill_processes(processes: Iterable[psutil.Process], *, wait_s: float = 0.0) -> list[str]:
    """SIGKILLs `processes`; returns `pid (name)` of each one it signalled.

    psutil refuses a pid that another process has taken since `processes` were found. With
    `wait_s` > 0, waits up to that long until they are dead (see `wait_dead`).
    """
    import psutil

    killed, described = [], []
    for proc in processes:
        try:
            description = f"{proc.pid} ({proc.name()})"
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            continue
        killed.append(proc)
        described.append(description)
    if wait_s > 0 and killed:
        wait_dead(killed, wait_s)
    return described


def kill_marked(var: str, value: str, *, wait_s: float = 0.0) -> list[str]:
    """SIGKILLs every process `processes_marked(var, value)` finds; returns `pid (name)`s."""
    return kill_processes(processes_marked(var, value), wait_s=wait_s)


def kill_tree(pid: int, *, wait_s: float = 0.0) -> list[str]:
    """SIGKILLs process `pid` first (so it cannot start more), then every process below it."""
    import psutil

    try:
        root = psutil.Process(pid)
        descendants = root.children(recursive=True)
    except psutil.Error:
        return []
    return kill_processes([root, *descendants], wait_s=wait_s)


def wait_dead(processes: Iterable[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Waits up to `timeout_s` until `processes` are dead; returns those still alive then.

    Reaps those that are this process's children. A dead process re-parented to init stays a
    zombie until init reaps it, which can take a second or more (e.g. in containers); it runs
    no code, so it counts as dead here.
    """
    import psutil

    me = os.getpid()
    deadline = time.monotonic() + timeout_s
    pending = list(processes)
    while pending:
        still = []
        for proc in pending:
            try:
                if proc.ppid() == me:
                    proc.wait(0)
                elif proc.status() != psutil.STATUS_ZOMBIE:
                    still.append(proc)
            except psutil.TimeoutExpired:
                still.append(proc)
            except psutil.Error:
                continue
        pending = still
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return pending
