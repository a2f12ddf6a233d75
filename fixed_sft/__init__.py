"""fixed-sft: fixed-length packed SFT datasets that anyone can rebuild and check."""

__version__ = "0.2.0"
