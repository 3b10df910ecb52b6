"""GGUF tensors of fused mixture-of-experts layers (qwen3_moe, mixtral; models/experts.py, formats/gptq/experts.py).

transformers 5 keeps a block's experts fused: `mlp.experts.gate_up_proj` [E, 2I, H] (rows: gate, then up, as its
forward's `chunk(2)`) and `mlp.experts.down_proj` [E, H, I]; matgptq quantizes each expert's projection as its own
layer `mlp.experts.<e>.gate_up_proj` / `.down_proj`. llama.cpp's converter writes them as three 3-D tensors per block,
`ffn_gate_exps` [E, I, H], `ffn_up_exps` [E, I, H], `ffn_down_exps` [E, H, I] (numpy order; Qwen2MoeModel /
LlamaModel.modify_tensors stack the experts and split gate_up at row I).

Quantized experts keep their codes: each expert's layer is encoded as a dense layer is (tensors.py), its
rows are whole GGUF blocks, so gate and up are the first and second half of the encoded rows, and the experts are
stacked. One GGUF tensor has one type: when `auto` picks different types for the experts of one projection (a
per-layer mix), all of them are encoded in the smallest of those types that holds every one with its codes, else
re-quantized to Q8_0 from their dequantized weights (a warning names them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np
import torch

from ...errors import UserError
from .tensors import encode_layer, float_encode, requantize
from .types import QTYPES

_LAYER = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_up_proj|down_proj)$")
_FUSED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
# GGUF tensors of one fused projection: (name, row slice as a fraction of the rows: part index, parts)
GGUF_PARTS = {"gate_up_proj": (("ffn_gate_exps", 0, 2), ("ffn_up_exps", 1, 2)), "down_proj": (("ffn_down_exps", 0, 1),)}


@dataclass
class ExpertGroup:
    """One fused projection of one block: its float [E, out, in] tensor, or its quantized experts' layer names."""

    block: int
    proj: str  # gate_up_proj or down_proj
    fused: torch.Tensor | None = None
    layers: dict[int, str] | None = None

    @property
    def hf(self) -> str:
        return f"model.layers.{self.block}.mlp.experts.{self.proj}"


def split_experts(tensors: dict, layers) -> tuple[dict, list[str], list[ExpertGroup]]:
    """(tensors, quantized layers, expert groups): the fused experts taken out of a source's float tensors and
    quantized layer names. A fused tensor stored whole beside some quantized experts (--skip of a few) is refused."""
    groups: dict[tuple[int, str], ExpertGroup] = {}
    rest_t, rest_l = {}, []
    for key, t in tensors.items():
        m = _FUSED.match(key.removesuffix(".weight"))
        if m is None:
            rest_t[key] = t
        else:
            groups[int(m.group(1)), m.group(2)] = ExpertGroup(int(m.group(1)), m.group(2), fused=t)
    for name in layers:
        m = _LAYER.match(name)
        if m is None:
            rest_l.append(name)
            continue
        g = groups.setdefault((int(m.group(1)), m.group(3)), ExpertGroup(int(m.group(1)), m.group(3), layers={}))
        if g.layers is None:
            raise UserError(
                f"{g.hf} is stored as float with only some experts quantized ({name}); GGUF stores one "
                "type per expert tensor: quantize every expert, or none"
            )
        g.layers[int(m.group(2))] = name
    for g in groups.values():
        if g.layers is not None and sorted(g.layers) != list(range(len(g.layers))):
            raise UserError(f"{g.hf}: experts {sorted(g.layers)} are quantized, not 0..{len(g.layers) - 1}")
    return rest_t, rest_l, sorted(groups.values(), key=lambda g: (g.block, g.proj))


