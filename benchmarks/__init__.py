"""Benchmarks for ablate: `python -m benchmarks` prints tables (speed is never asserted in tests)."""
