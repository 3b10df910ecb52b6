"""How good a loaded model is: perplexity and KL divergence on text windows (perplexity), and the plain-text tables
that report them (report).

The scoring functions are imported from `evaluation.perplexity` itself: re-exported here, the function `perplexity`
would shadow its module."""

from .report import format_table

__all__ = ["format_table"]
