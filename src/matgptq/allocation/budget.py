"""How many bits a per-layer mix of widths costs, counted exactly, and whether it fits a budget.

A mix gives each quantized layer l (N_l × K_l weights, G_l scale groups per row) one width r_l. Two counts follow
from the shape:

    code bits     C_l(r) = N_l·K_l·r                                    (the count of the MatGPTQ paper and EvoPress)
    storage bits  S_l(r) = 8·N_l·⌈K_l·r/8⌉ + N_l·G_l·(16 + 8) + 32·K_l [+ 32·K_l with act-order]

S_l(r) is the size, in bits, of the tensors that hold layer l in a matgptq checkpoint sliced to r bits
(formats/parent.py): codes packed as an r-bit little-endian stream per row, padded to whole bytes; one float16 scale
and one uint8 zero per row and group; int32 `g_idx` (and `perm`) per column. It is what the file holds, not an
estimate (tests compare it with safetensors headers). A third count is a GGUF file's:

    GGUF bits     U_l(r) = bits of layer l's tensor as `export --format gguf` writes the r-bit slice (`--type auto`)

the block type that keeps the slice's codes (Q4_0 for a symmetric 4-bit group-32 slice, Q6_K for a 6-bit one on the
K-quant lattice, ...) or the Q8_0/float fallback, from gguf-py's block sizes (formats/gguf/tensors.auto_type,
tensor_bits; tests compare it with the tensors gguf-py reads back). It depends on the parent's scales, not only on
the shape, so it is computed from the checkpoint, once per layer and level.

A tied search's unit (units.py: a group of layers an engine runs as one) costs its layers' sum, `GroupSize`.

The average over a mix is Σ_l X_l(r_l) / Σ_l N_l·K_l, "bits per quantized weight"; unquantized tensors (embeddings,
norms, head) are not counted, as in the paper.

A mix fits budget b (bits per weight) when Σ_l X_l(r_l) ≤ ⌊b·Σ_l N_l·K_l⌋; b is taken as the exact decimal the user
typed (Fraction), so 2.5 means 5/2 and nothing is lost to float rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

from ..errors import UserError

SCALE_BITS = 16  # float16 scale per row and group
ZERO_BITS = 8  # uint8 zero per row and group (stored on the master grid)
INDEX_BITS = 32  # int32 g_idx (and perm) entry per input column


class BudgetKind(str, Enum):
    CODE = "code"
    STORAGE = "storage"
    GGUF = "gguf"


@dataclass(frozen=True)
class LayerSize:
    """The shape facts of one quantized layer that its cost depends on."""

    name: str
    rows: int
    cols: int
    groups: int
    act_order: bool = False
    gguf: tuple[tuple[int, int], ...] = ()  # (width, GGUF bits) for the levels a GGUF budget may use

    def __post_init__(self) -> None:
        if min(self.rows, self.cols, self.groups) < 1:
            raise ValueError(f"{self.name}: rows, cols and groups must be positive")

    @property
    def weights(self) -> int:
        return self.rows * self.cols

    def bits(self, width: int, kind: BudgetKind) -> int:
        if kind is BudgetKind.CODE:
            return self.weights * width
        if kind is BudgetKind.GGUF:
            by_width = dict(self.gguf)
            if width not in by_width:
                raise ValueError(f"{self.name}: no GGUF size for width {width} (from_checkpoint(..., gguf=True))")
            return by_width[width]
        codes = 8 * self.rows * math.ceil(self.cols * width / 8)
        index = INDEX_BITS * self.cols * (2 if self.act_order else 1)
        return codes + self.rows * self.groups * (SCALE_BITS + ZERO_BITS) + index


@dataclass(frozen=True)
class GroupSize:
    """Layers that take one width together (a tied unit, units.py): each count the sum of its layers'."""

    name: str
    parts: tuple[LayerSize, ...]

    @property
    def weights(self) -> int:
        return sum(p.weights for p in self.parts)

    def bits(self, width: int, kind: BudgetKind) -> int:
        return sum(p.bits(width, kind) for p in self.parts)


