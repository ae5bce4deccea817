"""The 95 % interval of the what-if predictions (docs/advice.md, "Interval"; issue 21 items 4, 6).

Checked against the formula computed here by hand (a hand-made pieces dict) and, on
``advice_pair_base``, against the iteration walls and the overflow-check ranges read with plain SQL.
"""

from __future__ import annotations

import io
import math
import sqlite3
import statistics

import pytest
from conftest import FIXTURES
from rich.console import Console

from tracekit.analyze.model import phases
from tracekit.analyze.sections import whatif
from tracekit.analyze.trace.export import Export
from tracekit.render.tables import render_config_and_advice

#: t(0.975, df) from NIST/SEMATECH e-Handbook 1.3.6.7.2 (typed here, not read from tracekit)
T975 = {1: 12.706, 3: 3.182, 8: 2.306, 30: 2.042}


def test_interval_hand_made_pieces():
    walls = [100e6, 110e6, 90e6, 104e6]  # 4 steady iterations, ns
    per_it = [18e6, 22e6, 19e6, 21e6]  # the scenario's saving in each of them
    pieces = {"iteration_walls_ns": walls, "iteration_ns": sum(walls) / 4}
    saving = 20e6
    got = whatif.interval(pieces, saving, per_it, between_run_rel_sd=0.0)
    # by hand: sample sd (n - 1), standard error of a difference of two 4-iteration means
    mean_w = sum(walls) / 4
    s_w = math.sqrt(sum((w - mean_w) ** 2 for w in walls) / 3)
    mean_t = sum(per_it) / 4
    s_t = math.sqrt(sum((v - mean_t) ** 2 for v in per_it) / 3)
    noise = s_w * math.sqrt(1 / 4 + 1 / 4)
    term = s_t * math.sqrt(1 / 4 + 1 / 4)
    half = T975[3] * math.sqrt(noise ** 2 + term ** 2)
    pred = mean_w - saving
    assert got["interval_ns"] == pytest.approx([pred - half, pred + half], abs=1e-2)
    assert got["saving_interval_ns"] == pytest.approx([saving - half, saving + half], abs=1e-2)
    # sd 8.406 and 1.826 ms: 3.182 x sqrt((8.406 x 0.7071)^2 + (1.826 x 0.7071)^2) = 3.182 x 6.083 ms
    assert half == pytest.approx(19.355e6, rel=1e-3)
    assert got["within_noise"] is False  # 20 - 19.36 > 0
    wider = whatif.interval(pieces, saving, [10e6, 30e6, 15e6, 25e6], between_run_rel_sd=0.0)  # a noisier term
    assert wider["within_noise"] is True and wider["saving_interval_ns"][0] < 0


def test_interval_saving_above_noise_and_no_term():
    walls = [100e6, 101e6, 99e6]
    pieces = {"iteration_walls_ns": walls, "iteration_ns": 100e6}
    got = whatif.interval(pieces, 30e6, None, between_run_rel_sd=0.0)  # None: the same saving every iteration
    half = 12.706 * 0 + 4.303 * statistics.stdev(walls) * math.sqrt(2 / 3)
    assert got["saving_interval_ns"] == pytest.approx([30e6 - half, 30e6 + half], abs=1e-2)
    assert got["within_noise"] is False


