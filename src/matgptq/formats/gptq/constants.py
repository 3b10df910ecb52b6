"""GPTQ's constants (docs/formats.md §2): the widths it packs, the two `checkpoint_format` labels, the files and the
tensor names of a checkpoint, GPTQModel's v1 word constants and the mixture-of-experts types whose layout is known."""

from __future__ import annotations

SUPPORTED_BITS: tuple[int, ...] = (2, 3, 4, 8)
V1 = "gptq"  # checkpoint_format of v1: each zero point stored as z − 1 (§2.5)
V2 = "gptq_v2"  # checkpoint_format of v2: the true zero points
V1_WORD_ADD = {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}  # GPTQModel's v1 ⇄ v2 word constants (§2.5)
CONFIG_FILES = ("quantize_config.json", "quant_config.json")  # GPTQModel's order of preference (§2.6); writes the 1st
WEIGHTS_FILE = "model.safetensors"
TENSORS = ("qweight", "qzeros", "scales", "g_idx")  # per quantized Linear `<name>.<tensor>` (§2.1)
# the MoE types whose GPTQ export GPTQModel reads (tests/exporters/test_gptq_moe_interop.py; experts.py)
MOE_TYPES = ("gpt_oss", "mixtral", "qwen3_moe")
FIX = "the GPTQ checkpoint is damaged or incomplete; re-download or re-export it"
