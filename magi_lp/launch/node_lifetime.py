"""What every node process does first, before Launchpad unpickles and builds the node.

The launcher hands each node this module's `enter_node` as Launchpad's `--init_file` (a
cloudpickled function that `launchpad/nodes/python/process_entry.py` runs before it loads
the node functions, i.e. before TensorFlow, JAX or Reverb are imported). It:

- makes the node die with the launcher: `prctl(PR_SET_PDEATHSIG, SIGKILL)`. The signal is
  tied to the thread that forked the node, which is the launcher's main thread (`lp.launch`
  runs there, and the launcher exits when that thread ends). SIGKILL, not SIGTERM: a
  launcher that dies without stopping its nodes died abnormally (a stop, Ctrl-C or the
  isolation parent's SIGTERM all go through its staged stop), and with SIGTERM a node whose
  interpreter hangs on its way out (measured: 1 of 6 nodes still alive 20 s later) would
  outlive it; the run resumes from its last periodic checkpoint. A launcher that died
  before the prctl took effect is noticed through the parent pid.
- gives the node a private temporary folder, `<run temp folder>/node-<pid>`, as TMPDIR and as
  Python's `tempfile.tempdir`, so whatever the node's libraries leave there (TensorFlow's
  autograph files, which TF deletes only at a normal interpreter exit that `os._exit`
  skips) goes when the launcher removes the run's temp folder.

- makes the node end by itself at a stop, whatever its main thread is blocked in
  (`watch_for_stop`). Python runs a signal handler only between bytecodes of the main thread,
  so a node blocked in C++ (a Reverb insert held back by the rate limiter, a sample, a
  Courier call) never sees Launchpad's SIGTERM handler, and Launchpad's own escalation
  (SIGKILL of itself 10 s later) needs that handler too. The interpreter's C-level handler
  still writes the signal's number to the wakeup fd (`signal.set_wakeup_fd`), which a
  watcher thread reads: on SIGTERM it sets Launchpad's stop event itself (so
  `lp.wait_for_stop()` returns in every thread at once) and, if the process is still there
  `MAGI_LP_NODE_STOP_SECS` (default 1) seconds later, flushes its output and leaves it
  (`os._exit`), unless the node holds its exit for a final save (`hold_exit`). Launchpad's
  node-side SIGKILL is switched off: the launcher's SIGKILL after its notice stays the last
  resort, and it reports one as a fault.
- makes a node that returns at a stop leave at once instead of finalising its interpreter
  (`_leave_at_exit`, an atexit hook registered first, so it runs after every library's own).
  Measured under load (load 8 on 2 cores): a replay, learner and actor whose run returned
  0.7 s after SIGTERM were still finalising (TensorFlow, gRPC, Reverb teardown) 3 s later,
  and the watcher could not help, because Python stops daemon threads once finalisation
  begins. Nothing is left to do then: logs are flushed per row and a final save is held.
- ends the processes the node itself started (`leave_process`): a node that leaves takes
  its children with it (SIGTERM, then SIGKILL within the stop budget), so the launcher's
  sweep of marked processes is left for nodes that were killed.

It imports no ML framework and never fails the node: a platform without prctl only loses
the parent-death signal.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from magi_lp.launch import launchpad_seam, processes, run_folders

LAUNCHER_PID_VAR = "MAGI_LP_LAUNCHER_PID"
"""The pid of the launcher process; a node whose parent is another process has lost it."""

RUN_TMP_VAR = "MAGI_LP_RUN_TMP"
"""The run's private temporary folder; each node makes its own folder inside it."""

LIMIT_REACHED = "the coordinator reached max_actor_steps"
"""Why the program stops when its coordinator asks (`NodeLifetime.stop_program`), in the
launcher's words on every engine."""

STOP_REQUEST_FILE = "stop_requested"
"""In the run's temp folder: made by the node that asks the launcher to stop the program,
just before Launchpad's `lp.stop()` SIGTERMs the launcher, so the launcher can tell that
SIGTERM from one sent from outside (`note_stop_request`, `requested_stop`)."""

STOP_SECS_VAR = "MAGI_LP_NODE_STOP_SECS"
"""Seconds a node may take to end by itself after SIGTERM before it leaves its process."""

# Nothing but a final save (held with `hold_exit`) needs longer: node logs are flushed per
# row, and an actor, evaluator or counter has nothing else to finish.
DEFAULT_STOP_SECS = 1.0


