"""Builders of the project's own fixtures (`make real-model`); run from the repository root as `python -m tools.NAME`."""
