"""The one warm-up rule (tracekit/analyze/model/steady.py): warm-up = the iterations holding the
run's first two micro-steps (iteration 0, plus iteration 1 when iteration 0 holds a single
micro-step), as long as one complete iteration stays steady.

Hand-made cases for the rule itself and for each of its callers (the CPU optimizer step, the
update finding), then a real trace: ``ds_zero3_offload_iter0-3.sqlite`` (DeepSpeed ZeRO-3, gas 2,
iterations 0-3, the whole run) as recorded, and a copy of it with the first forward and backward
NVTX ranges deleted so that iteration 0 holds a single micro-step, as with
``gradient_accumulation_steps`` 1. There the expected steady mean of the iteration wall time is
plain SQL over the DeepSpeed NVTX ranges with the rule applied by hand: iteration ``i`` runs from
the end of update ``i - 1`` (the first one from its first forward) to the end of update ``i``.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from tracekit.analyze.model.steady import forward_counts, split_warmup

FIXTURES = Path(__file__).parent / "fixtures"
FULL_RUN = FIXTURES / "ds_zero3_offload_iter0-3.sqlite"
CUT = FIXTURES / "ds_zero3_offload_iter1-2.sqlite"
FWD, BWD, UPD = "DeepSpeedEngine.forward", "DeepSpeedEngine.backward", "DeepSpeedZeroOptimizer_Stage3.step"


# ---------------------------------------------------------------- the rule, hand-made cases
def test_gas2_leaves_out_iteration_0_only():
    # both of the run's first two micro-steps lie in iteration 0
    assert split_warmup([0, 1, 2, 3], {0: 2, 1: 2, 2: 2, 3: 2}) == ([1, 2, 3], [0])
    assert split_warmup([0, 1, 2], {0: 4, 1: 4, 2: 4}) == ([1, 2], [0])


def test_gas1_leaves_out_iterations_0_and_1():
    # the second micro-step lies in iteration 1 (z3s_mb2: 1,172 ms against 732 ms)
    assert split_warmup([0, 1, 2, 3], {0: 1, 1: 1, 2: 1, 3: 1}) == ([2, 3], [0, 1])
    assert split_warmup([3, 0, 2, 1, 2], {0: 1, 1: 1, 2: 1, 3: 1}) == ([2, 3], [0, 1])  # any order, duplicates


def test_only_two_iterations_keep_one_steady():
    # gas 1: the rule would leave nothing; falls back to iteration 0 alone apart
    assert split_warmup([0, 1], {0: 1, 1: 1}) == ([1], [0])
    assert split_warmup([0, 1], {0: 2, 1: 2}) == ([1], [0])
    assert split_warmup([0], {0: 1}) == ([0], [])
    assert split_warmup([], {}) == ([], [])


def test_cut_trace_whose_first_iteration_is_not_0_has_no_warmup():
    # iteration 0 is not in the trace: the run's first micro-steps were not recorded
    assert split_warmup([1, 2], {1: 1, 2: 1}) == ([1, 2], [])
    assert split_warmup([5, 6, 7], {5: 1, 6: 1, 7: 1}) == ([5, 6, 7], [])
    assert split_warmup([1, 2], {1: 2, 2: 2}) == ([1, 2], [])


def test_incomplete_iteration_0_still_counts_its_micro_step():
    # iteration 0 is in the trace but not a candidate (say, its update range never closed):
    # iteration 1 still holds the run's second micro-step
    assert split_warmup([1, 2, 3], {0: 1, 1: 1, 2: 1, 3: 1}) == ([2, 3], [1])
    # the same with gas 2: iteration 0 held both, nothing more to leave out
    assert split_warmup([1, 2, 3], {0: 2, 1: 2, 2: 2, 3: 2}) == ([1, 2, 3], [])


def test_unknown_micro_steps_leave_out_iteration_0_alone():
    assert split_warmup([0, 1, 2]) == ([1, 2], [0])
    assert split_warmup([0, 1, 2], {}) == ([1, 2], [0])
    # iteration 0 without a forward window (the capture began inside it): not the run's start
    assert split_warmup([0, 1, 2, 3], {1: 1, 2: 1, 3: 1}) == ([1, 2, 3], [0])


def test_forward_counts_of_hand_made_windows():
    w = pl.DataFrame({
        "global_pid": [7, 7, 7, 7, 7, 7, 9, 9],
        "iteration": [None, 0, 0, 0, 1, 1, 0, 0],
        "phase": ["forward", "forward", "backward", "update", "forward", "other", "forward", "forward"],
    }, schema_overrides={"iteration": pl.Int64})
    assert forward_counts(w, 7) == {0: 1, 1: 1}  # the one outside iterations is not counted
    assert forward_counts(w, 9) == {0: 2}
    assert forward_counts(w, 8) == {}
    assert forward_counts(w) == {7: {0: 1, 1: 1}, 9: {0: 2}}


# ---------------------------------------------------------------- callers, hand-made cases
def _cpu_update_table(busy: dict[int, int]) -> pl.DataFrame:
    n = len(busy)
    return pl.DataFrame({
        "global_pid": [5] * n, "pid": [5] * n, "device": [0] * n, "iteration": list(busy), "complete": [True] * n,
        "busy_ns": list(busy.values()), "hidden_ns": [0] * n, "exposed_ns": [b // 2 for b in busy.values()],
        "overlapped_ns": [0] * n, "wait_ns": [0] * n, "hidden_by_phase": ["{}"] * n,
        "overlapped_by_phase": ["{}"] * n, "exposed_basis": ["update window"] * n, "ranges": [1] * n,
        "worker_ranges": [0] * n, "workers": [[]] * n, "by_name": [False] * n})


def test_cpu_update_steady_follows_the_rule():
    from tracekit.analyze.sections.cpu_update import CpuUpdate, steady

    busy = {0: 900, 1: 700, 2: 100, 3: 300}
    gas1 = CpuUpdate(_cpu_update_table(busy), {(5, 0)}, [], {5: {0: 1, 1: 1, 2: 1, 3: 1}})
    s = steady(gas1, 5, 0)
    assert s["iterations"] == [2, 3] and s["warmup"] == [0, 1]
    assert s["busy_ns"] == (100 + 300) / 2 and s["exposed_ns"] == (50 + 150) / 2
    gas2 = CpuUpdate(_cpu_update_table(busy), {(5, 0)}, [], {5: {0: 2, 1: 2, 2: 2, 3: 2}})
    s = steady(gas2, 5, 0)
    assert s["iterations"] == [1, 2, 3] and s["warmup"] == [0]
    assert s["busy_ns"] == (700 + 100 + 300) / 3


def test_update_finding_follows_the_rule():
    from tracekit.analyze.sections.findings import build_findings

    gp = 5 << 24
    up = pl.DataFrame({
        "global_pid": [gp] * 4, "device": [0] * 4, "iteration": [0, 1, 2, 3],
        "wall_ns": [40e6, 30e6, 10e6, 12e6], "gpu_idle_ns": [36e6, 27e6, 9e6, 11e6],
        "gpu_idle_share": [0.9] * 4, "h2d_bytes": [0] * 4, "h2d_busy_ns": [0] * 4,
        "peak_bytes": [None] * 4, "total_memory": [None] * 4, "free_bytes": [None] * 4, "state_params": [None] * 4,
    }, schema_overrides={"peak_bytes": pl.Int64, "total_memory": pl.Int64, "free_bytes": pl.Int64,
                         "state_params": pl.Int64})
    iters = {(gp, 0): {"update": 4}}

    def update_finding(forwards):
        (f,) = [f for f in build_findings({"update_opportunity": up}, iters, forwards=forwards)
                if f["topic"] == "update"]
        return f

    f = update_finding({gp: {0: 1, 1: 1, 2: 1, 3: 1}})  # gas 1
    assert f["values"]["updates"] == 2 and f["values"]["wall_ns"] == 22e6 and f["values"]["gpu_idle_ns"] == 20e6
    assert "idle 10.0 ms of 11.0 ms per iteration" in f["text"]
    assert "mean over steady iterations 2-3; warm-up iterations 0: 40.0 ms, 1: 30.0 ms update" in f["text"]
    f = update_finding({gp: {0: 2, 1: 2, 2: 2, 3: 2}})  # gas 2
    assert f["values"]["updates"] == 3 and f["values"]["wall_ns"] == 52e6
    assert "mean over steady iterations 1-3; warm-up iteration 0: 40.0 ms update" in f["text"]
    f = update_finding(None)  # micro-steps unknown: iteration 0 alone
    assert f["values"]["updates"] == 3


# ---------------------------------------------------------------- a real trace, plain SQL
def _sql_iterations(path: Path) -> tuple[list[int], dict[int, int]]:
    """(wall ns of each iteration, forward ranges per iteration) from the DeepSpeed NVTX ranges:
    iteration i ends at the end of the i-th optimizer step and starts where the one before
    ended (the first at the first forward)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("SELECT s.value, e.start, e.end FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                       "WHERE s.value IN (?, ?, ?) AND e.end IS NOT NULL ORDER BY e.start", (FWD, BWD, UPD)).fetchall()
    con.close()
    first = rows[0][1]
    ends = [e for name, _, e in rows if name == UPD]
    walls = [b - a for a, b in zip([first, *ends[:-1]], ends)]
    forwards: dict[int, int] = {}
    for name, s, _ in rows:
        if name == FWD:
            i = sum(1 for e in ends if e <= s)
            forwards[i] = forwards.get(i, 0) + 1
    return walls, forwards


def _single_micro_step_copy(tmp_path: Path) -> Path:
    """The full run with its first forward and backward ranges deleted: iteration 0 holds one
    micro-step (the run's second), as with gradient_accumulation_steps 1."""
    dst = tmp_path / "gas1_view.sqlite"
    shutil.copyfile(FULL_RUN, dst)
    con = sqlite3.connect(dst)
    for name in (FWD, BWD):
        con.execute("DELETE FROM NVTX_EVENTS WHERE rowid = (SELECT e.rowid FROM NVTX_EVENTS e JOIN StringIds s "
                    "ON s.id = e.textId WHERE s.value = ? ORDER BY e.start LIMIT 1)", (name,))
    con.commit()
    con.close()
    return dst


def _check_every_copy(path: Path, steady: list[int], warm: list[int], mean_ns: float) -> None:
    """ReportData, the what-if model's pieces, the advice and the update finding all take
    ``steady`` / ``warm``, and the steady mean of the iteration wall time is ``mean_ns``."""
    from tracekit.analyze.sections import whatif
    from tracekit.render.data import ReportData, warmup_iterations

    d = ReportData.load(path)
    try:
        (rk,) = d.ranks.iter_rows(named=True)
        assert d.steady_iterations(rk) == steady
        assert d.warmup_iterations(rk) == warm == warmup_iterations(d, rk)
        spans = d.iteration_spans(rk).filter(pl.col("iteration").is_in(steady))
        assert spans["wall_ns"].mean() == pytest.approx(mean_ns, abs=1)
        (p,) = whatif.measure(d.export, d.model)
        assert p["iterations"] == steady and p["warmup"] == warm
        assert p["iteration_ns"] == pytest.approx(mean_ns, abs=1)
        assert p["iteration_walls_ns"] == pytest.approx(spans.sort("iteration")["wall_ns"].to_list(), abs=1)
        res = d.analysis.to_json()
        for r in res["ranks"]:  # no CPU optimizer ranges in these DeepSpeed-only traces
            assert r["cpu_update_steady"] is None
        assert len(res["predictions"]) >= 1
        for pred in res["predictions"]:
            assert pred["iterations"] == steady
            assert pred["baseline_ns"] == pytest.approx(mean_ns, abs=1)
        (f,) = [f for f in res["findings"] if f["topic"] == "update"]
        span = f"{steady[0]}-{steady[-1]}" if len(steady) > 1 else f"{steady[0]}"
        assert f"mean over steady iterations {span}" in f["text"]
        assert ("warm-up iteration" in f["text"]) == bool(warm)
        assert f["values"]["updates"] == len(steady)
    finally:
        d.close()


def test_real_run_gas2_leaves_out_iteration_0():
    walls, forwards = _sql_iterations(FULL_RUN)
    assert forwards == {0: 2, 1: 2, 2: 2, 3: 2}  # gas 2, four optimizer steps
    # the rule by hand: iteration 0 holds both of the first two micro-steps
    assert walls[0] > 4 * max(walls[1:])  # the warm-up (3.16 s against ~0.65 s)
    _check_every_copy(FULL_RUN, [1, 2, 3], [0], sum(walls[1:]) / 3)


def test_real_run_one_micro_step_in_iteration_0_leaves_out_iteration_1_too(tmp_path):
    path = _single_micro_step_copy(tmp_path)
    walls, forwards = _sql_iterations(path)
    assert forwards == {0: 1, 1: 2, 2: 2, 3: 2}
    # the rule by hand: iteration 0 holds the first micro-step, iteration 1 the second
    _check_every_copy(path, [2, 3], [0, 1], (walls[2] + walls[3]) / 2)


def test_real_cut_whose_first_iteration_is_1_keeps_both():
    walls, forwards = _sql_iterations(CUT)
    assert forwards == {0: 2, 1: 2}  # positions in the cut: its iterations 1 and 2
    _check_every_copy(CUT, [1, 2], [], sum(walls) / 2)
