"""Build fixed-length packed SFT datasets and verify them: ``python generate_fixed_sft.py --help``."""

import sys

from fixed_sft.cli import main

if __name__ == "__main__":
    sys.exit(main())
