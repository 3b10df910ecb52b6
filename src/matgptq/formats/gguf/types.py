"""Every GGUF type name matgptq uses, in one place (as gguf-py's constants are): the block types it writes (QTYPES),
the K-quant types whose lattice `quantize --kquant` targets (KQuantType), the float and embedding types, llama.cpp's
file-type codes (FILE_TYPES); and gguf-py itself, imported on first use (gguf_module)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ...errors import UserError


class KQuantType(str, Enum):
    Q2_K = "q2_k"
    Q3_K = "q3_k"
    Q4_K = "q4_k"
    Q5_K = "q5_k"
    Q6_K = "q6_k"


def gguf_module():
    """gguf-py, imported when a GGUF is written or sized (it is the interop extra, not a core dependency)."""
    try:
        import gguf
    except ImportError:
        raise UserError("GGUF export needs the gguf package (gguf-py): pip install gguf") from None
    return gguf


@dataclass(frozen=True)
class BlockType:
    """A GGUF block type as matgptq writes it: how a stored code n maps to a weight in one block."""

    name: str
    bits: int  # width of the stored code n
    offset: int | None  # w = d·(n − offset); None: w = d·n + m (min types)
    block: int  # columns sharing one (d, m): 32 legacy, 16 K-quant sub-block
    row: int  # in_features must be a multiple of this
    kquant: bool = False

    @property
    def ggml(self):
        return getattr(gguf_module().GGMLQuantizationType, self.name.upper())

    @property
    def bpw(self) -> float:
        block, nbytes = gguf_module().GGML_QUANT_SIZES[self.ggml]
        return 8 * nbytes / block


QTYPES: dict[str, BlockType] = {
    "q2_k": BlockType("q2_k", 2, None, 16, 256, True),
    "q3_k": BlockType("q3_k", 3, 4, 16, 256, True),
    "q4_0": BlockType("q4_0", 4, 8, 32, 32),
    "q4_k": BlockType("q4_k", 4, None, 32, 256, True),
    "q4_1": BlockType("q4_1", 4, None, 32, 32),
    "q5_0": BlockType("q5_0", 5, 16, 32, 32),
    "q5_k": BlockType("q5_k", 5, None, 32, 256, True),
    "q5_1": BlockType("q5_1", 5, None, 32, 32),
    "q6_k": BlockType("q6_k", 6, 32, 16, 256, True),
    "q8_0": BlockType("q8_0", 8, 128, 32, 32),
}  # ascending bits per weight: auto tries them in this order
FLOAT_TYPES = ("f32", "f16")
# token_embd/output: auto = llama.cpp's preset rule (embed_type_for); the block types as llama-quantize's
# --token-embedding-type / --output-tensor-type write them (requantize)
EMBED_TYPES = ("auto", "f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q6_k")
# llama.cpp's LlamaFileType of a file mostly of one type (Q3_K → MOSTLY_Q3_K_S, Q4_K → _S)
FILE_TYPES = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "q5_0": 8,
    "q5_1": 9,
    "q2_k": 10,
    "q3_k": 11,
    "q4_k": 14,
    "q5_k": 16,
    "q6_k": 18,
}
