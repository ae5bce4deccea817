"""The 95 % interval of a predicted iteration time never goes below 0 ms (hand-made cases)."""

from __future__ import annotations

import math

from tracekit.analyze.sections.whatif import interval, t95


def test_wide_interval_stops_at_zero():
    # 2 steady iterations of 100 and 300 ms: sd = 141.42 ms, se = sqrt(2/2) = 1, t(0.975, 1) = 12.706
    pieces = {"iteration_walls_ns": [100e6, 300e6], "iteration_ns": 200e6}
    out = interval(pieces, 50e6, None, between_run_rel_sd=0.0)
    half = t95(1) * math.sqrt(2) * 100e6
    assert abs(half - 1796.9e6) < 0.1e6
    assert out["interval_ns"][0] == 0.0  # 150 - 1,797 ms is below 0
    assert abs(out["interval_ns"][1] - (150e6 + half)) < 1
    assert out["saving_interval_ns"][1] == 200e6  # no saving beyond the whole iteration
    assert abs(out["saving_interval_ns"][0] - (50e6 - half)) < 1
    assert out["within_noise"] is True and out["interval_basis"].endswith("the low end stops at 0 ms")


def test_narrow_interval_unchanged():
    # 4 iterations 98, 102, 99, 101 ms: sd = 1.826 ms, se = sqrt(2/4), t(0.975, 3) = 3.182
    pieces = {"iteration_walls_ns": [98e6, 102e6, 99e6, 101e6], "iteration_ns": 100e6}
    out = interval(pieces, 10e6, None, between_run_rel_sd=0.0)
    sd = math.sqrt(sum((x - 100e6) ** 2 for x in pieces["iteration_walls_ns"]) / 3)
    half = 3.182 * sd * math.sqrt(0.5)
    assert abs(out["interval_ns"][0] - (90e6 - half)) < 0.01e6
    assert abs(out["interval_ns"][1] - (90e6 + half)) < 0.01e6
    assert "stops at 0" not in out["interval_basis"]
