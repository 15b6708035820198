"""TD3 whose `make_experiment` gets a Ctrl-C and swallows its KeyboardInterrupt, as a library
does that imports an optional C extension under `except ImportError` when the SIGINT lands in
that import: `python tests/swallowed_ctrl_c_entry.py one|many --config ...`."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from magi_lp import distributed_main, single_process_main
from projects.td3.config import validate_config


def make_experiment(config):
    from projects.td3.experiment import make_experiment as make

    try:  # noqa: SIM105 - written as the library code it stands for
        signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C, arriving here
    except KeyboardInterrupt:
        pass  # caught by code that meant to catch something else
    return make(config)


if __name__ == "__main__":
    main = single_process_main if sys.argv.pop(1) == "one" else distributed_main
    main(make_experiment, validate_config=validate_config)
