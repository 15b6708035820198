"""Haiku network functions as the pure init/apply pairs an agent's networks container holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import haiku as hk


def pure_functions(**functions: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    """Each function transformed (no RNG at apply) into `<name>_init` and `<name>_apply`.

        DrQNetworks(**pure_functions(encoder=encoder_fn, actor=actor_fn, critic=critic_fn), ...)
    gives `encoder_init`, `encoder_apply`, `actor_init`, ... as the container's fields.
    """
    pairs = {}
    for name, function in functions.items():
        transformed = hk.without_apply_rng(hk.transform(function))
        pairs[f"{name}_init"] = transformed.init
        pairs[f"{name}_apply"] = transformed.apply
    return pairs
