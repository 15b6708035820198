"""XLA flags checked by the installed jaxlib before any node starts.

XLA reads `XLA_FLAGS` when a process first starts a backend and aborts it (SIGABRT, "Unknown
flags in XLA_FLAGS: ...") on a flag it does not know. Left to the nodes, a typo in
`resources.<group>.xla_flags` starts every node and kills one of them half a minute later,
its reason buried in its log. So the flags the user gave (each group's `xla_flags`, and an
exported `XLA_FLAGS`) are handed once, together, to a short-lived Python that starts the
installed jaxlib's CPU backend; an unknown flag is one line naming the group, the flag and
the key. The launcher itself starts no backend (this layer imports no JAX).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError

_PROBE = "import jax; jax.devices()"
_UNKNOWN = re.compile(r"Unknown flags? in XLA_FLAGS:\s*(.+)")
TIMEOUT_S = 120.0


def unknown_xla_flags(flags: str, *, python: str = sys.executable) -> list[str]:
    """The flags of `flags` the installed jaxlib does not know ([] when all are known, or
    when the probe fails for another reason: the nodes then say why themselves)."""
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    try:
        result = subprocess.run(
            [python, "-c", _PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if result.returncode == 0:
        return []
    match = _UNKNOWN.search(result.stderr)
    return match.group(1).split() if match else []


def check_xla_flags(
    group_flags: Mapping[str, str], exported: str | None = None, *, python: str = sys.executable
) -> None:
    """Refuses, in one line, an XLA flag the installed jaxlib does not know.

    Args:
      group_flags: node group -> its `resources.<group>.xla_flags` (empty ones are skipped).
      exported: the launching shell's `XLA_FLAGS`, which every node inherits.
      python: the interpreter whose jaxlib the nodes run.
    """
    sources = {f"resources.{g}.xla_flags": f for g, f in group_flags.items() if f.strip()}
    if exported and exported.strip():
        sources["the exported XLA_FLAGS"] = exported
    if not sources:
        return
    tokens = list(dict.fromkeys(t for flags in sources.values() for t in flags.split()))
    unknown = unknown_xla_flags(" ".join(tokens), python=python)
    if not unknown:
        return
    flag = unknown[0]
    where = [key for key, flags in sources.items() if flag in flags.split()] or list(sources)
    raise ConfigError(
        fact_refusal(
            f"{where[0]}: the installed jaxlib does not know the XLA flag {flag} (XLA would "
            "abort every node given it at start-up)",
            "",
            "remove it or correct its name",
        )
    )
