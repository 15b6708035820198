"""The dm-reverb 0.7.0 internals magi_lp relies on, in one place.

Reverb's public API (`reverb.Server`, `reverb.Table`, `Client.server_info`, the trajectory
writer, `reverb.TrajectoryDataset`) is used as documented everywhere else. What it does not
offer comes from the two places below, and those are only touched here. Each, with what
breaks if an upgrade changes it:

- `Client._client.NewSampler(table, max_samples, in_flight)`, the pybind object behind the
  public `Client.sample` generator, whose `GetNextTrajectory()` returns an item's columns and
  whose `Close()` cancels a read blocked on an empty table from another thread
  (`open_sampler`). The learner's drain of the device store's step queue
  (`magi_lp.replay.frame_queue.QueueDrainer`) needs that cancel: a stop must not wait for an
  actor to write, and the public generator cannot be cancelled. If it changes: the device
  store cannot be filled in a distributed program (store 'device').
- `Table.info` (a `TableInfo` proto: `sampler_options` / `remover_options` as
  `KeyDistributionOptions`, `max_size`, `max_times_sampled`, `signature`): Reverb has no
  `Table.replace`, so the single-process runner rebuilds an agent's tables without their rate
  limiters from it (`without_rate_limit`). If it changes: a Reverb replay in one process
  cannot be rebuilt (one process with Reverb, Python 3.10 only).

Each function checks what it needs and raises one RuntimeError naming the attribute and the
pinned version (requirements.txt) instead of failing somewhere inside Reverb. Exercised by
tests/test_frame_queue.py (the sampler and its cancel) and the single-process runner's tests
on the Launchpad stack (tests/test_runtime.py).
"""

from __future__ import annotations

from typing import Any

PINNED = "dm-reverb 0.7.0 as pinned in requirements.txt"


def _require(owner: Any, name: str, what: str) -> Any:
    if not hasattr(owner, name):
        raise RuntimeError(
            f"reverb's {what} no longer has {name}; magi_lp supports {PINNED} "
            "(magi_lp/replay/reverb_seam.py lists what it relies on)."
        )
    return getattr(owner, name)


def open_sampler(client: Any, table: str, in_flight: int) -> Any:
    """A cancellable sampler of `table` over `client` (a `reverb.Client`), unbounded.

    Returns an object with `GetNextTrajectory()` (the next item's columns: its key,
    probability, table size and priority, then the data) and `Close()`, which ends a
    `GetNextTrajectory()` blocked in another thread with a RuntimeError. Connects lazily: the
    server may still be starting.
    """
    import numpy as np

    inner = _require(client, "_client", "Client")
    new_sampler = _require(inner, "NewSampler", "Client._client")
    return new_sampler(table, np.iinfo(np.int32).max, in_flight)


SAMPLER_KEY_COLUMNS = 4
"""Columns `GetNextTrajectory()` puts before an item's data (key, probability, table size,
priority)."""


def _selector(options: Any) -> Any:
    """The Reverb item selector a table's `KeyDistributionOptions` describes."""
    import reverb

    kind = options.WhichOneof("distribution")
    if kind == "prioritized":
        return reverb.selectors.Prioritized(options.prioritized.priority_exponent)
    if kind == "heap":
        return reverb.selectors.MinHeap() if options.heap.min_heap else reverb.selectors.MaxHeap()
    simple = {
        "fifo": reverb.selectors.Fifo,
        "lifo": reverb.selectors.Lifo,
        "uniform": reverb.selectors.Uniform,
    }
    if kind not in simple:
        raise ValueError(f"cannot rebuild a Reverb table with selector {kind!r}")
    return simple[kind]()


def without_rate_limit(table: Any) -> Any:
    """The same Reverb table (name, selectors, size, signature) with a limiter that never
    blocks: sampling only waits for the first item (`MinSize(1)`)."""
    import reverb

    info = _require(table, "info", "Table")
    return reverb.Table(
        name=info.name,
        sampler=_selector(info.sampler_options),
        remover=_selector(info.remover_options),
        max_size=info.max_size,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        max_times_sampled=info.max_times_sampled,
        signature=info.signature,
    )
