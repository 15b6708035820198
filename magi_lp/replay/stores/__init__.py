"""The replay stores, and the one place `replay.store` becomes a store.

To add a store: write one module here with a `ReplayStore` subclass (`magi_lp.replay.store`:
its tables, adder, learner side and device bytes; heavy imports inside the methods), and add
it to `FRAME_STORES` below; `replay.store` then accepts its name (`magi_lp.runtime.config`)
and every runner uses it (docs/architecture.md, "Adding a replay store").
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from magi_lp.replay.store import ReplayStore

FRAME_STORES: dict[str, str] = {
    "device": "magi_lp.replay.stores.device:DeviceStore",
    "reverb": "magi_lp.replay.stores.reverb_frames:ReverbFrameStore",
}
"""The stores that can serve a pixel agent's `frame_replay`: `replay.store` value ->
"module:class". Named, not imported: the config's checks read this list before anything
heavy loads (a store's module may import JAX, Reverb or TensorFlow)."""

_AGENT_TABLES = "magi_lp.replay.stores.agent_tables:AgentTables"
_HOST_TRANSITIONS = "magi_lp.replay.stores.host:HostTransitions"


def _load(path: str) -> type[ReplayStore]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def store_kind(config: Any) -> str:
    """`replay.store` as the entry points resolved it (`magi_lp.replay.plan`).

    An unresolved 'auto' (a runner called without the entry points' planning, as tests do)
    means Reverb where it is installed, the device store where it is not.
    """
    store = config.get("replay", {}).get("store", "auto")
    if store == "auto":
        return "reverb" if importlib.util.find_spec("reverb") is not None else "device"
    return store


def resolve_store(builder: Any, config: Any, *, single_process: bool = False) -> ReplayStore:
    """The store that serves `builder`'s agent under `config`: made once, before anything
    starts, and used by every node (or by the single-process runner).

    A pixel agent (`frame_replay`) gets the store `replay.store` names. Any other agent keeps
    its own Reverb tables, except in one process on the device store (Reverb is not
    installed, or not asked for) when its builder gives `transition_replay`: then its
    transitions live in host memory.
    """
    kind = store_kind(config)
    if builder.frame_replay(None) is not None:
        return _load(FRAME_STORES[kind])(builder, config, single_process=single_process)
    if single_process and kind == "device" and builder.transition_replay(None) is not None:
        return _load(_HOST_TRANSITIONS)(builder, config, single_process=True)
    return _load(_AGENT_TABLES)(builder, config, single_process=single_process)
