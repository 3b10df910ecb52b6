"""The width spec: which width each quantized layer takes, in the one form `quantize`, `load`, `set_bits`, `eval`,
`export` and transformers' `MatGPTQQuantizationConfig` take it: a width (an int: every layer), a per-layer mix
`{layer: bits}`, or the path of a mix JSON file, as `matgptq search` writes it.

JSON `{layer: bits}` with full module names (e.g. "model.layers.0.self_attn.q_proj"); "*" gives the width of every
layer not named; a search's mix file nests the mapping under "bits".
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..untrusted import read_json

WidthSpec = int | dict[str, int] | str | Path


def width_spec(bits: int | None, bits_config: WidthSpec | None) -> WidthSpec | None:
    """The one spec of a command that takes `--bits R` or `--bits-config MIX` (None: neither)."""
    if bits is not None and bits_config is not None:
        raise UserError("give either --bits or --bits-config, not both")
    return bits if bits is not None else bits_config


def width_specs(text: str) -> list[WidthSpec]:
    """Several specs from one option, as `eval --bits` takes them: "3,4,6,8" is four widths, anything else one spec
    (a mix file)."""
    parts = text.split(",")
    return [int(b) for b in parts] if all(b.strip().isdigit() for b in parts) else [text]


def read_mix(spec: WidthSpec, names: list[str]) -> dict[str, int]:
    """Every layer of `names` -> its width. Unknown or missing layers and widths that are not integers are a
    `UserError`; which widths exist is the caller's check (it depends on what holds the weights)."""
    if isinstance(spec, (str, Path)) and not str(spec).isdigit():
        data = read_json(spec, 'give a bits config: a JSON file {layer: bits} ("*" = default)')
        spec = data.get("bits", data)
    if isinstance(spec, (int, str)) and not isinstance(spec, bool) and str(spec).isdigit():
        spec = {"*": int(spec)}
    if not isinstance(spec, dict):
        raise UserError(f"bits must be an int, a {{layer: bits}} mapping or a JSON file, got {type(spec).__name__}")
    wrong = [k for k, v in spec.items() if not isinstance(v, int) or isinstance(v, bool)]
    if wrong:
        raise UserError(f"the bits config gives {wrong[0]} the width {spec[wrong[0]]!r}; widths must be integers")
    unknown = sorted(set(spec) - set(names) - {"*"})
    if unknown:
        raise UserError(
            f"the bits config names {len(unknown)} unknown layers (e.g. {unknown[0]}); use names from {names[0]}…"
        )
    missing = [n for n in names if n not in spec and "*" not in spec]
    if missing:
        raise UserError(
            f'the bits config misses {len(missing)} layers (e.g. {missing[0]}); list them or add a "*" default'
        )
    return {n: int(spec.get(n, spec.get("*"))) for n in names}
