"""compressed-tensors `pack-quantized` checkpoints (writer.py's and llm-compressor's) read as a `Checkpoint` of plain
b-bit layers (shift 0), so `matgptq.load`, `eval` and the exporters take them like GPTQ ones. Which Linears are
quantized, and how: scheme.py.

Tensors per quantized Linear `<name>` (N out, K in features, b = num_bits in 2..8, G groups):
  <name>.weight_packed      int32 [N, ceil(K·b/32)]  u = q + 2^(b−1) per row as a little-endian bit stream: u[n, k]
                                                    at stream bits [k·b, (k+1)·b), stream bit j = bit j mod 32 of
                                                    word j // 32 (codes straddle words at 3/5/6/7 bits: packing.py)
  <name>.weight_scale       float [N, G]             G = K / group_size ("group"), 1 ("channel"); one value ("tensor")
  <name>.weight_zero_point  int32 [ceil(N·b/32), G]  asymmetric group/channel: zp + 2^(b−1) packed the same way along
                                                    N; asymmetric "tensor": zp itself, one integer
  <name>.weight_shape       int [2]                  [N, K]
  <name>.weight_g_idx       int32 [K]                only with actorder "group" (older compressed-tensors)
dequantizing (compressed-tensors' `dequantize`) to

    W[n, k] = scale[n, g] · (q[n, k] − zp[n, g]) = scale[n, g] · (u[n, k] − (zp[n, g] + 2^(b−1))),  g = g_idx[k]

which is the QuantizedWeight with codes u, zeros zp + 2^(b−1) (2^(b−1) when symmetric: zp = 0) and the scales in
float16; a scale float16 cannot hold exactly is refused, never rounded. Our product is exact in float32 (an integer of
at most 9 bits times an 11-bit significand); compressed-tensors rounds the same product once to the scale's dtype, so
the two agree exactly in that dtype. With g_idx, compressed-tensors sorts the columns by group and cuts them into
consecutive blocks of group_size: that is scale[:, g_idx[k]] exactly when every group holds group_size columns, and
is refused otherwise; a g_idx holding −1 (never initialised) means column order, as there.

Refused in one line, beyond the schemes scheme.py refuses: 3/5/6/7 bits of a file whose `version` is below
STRADDLING (32 // b codes per word, no straddling; 2/4/8 bits are the same stream in both), and mixture-of-experts
checkpoints (per-expert Linears `<p>.experts.<e>.*_proj`, experts.py): matgptq runs fused experts and does not rejoin
them from this layout.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from ...errors import UserError
from ...untrusted import read_json, read_model_weights
from ..quantized import Checkpoint, QuantizedWeight
from .constants import FIX, FORMAT, INT_DTYPES, PARAMS, SCALE_DTYPES, STRADDLING
from .packing import unpack_int32
from .scheme import Scheme, read_schemes, scheme_of

_PARAM = re.compile(rf"^(.+)\.({'|'.join(PARAMS)})$")
_EXPERT = re.compile(r"\.experts\.\d+\.")


def _shape(p: Path, name: str, raw: dict, s: Scheme) -> tuple[int, int]:
    """[N, K] from weight_shape, checked against the packed words."""
    packed, shape = raw.get(f"{name}.weight_packed"), raw.get(f"{name}.weight_shape")
    if packed is None or packed.dtype != torch.int32 or packed.dim() != 2:
        raise UserError(f"{p}: {name}.weight_packed must be a 2-D int32 tensor; {FIX}")
    if shape is None or shape.dtype not in INT_DTYPES or shape.shape != (2,) or bool((shape < 1).any()):
        raise UserError(f"{p}: {name}.weight_shape must hold the layer's two positive sizes [out, in]; {FIX}")
    n, k = (int(v) for v in shape.tolist())
    if packed.shape != (n, -(-k * s.bits // 32)):
        raise UserError(
            f"{p}: {name}.weight_packed is {list(packed.shape)}, which is not a {n}×{k} layer packed at "
            f"{s.bits} bits ([{n}, {-(-k * s.bits // 32)}]); {FIX}"
        )
    return n, k


def _scales(p: Path, name: str, scale: torch.Tensor | None, n: int, k: int, s: Scheme) -> torch.Tensor:
    """float16 [N, G] scales, checked (shape, finite, exact in float16)."""
    groups = k // s.group_size if s.strategy == "group" else 1
    if s.strategy == "group" and k % s.group_size:
        raise UserError(
            f"{p}: {name} has {k} input features, which group_size {s.group_size} does not divide "
            "(compressed-tensors cannot decompress it either); re-export it"
        )
    if scale is None or scale.dtype not in SCALE_DTYPES:
        raise UserError(f"{p}: {name}.weight_scale is missing or not float16/bfloat16/float32; {FIX}")
    if s.strategy == "tensor" and scale.numel() == 1:
        scale = scale.reshape(1, 1).expand(n, 1)
    if tuple(scale.shape) != (n, groups):
        raise UserError(
            f"{p}: {name}.weight_scale is {list(scale.shape)}, expected [{n}, {groups}] for its "
            f"{s.strategy} scales; {FIX}"
        )
    if not bool(torch.isfinite(scale).all()):
        raise UserError(f"{p}: {name}.weight_scale holds NaN or Inf; the checkpoint is corrupt")
    half = scale.to(torch.float16)
    if not torch.equal(half.to(scale.dtype), scale):
        raise UserError(
            f"{p}: {name} has {str(scale.dtype).removeprefix('torch.')} scales that float16 cannot hold "
            "exactly (matgptq keeps float16 scales)"
        )
    return half.contiguous()


def _zeros(p: Path, name: str, zp: torch.Tensor | None, n: int, groups: int, s: Scheme) -> torch.Tensor:
    """uint8 [N, G] zero points on the unsigned grid: zp + 2^(b−1) (2^(b−1) when symmetric)."""
    mid = 1 << (s.bits - 1)
    if s.symmetric:
        if zp is not None and (zp.dtype not in INT_DTYPES or zp.numel() not in (1, n * groups) or bool(zp.any())):
            raise UserError(f"{p}: {name} is symmetric but stores non-zero zero points; {FIX}")
        return torch.full((n, groups), mid, dtype=torch.uint8)
    if zp is None or zp.dtype not in INT_DTYPES:
        raise UserError(f"{p}: {name} is asymmetric but has no integer weight_zero_point; {FIX}")
    if s.strategy == "tensor":
        if zp.numel() != 1 or not -mid <= int(zp.flatten()[0]) < mid:
            raise UserError(f"{p}: {name}.weight_zero_point must be one integer in [{-mid}, {mid - 1}]; {FIX}")
        return torch.full((n, 1), int(zp.flatten()[0]) + mid, dtype=torch.uint8)
    if zp.dtype != torch.int32 or zp.shape != (-(-n * s.bits // 32), groups):
        raise UserError(
            f"{p}: {name}.weight_zero_point is {str(zp.dtype).removeprefix('torch.')} "
            f"{list(zp.shape)}, expected int32 [{-(-n * s.bits // 32)}, {groups}]; {FIX}"
        )
    return torch.from_numpy(np.ascontiguousarray(unpack_int32(zp.numpy().T, s.bits, n).T))


def _g_idx(p: Path, name: str, g_idx: torch.Tensor | None, k: int, groups: int, s: Scheme) -> torch.Tensor:
    """int32 [K] group of each column: k // group_size, 0 (channel, tensor), or a valid stored weight_g_idx."""
    if g_idx is not None and (s.strategy != "group" or s.actorder != "group"):
        raise UserError(
            f"{p}: {name} stores weight_g_idx, which compressed-tensors reads only for group scales with "
            f"actorder 'group' (this layer: {s.strategy}, actorder {s.actorder!r}); {FIX}"
        )
    if s.strategy != "group":
        return torch.zeros(k, dtype=torch.int32)
    trivial = torch.arange(k, dtype=torch.int32) // s.group_size
    if g_idx is not None and g_idx.dtype not in INT_DTYPES:
        raise UserError(
            f"{p}: {name}.weight_g_idx is {str(g_idx.dtype).removeprefix('torch.')}, not an integer tensor; {FIX}"
        )
    if g_idx is None or bool((g_idx == -1).any()):  # −1: never initialised, column order (compressed-tensors)
        return trivial
    if g_idx.shape != (k,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
        raise UserError(f"{p}: {name}.weight_g_idx must give each of its {k} columns one of {groups} groups; {FIX}")
    if bool((torch.bincount(g_idx.long(), minlength=groups) != s.group_size).any()):
        raise UserError(
            f"{p}: {name}.weight_g_idx gives its groups other than {s.group_size} columns each, which "
            "compressed-tensors decodes unlike its g_idx; matgptq cannot read it"
        )
    return g_idx.to(torch.int32).contiguous()


def read_layer(p: Path, name: str, raw: dict[str, torch.Tensor], s: Scheme) -> QuantizedWeight:
    """Layer `name` from its tensors (removed from `raw`) as a QuantizedWeight, exactly (module docstring)."""
    n, k = _shape(p, name, raw, s)
    if f"{name}.weight" in raw:
        raise UserError(f"{p}: {name} stores both a float weight and a packed one; {FIX}")
    packed = raw.pop(f"{name}.weight_packed")
    raw.pop(f"{name}.weight_shape")
    scales = _scales(p, name, raw.pop(f"{name}.weight_scale", None), n, k, s)
    zeros = _zeros(p, name, raw.pop(f"{name}.weight_zero_point", None), n, scales.shape[1], s)
    g_idx = _g_idx(p, name, raw.pop(f"{name}.weight_g_idx", None), k, scales.shape[1], s)
    codes = torch.from_numpy(unpack_int32(packed.numpy(), s.bits, k))
    return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, g_idx=g_idx, bits=s.bits)