def _common_type(encs: list, qs: list, refs: list, names: list[str], float_type: str, warn) -> list:
    """The experts' encodings in one GGUF type (module docstring)."""
    types = list(dict.fromkeys(e.ggml_type for e in encs))
    if len(types) == 1:
        return encs
    for typ in sorted((t for t in types if t in QTYPES), key=list(QTYPES).index):  # the smallest that holds all
        try:
            again = [encode_layer(n, q, w, typ, float_type) for n, q, w in zip(names, qs, refs)]
        except UserError:
            continue
        if all(e.ggml_type == typ and e.method == "codes" for e in again):
            warn(
                f"{names[0].rpartition('.experts.')[0]}.experts: experts of one tensor written as {typ.upper()} "
                f"(auto chose {', '.join(t.upper() for t in types)}; GGUF has one type per tensor)"
            )
            return again
    typ = "q8_0" if refs[0].shape[1] % 32 == 0 else float_type
    warn(
        f"{names[0].rpartition('.experts.')[0]}.experts written as {typ.upper()} from floats: no block type holds "
        f"all of its experts' codes (auto chose {', '.join(t.upper() for t in types)})"
    )
    method, note = ("requantized", "re-quantized from floats") if typ == "q8_0" else ("float", "no common block type")
    data = [requantize(w, typ) if typ == "q8_0" else float_encode(w, typ) for w in refs]
    return [replace(encs[0], data=d, ggml_type=typ, method=method, note=note) for d in data]


def _rows(a: np.ndarray, part: int, parts: int) -> np.ndarray:
    """Rows `part` of `parts` equal slices along axis 1 of [E, rows, ...]."""
    step = a.shape[1] // parts
    return np.ascontiguousarray(a[:, part * step : (part + 1) * step])


def expert_tensors(g: ExpertGroup, ckpt, widths: dict, qtype: str, float_type: str, warn):
    """[(GGUF suffix, data, ggml type, method, bits, dequantized reference [E, rows, cols], note)] of group `g`."""
    if g.fused is not None:
        ref = g.fused.detach().float().numpy()
        data, typ, method, bits, note = float_encode(ref, float_type), float_type, "float", None, ""
    else:
        names = [g.layers[e] for e in range(len(g.layers))]
        qs = [ckpt.layers[n].slice(widths[n]) for n in names]
        refs = [q.dequantize(torch.float32).numpy() for q in qs]
        encs = [encode_layer(n, q, w, qtype, float_type) for n, q, w in zip(names, qs, refs)]
        for n, e in zip(names, encs):
            if e.method != "codes" or (qtype != "auto" and e.ggml_type != qtype):
                warn(f"{n} ({widths[n]}-bit) written as {e.ggml_type.upper()}: {e.note}")
        encs = _common_type(encs, qs, refs, names, float_type, warn)
        ref, data = np.stack(refs), np.stack([e.data for e in encs])
        typ, bits = encs[0].ggml_type, max(widths[n] for n in names)
        methods = {e.method for e in encs}
        method = "codes" if methods == {"codes"} else "requantized" if "requantized" in methods else "float"
        note = next((e.note for e in encs if e.note), "")
        if ref.shape[1] % 2 and g.proj == "gate_up_proj":
            raise UserError(f"{names[0]} has {ref.shape[1]} rows, which do not split into gate and up halves")
    return [
        (suffix, _rows(data, part, parts), typ, method, bits, _rows(ref, part, parts), note)
        for suffix, part, parts in GGUF_PARTS[g.proj]
    ]


def hf_experts(gguf_name: str) -> tuple[int, str, int, int] | None:
    """(block, HF projection, part, parts) of a GGUF expert tensor name (the inverse of GGUF_PARTS), else None."""
    m = re.fullmatch(r"blk\.(\d+)\.(ffn_\w+_exps)\.weight", gguf_name)
    if m is None:
        return None
    proj, part, parts = next((p, i, n) for p, ps in GGUF_PARTS.items() for s, i, n in ps if s == m.group(2))
    return int(m.group(1)), proj, part, parts


def join_experts(parts: dict[tuple[int, str], dict[int, np.ndarray]]) -> dict[str, np.ndarray]:
    """{matgptq layer name + ".weight": [out, in]} of each expert, from the read GGUF parts of each fused projection
    (gate rows before up rows)."""
    out = {}
    for (block, proj), pieces in parts.items():
        fused = np.concatenate([pieces[i] for i in sorted(pieces)], axis=1)
        for e in range(fused.shape[0]):
            out[f"model.layers.{block}.mlp.experts.{e}.{proj}.weight"] = fused[e]
    return out
