"""How good a loaded model is: perplexity and KL divergence on text windows (perplexity, teacher), zero-shot accuracy
through lm-eval (tasks), and `evaluate`, which runs them for a model or several widths (run).

The scoring functions are imported from `evaluation.perplexity` itself: re-exported here, the function `perplexity`
would shadow its module."""