def private_tmpdir(run_tmp: str) -> str | None:
    """Makes `<run_tmp>/node-<pid>` this process's temp folder; returns it (None if not made)."""
    path = os.path.join(run_tmp, f"node-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path
    return path


def enter_node() -> None:
    """Parent-death signal and private temp folder for this node (Launchpad's init hook)."""
    launcher = os.environ.get(LAUNCHER_PID_VAR)
    if processes.die_with_parent(signal.SIGKILL) and launcher and os.getppid() != int(launcher):
        # The launcher died between starting this process and the prctl above.
        os.kill(os.getpid(), signal.SIGKILL)
    run_tmp = os.environ.get(RUN_TMP_VAR)
    if run_tmp:
        private_tmpdir(run_tmp)
    quiet_gym_notice()
    if watch_for_stop(stop_secs_from_env()):
        atexit.register(_leave_at_exit)


def note_stop_request() -> None:
    """Marks, in the run's temp folder, that a node of the program asks for its stop (the
    coordinator at `max_actor_steps`). Nothing where there is no such folder (a node on
    another host): the launcher then names the signal."""
    run_tmp = os.environ.get(RUN_TMP_VAR)
    if run_tmp:
        with contextlib.suppress(OSError):
            open(os.path.join(run_tmp, STOP_REQUEST_FILE), "a").close()


def requested_stop(run_tmp: str) -> str | None:
    """Why a node of the launch whose temp folder is `run_tmp` asked for the stop
    (`LIMIT_REACHED`), or None when none did."""
    return LIMIT_REACHED if os.path.exists(os.path.join(run_tmp, STOP_REQUEST_FILE)) else None


def stop_secs_from_env(environ: dict[str, str] | None = None) -> float:
    """The node's stop budget from MAGI_LP_NODE_STOP_SECS (default 1 s; bad values too)."""
    raw = (os.environ if environ is None else environ).get(STOP_SECS_VAR, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_STOP_SECS
    return value if value >= 0 else DEFAULT_STOP_SECS


class _StopWatch:
    """What the watcher thread knows: when SIGTERM came, who holds the exit, the managers."""

    def __init__(self, stop_secs: float):
        self.stop_secs = stop_secs
        self.stop_at: float | None = None
        self.holds: list[str] = []
        self.managers: list = []
        self.uncaught = False
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)


_WATCH: _StopWatch | None = None


def stop_requested() -> bool:
    """Whether this node process got its SIGTERM (False where no watcher runs)."""
    return _WATCH is not None and _WATCH.stop_at is not None


@contextlib.contextmanager
def hold_exit(why: str) -> Iterator[None]:
    """Keeps the stop watcher from leaving the process while the block runs (a final save).

    The launcher's notice still bounds the wait: its SIGKILL is the last resort.
    """
    watch = _WATCH
    if watch is None:
        yield
        return
    with watch.lock:
        watch.holds.append(why)
    try:
        yield
    finally:
        with watch.changed:
            watch.holds.remove(why)
            watch.changed.notify_all()


def watch_for_stop(stop_secs: float) -> bool:
    """Starts the node's stop watcher (main thread only; once); returns whether it runs."""
    global _WATCH
    if _WATCH is not None:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(read_fd)
        os.close(write_fd)
        return False
    watch = _StopWatch(stop_secs)
    _WATCH = watch
    launchpad_seam.record_worker_managers(watch.managers)
    previous_hook = sys.excepthook

    def note_uncaught(*args):
        watch.uncaught = True
        previous_hook(*args)

    sys.excepthook = note_uncaught
    threading.Thread(
        target=_watch, args=(watch, read_fd), name="magi_lp-stop-watch", daemon=True
    ).start()
    return True


def _watch(watch: _StopWatch, read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data:
            break
    watch.stop_at = time.monotonic()
    for manager in list(watch.managers):
        with contextlib.suppress(Exception):
            manager.stop_event().set()
    deadline = watch.stop_at + watch.stop_secs
    with watch.changed:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 and not watch.holds:
                break
            watch.changed.wait(timeout=max(left, 0.2))
    where = _main_thread_position()
    _say(
        f"still running {time.monotonic() - watch.stop_at:.1f} s after SIGTERM "
        f"(main thread in {where}); leaving the process"
    )
    leave_process(1 if watch.uncaught else 0, children_secs=CHILDREN_STOP_SECS)


CHILDREN_STOP_SECS = 0.3
"""How long a leaving node waits for its own children to end on SIGTERM before SIGKILL."""


def _leave_at_exit() -> None:
    """atexit: a node whose main thread returned at a stop leaves without finalising."""
    watch = _WATCH
    if watch is None or not _stopping(watch):
        return  # a node that ended by itself exits as usual
    leave_process(1 if watch.uncaught else 0, children_secs=CHILDREN_STOP_SECS)


def _stopping(watch: _StopWatch) -> bool:
    """Whether this node got its SIGTERM. Launchpad's own handler may have set the stop
    event, and the main thread returned, before the watcher thread read the signal."""
    if watch.stop_at is not None:
        return True
    for manager in list(watch.managers):
        with contextlib.suppress(Exception):
            if manager.stop_event().is_set():
                return True
    return False


def leave_process(code: int = 0, *, children_secs: float = CHILDREN_STOP_SECS) -> None:
    """Ends this node's process now: its own child processes first, then its private temp
    folder (`run_folders.private_temp`, a node started by `magi_lp.cluster.host_node`), then
    its output is flushed and the interpreter left without finalising (`os._exit`)."""
    killed = processes.end_children(grace_s=children_secs, wait_s=children_secs)
    if killed:
        _say(f"killed processes this node had started that did not end on SIGTERM: {killed}")
    run_folders.remove_private_temps()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _main_thread_position() -> str:
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "its exit"
    return f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})"


def _say(text: str) -> None:
    from magi_lp.console import say

    with contextlib.suppress(Exception):
        say(f"stop: {text}", source="node")


def quiet_gym_notice() -> None:
    """Drops gym's import-time deprecation banner (acme.wrappers imports gym).

    gym 0.26 prints a notice from the `gym_notices` package to stderr when it is first
    imported; the run does not use gym, so the banner only buries the run's own lines.
    """
    try:
        from gym_notices import notices
    except ImportError:
        return
    notices.notices.clear()
