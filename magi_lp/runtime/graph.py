"""The distributed program as data: its nodes, their groups, constructors and handles.

`magi_lp.runtime.program.build_program` describes the program once, naming no engine: each
node's role, index and launch group (the placement plan's, so its env), the constructor that
makes it in its own process, and its arguments, where `Ref("counter")` stands for a handle to
another node. Each engine (`magi_lp.engines`) launches the same graph its own way: Launchpad
turns it into an `lp.Program` (Courier handles, a Reverb node); Ray into one actor per node
(actor handles, the replay served by `ReplayStore.make_server`).

A node constructor takes its arguments, then `lifetime=`: the engine's `NodeLifetime`, so
node code asks whether the program is stopping, waits for the stop, stops the program or
leaves its process without naming an engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Protocol


class NodeLifetime(Protocol):
    """What a node knows of the program's life; each engine gives its own."""

    def stopping(self) -> bool:
        """Whether this node was told to stop (does not wait)."""
        ...

    def wait_for_stop(self, seconds: float) -> bool:
        """Waits up to `seconds` for the stop; returns whether it came."""
        ...

    def stop_program(self) -> None:
        """Asks the engine to stop the whole program (the coordinator at its limit)."""
        ...

    def leave(self, code: int = 0) -> None:
        """Ends this node's process once its work is saved (a no-op where the node is not a
        process of its own); a non-zero code is the node's failure."""
        ...


@dataclasses.dataclass(frozen=True)
class Ref:
    """A handle to node `node` of the graph: the engine gives a client of it in its place."""

    node: str


def _refs_in(value: Any) -> tuple[Ref, ...]:
    """The handles an argument stands for: a `Ref`, or a non-empty tuple of nothing but
    `Ref`s (the coordinator's evaluators); none for anything else."""
    if isinstance(value, Ref):
        return (value,)
    if isinstance(value, tuple) and value and all(isinstance(v, Ref) for v in value):
        return value
    return ()


@dataclasses.dataclass(frozen=True)
class ReplaySpec:
    """What the replay node serves, which each engine serves its own way.

    Attributes:
      store: the run's one replay store (`magi_lp.replay.stores.resolve_store`).
      environment_spec: the environment's spec (the store's shapes).
      workdir: the run folder (the replay's checkpoints).
      checkpoint_at_stop: the replay writes its checkpoint at its stop (`checkpoint.reverb`).
    """

    store: Any
    environment_spec: Any
    workdir: str
    checkpoint_at_stop: bool


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """One node: what makes it, where it runs, and the handles it takes.

    Attributes:
      role: its node group (one of `magi_lp.runtime.config.NODE_GROUPS`).
      index: its index within the role.
      group: its launch group (the placement plan's; the engine applies that group's env).
      make: the constructor, called in the node's process with `args` (each `Ref` replaced by
        a client of that node), `kwargs` and `lifetime=` (None for the replay node: each
        engine serves `replay` itself).
      replay: the replay node's `ReplaySpec` (replay only).
      colocate_with: the node whose process this one shares (a replay beside the learner).
    """

    role: str
    index: int
    group: str
    make: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    replay: ReplaySpec | None = None
    colocate_with: str | None = None

    @property
    def name(self) -> str:
        return f"{self.role}_{self.index}"

    @property
    def refs(self) -> list[str]:
        """The nodes this one takes handles of."""
        found = [ref.node for a in (*self.args, *self.kwargs.values()) for ref in _refs_in(a)]
        return list(dict.fromkeys(found))

    def resolved(self, client: Callable[[str], Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """`args` and `kwargs` with each `Ref` replaced by `client(node name)`, also in a
        tuple of them (the coordinator's evaluators)."""

        def resolve(value: Any) -> Any:
            if isinstance(value, tuple) and _refs_in(value):
                return tuple(client(v.node) for v in value)
            return client(value.node) if isinstance(value, Ref) else value

        args = tuple(resolve(a) for a in self.args)
        return args, {k: resolve(v) for k, v in self.kwargs.items()}


@dataclasses.dataclass
class ProgramGraph:
    """The program: its nodes in the order they were added, and the one replay store.

    Attributes:
      name: the program's name.
      nodes: every node (`NodeSpec.name` is unique).
      store: the replay store every node uses (resolved once).
    """

    name: str
    nodes: list[NodeSpec]
    store: Any

    def __post_init__(self) -> None:
        names = [node.name for node in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names repeat in program {self.name!r}: {names}")
        for node in self.nodes:
            missing = [ref for ref in node.refs if ref not in names]
            if missing:
                raise ValueError(f"node {node.name} takes handles of unknown nodes {missing}")

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(node.name == name for node in self.nodes)

    def of_role(self, role: str) -> Iterator[NodeSpec]:
        return (node for node in self.nodes if node.role == role)

    def groups(self) -> dict[str, list[NodeSpec]]:
        """Launch group -> its nodes, in order."""
        found: dict[str, list[NodeSpec]] = {}
        for node in self.nodes:
            found.setdefault(node.group, []).append(node)
        return found
