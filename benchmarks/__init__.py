"""Benchmarks of magi_lp: `python -m benchmarks.run` writes BENCHMARKS.md (see README.md)."""
