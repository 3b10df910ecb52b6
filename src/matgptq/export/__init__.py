"""Exports of quantized checkpoints to formats other tools run: GPTQ (v1/v2) and GGUF."""
