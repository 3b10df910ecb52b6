"""Mix'n'Match: the best per-layer widths of a parent under a bit budget. Exact bit counts (budget), an exact
knapsack (knapsack)."""
