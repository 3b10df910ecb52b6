"""What benchmarks/gguf/presets.py compares: llama.cpp's presets, our checkpoints and the GGUF rows made from
them, and their labels (the runner and the report both read these)."""

from __future__ import annotations

ISSUE_PRESETS = ("Q4_0", "Q4_K_M", "Q3_K_M")  # issue 12's; ours must be ≤ their bytes
PRESETS = (*ISSUE_PRESETS, "Q4_K_S-e51")
# preset -> llama-quantize's type and options. "Q4_K_S-e51": the reallocation our Q5_1-embedding rows make, done by
# llama.cpp itself (`--token-embedding-type q5_1`, as EMBED_OF's rows), the richest preset that then still fits in
# Q3_K_M's tensor bytes (Q4_K_S: 91.41 MB against 91.72); the fair opponent for those rows, not one of issue 12's
QUANTIZE = {p: (p, ()) for p in PRESETS} | {"Q4_K_S-e51": ("Q4_K_S", ("--token-embedding-type", "q5_1"))}
PRESET_LABEL = {"Q4_K_S-e51": "Q4_K_S, token_embd Q5_1"}
# ours: name -> (checkpoint, the width or per-layer mix exported, the presets it is compared with); --type auto writes
# 4 -> Q4_0, 5 -> Q5_0. The mix keeps attn_v/attn_output at 5 bits (Q5_0), as Q3_K_M does, from one MatGPTQ [4,5]
# parent: 13.3M weights · 1 bit more than Q4_0 = 1.66 MB, inside the 1.78 MB Q3_K_M spends over Q4_0.
V_O_AT_5 = {"*": 4, **{f"model.layers.{i}.self_attn.{m}": 5 for i in range(30) for m in ("v_proj", "o_proj")}}
# checkpoint -> (method, bits, flags beyond GPTQ_FLAGS). "-hw": the Hessian-weighted grid search and scale refit
# (`--mse-weighted --refit-scales`, grid.py and refit.py): llama.cpp's imatrix idea on top of GPTQ's error feedback.
HW = ("--mse-weighted", "--refit-scales")
CKPTS = {
    "gptq4": ("gptq", "4", ()),
    "gptq5": ("gptq", "5", ()),
    "matgptq45": ("matgptq", "4,5", ()),
    "gptq4-hw": ("gptq", "4", HW),
    "gptq5-hw": ("gptq", "5", HW),
    "matgptq45-hw": ("matgptq", "4,5", HW),
    "matgptq458-hw": ("matgptq", "4,5,8", HW),
    # ffn_down's 1536-wide rows on Q6_K's signed lattice: its 6-bit slice is an exact Q6_K (6.56 bits per weight
    # instead of Q8_0's 8.5), as Q4_K_M gives ffn_down Q6_K; the 576-wide layers are unconstrained (legacy types)
    "matgptq4568-q6k-hw": ("matgptq", "4,5,6,8", (*HW, "--kquant", "q6_k")),
}
# (SEARCH, PRESET, EMBED[, "dp"[, RESOLVE]]): the widths `matgptq search` finds for the [4,5,8] parent at the preset's
# tensor bytes, with token_embd (tied output) in EMBED; Q5_1 instead of Q8_0 frees 10 of every 34 bytes of it for the
# layers. Without "dp" the evolved mix (search_bits), with it the knapsack start (dp_bits): what the evolution adds.
# The command itself writes whichever of the two scores lower on its calibration pool. RESOLVE: that mix solved again,
# every layer a dedicated GPTQ run at its width (`quantize --method gptq --bits-config MIX`, the "-hw" options)
# instead of the parent's slice: the same per-layer types, so the same bytes
SEARCH, RESOLVE = "search", "gptq"
EMBED_BLOCK_BYTES = {"q8_0": 34, "q5_1": 24}  # bytes per block of 32 weights (ggml-common.h)
# parent -> (budget kind, levels) of its search. "code" on the [4,5,8] parent: Q4_0, Q5_0, Q8_0 all carry 1/2 bit of
# scale per weight, so code bits + 1/2 are the GGUF bits (search_budget); "gguf" counts the file's bytes directly
SEARCH_OF = {"matgptq458-hw": ("code", "4,5,8"), "matgptq4568-q6k-hw": ("gguf", "4,5,6,8")}
OURS = {
    "gptq4": ("gptq4", None, ("Q4_0", "Q3_K_M")),
    "gptq5": ("gptq5", None, ("Q4_K_M",)),
    "matgptq45-mix": ("matgptq45", V_O_AT_5, ("Q3_K_M",)),
    "matgptq45-5": ("matgptq45", 5, ("Q4_K_M",)),
    "gptq4-hw": ("gptq4-hw", None, ("Q4_0", "Q3_K_M")),
    "gptq5-hw": ("gptq5-hw", None, ("Q4_K_M",)),
    "matgptq45-hw-mix": ("matgptq45-hw", V_O_AT_5, ("Q3_K_M",)),
    "matgptq458-hw-q4km": ("matgptq458-hw", (SEARCH, "Q4_K_M", "q8_0"), ("Q4_K_M",)),
    "matgptq458-hw-q3km": ("matgptq458-hw", (SEARCH, "Q3_K_M", "q8_0"), ("Q3_K_M",)),
    "matgptq458-hw-q3km-e51": ("matgptq458-hw", (SEARCH, "Q3_K_M", "q5_1"), ("Q3_K_M", "Q4_K_S-e51")),
    "matgptq458-hw-q4km-dp": ("matgptq458-hw", (SEARCH, "Q4_K_M", "q8_0", "dp"), ("Q4_K_M",)),
    "matgptq458-hw-q3km-e51-dp": ("matgptq458-hw", (SEARCH, "Q3_K_M", "q5_1", "dp"), ("Q3_K_M", "Q4_K_S-e51")),
    "matgptq458-hw-q4km-dp-gptq": ("matgptq458-hw", (SEARCH, "Q4_K_M", "q8_0", "dp", RESOLVE), ("Q4_K_M",)),
    "matgptq458-hw-q3km-e51-dp-gptq": (
        "matgptq458-hw",
        (SEARCH, "Q3_K_M", "q5_1", "dp", RESOLVE),
        ("Q3_K_M", "Q4_K_S-e51"),
    ),
    "matgptq4568-q6k-hw-q4km": ("matgptq4568-q6k-hw", (SEARCH, "Q4_K_M", "q8_0"), ("Q4_K_M",)),
    "matgptq4568-q6k-hw-q4km-dp": ("matgptq4568-q6k-hw", (SEARCH, "Q4_K_M", "q8_0", "dp"), ("Q4_K_M",)),
    "gptq5-hw-e16": ("gptq5-hw", None, ()),
    "gptq5-hw-e51": ("gptq5-hw", None, ()),
    "gptq5-hw-e50": ("gptq5-hw", None, ()),
}
# what the token_embd type alone costs: the GPTQ-5 file again with token_embd in F16, Q5_1 or Q5_0 (not size-matched)
EMBED_OF = {"gptq5-hw-e16": "f16", "gptq5-hw-e51": "q5_1", "gptq5-hw-e50": "q5_0"}
GPTQ_FLAGS = ["--group-size", "32", "--signed-scale", "--act-order", "--static-groups", "--mse"]
DATASETS = ("wiki", "ts")
GOAL = 0.7