def _in_order(names: set[str], targets: dict[str, Scheme]) -> list[str]:
    """Layers in the order the config names them exactly (module order, as our exports list them), then the others
    in natural order (layer 2 before layer 10)."""
    listed = {t: i for i, t in enumerate(targets)}
    natural = lambda n: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", n)]  # noqa: E731
    return sorted(names, key=lambda n: (listed.get(n, len(listed)), natural(n)))


def _check_version(p: Path, qc: dict, bits: set[int]) -> None:
    """Refuse 3/5/6/7 bits packed before STRADDLING (32 // b codes per word: module docstring)."""
    m = re.match(r"^(\d+)\.(\d+)", str(qc.get("version") or ""))
    odd = sorted(bits - {2, 4, 8})
    if m and (int(m.group(1)), int(m.group(2))) < STRADDLING and odd:
        since = "%d.%d" % STRADDLING
        raise UserError(
            f"{p} was written by compressed-tensors {qc['version']}, whose {odd[0]}-bit packing (no codes "
            f"across words) predates {since}; re-save it with compressed-tensors >= {since}"
        )


def _meta(qc: dict, schemes: list[Scheme]) -> dict:
    """matgptq.json-like record: the widest width, the one group size (-1: per channel) if all layers share it."""
    sizes = {s.group_size if s.strategy == "group" else -1 for s in schemes}
    quant = {
        "method": "gptq",
        "bits": max(s.bits for s in schemes),
        "sym": all(s.symmetric for s in schemes),
        "act_order": any(s.actorder for s in schemes),
    }
    if len(sizes) == 1:
        quant["group_size"] = sizes.pop()
    return {
        "format": "compressed-tensors",
        "checkpoint_format": f"{FORMAT} {qc.get('version', '')}".strip(),
        "quantization": quant,
    }


