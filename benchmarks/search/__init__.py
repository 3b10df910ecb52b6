"""Search claims on SmolLM2-135M-Instruct: the searched mixes at every budget (real_model) and all eight budgets in
ten minutes against every one-shot allocation (ten_minutes)."""
