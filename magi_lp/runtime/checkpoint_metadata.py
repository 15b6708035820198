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


RUN_SECTIONS = ("agent", "env")
"""The config sections that make a run what it is: a resume continues the run its checkpoint
was saved by, so a relaunch must give them as they were (`run_identity`, saved with each
checkpoint as "config"). The rest (limits, resources, logging, evaluation) may change, and
so may `NOT_IDENTITY`."""

NOT_IDENTITY = ("agent.dataset_num_parallel_calls", "env.video")
"""Keys (and sub-sections) of `RUN_SECTIONS` that change how fast a run goes or what it
records, not what it learns: the replay's readers, DrQ-v2's evaluation videos."""


def run_identity(config: Any) -> dict[str, Any]:
    """`RUN_SECTIONS` of `config` as plain JSON values (tuples as lists)."""
    sections = {name: config[name].to_dict() for name in RUN_SECTIONS if name in config}
    return json.loads(json.dumps(sections, default=str))


def identity_differences(saved: Any, current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, saved value, current value) for every key of `RUN_SECTIONS` that both the
    checkpoint's saved identity and this run's have and that differs (`NOT_IDENTITY` aside);
    [] for a checkpoint that saved none (written before identities were). A key on one side
    only is another version of the project's (a setting added or removed since): not a
    difference the user made, and no flag could give it."""
    if not isinstance(saved, dict):
        return []
    found: list[tuple[str, Any, Any]] = []

    def walk(prefix: str, before: Any, now: Any) -> None:
        if prefix in NOT_IDENTITY:
            return
        if isinstance(before, dict) and isinstance(now, dict):
            for key in sorted(set(before) & set(now)):
                walk(f"{prefix}.{key}", before[key], now[key])
        elif before != now:
            found.append((prefix, before, now))

    for section in RUN_SECTIONS:
        if section in saved and section in current:
            walk(section, saved[section], current[section])
    return found
