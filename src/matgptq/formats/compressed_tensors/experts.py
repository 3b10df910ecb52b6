"""compressed-tensors names of fused mixture-of-experts layers: the layout llm-compressor writes for qwen3_moe,
mixtral and gpt_oss (it linearizes the fused experts into per-expert Linears before quantizing;
tests/exporters/test_compressed_tensors_moe.py compares its files with ours; the versions read, LLM_COMPRESSOR on
TRANSFORMERS: exporters/tested.py).

matgptq quantizes expert e of `<p>.experts` as `<p>.experts.<e>.gate_up_proj` ([2I, H]) and `.down_proj` ([H, I])
(models/experts.py). Written per expert as llm-compressor does, each a pack-quantized Linear (writer.py):

    <p>.experts.<e>.gate_proj  = gate rows of gate_up      <p>.experts.<e>.up_proj = up rows      .down_proj as is

  * qwen3_moe, mixtral: gate = rows [0, I), up = rows [I, 2I) (transformers' `chunk(2)`), the GPTQ export's split
    (formats/gptq/experts.py, reused here).
  * gpt_oss: gate and up interleave (transformers: `gate_up[..., ::2]`, `[..., 1::2]`), so gate = the even rows and
    up = the odd ones (llm-compressor's GptOssExpertMLP: `gate_up[:, 0::2].T`); the fused biases [E, 2I] / [E, H]
    split the same way into `.gate_proj.bias`, `.up_proj.bias`, `.down_proj.bias` (float, as llm-compressor writes
    them). This is not the GPTQ export's split (Defuser's halves), which a reader of named gate/up would misread.
  * mixtral: the block is saved as `block_sparse_moe` (the save conversion of transformers at TRANSFORMERS, which
    llm-compressor's file shows), so every `<layer>.mlp.` tensor is written as `<layer>.block_sparse_moe.`: the router
    `block_sparse_moe.gate.weight` and the experts `block_sparse_moe.experts.<e>.gate_proj`, ...
    vLLM's Mixtral (VLLM) names those projections w1, w3 and w2 and looks up the scheme of `…experts.0.w1` (w3, w2),
    which no exact `…gate_proj` target matches (its rename `.gate_proj.` → `.w1.` needs a dot after the name), so
    each target and `ignore` entry of an expert is followed by its vLLM spelling (`aliases`): a name no tensor has,
    which compressed-tensors' decompressor never looks up (llm-compressor's own `Linear` target matches both).

Rows are output features, each with its own scales and zeros, so every split is exact (the parts' codes, scales and
zeros are rows of the parent's). The router (a transformers TopKRouter, not an nn.Linear) stays float and is listed
in `ignore` (exporters/compressed_tensors.py), as llm-compressor lists it. A fused tensor some of whose experts were
left unquantized (--skip) is stored whole by the parent: its other experts are written as float per-expert weights
(split the same way), also in `ignore`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ...errors import UserError
from ..gptq.experts import gptq_names, is_expert, row_parts, split_biases, split_layer
from ..quantized import QuantizedWeight


@dataclass(frozen=True)
class CtMoE:
    """How one model type's experts are written: the file name of the `mlp` block, interleaved gate/up rows, and
    whether the fused parameters are stored transposed ([E, in, out])."""

    block: str
    interleaved: bool
    transposed: bool
    vllm_names: tuple[str, str, str] | None = None  # vLLM's names of gate, up and down where they differ

    def aliases(self, names: list[str]) -> list[str]:
        """`names` (file names of per-expert Linears and others), each expert's followed by vLLM's spelling."""
        if self.vllm_names is None:
            return names
        rename = dict(zip(("gate_proj", "up_proj", "down_proj"), self.vllm_names))
        out = []
        for name in names:
            out.append(name)
            if (m := _PER_EXPERT.search(name)) is not None:
                out.append(f"{name[: m.start(1)]}{rename[m.group(1)]}")
        return out

    def file_name(self, name: str) -> str:
        """The file's name of model tensor or module `name` (mixtral: `.mlp.` → `.block_sparse_moe.`)."""
        return name.replace(".mlp.", f".{self.block}.", 1) if self.block != "mlp" else name

    def layers(self, name: str, q: QuantizedWeight) -> dict[str, QuantizedWeight]:
        """{file name: weight} of quantized layer `name`: an expert's gate_up split into gate and up, else itself."""
        return {self.file_name(part): w for part, w in split_layer(name, q, self.interleaved).items()}

    def tensors(self, tensors: dict[str, torch.Tensor], quantized) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The float tensors under their file names: fused biases per expert, and any fused weight still stored
        (some experts not quantized) as per-expert float weights of the experts not in `quantized`; and the model
        names of those float per-expert Linears."""
        out, linears = {}, []
        for key, value in split_biases(tensors, self.interleaved).items():
            m = _FUSED.match(key)
            if m is None:
                out[self.file_name(key)] = value
                continue
            for e in range(value.shape[0]):
                if f"{m.group(1)}.{e}.{m.group(2)}" in quantized:
                    continue
                w = value[e].T if self.transposed else value[e]
                parts = gptq_names(f"{m.group(1)}.{e}.{m.group(2)}")
                for part, rows in zip(parts, row_parts(w.shape[0], len(parts), self.interleaved)):
                    out[self.file_name(f"{part}.weight")] = w[rows].contiguous()
                    linears.append(part)
        return out, linears


_PER_EXPERT = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj)$")  # a per-expert Linear's file name
_FUSED = re.compile(r"^(.+\.experts)\.(gate_up_proj|down_proj)$")  # a fused [E, ...] weight stored whole
CT_MOE = {  # the types llm-compressor linearizes this way (its moe/ modules), checked against its files
    "qwen3_moe": CtMoE("mlp", interleaved=False, transposed=False),
    "mixtral": CtMoE("block_sparse_moe", interleaved=False, transposed=False, vllm_names=("w1", "w3", "w2")),
    "gpt_oss": CtMoE("mlp", interleaved=True, transposed=True),
}


def ct_moe(src, model_type: str | None, names) -> CtMoE | None:
    """How the experts of a checkpoint are written (None: it has none); an MoE type not in CT_MOE is refused."""
    expert = next((n for n in names if is_expert(n)), None)
    if expert is None:
        return None
    if model_type not in CT_MOE:
        raise UserError(
            f"{src} quantizes fused experts ({expert}) of {model_type}, whose compressed-tensors layout "
            f"was not checked against llm-compressor's (compressed-tensors export of experts: "
            f"{', '.join(CT_MOE)}); export --format gptq_v2, or load it with matgptq.load"
        )
    return CT_MOE[model_type]
