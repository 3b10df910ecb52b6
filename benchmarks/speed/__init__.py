"""CPU cost claims: end-to-end quantization against the peers (pipeline)."""
