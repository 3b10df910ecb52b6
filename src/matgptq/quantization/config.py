"""Typed, validated quantization settings shared by the solver, the pipeline and the checkpoint metadata."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from enum import Enum

from ..errors import UserError
from ..formats.gguf import KQuantType
from .kquant_scales import LATTICES, check_group_size


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

MIN_BITS, MAX_BITS = 2, 8
MASTER_BIT_WEIGHT = 16.0  # default λ_c of the per-width variants (QuantConfig.default_bit_weight)


# Each method's defaults for the options left None in QuantConfig, chosen by measurement: scripts/gptq_defaults.py
# runs the ablation, docs/results/gptq_defaults.md shows it and docs/guide/quantize.md gives each default's reason.
METHOD_DEFAULTS: dict[Method, dict[str, object]] = {
    Method.GPTQ: {"group_size": 128, "group_act_order": True, "mse": True, "mse_weighted": True,
                  "refit_scales": True, "damp": 0.01},
    Method.MATGPTQ: {"group_size": 128, "group_act_order": True, "mse": False, "mse_weighted": False,
                     "refit_scales": True, "damp": 0.01},  # the scale search: ~2.8x the CPU time on a parent
    Method.RTN: {"group_size": 128, "group_act_order": False, "mse": False, "mse_weighted": False,
                 "refit_scales": False, "damp": 0.01},
}  # fmt: skip


@dataclass(frozen=True)
class QuantConfig:
    """Everything that determines the quantized weights (besides the model and the calibration data).

    `bits` is the width of the stored codes: for MatGPTQ the master width c. `target_bits` is the set R of widths
    the codes are optimised for (always contains `bits`; `(bits,)` for GPTQ/RTN) and `bit_weights` the λ_r.
    A field that is None takes its method's default (METHOD_DEFAULTS) on construction; `group_act_order` and
    `mse_weighted` default to off where they mean nothing (with act-order, without the MSE search).
    """

    method: Method = Method.GPTQ
    bits: int = 4
    group_size: int | None = None
    sym: bool = True
    act_order: bool = False
    group_act_order: bool | None = None  # GAR (solver.py): groups and the columns inside them by decreasing diag H
    static_groups: bool = False
    mse: bool | None = None
    mse_weighted: bool | None = None  # the MSE search's error weighted per column by diag H (grid.py), as llama.cpp's imatrix
    damp: float | None = None
    block_size: int = 128
    true_sequential: bool = True
    # symmetric grid with the sign of the extreme weight (llama.cpp Q4_0's), grid.py; None: on for --target gguf
    signed_scale: bool | None = None
    skip: tuple[str, ...] = ()  # regexes on full module names of block Linears to leave unquantized
    target_bits: tuple[int, ...] = ()
    bit_weights: tuple[float, ...] = ()
    variant: Variant = Variant.PER_WIDTH_SCALES  # MatGPTQ only; parents recorded before it existed are PAPER
    kquant: KQuantType | None = None  # scales on this GGUF K-quant's super-block lattice (kquant_scales.py)
    refit_scales: bool | None = None  # the master's scales refit to its codes by Hessian least squares (refit.refit_master)
    # per-layer widths (GPTQ/RTN): (full layer name, width) pairs, e.g. a `matgptq search` mix; `bits` is then the
    # widest, the checkpoint's stored width. Each layer is solved as a one-width run at its own width (`for_layer`)
    layer_bits: tuple[tuple[str, int], ...] = ()
    target: Target = Target.ANY

    def _fill_defaults(self) -> None:
        """The None fields from METHOD_DEFAULTS (the target's, for --target gguf); an option that means nothing
        with the ones given stays off."""
        gguf = self.target is Target.GGUF
        signed_fits = self.sym and (self.kquant is None or LATTICES[self.kquant].signed)
        defaults = {**METHOD_DEFAULTS[self.method], "signed_scale": gguf and signed_fits,
                    **({"group_size": GGUF_BLOCK} if gguf and self.kquant is None else {})}  # fmt: skip
        for name, value in defaults.items():  # mse before mse_weighted
            moot = {"group_act_order": self.act_order, "mse_weighted": not self.mse}.get(name, False)
            if getattr(self, name) is None:
                object.__setattr__(self, name, False if moot else value)

    def _enum(self, name: str, kind: type[Enum], what: str) -> None:
        """Field `name` as its enum `kind`, or a UserError naming the choices."""
        value = getattr(self, name)
        try:
            object.__setattr__(self, name, None if value is None else kind(value))
        except ValueError:
            raise UserError(f"unknown {what} {value!r}; use one of {', '.join(v.value for v in kind)}") from None

    def __post_init__(self) -> None:
        self._enum("method", Method, "method")
        self._enum("variant", Variant, "MatGPTQ variant")
        self._enum("target", Target, "target")
        self._enum("kquant", KQuantType, "K-quant type")
        self._fill_defaults()
        if self.layer_bits:  # before the checks of `bits`, which a mix sets to its widest width
            self._check_layer_bits()
        if not MIN_BITS <= self.bits <= MAX_BITS:
            raise UserError(f"bits must be between {MIN_BITS} and {MAX_BITS}, got {self.bits}")
        if self.group_size == 0 or self.group_size < -1:
            raise UserError(f"group size must be -1 (per output channel) or positive, got {self.group_size}")
        if not 0 < self.damp <= 1:
            raise UserError(f"damping must be in (0, 1] (relative to mean(diag H)), got {self.damp}")
        if self.block_size < 1:
            raise UserError(f"block size must be positive, got {self.block_size}")
        if self.signed_scale and not self.sym:
            raise UserError("--signed-scale is a symmetric grid; drop --asym or --signed-scale")
        if self.kquant is not None:
            self._check_kquant()
        if self.target is Target.GGUF:
            self._check_gguf_target()
        if self.mse_weighted and not self.mse:
            raise UserError("--mse-weighted weights the --mse scale search, which is off; drop --no-mse")
        if self.mse_weighted and self.method is Method.RTN:
            raise UserError("--mse-weighted weights by the calibration Hessian, which RTN does not collect; "
                            "use --method gptq or matgptq")  # fmt: skip
        if self.refit_scales and self.method is Method.RTN:
            raise UserError("--refit-scales fits scales on the calibration Hessian, which RTN does not collect; "
                            "use --method gptq or matgptq")  # fmt: skip
        for pattern in self.skip:
            try:
                re.compile(pattern)
            except re.error as e:
                raise UserError(f"--skip {pattern!r} is not a valid regular expression ({e})") from None
        self._set_targets()

    def _check_kquant(self) -> None:
        """--kquant: a K-quant whose lattice the grid, scale sign, groups and group size fit."""
        if not self.sym:
            raise UserError("--kquant needs a symmetric grid; drop --asym")
        if self.signed_scale and not LATTICES[self.kquant].signed:
            raise UserError(f"--kquant {self.kquant.value} stores unsigned sub-scales, so it needs the plain "
                            "symmetric grid; drop --signed-scale, or use --kquant q3_k or q6_k (signed)")  # fmt: skip
        if self.act_order and not self.static_groups:
            raise UserError("--kquant needs contiguous groups; add --static-groups to --act-order")
        why = check_group_size(self.kquant, self.group_size)
        if why:
            raise UserError(f"--kquant {self.kquant.value}: {why}")

    def _check_gguf_target(self) -> None:
        """--target gguf: groups llama.cpp's blocks hold (contiguous; 32 columns, or a K-quant's lattice)."""
        if self.act_order and not self.static_groups:
            raise UserError("--target gguf needs contiguous groups, which --act-order alone breaks; add "
                            "--static-groups, or drop --act-order (group act-order, the default, keeps them)")  # fmt: skip
        if self.kquant is None and self.group_size != GGUF_BLOCK:
            raise UserError(f"--target gguf writes llama.cpp's {GGUF_BLOCK}-column blocks (Q4_0 ... Q8_0): drop "
                            f"--group-size {self.group_size}, or add --kquant TYPE for K-quant super-blocks")  # fmt: skip

    def _set_targets(self) -> None:
        """`target_bits` sorted (R, containing the master width) and `bit_weights` one positive λ_r per width."""
        targets = tuple(sorted(set(self.target_bits))) if self.target_bits else (self.bits,)
        if self.method is not Method.MATGPTQ and targets != (self.bits,):
            raise UserError(f"method {self.method.value} quantizes one width; use --method matgptq for several")
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

    def _check_layer_bits(self) -> None:
        if self.method is Method.MATGPTQ:
            raise UserError("a per-layer width mix is for --method gptq or rtn; a matgptq parent already holds "
                            "every width (slice a mix from it with `export --bits-config` or `load(bits=...)`)")  # fmt: skip
        widths = dict(self.layer_bits)
        bad = [(n, r) for n, r in widths.items()
               if not isinstance(r, int) or isinstance(r, bool) or not MIN_BITS <= r <= MAX_BITS]  # fmt: skip
        if bad:
            raise UserError(f"the width mix gives {bad[0][0]} {bad[0][1]!r} bits; widths are {MIN_BITS}..{MAX_BITS}")
        if len(widths) != len(self.layer_bits):
            raise UserError("the width mix names a layer twice")
        if self.bits != max(widths.values()):
            raise UserError(f"bits ({self.bits}) must be the widest width of the mix ({max(widths.values())})")

    def skips(self, name: str) -> bool:
        """Whether layer `name` (its full module name) stays unquantized (--skip)."""
        return any(re.search(pattern, name) for pattern in self.skip)

    def width_of(self, name: str) -> int:
        """The width layer `name` (its full module name) is quantized at."""
        return dict(self.layer_bits).get(name, self.bits) if self.layer_bits else self.bits

    def for_layer(self, name: str) -> "QuantConfig":
        """The one-width config layer `name` is solved with: itself, or for a mix, the same options at its width."""
        r = self.width_of(name)
        return self if not self.layer_bits else replace(self, bits=r, target_bits=(r,), bit_weights=(), layer_bits=())

    def default_bit_weight(self, width: int) -> float:
        """λ_r when none is given: 1 (the paper), except the master's in the per-width variants: 16. A larger λ_c
        pulls the shared codes towards the master width's own optimum, improving the widest slices at a small cost to
        the narrow ones (docs/results/ablation*.md compare values)."""
        per_width = self.method is Method.MATGPTQ and self.variant is not Variant.PAPER
        return MASTER_BIT_WEIGHT if per_width and width == self.bits else 1.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["method"] = self.method.value
        d["variant"] = self.variant.value
        d["target"] = self.target.value
        d["kquant"] = self.kquant.value if self.kquant else None
        d["target_bits"] = list(self.target_bits)
        d["bit_weights"] = list(self.bit_weights)
        d["layer_bits"] = dict(self.layer_bits)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "QuantConfig":
        # recorded before variants existed: the published algorithm; before an option existed: without it (not the
        # method's default of today)
        d = {"variant": Variant.PAPER.value, "group_act_order": False, "mse_weighted": False, "refit_scales": False, **d}
        mix = d.get("layer_bits") or {}
        d["layer_bits"] = tuple(mix.items()) if isinstance(mix, dict) else mix
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class CalibConfig:
    """Where the calibration windows come from (recorded so a run can be reproduced bit-exactly)."""

    path: str | None = None
    text_range: tuple[float, float] = (0.0, 1.0)
    nsamples: int = 128
    seqlen: int = 256
    seed: int = 0
    sha256: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.nsamples < 1:
            raise UserError(f"--nsamples must be at least 1, got {self.nsamples}")
        if self.seqlen < 2:
            raise UserError(f"--seqlen must be at least 2, got {self.seqlen}")
        a, b = self.text_range
        if not 0.0 <= a < b <= 1.0:
            raise UserError(f"text range must satisfy 0 <= start < end <= 1, got {a}:{b}")
