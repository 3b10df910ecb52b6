"""What other tools read of our exports: compressed-tensors against llm-compressor's checkpoints (compressed_tensors),
GPTQ exports in GPTQModel and transformers + optimum (gptq_compat)."""
