"""Repacks a wheel for a GPU machine's offline `pip install --no-deps`: drops files no run
there reads, and the `Requires-Python` bound of a wheel that works past it.

    python scripts/repack_wheel.py WHEEL [--drop PREFIX ...] [--any-python]

Used by scripts/gpu_learn_wheels.sh: dm_control's wheel is 56 MB, mostly assets of the
locomotion walkers, soccer and the dog that the DrQ-v2 suite tasks never load, and a call to
the GPU machine carries at most 64 MiB; dm-acme 0.4.0 says Python <= 3.10 but the modules
magi_lp.acme_api loads run on 3.12 (tests/test_current_stack.py). The wheel is rewritten in
place with a matching RECORD.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack(wheel: Path, drop: list[str], any_python: bool) -> tuple[int, int]:
    """Rewrites `wheel`; returns (files dropped, bytes after)."""
    with zipfile.ZipFile(wheel) as source:
        members = [(info, source.read(info)) for info in source.infolist()]
    # The wheel's own RECORD, at the top (a vendored package's, deeper, is a file like others:
    # ray carries several).
    record = next(
        info.filename
        for info, _ in members
        if info.filename.endswith(".dist-info/RECORD") and info.filename.count("/") == 1
    )
    kept, dropped = [], 0
    for info, data in members:
        if info.filename == record:
            continue
        if any(info.filename.startswith(prefix) for prefix in drop):
            dropped += 1
            continue
        if any_python and info.filename.endswith(".dist-info/METADATA"):
            data = re.sub(rb"(?m)^Requires-Python:.*\n", b"", data)
        kept.append((info, data))
    lines = [_record_line(info.filename, data) for info, data in kept if not info.is_dir()] + [
        f"{record},,"
    ]
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as target:
        for info, data in kept:
            target.writestr(info, data)
        target.writestr(record, "\n".join(lines) + "\n")
    tmp.replace(wheel)
    return dropped, wheel.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--drop", action="append", default=[], help="a path prefix to leave out")
    parser.add_argument("--any-python", action="store_true", help="drop Requires-Python")
    args = parser.parse_args(argv)
    dropped, size = repack(args.wheel, args.drop, args.any_python)
    print(f"{args.wheel.name}: {dropped} files left out, {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
