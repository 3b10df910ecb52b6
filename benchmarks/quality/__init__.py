"""Quality claims: the default GPTQ and the MatGPTQ parent against the peers' defaults (gptq_defaults), SmolLM2's
Table 1 (real_model_table), and the README's overview figure drawn from three claims' JSON (overview)."""
