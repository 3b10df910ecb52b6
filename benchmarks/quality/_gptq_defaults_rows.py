"""What benchmarks/quality/gptq_defaults.py compares: its rows (every option spelled out), the peers and the MatGPTQ parents'
widths; the runner and the report (gptq_defaults_report.py, gptq_defaults_blocks.py) read these."""

from __future__ import annotations

# Every GPTQ option the ablation turns, at its value before the ablation (all off, damping 0.01, float32: the rows
# ran `--dtype auto`, float32 for these float32 models until auto calibrated GPTQ in bfloat16 on a CPU with bfloat16
# arithmetic; `default` has that).
ALL = {
    "group_act_order": False,
    "act_order": False,
    "static_groups": False,
    "damp": 0.01,
    "mse": False,
    "mse_weighted": False,
    "refit_scales": False,
    "true_sequential": True,
    "dtype": "float32",
}
GAR = {"group_act_order": True}
# each part of the parent's defaults, turned: the flags that turn it (added to `--method matgptq` with no other option)
PARENT_PARTS = {
    "no-mse": ["--no-mse"],  # min/max scales: no scale search
    "no-refit": ["--no-refit-scales"],  # the solver's scales kept: no least-squares refit per width
    "gar": ["--group-act-order"],  # GAR's column order in place of act order with static groups
    "damp0.05": ["--damp", "0.05"],  # five times the damping
    "asym": ["--asym"],  # an asymmetric grid with a zero point per group
    "shared-scales": ["--variant", "per-width"],  # every width slices the master's scales (no scales of its own)
    # calibration passes in float32: auto's for a parent until it took GPTQ's bfloat16 passes; its records ran then, as
    # `matgptq-default` with no option (auto was float32 for this float32 model, the same bytes: tests/test_api.py)
    "fp32": ["--dtype", "float32"],
}
AS_TYPED = "as typed"  # a row with no option at all, not even the script's calibration size: quantize's own
ROWS = {
    "default": None,  # no option at all: the defaults as they are when the script runs
    "default-own-size": AS_TYPED,
    "plain": {},  # every option off: the defaults before this ablation
    "gar": GAR,
    "gar-damp0.05": {**GAR, "damp": 0.05},
    "gar-mse": {**GAR, "mse": True},
    "gar-mse-w": {**GAR, "mse": True, "mse_weighted": True},
    "gar-refit": {**GAR, "refit_scales": True},
    "gar-mse-w-refit": {**GAR, "mse": True, "mse_weighted": True, "refit_scales": True},
    # the same calibrating in bfloat16, as GPTQModel does on a CPU (and as `--dtype auto` does for a bf16 model)
    "gar-mse-w-refit-bf16": {**GAR, "mse": True, "mse_weighted": True, "refit_scales": True, "dtype": "bfloat16"},
    "gar-not-seq": {**GAR, "true_sequential": False},
    # the defaults with one more option turned: damping, and the whole block's inputs at once (not true-sequential)
    "gar-mse-w-refit-damp0.05": {**GAR, "mse": True, "mse_weighted": True, "refit_scales": True, "damp": 0.05},
    "gar-mse-w-refit-not-seq": {
        **GAR,
        "mse": True,
        "mse_weighted": True,
        "refit_scales": True,
        "true_sequential": False,
    },
    # the defaults' options with another calibration size than the script's --nsamples x --seqlen: the CLI's own
    # default (the same tokens in shorter windows), and twice the tokens in longer windows or in more of them
    "gar-mse-w-refit-128x256": {
        **GAR,
        "mse": True,
        "mse_weighted": True,
        "refit_scales": True,
        "nsamples": 128,
        "seqlen": 256,
    },
    "gar-mse-w-refit-128x512": {
        **GAR,
        "mse": True,
        "mse_weighted": True,
        "refit_scales": True,
        "nsamples": 128,
        "seqlen": 512,
    },
    "gar-mse-w-refit-256x256": {
        **GAR,
        "mse": True,
        "mse_weighted": True,
        "refit_scales": True,
        "nsamples": 256,
        "seqlen": 256,
    },
    "gar-bf16": {**GAR, "dtype": "bfloat16"},
    "ao-static": {"act_order": True, "static_groups": True},
    "ao-static-damp0.05": {"act_order": True, "static_groups": True, "damp": 0.05},
    # act order with static groups in place of GAR, the defaults' other options kept (scale search, its weighting, refit)
    "ao-static-mse-w-refit": {
        "act_order": True,
        "static_groups": True,
        "mse": True,
        "mse_weighted": True,
        "refit_scales": True,
    },
    # the same calibrating in bfloat16: what `--dtype auto` gives a model stored in bfloat16 (SmolLM2 as published) on
    # a CPU with bfloat16 arithmetic, and what GPTQModel does with any model on a CPU
    "ao-static-mse-w-refit-bf16": {
        "act_order": True,
        "static_groups": True,
        "mse": True,
        "mse_weighted": True,
        "refit_scales": True,
        "dtype": "bfloat16",
    },
    # one MatGPTQ parent per seed (target widths PARENT_WIDTHS), each width scored as its slice: `matgptq-parent` with
    # the plain options (MatGPTQ's defaults), then with GPTQ's scale choice (`--method matgptq` re-checked, item 2)
    "matgptq-parent": {"method": "matgptq"},
    "matgptq-parent-gar-mse-w-refit": {
        "method": "matgptq",
        **GAR,
        "mse": True,
        "mse_weighted": True,
        "refit_scales": True,
    },
    "matgptq-parent-gar-refit": {"method": "matgptq", **GAR, "refit_scales": True},  # without the scale search's cost
    # the parent with GPTQ's default column order (act order, static groups), calibrating as `--dtype auto` does on a
    # CPU with bfloat16 arithmetic (the `default` row's), without and with the weighted scale search (issue #102)
    "matgptq-parent-ao-static-refit-bf16": {
        "method": "matgptq",
        "act_order": True,
        "static_groups": True,
        "refit_scales": True,
        "dtype": "bfloat16",
    },
    "matgptq-parent-ao-static-mse-w-refit-bf16": {
        "method": "matgptq",
        "act_order": True,
        "static_groups": True,
        "mse": True,
        "mse_weighted": True,
        "refit_scales": True,
        "dtype": "bfloat16",
    },
    # the same with the master width's weight λ_8 lowered from its default 16 (λ_3 = λ_4 = 1): the trade-off between
    # the narrow slices and the 8-bit one
    **{
        f"matgptq-parent-ao-static-mse-w-refit-bf16-l{lam}": {
            "method": "matgptq",
            "act_order": True,
            "static_groups": True,
            "mse": True,
            "mse_weighted": True,
            "refit_scales": True,
            "dtype": "bfloat16",
            "bit_weights": f"1,1,{lam}",
        }
        for lam in (1, 4)
    },
    "matgptq-default": {"method": "matgptq", "as_typed": True},  # --method matgptq and no option: its defaults
    # the default parent with one part of its defaults turned, the rest as typed (issue #102 item 2)
    **{
        f"matgptq-default-{part}": {"method": "matgptq", "as_typed": True, "flags": f}
        for part, f in PARENT_PARTS.items()
    },
    "gptqmodel": "peer",
    "llmcompressor": "peer",
    "llmcompressor-g64": "peer",  # where it cannot run the row's group size: the largest it runs on SmolLM2 (576 columns)
}
PEER_GROUP = {"llmcompressor-g64": 64}
PARENT_WIDTHS = "3,4,8"
PEER_LABELS = {
    "gptqmodel": "GPTQModel 7.6.0 (its defaults)",
    "llmcompressor": "llm-compressor 0.14 (its defaults)",
    "llmcompressor-g64": "llm-compressor 0.14 (its defaults) at g64",
}


