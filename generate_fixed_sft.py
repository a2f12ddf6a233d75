"""Build fixed-length packed SFT datasets and verify them: ``python generate_fixed_sft.py --help``."""

from fixed_sft.cli import run

if __name__ == "__main__":
    run()
