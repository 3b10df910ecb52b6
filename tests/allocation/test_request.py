"""A search request's defaults: the measured additive table on one window, or the probe table on nine."""

from pathlib import Path

from matgptq.allocation import SearchRequest
from matgptq.allocation.sensitivity import Sensitivity


def request(**options) -> SearchRequest:
    return SearchRequest(parent=Path("p"), budgets=("3.0",), calib=Path("c.txt"), out=Path("o"), **options)


def test_the_default_table_is_full_on_one_window_and_probe_keeps_its_nine():
    assert request().sensitivity is Sensitivity.FULL and request().sensitivity_tokens == 255  # one 256-token window
    assert request(sensitivity=Sensitivity.PROBE).sensitivity_tokens == 2048  # ceil(2048 / 255) = 9 windows
    assert request(sensitivity=Sensitivity.PROBE, sensitivity_tokens=126).sensitivity_tokens == 126
