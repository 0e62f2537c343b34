"""The committed steps' rate and the time left (monarch_ft.controller.throughput), and the progress
line's part that shows them (monarch_ft.controller.console)."""

from __future__ import annotations

import pytest

from monarch_ft.controller.console import job_progress
from monarch_ft.controller.throughput import StepRate


def test_rate_and_eta_over_the_window():
    rate = StepRate(window_s=10)
    assert rate.rate() is None and rate.eta_s(10) is None
    for t in range(0, 31):
        rate.observe(float(t), 2 * t if t <= 20 else 40 + 4 * (t - 20))  # 2 steps/s, then 4
    assert rate.rate() == pytest.approx(4.0)  # the last 10 s only
    assert rate.eta_s(80) == pytest.approx(20.0)
    assert rate.eta_s(0) == 0.0


def test_a_stall_has_no_eta():
    rate = StepRate(window_s=5)
    for t in range(10):
        rate.observe(float(t), 7)
    assert rate.rate() == 0 and rate.eta_s(5) is None


def test_the_progress_line_part():
    rate = StepRate()
    assert job_progress(0, 30, rate) == "job 0/30 - steps/s ETA -"
    rate.observe(0.0, 10)
    rate.observe(5.0, 30)
    assert job_progress(30, 300, rate) == "job 30/300 4.0 steps/s ETA 1m07s"