def parse_budget(value: str | float | Fraction) -> Fraction:
    """The budget as an exact fraction of the decimal given ("2.5" → 5/2)."""
    try:
        b = Fraction(str(value))
    except (ValueError, ZeroDivisionError):
        raise UserError(f"a budget must be a number of bits per weight like 3.0, got {value!r}") from None
    if b <= 0:
        raise UserError(f"a budget must be positive, got {value}")
    return b


@dataclass(frozen=True)
class CostModel:
    """The layers of a parent (in a fixed order) and the widths each may take."""

    layers: tuple[LayerSize | GroupSize, ...]  # one per unit of the mix (a tied search's units: `grouped`)
    levels: tuple[int, ...]  # sorted, distinct

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a cost model needs at least one layer")
        if not self.levels or tuple(sorted(set(self.levels))) != self.levels:
            raise ValueError(f"levels must be sorted and distinct, got {self.levels}")

    @classmethod
    def from_checkpoint(cls, ckpt, levels: tuple[int, ...], gguf: bool = False) -> "CostModel":
        """The parent's layers; with `gguf`, also each layer's GGUF size at every level (slices each layer)."""
        levels = tuple(sorted(set(levels)))
        if gguf:
            from ..formats.gguf import auto_type, tensor_bits
        sizes = []
        for n, q in ckpt.layers.items():
            u = tuple((r, tensor_bits(auto_type(q.slice(r)), *q.shape)) for r in levels) if gguf else ()
            for (r, bits), (_, above) in zip(u, u[1:]):  # the mutation and the bounds assume costs rise with r
                if bits > above:
                    raise UserError(
                        f"{n}: in GGUF, width {r} takes more bytes than the next level; drop {r} from --levels"
                    )
            sizes.append(LayerSize(n, q.shape[0], q.shape[1], q.scales.shape[1], q.perm is not None, u))
        return cls(tuple(sizes), levels)

    def grouped(self, units) -> "CostModel":
        """The cost model of a mix of one width per unit of `units` (units.Units of this model's layers): a unit of
        several layers one GroupSize, named by its label."""
        if units.layers != self.names:
            raise ValueError("the units are not of this cost model's layers")
        sizes = tuple(
            self.layers[unit[0]] if len(unit) == 1 else GroupSize(name, tuple(self.layers[i] for i in unit))
            for name, unit in zip(units.names, units.members)
        )
        return CostModel(sizes, self.levels)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers)

    @property
    def total_weights(self) -> int:
        return sum(layer.weights for layer in self.layers)

    def table(self, kind: BudgetKind) -> list[list[int]]:
        """cost[l][i]: bits of layer l at levels[i]."""
        return [[layer.bits(r, kind) for r in self.levels] for layer in self.layers]

    def cost(self, widths: tuple[int, ...], kind: BudgetKind) -> int:
        if len(widths) != len(self.layers):
            raise ValueError(f"a mix needs {len(self.layers)} widths, got {len(widths)}")
        return sum(layer.bits(r, kind) for layer, r in zip(self.layers, widths))

    def average(self, widths: tuple[int, ...], kind: BudgetKind) -> float:
        return self.cost(widths, kind) / self.total_weights

    def limit(self, budget: Fraction, kind: BudgetKind) -> int:
        """The largest total a mix may cost under `budget` bits per weight: ⌊b·Σ N·K⌋."""
        return math.floor(budget * self.total_weights)

    def fits(self, widths: tuple[int, ...], budget: Fraction, kind: BudgetKind) -> bool:
        return self.cost(widths, kind) <= self.limit(budget, kind)

    def check_budget(self, budget: Fraction, kind: BudgetKind) -> None:
        """A budget the levels can meet, and one that does not already allow every layer the top level."""
        for level, below in ((self.levels[0], True), (self.levels[-1], False)):
            floor_or_roof = Fraction(self.cost(tuple(level for _ in self.layers), kind), self.total_weights)
            if (budget < floor_or_roof) if below else (budget > floor_or_roof):
                where, fix = (
                    ("below", "raise it or add a lower level")
                    if below
                    else ("above", "use that level for every layer, or lower the budget")
                )
                raise UserError(
                    f"budget {float(budget):g} ({kind.value} bits per weight) is {where} what "
                    f"{'the lowest' if below else 'the highest'} level {level} costs "
                    f"({float(floor_or_roof):.4f}); {fix}"
                )
