"""Files other processes read while they may be rewritten: written whole or not at all.

`write_atomically` writes through a hidden temporary file beside the target (`.<name>.tmp-*`,
which .gitignore leaves out) and renames it into place: a reader (a node starting while its
job is rewritten, the next launch of a benchmark run) sees the old file or the new one, and a
process killed while writing leaves the old one, never half a file. The temporary file goes
away on any failure but a kill.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Calls `write(temporary_path)`, then renames that file to `path` (mode 0644: nodes may
    run as another user, a pod's)."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(handle)
    try:
        write(temporary)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """`write_atomically` of a text."""
    write_atomically(path, lambda temporary: Path(temporary).write_text(text))
