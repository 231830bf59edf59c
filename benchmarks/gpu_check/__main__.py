"""``python -m benchmarks.gpu_check``: see ``benchmarks.gpu_check.cli``."""

import sys

from benchmarks.gpu_check.cli import main

if __name__ == "__main__":
    sys.exit(main())
