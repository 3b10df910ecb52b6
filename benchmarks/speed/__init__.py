"""CPU cost claims: end-to-end quantization against the peers (pipeline), the streamed teacher of `eval --kl-to`
(eval), a mixture-of-experts block against a dense one (moe_block)."""
