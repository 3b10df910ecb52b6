"""Calibration windows: enough text for every window asked for, else one line with the numbers and the fix."""

import pytest
import torch

from matgptq.errors import UserError
from matgptq.models import calibration_windows


def test_text_must_hold_nsamples_times_seqlen_tokens():
    message = (
        "the calibration text has 1,499 tokens, fewer than the 32,768 that --nsamples 128 × --seqlen 256 ask "
        "for; give more text (or a wider --calib-range) or lower --nsamples/--seqlen"
    )
    with pytest.raises(UserError) as e:
        calibration_windows(torch.arange(1499), 128, 256, 0)  # 5 windows' worth: once accepted
    assert str(e.value) == message
    with pytest.raises(UserError, match="has 63 tokens, fewer than the 64 that --nsamples 2 × --seqlen 32"):
        calibration_windows(torch.arange(63), 2, 32, 0)
    windows = calibration_windows(torch.arange(64), 2, 32, 0)  # exactly enough
    assert windows.shape == (2, 32)
    assert all(torch.equal(w, torch.arange(int(w[0]), int(w[0]) + 32)) for w in windows)  # contiguous slices
