"""Each method's config by name: the class of each Method (CONFIGS), a config built from the flat options the API
and CLI take (`config_for`) or read back from a checkpoint's `matgptq.json` record (`config_from_json`, the inverse of
the configs' `to_json`, config.py), and the defaults --help shows per method (METHOD_DEFAULTS).
"""

from __future__ import annotations

from dataclasses import fields

from ..errors import UserError
from .config import GPTQConfig, GridConfig, MatGPTQConfig, Method, MethodConfig, RTNConfig, Variant, method_of

CONFIGS: dict[Method, type[GridConfig]] = {
    Method.GPTQ: GPTQConfig,
    Method.MATGPTQ: MatGPTQConfig,
    Method.RTN: RTNConfig,
}
OPTIONS = frozenset(f.name for cls in CONFIGS.values() for f in fields(cls))  # every method's options together


SHOWN_DEFAULTS = (
    "group_size",
    "act_order",
    "static_groups",
    "group_act_order",
    "mse",
    "mse_weighted",
    "refit_scales",
    "damp",
)
# each method's default of the options --help and docs/guide/quantize.md show per method (resolved as without
# --target); an on/off option the method does not have is off, a numeric one is absent
METHOD_DEFAULTS: dict[Method, dict[str, object]] = {
    m: {k: getattr(cfg, k, False) for k in SHOWN_DEFAULTS if hasattr(cfg, k) or k != "damp"}
    for m, cfg in ((m, cls()) for m, cls in CONFIGS.items())
}


# GPTQ's options that act through the calibration Hessian, which RTN does not collect: refused with RTN when on
NEEDS_HESSIAN = {
    "mse_weighted": "weights",
    "refit_scales": "fits scales on",
    "act_order": "orders columns by",
    "group_act_order": "orders groups by",
    "static_groups": "fixes groups for the column order of",
}


def config_for(method: str | Method, **options) -> MethodConfig:
    """The method's config from flat options (the API's and CLI's keyword arguments, which name every option). An
    option that is None takes the config's default; one the method does not have is dropped, unless it is on and
    acts through the calibration Hessian RTN does not collect (NEEDS_HESSIAN), which is refused."""
    cls = CONFIGS[method_of(method)]
    unknown = set(options) - OPTIONS
    if unknown:
        raise TypeError(f"unknown quantization option(s): {', '.join(sorted(unknown))}")
    own = {f.name for f in fields(cls)}
    for name, verb in NEEDS_HESSIAN.items():
        if name not in own and options.get(name):
            raise UserError(
                f"--{name.replace('_', '-')} {verb} the calibration Hessian, which RTN does not collect; "
                "use --method gptq or matgptq"
            )
    return cls(**{k: v for k, v in options.items() if k in own and v is not None})


def config_from_json(record: dict) -> MethodConfig:
    """The config a checkpoint's "quantization" record describes. Recorded before an option existed means made
    without it (not with today's default): MatGPTQ before variants is the paper's; before group act-order, the
    weighted search and the refit, without them. Keys the method does not have (older records wrote every key)
    are ignored; a record no config can be built from is a UserError."""
    cls = CONFIGS[method_of(record.get("method", Method.GPTQ.value))]
    old = {
        "variant": Variant.PAPER.value,
        "act_order": False,
        "static_groups": False,
        "group_act_order": False,
        "mse_weighted": False,
        "refit_scales": False,
    }
    d = {**old, **record}
    mix = d.get("layer_bits") or {}
    d["layer_bits"] = tuple(mix.items()) if isinstance(mix, dict) else mix
    own = {f.name for f in fields(cls)}
    try:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in own and v is not None})
    except (TypeError, ValueError, UserError) as e:
        raise UserError(
            f"the checkpoint's `quantization` record is not valid ({e}); re-create the checkpoint"
        ) from None
