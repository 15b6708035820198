"""A small distributed Launchpad program for tests/test_isolation.py.

Nodes: `replay` (a ReverbNode), `echo` (a CourierNode serving `ping`) and `prober` (a
CourierNode that calls `echo` and does a Reverb insert + sample, all over loopback). When that
worked, `prober` writes <workdir>/ready.json; it then waits, and stops the program through
`lp.stop()` when <workdir>/stop appears. SIGTERM / SIGINT to the launching process stop it too.
It calls `run_isolated_if_needed` first, as an entry point does, and runs the program with
magi_lp.launch.launcher (node logs in <workdir>/logs).

    python tests/isolation_program.py --isolation auto|required|off --workdir DIR
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from magi_lp.launch import isolation


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--isolation", default="auto", choices=isolation.MODES)
    parser.add_argument("--workdir", required=True)
    return parser.parse_args(argv)


class Echo:
    """Answers `ping(x)` with x + 1."""

    def ping(self, x: int) -> int:
        return x + 1


class Prober:
    """Talks to the other nodes, reports what it got, then waits for the stop file."""

    def __init__(self, echo, replay, workdir: str):
        self._echo = echo
        self._replay = replay
        self._workdir = workdir

    def run(self) -> None:
        import json

        import launchpad as lp
        import numpy as np

        result = {"echo": self._echo.ping(41), "pid": os.getpid()}
        self._replay.insert([np.int64(7)], {"items": 1.0})
        sample = next(iter(self._replay.sample("items", num_samples=1)))
        result["sample"] = int(np.asarray(sample[0].data[0]))
        path = os.path.join(self._workdir, "ready.json")
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
        stop_file = os.path.join(self._workdir, "stop")
        while not lp.wait_for_stop(0.2):
            if os.path.exists(stop_file):
                lp.stop()
                lp.wait_for_stop()
                return


def _make_tables():
    import reverb

    return [
        reverb.Table(
            name="items",
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            max_size=100,
            rate_limiter=reverb.rate_limiters.MinSize(1),
        )
    ]


def main() -> int:
    args = _parse_args(sys.argv[1:])
    code = isolation.run_isolated_if_needed(args.isolation, sys.argv)
    if code is not None:
        return code

    # Heavy imports only in the process that runs the program.
    import launchpad as lp

    from magi_lp.launch import launcher

    program = lp.Program("isolation_test")
    with program.group("replay"):
        replay = program.add_node(lp.ReverbNode(_make_tables))
    with program.group("echo"):
        echo = program.add_node(lp.CourierNode(Echo))
    with program.group("prober"):
        program.add_node(lp.CourierNode(Prober, echo, replay, args.workdir))
    return launcher.launch(program, {}, log_dir=os.path.join(args.workdir, "logs"))


if __name__ == "__main__":
    sys.exit(main())
