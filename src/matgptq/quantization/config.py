"""The settings that determine quantized weights: one grid config and one typed config per method, each checked in
its own terms, and the enums their options take. Each config writes itself as a checkpoint's `matgptq.json` record
(`to_json`); method_configs.py reads one back (`config_from_json`) and builds one from flat options (`config_for`).

    GridConfig                      the grid (grid.py): width, groups, symmetry, how scales are chosen; which layers
      RTNConfig                     round-to-nearest onto it: nothing else
      GPTQConfig                    + the solver (solver.py): column order, damping, lazy blocks, scale refit
        MatGPTQConfig               + the target widths R, their weights λ_r and the code-sharing variant

Each class's defaults are its method's, chosen by measurement (benchmarks/gptq_defaults.py runs the ablation,
docs/results/gptq_defaults.md shows it, docs/guide/quantize.md gives each default's reason). A field that is None
depends on other fields and is resolved on construction (its comment says how).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import ClassVar

from ..errors import UserError
from ..formats.gguf import KQuantType
from .algorithm.kquant_scales import LATTICES, check_group_size


class Method(str, Enum):
    GPTQ = "gptq"  # GPTQ (Frantar et al. 2022; MatGPTQ paper, Algorithm 2), one width
    RTN = "rtn"  # round-to-nearest on the same grid, no error feedback
    MATGPTQ = "matgptq"  # multi-precision GPTQ (MatGPTQ paper, Algorithms 1 + 2)


class Variant(str, Enum):
    """How MatGPTQ shares one set of codes between its widths (docs/results/ablation.md compares them)."""

    PAPER = "paper"  # the MatGPTQ paper as published: the mean error over R fed back, every slice on the master scale
    PER_WIDTH = "per-width"  # one error-feedback track per width (multibit.PerWidthRounding), master scale
    PER_WIDTH_SCALES = "per-width-scales"  # per-width tracks + each width's own least-squares scales (refit.py)


class Target(str, Enum):
    """Which runtime's grid the codes are shaped for (`--target`)."""

    ANY = "any"  # the plain grid, which every export takes (GPTQ v1/v2, compressed-tensors, GGUF)
    GGUF = "gguf"  # llama.cpp's: signed scale (Q4_0/Q5_0/Q8_0's, grid.py) and its 32-column block by default


GGUF_BLOCK = 32  # columns per block of llama.cpp's legacy types (Q4_0 ... Q8_0): --target gguf's group size
DEFAULT_GROUP_SIZE = 128  # GPTQModel's and llm-compressor's
MIN_BITS, MAX_BITS = 2, 8
MASTER_BIT_WEIGHT = 4.0  # default λ_c of the per-width variants (MatGPTQConfig.default_bit_weight)


def _as_enum(cfg, name: str, kind: type[Enum], what: str) -> None:
    """Field `name` of the frozen `cfg` as its enum `kind`, or a UserError naming the choices."""
    value = getattr(cfg, name)
    try:
        object.__setattr__(cfg, name, None if value is None else kind(value))
    except ValueError:
        raise UserError(f"unknown {what} {value!r}; use one of {', '.join(v.value for v in kind)}") from None


def method_of(method: str | Method) -> Method:
    """`method` as a Method, or a UserError naming the choices."""
    try:
        return Method(method)
    except ValueError:
        raise UserError(f"unknown method {method!r}; use one of {', '.join(m.value for m in Method)}") from None


