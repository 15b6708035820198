"""Where a run's Ray files go: a folder whose socket paths fit Linux's limit.

Ray puts its sockets under its temp folder (`_temp_dir`, `ray start --temp-dir`), at
`session_<start time>_<driver pid>/sockets/plasma_store` (and `raylet`), and checks each path
against Linux's AF_UNIX limit of 107 bytes. Its own default root on Linux is /tmp, not the
temp folder, for that reason. A run's Ray folder goes under the temp folder where its longest
socket path fits, else under /tmp (`run_temp_folder`); the SLURM job's script applies the
same rule to its machines' Ray folders (`longest_root`). Seen with the test suite's own temp
folder (/tmp/magi_lp_tests_<8>/magi_lp_ray_<8>/...: 109 bytes). If Ray changes the layout: a
long TMPDIR stops Ray's start with "validate_socket_filename failed". No Ray import here.
"""

from __future__ import annotations

import os
import tempfile

from magi_lp.launch import run_folders

SOCKET_PATH_LIMIT = 107
"""Linux's AF_UNIX path limit (108 bytes) less the terminating byte, as Ray checks it."""
LONGEST_SOCKET = "session_2026-11-27_08-12-52_585813_4194304/sockets/plasma_store"
"""The longest path Ray puts a socket at under its temp folder: the session (its start time
to the microsecond, the driver's pid of up to 7 digits), then the plasma store's socket."""
RAY_FALLBACK_ROOT = "/tmp"


def longest_root(folder_name: str) -> int:
    """The longest temp folder (in bytes) under which a Ray folder named `folder_name` keeps
    Ray's longest socket path within `SOCKET_PATH_LIMIT`."""
    return SOCKET_PATH_LIMIT - len(f"/{folder_name}/{LONGEST_SOCKET}".encode())


def run_temp_folder(prefix: str = run_folders.RAY_TMP_PREFIX) -> str:
    """A new folder for one run's Ray files (the caller removes it): under the temp folder
    where Ray's longest socket path there fits `SOCKET_PATH_LIMIT`, else under /tmp. It is
    marked as this process's (`run_folders.OWNER_FILE`), and the folders of runs whose
    driver was SIGKILLed are removed first, in both places.

    Raises:
      ConfigError: one line naming TMPDIR and the longest it may be, where neither fits or
        can be written (before Ray starts anything).
    """
    from magi_lp.config_schema import fact_refusal
    from magi_lp.errors import ConfigError

    name = prefix + "x" * 8  # mkdtemp's 8 random characters
    roots = dict.fromkeys((tempfile.gettempdir(), RAY_FALLBACK_ROOT))
    room = longest_root(name)
    for root in roots:
        run_folders.sweep_stale_run_folders(root, (prefix,))
    for root in roots:
        if len(root.encode()) <= room and os.access(root, os.W_OK | os.X_OK):
            folder = tempfile.mkdtemp(prefix=prefix, dir=root)
            run_folders.mark_owner(folder)
            return folder
    raise ConfigError(
        fact_refusal(
            f"TMPDIR {tempfile.gettempdir()}",
            f"Ray's socket paths under it would pass Linux's {SOCKET_PATH_LIMIT}-byte limit, "
            f"and {RAY_FALLBACK_ROOT} cannot be written",
            f"set TMPDIR to a writable folder of at most {room} characters (e.g. TMPDIR=/tmp)",
        )
    )
