"""The program graph's handles: a `Ref`, alone or in a tuple (the coordinator's evaluators),
becomes the engine's client of that node, and names a node the holder depends on."""

from __future__ import annotations

from magi_lp.runtime.graph import NodeSpec, Ref


def test_refs_alone_and_in_a_tuple_become_clients_and_dependencies():
    spec = NodeSpec(
        "coordinator",
        0,
        "coordinator",
        dict,
        (Ref("counter_0"), 3, (Ref("evaluator_0"), Ref("evaluator_1")), ()),
        {"replay": Ref("replay_0"), "names": ("a", "b")},
    )
    assert spec.refs == ["counter_0", "evaluator_0", "evaluator_1", "replay_0"]
    args, kwargs = spec.resolved(lambda name: f"client of {name}")
    assert args == (
        "client of counter_0",
        3,
        ("client of evaluator_0", "client of evaluator_1"),
        (),
    )
    assert kwargs == {"replay": "client of replay_0", "names": ("a", "b")}
