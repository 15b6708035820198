"""The folders of one local launch: the node logs in the workdir, the private temp folder.

- `<log_dir>/<group>/<index>`: each node's output; an earlier launch's logs are kept as
  `<index>.<n>` (`keep_earlier_logs`; a node of several hosts, its own: `keep_earlier_log`),
  so a resumed run does not overwrite them;
- `<log_dir>/launcher.log`: the launcher's own lines, dated (`reporter`);
- a private temp folder per launch (`make_run_temp`): Launchpad's job files and every
  node's TMPDIR, removed at the end; one whose launcher was SIGKILLed is removed by the
  isolation parent as the launcher dies, or by the next launch (`sweep_stale_run_folders`).
  A run in one process (`main.py`) takes one as its own temp folder (`private_temp`). A Ray
  run's folder (`magi_lp.engines.ray_paths`) carries the same owner file and is swept alike.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO

from magi_lp import console
from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError

RUN_TMP_PREFIX = "magi_lp_launch_"
RAY_TMP_PREFIX = "magi_lp_ray_"
"""A Ray run's folder (its session, sockets and the nodes' TMPDIR): `ray_paths`."""
RUN_PREFIXES = (RUN_TMP_PREFIX, RAY_TMP_PREFIX)
OWNER_FILE = "launcher.pid"


def make_run_temp() -> str:
    """A new private temp folder for one launch, marked with this launcher's pid."""
    run_tmp = tempfile.mkdtemp(prefix=RUN_TMP_PREFIX)
    mark_owner(run_tmp)
    return run_tmp


def mark_owner(folder: str) -> None:
    """Marks `folder` as this process's: removed by a sweep once this process is gone."""
    Path(folder, OWNER_FILE).write_text(str(os.getpid()))


LAUNCHER_LOG = "launcher.log"
"""The launcher's own lines, appended beside the node logs (`<log_dir>/launcher.log`)."""


