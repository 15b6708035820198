"""The replay stores, and the one place `replay.store` becomes a store.

To add a store: write one module here with a `ReplayStore` subclass (`magi_lp.replay.store`:
its tables or served object, adder, learner side and device bytes; heavy imports inside the
methods), and add it to `FRAME_STORES` below; `replay.store` then accepts its name
(`magi_lp.runtime.config`) and every runner uses it (docs/architecture.md, "Adding a replay
store").
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from magi_lp.config_schema import fail_unless
from magi_lp.replay.store import TRANSPORTS

if TYPE_CHECKING:
    from magi_lp.replay.store import ReplayStore

FRAME_STORES: dict[str, str] = {
    "device": "magi_lp.replay.stores.device:DeviceStore",
    "host": "magi_lp.replay.stores.host_frames:HostFrameStore",
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


def reverb_installed() -> bool:
    """Whether Reverb can be imported here: the Launchpad stack (`magi_lp.stack`)."""
    from magi_lp.stack import stack_here

    return stack_here() == "launchpad"


def auto_frame_store(*, device_fits: bool, host_fits: bool, reverb: bool) -> str | None:
    """What `replay.store='auto'` means for a pixel agent: the one rule, used by the plan
    (`magi_lp.replay.plan`, which knows the sizes) and by `store_kind` (which does not).

    The device store where it fits the learner's device (batches gathered there, no host
    CPU); else Reverb's frame replay where Reverb carries the replay (`reverb`: installed, on
    the 'reverb' transport: the Launchpad stack keeps the store it has always fallen back
    to); else the compressed host store where it fits the learner's host memory (the current
    stack, which has no Reverb). None: nothing fits (the plan refuses in one line).
    """
    if device_fits:
        return "device"
    if reverb:
        return "reverb"
    return "host" if host_fits else None


def store_kind(config: Any, transport: str = "reverb") -> str:
    """`replay.store` as the entry points resolved it (`magi_lp.replay.plan`).

    An unresolved 'auto' (a runner called without the entry points' planning, as tests do)
    knows no sizes: `auto_frame_store` with every store taken to fit where Reverb cannot
    carry the replay (the 'served' transport, or not installed), so the device store, and
    taken not to fit where it can, so Reverb's frame replay (which needs no sizing).
    """
    store = config.get("replay", {}).get("store", "auto")
    if store == "auto":
        reverb = transport != "served" and reverb_installed()
        store = auto_frame_store(device_fits=not reverb, host_fits=not reverb, reverb=reverb)
    return store


def resolve_store(
    builder: Any, config: Any, *, single_process: bool = False, transport: str = "reverb"
) -> ReplayStore:
    """The store that serves `builder`'s agent under `config`: made once, before anything
    starts, and used by every node (or by the single-process runner).

    `transport` is the engine's replay transport (`magi_lp.replay.store.TRANSPORTS`):
    'reverb' (Launchpad), or 'served' (an engine without Reverb serves the store's
    `make_server`); one process uses none and ignores it.

    A pixel agent (`frame_replay`) gets the store `replay.store` names (on 'served', the
    device or the host store). Any other agent keeps its own Reverb tables, except where its builder
    gives `transition_replay` and Reverb is not the replay: in one process on the device
    store (Reverb is not installed, or not asked for), or on 'served'. Then its transitions
    live in host memory (the replay node's, on 'served').
    """
    fail_unless(
        transport in TRANSPORTS,
        "the replay transport",
        " or ".join(map(repr, TRANSPORTS)),
        transport,
    )
    served = transport == "served" and not single_process
    kind = store_kind(config, "served" if served else "reverb")
    made = {"single_process": single_process, "transport": transport}
    if builder.frame_replay(None) is not None:
        fail_unless(
            not served or kind != "reverb",
            "replay.store",
            "'device', 'host' or 'auto' where the engine carries the replay without Reverb",
            kind,
            "the Reverb frame replay needs the Launchpad engine",
        )
        return _load(FRAME_STORES[kind])(builder, config, **made)
    transitions = builder.transition_replay(None) is not None
    if transitions and (served or (single_process and kind != "reverb")):
        return _load(_HOST_TRANSITIONS)(builder, config, **made)
    fail_unless(
        not served,
        f"{type(builder).__name__}.transition_replay(None)",
        "a TransitionReplaySpec where the engine carries the replay without Reverb",
        None,
        "the agent's own Reverb tables (make_replay_tables) need the Launchpad engine",
    )
    return _load(_AGENT_TABLES)(builder, config, **made)
