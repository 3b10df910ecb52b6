"""What a search gives one width: each layer alone, or each group of layers an engine runs as one, tied.

vLLM runs a block's q/k/v as one `qkv_proj`, its gate/up as one `gate_up_proj` and its experts as one fused MoE
layer, with one quantization scheme per fused layer (models/fused.py finds the groups from the model's own forward;
exporters/readers.py names a file that splits one). A tied search (`search --tie`, the default) makes each such group
one *unit*: the mix holds one width per unit, the cost model counts a unit as its layers' sum (budget.GroupSize, so
the budget stays exact), and the tables score a unit as a whole (sensitivity.py lowers all its layers together) or,
where a table is made layer by layer (allocators.ERROR, gradient.py), add its layers' increments over the table's
base b (the loss of the mix the table is made at; 0 for ERROR's errors):

    v_U(r) = b + Σ_{l ∈ U} (v_l(r) − b)

the additive model every allocator already assumes, applied inside the unit. The probe's relative weight error of a
unit is its layers' summed squared error over their summed squared norm (sensitivity.weight_errors). Untied
(`--no-tie`), every layer is a unit of its own and the search is the layer-wise one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Mix = tuple[int, ...]  # one width per unit (fitness.Mix)


@dataclass(frozen=True)
class Units:
    """The parent's quantized layers (in its order) and the units they fall into (indices into `layers`)."""

    layers: tuple[str, ...]
    members: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        flat = sorted(i for unit in self.members for i in unit)
        if flat != list(range(len(self.layers))) or not all(self.members):
            raise ValueError("the units must cover every layer exactly once")

    @classmethod
    def each(cls, layers: Iterable[str]) -> "Units":
        """Every layer a unit of its own (the untied search)."""
        layers = tuple(layers)
        return cls(layers, tuple((i,) for i in range(len(layers))))

    @classmethod
    def grouped(cls, layers: Iterable[str], groups: Iterable[Sequence[str]]) -> "Units":
        """The units of `groups` (models.fused.fused_groups of `layers`), ordered by their first layer; a layer of a
        group that is not among `layers` (not quantized) is left out of its unit."""
        layers = tuple(layers)
        index = {n: i for i, n in enumerate(layers)}
        members = [tuple(index[n] for n in group if n in index) for group in groups]
        return cls(layers, tuple(sorted((m for m in members if m), key=lambda m: m[0])))

    @property
    def tied(self) -> bool:
        return any(len(unit) > 1 for unit in self.members)

    @property
    def names(self) -> tuple[str, ...]:
        """A label per unit: the layer's name, or `model.layers.0.self_attn.{q_proj,k_proj,v_proj}`."""
        return tuple(label([self.layers[i] for i in unit]) for unit in self.members)

    def expand(self, mix: Mix) -> tuple[int, ...]:
        """The width of every layer (in `layers` order) under a mix of one width per unit."""
        if len(mix) != len(self.members):
            raise ValueError(f"a mix needs {len(self.members)} widths, got {len(mix)}")
        out = [0] * len(self.layers)
        for unit, width in zip(self.members, mix):
            for i in unit:
                out[i] = width
        return tuple(out)

    def widths(self, mix: Mix) -> dict[str, int]:
        """{layer: width} of a mix of one width per unit."""
        return dict(zip(self.layers, self.expand(mix)))

    def sum_rows(self, rows: Sequence[Sequence[float | None]], base: float = 0.0) -> list[list[float | None]]:
        """A per-layer table (one row per layer, one value per level) as a per-unit one: b + Σ (v_l − b) over each
        unit's layers, b = `base` (module docstring), None where any of its layers has None."""
        if len(rows) != len(self.layers):
            raise ValueError(f"a per-layer table needs {len(self.layers)} rows, got {len(rows)}")
        out = []
        for unit in self.members:
            cols = zip(*(rows[i] for i in unit))
            out.append([None if None in col else base + sum(v - base for v in col) for col in cols])
        return out


def label(layers: Sequence[str]) -> str:
    """A unit's label: the layer's name; `a.b.{c,d,e}` for layers under one prefix `a.b` (the longest shared one);
    `a.b.{N layers}` for more than four (a block's experts)."""
    if len(layers) == 1:
        return layers[0]
    parts = [n.split(".") for n in layers]
    shared = 0
    while all(len(p) > shared + 1 and p[shared] == parts[0][shared] for p in parts):
        shared += 1
    prefix = ".".join(parts[0][:shared])
    rests = [".".join(p[shared:]) for p in parts]
    inner = ",".join(rests) if len(rests) <= 4 else f"{len(rests)} layers"
    return f"{prefix}.{{{inner}}}" if prefix else "{" + inner + "}"
