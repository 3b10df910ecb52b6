"""What a GGUF export wrote, tensor by tensor (TensorExport) and as a whole (GGUFExport: types, bits per weight,
the largest measured |Δw|, a table and a summary), and the warning of a tensor not stored with its codes kept."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ...execution import format_table


class GGUFExportWarning(UserWarning):
    """A tensor could not be stored with its codes kept (re-quantized or written as float)."""


@dataclass
class TensorExport:
    """One tensor of the exported file."""

    name: str  # GGUF name
    source: str  # HF tensor name
    ggml_type: str  # e.g. "Q4_0"
    shape: tuple[int, ...]  # HF shape ([out, in] for weights)
    bits: int | None  # slice width of a quantized layer, None for float tensors
    method: str  # "codes" (integer codes kept), "requantized", "float"
    exact: bool  # measured: GGUF dequantization == matgptq's dequantized weight, bit for bit
    max_abs_err: float  # max |w_gguf − w_matgptq| (after undoing the Q/K permutation)
    rel_err: float  # max_abs_err / max |w_matgptq|
    note: str = ""
    nbytes: int = 0  # bytes of the stored tensor data


@dataclass
class GGUFExport:
    """What `export_gguf` wrote."""

    path: Path
    file_type: str
    size_bytes: int
    tensors: list[TensorExport] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return all(t.exact for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        """Tensor data bits per stored weight, over every tensor: the BPW llama.cpp prints for a file."""
        weights = sum(int(np.prod(t.shape)) for t in self.tensors)
        return 8 * sum(t.nbytes for t in self.tensors) / weights if weights else 0.0

    @property
    def max_abs_err(self) -> float:
        return max((t.max_abs_err for t in self.tensors), default=0.0)

    def types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.ggml_type] = out.get(t.ggml_type, 0) + 1
        return out

    def table(self) -> str:
        rows = [
            [t.name, t.ggml_type, t.bits, t.method, "yes" if t.exact else "no", t.max_abs_err, t.note]
            for t in self.tensors
        ]
        return format_table(["tensor", "type", "bits", "method", "exact", "max |Δw|", "note"], rows)

    def summary(self) -> str:
        """The table in a few lines: tensors per type, how many are exact, the largest |Δw| and where."""
        types = ", ".join(f"{n} {t}" for t, n in sorted(self.types().items(), key=lambda kv: (-kv[1], kv[0])))
        exact = sum(t.exact for t in self.tensors)
        worst = max(self.tensors, key=lambda t: t.max_abs_err, default=None)
        where = f" ({worst.name}, {worst.ggml_type})" if worst is not None and worst.max_abs_err > 0 else ""
        return (
            f"{len(self.tensors)} tensors: {types}\n"
            f"{exact}/{len(self.tensors)} tensors bit-exact, max |Δw| {self.max_abs_err:.3g}{where}"
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        d["exact"] = self.exact
        d["max_abs_err"] = self.max_abs_err
        return d
