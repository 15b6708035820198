"""Runs one launcher test scenario in its own process.

    python tests/launch_programs.py <stop|serve> <out_dir> [termination_notice_secs]

The tests run the launcher in a subprocess so that Launchpad's and the launcher's signal
handlers are installed there and never in the pytest process. Node logs go to
`<out_dir>/logs`, node reports to `<out_dir>/reports`; the exit status is launch()'s.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    scenario, out_dir = argv[1], argv[2]
    notice_secs = float(argv[3]) if len(argv) > 3 else 10.0
    # Node processes unpickle launcher_nodes' classes by reference: they inherit this.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_HERE), os.environ.get("PYTHONPATH", "")) if p
    )
    import launcher_nodes

    from magi_lp.launch import launcher

    program = launcher_nodes.build_program(scenario, out_dir)
    return launcher.launch(
        program,
        launcher_nodes.ENVS,
        log_dir=Path(out_dir) / "logs",
        termination_notice_secs=notice_secs,
        report_stream=sys.stdout,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv))
