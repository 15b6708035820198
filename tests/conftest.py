"""The suite's shared set-up.

Lanes: `make test-fast` runs the tests not marked `integration` (no Launchpad program, Reverb
server or entry point is started, nor a Python process of its own that imports TensorFlow, JAX
or wandb); `make test` runs everything, on both stacks.
Names: `tests/test_<module>.py` holds the tests of `<module>` (e.g. test_launcher.py for
magi_lp/launch/launcher.py, test_cluster.py for magi_lp/cluster/, test_drq_<module>.py for
projects/drq_v2/<module>.py); `*_e2e.py` runs a whole program through its entry point
(test_launcher_e2e.py: the launcher as an operator meets it, through projects/td3/lp_main.py).
Shared helpers: `tests/e2e_utils.py` (fresh processes: Python snippets, entry points, leftovers),
`tests/fake_nvidia.py` (the GPUs, driver and CUDA JAX this machine lacks).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator

import pytest

from magi_lp.placement.jax_build import COMPILATION_CACHE_VAR, detect_jax_build


def pytest_configure(config) -> None:
    """Children start with the terminal's SIGINT, however the suite was started.

    A suite started from a script in the background (`cmd &`, nohup, some CI runners)
    inherits SIGINT ignored, and every process it starts would inherit that too: the tests
    that press Ctrl-C on a launcher (and the launcher rightly keeps an inherited ignore)
    would see nothing happen. A handled SIGINT is reset to the default at exec, so the
    children start as a terminal's job would; the test that checks the inherited ignore sets
    it on its own child.
    """
    del config
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _share_compiled_programs()


_MIN_COMPILE_TIME_VAR = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
_cache_folder: str | None = None
_set_here: list[str] = []  # the variables this conftest set, unset at the end
_pytest_root: list[str] = []  # pytest's folder of this user's sessions (`pytest-of-<user>`)


def _share_compiled_programs() -> None:
    """On the current stack, every process of the suite shares one JAX compilation cache,
    removed when the suite ends.

    The suite starts a few hundred processes (entry points, Ray nodes, SLURM steps, the GPU
    check's workers), and most compile the same tiny learner update and policy: several CPU
    seconds each on a 2-core machine. JAX's persistent cache (set through its environment
    variables, which every child inherits) lets the first compile serve the rest; measured
    on this machine, test_gpu_check's injected-GPU run went from 171 s to 95 s. What a test
    proves is unchanged: each program still compiles the first time the suite meets it.

    Not on the Launchpad stack's jaxlib 0.4.30, where a learner running an update read back
    from the cache died of a segmentation fault (`JaxBuild.compilation_cache_safe`; the
    entry points warn of it there). A cache the caller chose (the variable already set) is
    used as it is and left alone. The build is read from package metadata: importing JAX
    here would read the cache's variables before they are set.
    """
    global _cache_folder
    if os.environ.get(COMPILATION_CACHE_VAR) or not detect_jax_build().compilation_cache_safe:
        return
    _cache_folder = tempfile.mkdtemp(prefix="magi_lp_tests_jax_cache_")
    os.environ[COMPILATION_CACHE_VAR] = _cache_folder
    _set_here.append(COMPILATION_CACHE_VAR)
    # Cache every compile: on a busy machine most of the small ones take under JAX's 1 s.
    if _MIN_COMPILE_TIME_VAR not in os.environ:
        os.environ[_MIN_COMPILE_TIME_VAR] = "0"
        _set_here.append(_MIN_COMPILE_TIME_VAR)


def pytest_unconfigure(config) -> None:
    """Removes the suite's JAX cache, and pytest's `pytest-of-<user>` folder once empty.

    pytest removes a passing session's own folder (`tmp_path_retention_policy`) but not the
    folder that holds it, which `make test` then left empty in /tmp. It goes only when
    empty: a failing test's folder is kept in it, and so is a session still running beside
    this one (the other leg of `make test`; the last one to end removes it).
    """
    del config
    for root in _pytest_root:
        with contextlib.suppress(OSError):
            os.rmdir(root)
    if _cache_folder is not None:
        for name in _set_here:
            os.environ.pop(name, None)
        shutil.rmtree(_cache_folder, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _temp_folder_of_this_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This process's temp files go to one folder, removed when the suite ends.

    A `reverb.Server` started without a checkpointer (as most replay tests start theirs)
    makes a folder in the temp folder (Reverb's TempDirCheckpointer) and never removes it:
    `make test` left dozens in /tmp. Only this process is redirected (`tempfile.tempdir`):
    the programs the tests start keep the real temp folder, and a test that checks what a
    program leaves there gives it a TMPDIR of its own (the host's /tmp also holds whatever
    else runs meanwhile: `make test` runs its two legs at once). pytest's own folders
    (`tmp_path`) stay where pytest keeps them: a failing test's, for the failure to be
    looked into (`tmp_path_retention_policy` in pyproject.toml).
    """
    # Resolved under the real temp folder, before the switch.
    _pytest_root.append(str(tmp_path_factory.getbasetemp().parent))
    folder = tempfile.mkdtemp(prefix="magi_lp_tests_")
    before = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = before
        shutil.rmtree(folder, ignore_errors=True)