@dataclass(frozen=True)
class GridConfig:
    """The grid the codes live on (grid.py), and which layers get it at which width."""

    bits: int = 4  # the stored width: for MatGPTQ the master width c
    group_size: int | None = None  # None: 128, or llama.cpp's 32-column block for --target gguf (without --kquant)
    sym: bool = True
    # symmetric grid with the sign of the extreme weight (llama.cpp Q4_0's), grid.py; None: on for --target gguf
    # where the grid is symmetric and the K-quant lattice (if any) stores signed sub-scales
    signed_scale: bool | None = None
    mse: bool = False  # each group's scale by a search over shrunk ranges (grid.py) instead of min/max
    kquant: KQuantType | None = None  # scales on this GGUF K-quant's super-block lattice (kquant_scales.py)
    target: Target = Target.ANY
    skip: tuple[str, ...] = ()  # regexes on full module names of block Linears to leave unquantized
    # per-layer widths: (full layer name, width) pairs, e.g. a `matgptq search` mix; `bits` is then the widest, the
    # checkpoint's stored width. Each layer is solved as a one-width run at its own width (`for_layer`)
    layer_bits: tuple[tuple[str, int], ...] = ()

    method: ClassVar[Method]

    def __post_init__(self) -> None:
        _as_enum(self, "target", Target, "target")
        _as_enum(self, "kquant", KQuantType, "K-quant type")
        self._resolve()
        self._check()

    def _resolve(self) -> None:
        """The None fields, from the others; `skip` as a tuple (one pattern or any sequence of them)."""
        object.__setattr__(self, "skip", (self.skip,) if isinstance(self.skip, str) else tuple(self.skip))
        gguf = self.target is Target.GGUF
        if self.group_size is None:
            object.__setattr__(self, "group_size", GGUF_BLOCK if gguf and self.kquant is None else DEFAULT_GROUP_SIZE)
        if self.signed_scale is None:
            signed_fits = self.sym and (self.kquant is None or LATTICES[self.kquant].signed)
            object.__setattr__(self, "signed_scale", gguf and signed_fits)

    def _check(self) -> None:
        if self.layer_bits:  # before the checks of `bits`, which a mix sets to its widest width
            self._check_layer_bits()
        if not MIN_BITS <= self.bits <= MAX_BITS:
            raise UserError(f"bits must be between {MIN_BITS} and {MAX_BITS}, got {self.bits}")
        if self.group_size == 0 or self.group_size < -1:
            raise UserError(f"group size must be -1 (per output channel) or positive, got {self.group_size}")
        if self.signed_scale and not self.sym:
            raise UserError("--signed-scale is a symmetric grid; drop --asym or --signed-scale")
        if self.kquant is not None:
            self._check_kquant()
        if self.target is Target.GGUF and self.kquant is None and self.group_size != GGUF_BLOCK:
            raise UserError(
                f"--target gguf writes llama.cpp's {GGUF_BLOCK}-column blocks (Q4_0 ... Q8_0): drop "
                f"--group-size {self.group_size}, or add --kquant TYPE for K-quant super-blocks"
            )
        for pattern in self.skip:
            try:
                re.compile(pattern)
            except re.error as e:
                raise UserError(f"--skip {pattern!r} is not a valid regular expression ({e})") from None

    def _check_kquant(self) -> None:
        """--kquant: a K-quant whose lattice the grid, scale sign and group size fit."""
        if not self.sym:
            raise UserError("--kquant needs a symmetric grid; drop --asym")
        if self.signed_scale and not LATTICES[self.kquant].signed:
            raise UserError(
                f"--kquant {self.kquant.value} stores unsigned sub-scales, so it needs the plain "
                "symmetric grid; drop --signed-scale, or use --kquant q3_k or q6_k (signed)"
            )
        why = check_group_size(self.kquant, self.group_size)
        if why:
            raise UserError(f"--kquant {self.kquant.value}: {why}")

    def _check_layer_bits(self) -> None:
        widths = dict(self.layer_bits)
        bad = [
            (n, r)
            for n, r in widths.items()
            if not isinstance(r, int) or isinstance(r, bool) or not MIN_BITS <= r <= MAX_BITS
        ]
        if bad:
            raise UserError(f"the width mix gives {bad[0][0]} {bad[0][1]!r} bits; widths are {MIN_BITS}..{MAX_BITS}")
        if len(widths) != len(self.layer_bits):
            raise UserError("the width mix names a layer twice")
        if self.bits != max(widths.values()):
            raise UserError(f"bits ({self.bits}) must be the widest width of the mix ({max(widths.values())})")

    @property
    def widths(self) -> tuple[int, ...]:
        """The widths the codes are solved for: R for MatGPTQ, the one width otherwise."""
        return (self.bits,)

    def skips(self, name: str) -> bool:
        """Whether layer `name` (its full module name) stays unquantized (--skip)."""
        return any(re.search(pattern, name) for pattern in self.skip)

    def width_of(self, name: str) -> int:
        """The width layer `name` (its full module name) is quantized at."""
        return dict(self.layer_bits).get(name, self.bits) if self.layer_bits else self.bits

    def for_layer(self, name: str):
        """The one-width config layer `name` is solved with: itself, or for a mix, the same options at its width."""
        return self if not self.layer_bits else replace(self, bits=self.width_of(name), layer_bits=())

    def with_mix(self, widths: dict[str, int]):
        """This config with each layer's own width (a mix); the stored width becomes the widest."""
        return replace(self, bits=max(widths.values()), layer_bits=tuple(widths.items()))

    def to_json(self) -> dict:
        """The record in `matgptq.json` ("quantization"): the method and every field, as JSON values."""
        d = {"method": self.method.value}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = (
                v.value
                if isinstance(v, Enum)
                else dict(v)
                if f.name == "layer_bits"
                else list(v)
                if isinstance(v, tuple)
                else v
            )
        return d


@dataclass(frozen=True)
class RTNConfig(GridConfig):
    """Round-to-nearest onto the grid: no calibration data, no Hessian."""

    method: ClassVar[Method] = Method.RTN


