"""A quantize run's options, each defined once: as a field of one of the typed configs a run takes (the method's,
config.py; the calibration windows', calibration.py; the run's own, RunConfig here). They are given either as a
method config object or as flat keywords (the API's short form; the CLI's flags, cli/quantize_flags.py, give the same
keywords), and `settings` turns either into the same configs.

KEYWORDS names every keyword and the config fields it sets: each field under its own name, except the widths (`bits`:
one width, or MatGPTQ's target set R; `master_bits`: MatGPTQ's stored width; `bits_config`: a per-layer mix, checked
against the model's layers once it is loaded) and the two calibration fields the API spells after the text they cut
(`calib` for `path`, `calib_range` for `text_range`). A field added to a config is a keyword at once; the CLI's test
fails until it has a flag.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from difflib import get_close_matches
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from ..errors import UserError
from ..execution import DTYPES
from ..formats.mix import WidthSpec, width_spec
from ..formats.staged import SHARD_BYTES
from .calibration import CalibConfig
from .config import GridConfig, Method, MethodConfig, method_of
from .method_configs import CONFIGS, config_for

DEFAULT_METHOD = Method.GPTQ


@dataclass(frozen=True)
class RunConfig:
    """How a run executes and where its output goes: the dtype the calibration runs in (which the checkpoint records),
    the device, streaming, the shard size, and what to do with an existing output."""

    dtype: str = "auto"  # one of execution.DTYPES (run.calibration_dtypes resolves "auto")
    device: str = "auto"  # auto | cpu | cuda | cuda:i (execution/devices.py)
    stream: bool | None = None  # read each block from the files when it is quantized; None: whenever they allow it
    shard_bytes: int = SHARD_BYTES  # the largest file of the written checkpoint
    overwrite: bool = False
    resume: bool = False  # continue a killed run from its last finished block (quantization/resume.py)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UserError(f"--dtype {self.dtype} is not one of {', '.join(DTYPES)}")
        if self.shard_bytes < 1:
            raise UserError(f"--shard-size must be positive, got {self.shard_bytes} bytes")


class Part(str, Enum):
    """Which config a keyword fills."""

    METHOD = "method"  # the method config: given as `config` or as these keywords, not both
    MIX = "mix"  # the per-layer widths (the method config's layer_bits), resolved against the model: with either
    CALIBRATION = "calibration"
    RUN = "run"


class Keyword(NamedTuple):
    part: Part
    fields: tuple[str, ...]  # the fields of the part's config it sets (`method`: the config's class)


def configs_of(part: Part) -> tuple[type, ...]:
    """The config classes whose fields the keywords of `part` set."""
    return {Part.CALIBRATION: (CalibConfig,), Part.RUN: (RunConfig,)}.get(part, tuple(CONFIGS.values()))


def choices_of(part: Part) -> dict[str, None]:
    """The fields of `part`'s configs a run is given, in declaration order (a dict as an ordered set): all but
    those outside a config's equality (CalibConfig's hash of the text: a record of the run, not a choice)."""
    return {f.name: None for cls in configs_of(part) for f in fields(cls) if f.compare}


def derive_keywords() -> dict[str, Keyword]:
    """Every keyword, from the configs' fields (module docstring)."""
    widths = {"method": ("method",), "bits": ("bits", "target_bits"), "master_bits": ("bits",)}
    kw = {k: Keyword(Part.METHOD, f) for k, f in widths.items()}
    by_widths = {f for fs in widths.values() for f in fs} | {"layer_bits"}
    kw.update({name: Keyword(Part.METHOD, (name,)) for name in choices_of(Part.METHOD) if name not in by_widths})
    kw["bits_config"] = Keyword(Part.MIX, ("layer_bits",))
    renamed = {"path": "calib", "text_range": "calib_range"}
    kw.update({renamed.get(n, n): Keyword(Part.CALIBRATION, (n,)) for n in choices_of(Part.CALIBRATION)})
    kw.update({n: Keyword(Part.RUN, (n,)) for n in choices_of(Part.RUN)})
    return kw


KEYWORDS = derive_keywords()


