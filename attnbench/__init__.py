"""attnbench: a reproducible benchmark and experiment harness for attention."""
__version__ = "0.1.0"