@dataclass(frozen=True)
class GPTQConfig(GridConfig):
    """GPTQ (solver.py) onto the grid: the calibration Hessian's error feedback, column by column."""

    mse: bool = True
    # the MSE search's error weighted by diag H (grid.py); None: as `mse` for GPTQ, off for MatGPTQ (weight_search)
    mse_weighted: bool | None = None
    # columns by decreasing diag H (groups follow the columns unless static_groups); None: the method's
    # `act_order_default` unless group_act_order is asked for
    act_order: bool | None = None
    group_act_order: bool | None = None  # GAR (solver.py): groups, and columns inside them, by decreasing diag H;
    # None: on unless act_order, which orders every column itself
    # each group's scale from its original columns, fixed up front (the plain layout, no g_idx); None: as act_order
    static_groups: bool | None = None
    damp: float = 0.01  # λ added to diag H, relative to mean(diag H)
    block_size: int = 128  # the solver's lazy-update block
    true_sequential: bool = True  # each group of a block's Linears sees the quantized outputs of the groups before
    refit_scales: bool = True  # the scales refit to the chosen codes by Hessian least squares (refit.refit_master)

    method: ClassVar[Method] = Method.GPTQ
    weight_search: ClassVar[bool] = True  # mse_weighted's default where the search is on
    # act order with static groups by default, with the plain layout GAR has (docs/decisions/gptq-defaults.md)
    act_order_default: ClassVar[bool] = True

    def _resolve(self) -> None:
        super()._resolve()
        if self.mse_weighted is None:
            object.__setattr__(self, "mse_weighted", self.mse and self.weight_search)
        if self.act_order is None:
            object.__setattr__(self, "act_order", self.act_order_default and not self.group_act_order)
        if self.group_act_order is None:
            object.__setattr__(self, "group_act_order", not self.act_order)
        if self.static_groups is None:
            object.__setattr__(self, "static_groups", self.act_order)

    def _check(self) -> None:
        super()._check()
        if not 0 < self.damp <= 1:
            raise UserError(f"damping must be in (0, 1] (relative to mean(diag H)), got {self.damp}")
        if self.block_size < 1:
            raise UserError(f"block size must be positive, got {self.block_size}")
        if self.mse_weighted and not self.mse:
            raise UserError("--mse-weighted weights the --mse scale search, which is off; drop --no-mse")
        if self.act_order and not self.static_groups and self.kquant is not None:
            raise UserError(
                "--kquant needs contiguous groups, which act order without static groups breaks; drop "
                "--no-static-groups"
            )
        if self.act_order and not self.static_groups and self.target is Target.GGUF:
            raise UserError(
                "--target gguf needs contiguous groups, which act order without static groups breaks; "
                "drop --no-static-groups (or use --group-act-order)"
            )


@dataclass(frozen=True)
class MatGPTQConfig(GPTQConfig):
    """MatGPTQ: one set of `bits`-bit codes whose top r bits are also good r-bit codes, for each r in R."""

    target_bits: tuple[int, ...] = ()  # R, sorted, containing the master width; () = (bits,)
    bit_weights: tuple[float, ...] = ()  # λ_r, one per width of R; () = default_bit_weight
    variant: Variant = Variant.PER_WIDTH_SCALES  # parents recorded before variants existed are PAPER

    method: ClassVar[Method] = Method.MATGPTQ  # GPTQ's defaults, and its own λ_c (docs/decisions/matgptq-defaults.md)

    def __post_init__(self) -> None:
        _as_enum(self, "variant", Variant, "MatGPTQ variant")
        super().__post_init__()

    def _check_layer_bits(self) -> None:
        raise UserError(
            "a per-layer width mix is for --method gptq or rtn; a matgptq parent already holds "
            "every width (slice a mix from it with `export --bits-config` or `load(bits=...)`)"
        )

    def _check(self) -> None:
        super()._check()
        targets = tuple(sorted(set(self.target_bits))) if self.target_bits else (self.bits,)
        for r in targets:
            if not MIN_BITS <= r <= self.bits:
                raise UserError(f"target width {r} must be between {MIN_BITS} and the master width {self.bits}")
        if self.bits not in targets:
            raise UserError(f"the master width {self.bits} must be one of the target widths {list(targets)}")
        if self.bit_weights and len(self.bit_weights) != len(self.target_bits):
            raise UserError(
                f"got {len(self.bit_weights)} bit weights for {len(self.target_bits)} target widths; give one per width"
            )
        weights = dict(zip(self.target_bits, self.bit_weights)) if self.bit_weights else {}
        lambdas = tuple(float(weights.get(r, self.default_bit_weight(r))) for r in targets)
        if any(not (w > 0) for w in lambdas):
            raise UserError(f"bit weights must be positive, got {list(self.bit_weights)}")
        object.__setattr__(self, "target_bits", targets)
        object.__setattr__(self, "bit_weights", lambdas)

    @property
    def widths(self) -> tuple[int, ...]:
        return self.target_bits

    def default_bit_weight(self, width: int) -> float:
        """λ_r when none is given: 1 (the paper), except the master's in the per-width variants: MASTER_BIT_WEIGHT.
        A larger λ_c pulls the shared codes towards the master width's own optimum, improving the widest slices at a
        cost to the narrow ones (docs/decisions/matgptq-defaults.md)."""
        return MASTER_BIT_WEIGHT if self.variant is not Variant.PAPER and width == self.bits else 1.0


MethodConfig = RTNConfig | GPTQConfig | MatGPTQConfig