def parse_bits(bits: int | str | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    if isinstance(bits, int):
        return (bits,)
    if isinstance(bits, str):
        return tuple(int(b) for b in bits.split(",") if b.strip())
    return tuple(int(b) for b in bits)


def make_config(
    method: str | Method = DEFAULT_METHOD,
    bits=None,
    master_bits: int | None = None,
    bit_weights: tuple[float, ...] | None = None,
    **options,
) -> MethodConfig:
    """The method's typed config (config.py) from the short keywords: `bits` is one width (None: the configs'
    default), or the target set R for MatGPTQ (its master width `master_bits`, default the widest); `options` are
    the configs' other fields, None meaning the method's default."""
    method = method_of(method)
    widths = parse_bits(GridConfig.bits if bits is None else bits)
    if method is Method.MATGPTQ:
        master = master_bits or max(widths)
        return config_for(method, bits=master, target_bits=widths, bit_weights=tuple(bit_weights or ()), **options)
    if len(widths) != 1:
        raise UserError(
            f"--method {method.value} takes one width, got {list(widths)}; use --method matgptq for several"
        )
    return config_for(method, bits=widths[0], **options)


class Settings(NamedTuple):
    """Everything a quantize run is given besides the model, the output and the calibration text itself."""

    method: MethodConfig
    calibration: CalibConfig
    run: RunConfig
    bits_config: WidthSpec | None  # the per-layer mix, resolved against the model's layers (run.py)


def settings(config: MethodConfig | None = None, **options) -> Settings:
    """The typed configs of a run from a method config object or the short keywords (KEYWORDS; not both for the
    method's), and the other keywords. A keyword given as None takes its default. An unknown keyword, a config that
    is not a method config, or both forms is a TypeError, as a wrong argument of any function is."""
    unknown = [k for k in options if k not in KEYWORDS]
    if unknown:
        named = [f"{k} (did you mean {m[0]}?)" if (m := get_close_matches(k, KEYWORDS, 1)) else k for k in unknown]
        raise TypeError(
            f"quantize() got unknown option(s) {', '.join(named)}; the options are the flags of `matgptq "
            "quantize --help` as keywords (--group-size: group_size)"
        )
    given = {p: {k: v for k, v in options.items() if KEYWORDS[k].part is p and v is not None} for p in Part}
    bits_config = given[Part.MIX].get("bits_config")
    if config is None:
        width_spec(given[Part.METHOD].get("bits"), bits_config)  # one of them
        method = make_config(**given[Part.METHOD])
    else:
        method, bits_config = _config_object(config, given[Part.METHOD], bits_config)
    calib = {KEYWORDS[k].fields[0]: v for k, v in given[Part.CALIBRATION].items()}
    if "path" in calib:  # a file; a list of texts has no path
        calib["path"] = str(calib["path"]) if isinstance(calib["path"], (str, Path)) else None
    if "text_range" in calib:
        calib["text_range"] = tuple(calib["text_range"])
    run = RunConfig(**{KEYWORDS[k].fields[0]: v for k, v in given[Part.RUN].items()})
    return Settings(method, CalibConfig(**calib), run, bits_config)


def _config_object(config, keywords: dict, bits_config: WidthSpec | None) -> tuple[MethodConfig, WidthSpec | None]:
    """A method config given as an object: no method keywords beside it; a per-layer mix in it (`layer_bits`, e.g. a
    checkpoint's record) is checked against the model's layers as `bits_config` is ("*": the config's `bits`)."""
    if type(config) not in CONFIGS.values():
        names = ", ".join(f"matgptq.{cls.__name__}" for cls in CONFIGS.values())
        raise TypeError(f"config must be a method config ({names}), got {type(config).__name__}")
    if keywords:
        raise TypeError(
            "quantize() takes the method's options either as config= or as keywords, not both: got "
            f"config={type(config).__name__}(...) and {', '.join(keywords)}; put them in the "
            "config"
        )
    if config.layer_bits:
        if bits_config is not None:
            raise TypeError("quantize() got the per-layer widths twice: config.layer_bits and bits_config; give one")
        bits_config = {"*": config.bits, **dict(config.layer_bits)}
    return config, bits_config
