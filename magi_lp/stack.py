"""Which stack this Python is: the one question every part asks the same way.

The Launchpad stack (Python 3.10: Launchpad, Reverb, TensorFlow; `make setup`, .venv) runs the
graph on Launchpad and keeps replay in Reverb; the current stack (Python 3.12: `make
setup312`, .venv312) has neither and runs the graph on Ray. The engine registry is keyed by
it (`magi_lp.engines.REGISTRY`), and so are the replay's defaults and the cluster engines.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

Stack = Literal["launchpad", "ray"]

STACKS: tuple[Stack, ...] = ("launchpad", "ray")
"""Every stack, by what runs the program graph on it."""


def stack_here() -> Stack:
    """'launchpad' where Launchpad and Reverb import (Python 3.10), else 'ray'."""
    found = all(importlib.util.find_spec(m) is not None for m in ("launchpad", "reverb"))
    return "launchpad" if found else "ray"