def read_ct_checkpoint(path: str | Path) -> Checkpoint:
    """A compressed-tensors pack-quantized checkpoint directory (safetensors) as a `Checkpoint` of b-bit layers."""
    p = Path(path)
    config = read_json(p / "config.json", FIX)
    qc = config.pop("quantization_config", None)
    if not isinstance(qc, dict):
        raise UserError(f"{p}/config.json: `quantization_config` is not an object; {FIX}")
    targets, ignore = read_schemes(p, qc)
    raw = read_model_weights(p, FIX)
    names = _in_order({m.group(1) for key in raw if (m := _PARAM.match(key))}, targets)
    if not names:
        raise UserError(f"{p} stores no packed weights (<name>.weight_packed); {FIX}")
    expert = next((n for n in names if _EXPERT.search(n)), None)
    if expert is not None:
        raise UserError(
            f"{p} quantizes per-expert Linears ({expert}); matgptq does not read compressed-tensors "
            "mixture-of-experts checkpoints: load the matgptq parent or a GPTQ checkpoint of the "
            "model"
        )
    schemes = {}
    for name in names:
        s = scheme_of(name, targets, ignore)
        if s is None:
            raise UserError(
                f"{p}: {name} is stored quantized but no config group targets it (or `ignore` lists it); fix the config"
            )
        schemes[name] = s
    _check_version(p, qc, {s.bits for s in schemes.values()})
    layers = {name: read_layer(p, name, raw, s) for name, s in schemes.items()}
    return Checkpoint(_meta(qc, list(schemes.values())), config, layers, raw, p)