def test_interval_between_run_term_by_hand():
    """The third term: 10 % of the predicted iteration, its spread measured on 4 pairs; each part's
    own 95 % half width (t with 3 and with 4 degrees of freedom), combined in quadrature."""
    walls = [100e6, 110e6, 90e6, 104e6]
    per_it = [18e6, 22e6, 19e6, 21e6]
    pieces = {"iteration_walls_ns": walls, "iteration_ns": sum(walls) / 4}
    got = whatif.interval(pieces, 20e6, per_it, between_run_rel_sd=0.10, between_run_df=4)
    within = 3.182 * 6.083e6  # t(0.975, 3) x sqrt(noise^2 + term^2) of test_interval_hand_made_pieces
    between = 2.776 * 0.10 * 81e6  # t(0.975, 4) x 10 % of the predicted 101 - 20 = 81 ms
    half = math.sqrt(within ** 2 + between ** 2)  # 19.36 and 22.49 ms: 29.67 ms
    assert half == pytest.approx(29.67e6, rel=1e-3)
    assert got["between_run_sd_ns"] == pytest.approx(8.1e6, abs=1)
    assert got["interval_ns"] == pytest.approx([81e6 - half, 81e6 + half], rel=2e-4)
    assert got["saving_interval_ns"] == pytest.approx([20e6 - half, 20e6 + half], rel=2e-4)
    # without the term: the two-part interval of the test above, kept under its own keys
    assert got["interval_within_run_ns"] == pytest.approx([81e6 - within, 81e6 + within], rel=2e-4)
    assert got["within_noise"] is True and got["within_noise_within_run"] is False  # 20 - 29.7 < 0 < 20 - 19.4
    assert "between-run 8.10" in got["interval_basis"] and "t(0.975, 4) = 2.776" in got["interval_basis"]
    with pytest.raises(ValueError):
        whatif.interval(pieces, 20e6, per_it, between_run_rel_sd=-0.1)
    # never narrower than without the term, even with 2 steady iterations (t = 12.7 for the noise)
    two = {"iteration_walls_ns": [100e6, 110e6], "iteration_ns": 105e6}
    g2 = whatif.interval(two, 5e6, None, between_run_rel_sd=0.10, between_run_df=5)
    assert g2["interval_ns"][1] - 100e6 > g2["interval_within_run_ns"][1] - 100e6 > 12.7 * 7.07e6


def test_interval_needs_two_steady_iterations():
    got = whatif.interval({"iteration_walls_ns": [100e6], "iteration_ns": 100e6}, 10e6, [10e6])
    assert got["interval_ns"] is None and got["saving_interval_ns"] is None and got["within_noise"] is None
    assert "at least 2" in got["interval_basis"]


def test_t_table():
    for df, t in T975.items():
        assert whatif.t95(df) == t
    assert whatif.t95(35) == 2.042  # between 30 and 40: the wider (df 30)
    assert whatif.t95(1000) == 1.960
    with pytest.raises(ValueError):
        whatif.t95(0)


@pytest.fixture(scope="module")
def base_pieces():
    with Export.open(FIXTURES / "advice_pair_base.sqlite") as ex:
        (p,) = whatif.measure(ex, phases.build(ex))
    return p


