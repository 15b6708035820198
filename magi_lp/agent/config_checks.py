"""Range checks for an agent's own config keys, with one line naming the key and the fix.

An agent project declares what its hyperparameters may be in a `validate_agent_config(agent)`
function (its `config.py`) built from a `ConfigChecker`, and returns it from its builder's
`AgentBuilder.validate_config`; both entry points run it before any process starts, so a
batch size of 0 or a discount of 1.5 is refused in a second instead of crashing the learner
after every node has started:

    check = ConfigChecker(agent, defaults=get_agent_config())
    check.integer("batch_size", minimum=1)
    check.number("discount", above=0, maximum=1)

    error: agent.batch_size must be an integer >= 1, got 0; e.g. --config.agent.batch_size=256

Imports nothing heavy: the entry points call it before importing JAX or TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from magi_lp.errors import ConfigError


class ConfigChecker:
    """Checks keys of one config section; each failed check raises one ConfigError line."""

    def __init__(self, config: Mapping[str, Any], *, section: str = "agent", defaults: Any = None):
        """Args: the section's values, its name (for messages), and its defaults (the fix)."""
        self._config = config
        self._section = section
        self._defaults = defaults

    def _fail(self, key: str, wanted: str, value: Any) -> None:
        name = f"{self._section}.{key}"
        fix = ""
        if self._defaults is not None and key in self._defaults:
            fix = f"; e.g. --config.{name}={self._defaults[key]!r} (the default)"
        raise ConfigError(f"{name} must be {wanted}, got {value!r}{fix}")

    def _value(self, key: str) -> Any:
        if key not in self._config:
            raise ConfigError(
                f"{self._section}.{key} is missing; start from the project's default agent config"
            )
        return self._config[key]

    def integer(self, key: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
        """An int (not a bool) within [minimum, maximum]."""
        value = self._value(key)
        ok = isinstance(value, int) and not isinstance(value, bool)
        ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
        if not ok:
            self._fail(key, "an integer" + _bounds(minimum, maximum, None, None), value)
        return value

    def number(
        self,
        key: str,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        above: float | None = None,
        below: float | None = None,
    ) -> float:
        """A finite int or float within the bounds (`above` / `below` are strict)."""
        value = self._value(key)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
        ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
        ok = ok and (above is None or value > above) and (below is None or value < below)
        if not ok:
            self._fail(key, "a number" + _bounds(minimum, maximum, above, below), value)
        return float(value)

    def sizes(self, key: str) -> tuple[int, ...]:
        """A non-empty sequence of integers >= 1 (layer widths)."""
        value = self._value(key)
        ok = isinstance(value, list | tuple) and len(value) > 0
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
        if not ok:
            self._fail(key, "a non-empty list of integers >= 1, e.g. (256, 256)", value)
        return tuple(value)

    def at_least(self, key: str, other: str) -> None:
        """`key`'s value must be >= `other`'s (both already checked as numbers)."""
        value, bound = self._value(key), self._value(other)
        if value < bound:
            self._fail(key, f">= {self._section}.{other} ({bound!r})", value)


def _bounds(minimum: Any, maximum: Any, above: Any, below: Any) -> str:
    parts = []
    if above is not None:
        parts.append(f"> {above}")
    if minimum is not None:
        parts.append(f">= {minimum}")
    if below is not None:
        parts.append(f"< {below}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    return (" " + " and ".join(parts)) if parts else ""