CALIBRATION = ("nsamples", "seqlen")  # a row that sets these replaces the script's own


def options(row: dict) -> list[str]:
    """The command-line options of a row, every option of ALL spelled out (and the row's calibration size, if any:
    the last occurrence of an option is the one the command takes)."""
    s = {**ALL, **{k: v for k, v in row.items() if k != "method" and k not in CALIBRATION}}
    calibration = [x for k in CALIBRATION if k in row for x in (f"--{k}", str(row[k]))]
    out = [
        f"--{'' if s[k] else 'no-'}{k.replace('_', '-')}"
        for k in ("group_act_order", "mse", "mse_weighted", "refit_scales", "act_order", "static_groups")
    ]
    out += [] if s["true_sequential"] else ["--no-true-sequential"]
    weights = ["--bit-weights", row["bit_weights"]] if "bit_weights" in row else []
    return out + ["--damp", str(s["damp"]), "--dtype", s["dtype"], *weights, *calibration]


def flags(row: dict) -> list[str]:
    """The options a dict row's command adds: its own flags as typed, or every option of ALL spelled out."""
    return list(row.get("flags", [])) if row.get("as_typed") else options(row)


def is_parent(row: str) -> bool:
    return isinstance(ROWS[row], dict) and ROWS[row].get("method") == "matgptq"