def _sql_walls_and_overflow(path):
    """Per complete iteration (an ``update`` range), by plain SQL: its wall as the model bounds it
    (docs: the gap between two iterations belongs to the next one, so from the previous update's
    end, or the iteration's first ``forward`` when no update precedes it in the cut, to its own
    update's end) and the summed duration of the outer overflow-check range inside its update."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    q = """
    WITH r AS (SELECT coalesce(n.text, s.value) AS name, n.start, n.end FROM NVTX_EVENTS n
               LEFT JOIN StringIds s ON s.id = n.textId WHERE n.end IS NOT NULL),
         u AS (SELECT start, end, lag(end) OVER (ORDER BY start) AS prev_end FROM r WHERE name = 'update')
    SELECT u.end - coalesce(u.prev_end, (SELECT min(f.start) FROM r f WHERE f.name = 'forward' AND f.end <= u.start)),
           (SELECT sum(o.end - o.start) FROM r o WHERE o.name LIKE '%._overflow_check_and_loss_scale_update'
            AND o.start >= u.start AND o.end <= u.end)
    FROM u ORDER BY u.start"""
    rows = con.execute(q).fetchall()
    con.close()
    return [float(a) for a, _ in rows], [float(b or 0) for _, b in rows]


def test_noise_part_on_fixture_is_sql_spread(base_pieces):
    walls, _ = _sql_walls_and_overflow(FIXTURES / "advice_pair_base.sqlite")
    assert len(walls) == 2 and base_pieces["iterations"] == [1, 2]  # both complete, no iteration 0 in the cut
    assert base_pieces["iteration_walls_ns"] == pytest.approx(walls, abs=1)
    preds = {s["scenario"]: s for s in whatif.predict(base_pieces, {"precision": "fp16"})}
    # superoffload_no_clipping saves nothing here: its interval is the noise alone (and the between-run term)
    s = preds["superoffload_no_clipping"]
    assert s["saving_ns"] == 0
    half = T975[1] * statistics.stdev(walls) * math.sqrt(1 / 2 + 1 / 2)
    assert s["interval_within_run_ns"] == pytest.approx([s["predicted_ns"] - half, s["predicted_ns"] + half], abs=1)
    assert s["within_noise"] is True
    between = whatif.t95(len(whatif.BETWEEN_RUN_PAIRS)) * whatif.BETWEEN_RUN_REL_SD * s["predicted_ns"]
    full = math.hypot(half, between)
    assert s["interval_ns"] == pytest.approx([s["predicted_ns"] - full, s["predicted_ns"] + full], abs=1)


def test_bf16_term_on_fixture_is_sql_overflow_spread(base_pieces):
    walls, oc = _sql_walls_and_overflow(FIXTURES / "advice_pair_base.sqlite")
    s = {r["scenario"]: r for r in whatif.predict(base_pieces, {"precision": "fp16"})}["bf16"]
    assert s["saving_ns"] == pytest.approx(sum(oc) / 2, abs=1)
    se = math.sqrt(1 / 2 + 1 / 2)
    half = T975[1] * math.hypot(statistics.stdev(walls) * se, statistics.stdev(oc) * se)
    assert s["saving_interval_within_run_ns"] == pytest.approx([s["saving_ns"] - half, s["saving_ns"] + half], abs=1)


def _text(items):
    buf = io.StringIO()
    render_config_and_advice(Console(file=buf, width=400, color_system=None), {"config": None, "advice": items})
    return buf.getvalue()


def _item(saving, lo, hi, within):
    return {"problem": "p", "knob": "k", "change": "a -> b", "baseline_iteration_ms": 2000.0,
            "predicted_iteration_ms": 2000.0 - saving, "saving_ms_per_iteration": saving,
            "saving_pct": saving / 20, "basis": "b", "confidence": "high", "scenario": "x", "pid": 1, "device": 0,
            "config_fixable": True, "saving_interval_ms": [lo, hi],
            "predicted_interval_ms": [2000.0 - hi, 2000.0 - lo], "within_noise": within}


def test_advice_text_shows_interval_and_within_noise():
    out = _text([_item(760.0, 690.0, 830.0, False), _item(20.0, -50.0, 90.0, True)])
    assert "saves 760.0 ms (690.0-830.0) per iteration" in out
    assert "(2,000.0 -> 1,240.0 ms (1,170.0-1,310.0); confidence high)" in out
    first, second = out.split("\n1. ")[1].split("\n2. ")
    assert "(within noise)" not in first
    assert "saves 20.0 ms (-50.0 to 90.0) per iteration" in second and second.splitlines()[0].endswith("confidence high) (within noise)")


def test_advice_items_carry_interval_sorted_by_saving(base_pieces):
    from tracekit.analyze.sections import advice

    sett = {"precision": "fp16", "zero_optimization.offload_optimizer.device": "cpu",
            "zero_optimization.offload_optimizer.pin_memory": False, "zero_optimization.stage": 3}
    scen = whatif.predict(base_pieces, sett)
    items = advice.build_advice(base_pieces, scen, sett)
    assert items and [a["saving_ms_per_iteration"] for a in items] == sorted(
        (a["saving_ms_per_iteration"] for a in items), reverse=True)
    by = {s["scenario"]: s for s in scen}
    for a in items:
        if a["scenario"] == "pageable_to_pinned":  # the copy-back item: its own saving's interval
            siv = by[a["scenario"]]["copy_back_saving_interval_ns"]
        else:
            siv = by[a["scenario"]]["saving_interval_ns"]
        assert a["saving_interval_ms"] == pytest.approx([siv[0] / 1e6, siv[1] / 1e6], abs=1e-3)
        assert a["within_noise"] is (siv[0] <= 0 <= siv[1])
