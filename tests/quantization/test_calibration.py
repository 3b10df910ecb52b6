"""CalibConfig (quantization/calibration.py): where the calibration windows come from, refused in one line when it
cannot describe any windows, and compared without its text's hash (two runs on the same range are the same run)."""

from __future__ import annotations

import pytest

from matgptq.errors import UserError
from matgptq.quantization import CalibConfig


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(nsamples=0), "--nsamples must be at least 1"),
        (dict(seqlen=1), "--seqlen must be at least 2"),
        (dict(text_range=(0.5, 0.5)), "0 <= start < end <= 1"),
        (dict(text_range=(0.2, 1.5)), "0 <= start < end <= 1"),
    ],
)
def test_impossible_windows_are_refused_in_one_line(options, says):
    with pytest.raises(UserError, match=says) as e:
        CalibConfig(**options)
    assert "\n" not in str(e.value)


def test_the_hash_is_recorded_but_not_compared():
    a = CalibConfig("calib.txt", (0.0, 0.5), 16, 64, 1, sha256="a" * 64)
    assert a == CalibConfig("calib.txt", (0.0, 0.5), 16, 64, 1, sha256="b" * 64)
    assert a != CalibConfig("calib.txt", (0.0, 0.5), 16, 64, 2, sha256="a" * 64)
