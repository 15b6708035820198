"""A Ray node client whose calls run at once in this process, and lose the answers a test
names: Ray's `ActorUnavailableError` after the call ran (its "may or may not have been
executed"), which the client meets by asking again (`ray_nodes.answer_through_blips`)."""

from __future__ import annotations

from typing import Any

import ray

from magi_lp.engines import ray_nodes


def lossy_client(
    monkeypatch: Any, node: Any, methods: list[str], lose: dict[str, set[int]]
) -> tuple[ray_nodes.NodeClient, dict[str, int]]:
    """(A `NodeClient` of `node`, the calls made of each method in `lose`): the n-th call of
    `method` loses its answer where n is in `lose[method]`. Patches `ray_nodes`' `ray.get` and
    its wait before asking again (none) for the test."""
    made = dict.fromkeys(lose, 0)

    class Call:  # what `actor.call.remote` reaches: the node actor's `call`, run at once
        @staticmethod
        def remote(method: str, *args: Any, **kwargs: Any) -> Any:
            answer = getattr(node, method)(*args, **kwargs)
            if method in made:
                made[method] += 1
                if made[method] in lose[method]:
                    return ray.exceptions.ActorUnavailableError("blip", None)
            return answer

    class Handle:
        call = Call

    def get(value: Any, timeout: float | None = None) -> Any:
        if isinstance(value, ray.exceptions.ActorUnavailableError):
            raise value
        return value

    monkeypatch.setattr(ray_nodes.ray, "get", get)
    monkeypatch.setattr(ray_nodes, "_REASK_S", 0.0)
    return ray_nodes.NodeClient(Handle(), methods), made
