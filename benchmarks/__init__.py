"""Measurements behind the README and docs/results/: run from the repository root as `python -m benchmarks.NAME`."""
