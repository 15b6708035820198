"""A learner checkpoint's JSON metadata, read without orbax or JAX.

`<directory>/<step>/metadata/metadata` is the JSON that `checkpointing.Checkpointer` saves
beside each step's state (its counts among it). The launcher reads it to say where a
relaunch resumes, or that a run is finished, before anything heavy is imported; the nodes
read it to seed a resumed run's streams before they restore.
"""

from __future__ import annotations

import json
import os
from typing import Any

METADATA_ITEM = "metadata"
"""The checkpoint item (orbax's name for it) that holds the JSON metadata."""


def metadata_path(directory: str | os.PathLike, step: int) -> str:
    """`<directory>/<step>/metadata/metadata`: a checkpoint's JSON metadata."""
    return os.path.join(directory, str(step), METADATA_ITEM, "metadata")


def saved_metadata(directory: str | os.PathLike) -> dict[str, Any]:
    """The metadata of the newest finished checkpoint in `directory` whose metadata file
    reads, as plain JSON (no orbax, no state read); {} when there is none. For processes that
    need the counts a relaunch resumes from before (or without) restoring anything."""
    try:
        steps = sorted((int(p) for p in os.listdir(directory) if p.isdigit()), reverse=True)
    except OSError:
        return {}
    for step in steps:
        try:
            with open(metadata_path(directory, step)) as f:
                metadata = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(metadata, dict):
            return metadata
    return {}
