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

It imports no ML framework and never fails the node: a platform without prctl only loses
the parent-death signal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import tempfile

LAUNCHER_PID_VAR = "MAGI_LP_LAUNCHER_PID"
"""The pid of the launcher process; a node whose parent is another process has lost it."""

RUN_TMP_VAR = "MAGI_LP_RUN_TMP"
"""The run's private temporary folder; each node makes its own folder inside it."""

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Asks the kernel to send `sig` to this process when its parent thread exits.

    Returns False where that is not possible (not Linux, no libc).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


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
    if die_with_parent() and launcher and os.getppid() != int(launcher):
        # The launcher died between starting this process and the prctl above.
        os.kill(os.getpid(), signal.SIGKILL)
    run_tmp = os.environ.get(RUN_TMP_VAR)
    if run_tmp:
        private_tmpdir(run_tmp)
    quiet_gym_notice()


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