LABEL = {
    "f32": "F32 (convert_hf_to_gguf)",
    "gptq4": "**ours: GPTQ-4 → Q4_0**",
    "gptq5": "**ours: GPTQ-5 → Q5_0**",
    "matgptq45-mix": "**ours: MatGPTQ[4,5] mix, attn_v/o 5-bit → Q4_0+Q5_0**",
    "matgptq45-5": "**ours: MatGPTQ[4,5] 5-bit slice → Q5_0**",
    "gptq4-hw": "**ours: GPTQ-4 + Hessian-weighted grid & refit → Q4_0**",
    "gptq5-hw": "**ours: GPTQ-5 + Hessian-weighted grid & refit → Q5_0**",
    "matgptq45-hw-mix": "**ours: MatGPTQ[4,5] + weighted grid & refit, attn_v/o 5-bit → Q4_0+Q5_0**",
    "matgptq458-hw-q4km": "**ours: MatGPTQ[4,5,8] + weighted grid & refit, searched mix at Q4_K_M's size**",
    "matgptq458-hw-q3km": "**ours: MatGPTQ[4,5,8] + weighted grid & refit, searched mix at Q3_K_M's size**",
    "matgptq458-hw-q3km-e51": "**ours: the same at Q3_K_M's size, token_embd Q5_1**",
    "matgptq458-hw-q4km-dp": "**ours: the search's knapsack start at Q4_K_M's size (no evolution)**",
    "matgptq458-hw-q3km-e51-dp": "**ours: the search's knapsack start at Q3_K_M's size, token_embd Q5_1**",
    "matgptq458-hw-q4km-dp-gptq": "**ours: that knapsack mix at Q4_K_M's size, each layer solved again by GPTQ at "
    "its width**",
    "matgptq458-hw-q3km-e51-dp-gptq": "**ours: that knapsack mix at Q3_K_M's size (token_embd Q5_1), each layer "
    "solved again by GPTQ at its width**",
    "matgptq4568-q6k-hw-q4km": "**ours: MatGPTQ[4,5,6,8] on Q6_K's lattice + weighted grid & refit, searched at "
    "Q4_K_M's size (GGUF budget)**",
    "matgptq4568-q6k-hw-q4km-dp": "**ours: its knapsack start at Q4_K_M's size**",
    **{n: f"ours: GPTQ-5 + weighted grid & refit → Q5_0, token_embd {t.upper()}" for n, t in EMBED_OF.items()},
}


def label(name: str) -> str:
    if name.startswith("llama:"):
        preset, im = name[6:].split("+")[0], name.endswith("+im")
        return f"llama.cpp {PRESET_LABEL.get(preset, preset)}" + (" + imatrix" if im else "")
    return LABEL.get(name, name)