def reporter(stream: TextIO | None, path: Path) -> Callable[[str], None]:
    """The launcher's lines: on its terminal, and appended to `path` with the date, so that
    what a run's launcher said (a dead node's cause, a stop's stages, a SIGKILL) stays in the
    workdir after the terminal is gone. A line that cannot be written there is only shown."""

    def report(text: str) -> None:
        console.say(text, source="launcher", stream=stream)
        with contextlib.suppress(OSError), open(path, "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    return report


def keep_earlier_logs(log_dir: Path) -> int | None:
    """Renames the node logs of an earlier launch `<index>` -> `<index>.<n>`; returns n."""
    current = [p for p in log_dir.glob("*/*") if p.is_file() and p.name.isdigit()]
    if not current:
        return None
    launch_number = _next_number(log_dir.glob("*/*.*"))
    for path in current:
        path.rename(path.with_name(f"{path.name}.{launch_number}"))
    return launch_number


def keep_earlier_log(path: Path) -> int | None:
    """Renames one node's log of an earlier launch `<index>` -> `<index>.<n>`; returns n.

    For a node that opens its own log (`magi_lp.cluster.host_node`, each on its host, the
    log folder shared): n counts this node's earlier logs, so nodes that start at different
    moments need not agree on a number that another one may have taken meanwhile.
    """
    if not path.is_file():
        return None
    launch_number = _next_number(path.parent.glob(f"{path.name}.*"))
    path.rename(path.with_name(f"{path.name}.{launch_number}"))
    return launch_number


def _next_number(kept: Iterable[Path]) -> int:
    """One more than the highest launch number `<index>.<n>` among `kept` (1 for none)."""
    numbers = [int(suffix) for p in kept if (suffix := p.name.rpartition(".")[2]).isdigit()]
    return max(numbers, default=0) + 1


def sweep_stale_run_folders(temp_dir: str, prefixes: tuple[str, ...] = RUN_PREFIXES) -> list[Path]:
    """Removes the run folders in `temp_dir` whose launcher is gone (one that was SIGKILLed);
    returns them."""
    removed = []
    for prefix in prefixes:
        for folder in Path(temp_dir).glob(f"{prefix}*"):
            try:
                owner = int(Path(folder, OWNER_FILE).read_text())
            except (OSError, ValueError):
                continue  # not ours, or still being set up
            if not _alive(owner) or owner == os.getpid():
                _remove_owned(folder)
                if not folder.exists():
                    removed.append(folder)
    return removed


REMOVAL_PASSES = 5
"""How often `_remove_owned` empties a folder that something still writes into."""


def _remove_owned(folder: Path) -> None:
    """Removes a run folder, its owner file last, and only once nothing else is left in it:
    a removal cut short (a file that cannot be removed, a stop, a thread of the leaving
    process that still writes there) leaves a folder the next sweep still knows as a run's.
    The owner file is put back if something was written between the last pass and the
    folder's removal (a node leaving with `os._exit` while its main thread still ran: the
    folder stayed, unowned, where no sweep removes it). Another process's sweep may remove
    it meanwhile (a SLURM job's nodes of one host start together and each sweeps the host's
    temp dir): what is already gone is no error."""
    owner = Path(folder, OWNER_FILE)
    for attempt in range(REMOVAL_PASSES + 1):
        try:
            entries = [entry for entry in folder.iterdir() if entry.name != OWNER_FILE]
        except FileNotFoundError:
            return
        if not entries:
            break
        if attempt == REMOVAL_PASSES:
            return  # still written into: the owner file stays, and a later sweep removes it
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
    try:
        mark = owner.read_text()
    except OSError:
        mark = None  # another sweep took the owner file: still the folder
    with contextlib.suppress(OSError):
        owner.unlink()
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass
    except OSError:  # written into meanwhile: owned again, for the next sweep
        if mark is not None:
            with contextlib.suppress(OSError):
                owner.write_text(mark)


def _alive(pid: int) -> bool:
    """Whether process `pid` exists, with the standard library only: the isolation parent
    runs this module, and the isolation tests start it with a system Python (no psutil)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


def prepared_folder(folder: str | os.PathLike, named: str) -> Path:
    """`folder` (absolute) made with its parents where missing; where it cannot be, a
    `ConfigError` in one line that names it as `named` ("--workdir /x/run") and says why."""
    path = Path(folder).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            fact_refusal(
                f"{named} cannot be created", str(error.strerror), "pick a path you can write to"
            )
        ) from None
    return path


_PRIVATE_TEMPS: list[str] = []
"""This process's private temp folders in use (`private_temp`), innermost last."""
_PRIVATE_TEMPS_LOCK = threading.Lock()


@contextlib.contextmanager
def private_temp() -> Iterator[str]:
    """This process's temp folder (TMPDIR and `tempfile.tempdir`) is a fresh run temp folder
    while the block runs; then it is removed and the old one restored.

    What libraries leave in the temp folder goes with it: TensorFlow's autograph files, for
    one, which TF removes only at a normal interpreter exit. A process that leaves from
    inside the block with `os._exit` (a node: `node_lifetime.leave_process`) removes it first
    (`remove_private_temps`). A process killed with SIGKILL leaves its folder; the isolation
    parent (where there is one) or the next launch or run on this machine removes it
    (`sweep_stale_run_folders`, by its owner's pid).
    """
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    sweep_stale_run_folders(tempfile.gettempdir())
    run_tmp = make_run_temp()
    os.environ["TMPDIR"] = run_tmp
    tempfile.tempdir = run_tmp
    with _PRIVATE_TEMPS_LOCK:
        _PRIVATE_TEMPS.append(run_tmp)
    try:
        yield run_tmp
    finally:
        if before[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before[0]
        tempfile.tempdir = before[1]
        with _PRIVATE_TEMPS_LOCK:
            if run_tmp in _PRIVATE_TEMPS:  # else a leaving thread has it
                _PRIVATE_TEMPS.remove(run_tmp)
                _remove_owned(Path(run_tmp))


def remove_private_temps() -> None:
    """Removes this process's private temp folders now: called just before the process
    leaves with `os._exit`, which skips the `private_temp` block's own removal (each node of
    a SLURM job left its folder in the host's /tmp). A second thread leaving at the same
    time waits for the first one's removal, which a sooner `os._exit` would cut short; the
    owner file goes last, so a removal cut short all the same (a SIGKILL) leaves a folder
    the next sweep knows."""
    with _PRIVATE_TEMPS_LOCK:
        while _PRIVATE_TEMPS:
            _remove_owned(Path(_PRIVATE_TEMPS.pop()))
