"""Where a run's calibration windows come from: the text, its range, how many windows of what length, the seed; kept
in the checkpoint's `matgptq.json` so that a run can be reproduced bit-exactly."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UserError


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
