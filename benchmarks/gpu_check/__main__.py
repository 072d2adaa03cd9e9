"""`python3 -m benchmarks.gpu_check`: the command line (benchmarks/gpu_check/cli.py)."""

import sys

from benchmarks.gpu_check.cli import main

if __name__ == "__main__":
    sys.exit(main())
