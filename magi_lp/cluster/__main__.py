"""`python -m magi_lp.cluster --golden`: regenerate tests/golden/cluster (`make golden`)."""

import sys

from magi_lp.cluster.main import main

if __name__ == "__main__":
    sys.exit(main())
