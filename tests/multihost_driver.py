"""Runs the generated per-host scripts of a `--launcher hosts` job at once, in a private
network namespace (only loopback), as a person would run one script on each host.

    python tests/multihost_driver.py DIR host-main.sh host-a1.sh ...

Prints each script's exit code (`host-a1.sh: exit code 0`) and exits with the largest.
The namespace keeps the nodes' servers (which listen on every interface) off any network:
inside it, 127.0.0.2, 127.0.0.3, ... are all its own loopback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from magi_lp.launch import isolation


def main() -> int:
    code = isolation.run_isolated_if_needed("required", sys.argv)
    if code is not None:
        return code
    folder = Path(sys.argv[1])
    scripts = sys.argv[2:]
    running = [(name, subprocess.Popen(["bash", str(folder / name)])) for name in scripts]
    worst = 0
    for name, process in running:
        returncode = process.wait()
        print(f"{name}: exit code {returncode}", flush=True)
        worst = max(worst, returncode if returncode >= 0 else 128 - returncode)
    return worst


if __name__ == "__main__":
    sys.exit(main())
