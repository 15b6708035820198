"""Tries plain TCP connects to HOST:PORT for each port; prints {port: outcome} as JSON.

tests/test_isolation.py runs it inside the probe network namespace it made
(`ip netns exec <ns> python tests/isolation_probe.py HOST PORT...`). An outcome is "reached",
"refused", "timeout" or an error name; each port gets a few attempts with a short timeout,
stopping at the first that connects.

    python tests/isolation_probe.py 192.0.2.1 40123 40124
"""

import json
import socket
import sys
import time

ATTEMPTS = 3
TIMEOUT_S = 0.5


def connect_outcome(host: str, port: int) -> str:
    """The last outcome of up to ATTEMPTS connects; "reached" as soon as one connects."""
    outcome = "not tried"
    for _ in range(ATTEMPTS):
        try:
            with socket.create_connection((host, port), timeout=TIMEOUT_S):
                return "reached"
        except ConnectionRefusedError:
            outcome = "refused"
        except TimeoutError:
            outcome = "timeout"
        except OSError as e:
            outcome = type(e).__name__
        time.sleep(0.05)
    return outcome


def main(argv: list[str]) -> int:
    host, ports = argv[1], [int(p) for p in argv[2:]]
    print(json.dumps({port: connect_outcome(host, port) for port in ports}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
