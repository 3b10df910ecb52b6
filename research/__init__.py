"""One-off studies that chose a default; run from the repository root as `python -m research.NAME`."""
