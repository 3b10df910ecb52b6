"""Measurements behind the README and docs/results/, one script per claim, grouped by topic (quality, search, gguf,
speed, gpu, interop, robustness): run from the repository root as `python -m benchmarks.TOPIC.NAME`. What they share
is benchmarks/_harness/; benchmarks/render_docs.py renders or checks every page from its JSON."""
