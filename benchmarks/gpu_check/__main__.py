"""`python -m benchmarks.gpu_check` (`make gpu-check`); workers run it again as `--worker`."""

import sys

from benchmarks.gpu_check.cli import main

if __name__ == "__main__":
    sys.exit(main())
