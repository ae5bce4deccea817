"""Attribution rule edge cases on synthetic (hand-made) exports; expected values by hand."""

import polars as pl
import pytest
from synthetic import START_END, SyntheticTrace, gtid

from tracekit.analyze.model import phases
from tracekit.analyze.result import analyze_path
from tracekit.analyze.sections import breakdown
from tracekit.analyze.trace.export import Export

MAIN, AUTOGRAD = 1, 2
MS = 1_000_000


def build(t: SyntheticTrace, tmp_path, name="synthetic.sqlite", **kw):
    path = t.write(tmp_path / name)
    with Export.open(path) as e:
        return phases.build(e, **kw), path


def ds_iteration(t, t0, pid=1, gas=2, with_step=True, domain="DeepSpeed"):
    """gas micro-steps of 10 ms forward + 10 ms backward, 1 ms gaps, then a 20 ms step."""
    tid = gtid(pid, MAIN)
    now = t0
    for _ in range(gas):
        t.range("DeepSpeedEngine.forward", now, now + 10 * MS, tid, domain)
        now += 11 * MS
        t.range("DeepSpeedEngine.backward", now, now + 10 * MS, tid, domain)
        now += 11 * MS
    if with_step:
        t.range("DeepSpeedZeroOptimizer_Stage3.step", now, now + 20 * MS, tid, domain)
    return now + (21 if with_step else 0) * MS


def test_autograd_thread_copy_counts_in_backward_and_launch_time_rule(tmp_path):
    t = SyntheticTrace()
    ds_iteration(t, 0)
    # a D2H launched by the autograd thread inside backward 0 (11..21 ms), running after it ends
    t.copy(22 * MS, 23 * MS, 4096, 2, pid=1, tid=AUTOGRAD, launch=15 * MS)
    # a kernel launched in forward 1 (22..32 ms) that runs during backward 1
    t.kernel(34 * MS, 35 * MS, pid=1, tid=MAIN, launch=31 * MS)
    # a copy without runtime record: attributed by its GPU start (inside the step, 44..64 ms)
    t.copy(50 * MS, 51 * MS, 1000, 1, pid=1, tid=MAIN, launch=None)
    m, _ = build(t, tmp_path)
    ops = m.ops.sort("start")
    assert ops["phase"].to_list() == ["backward", "forward", "update"]
    assert ops["micro_step"].to_list() == [0, 1, None]
    tot = breakdown.totals(m)
    bwd = tot.filter(pl.col("phase") == "backward").row(0, named=True)
    assert (bwd["d2h_bytes"], bwd["d2h_count"], bwd["d2h_busy_ns"]) == (4096, 1, 1 * MS)
    upd = tot.filter(pl.col("phase") == "update").row(0, named=True)
    assert upd["h2d_bytes"] == 1000
    # the GPU idle share uses execution time: backward 1 (33..43 ms) ran the 1 ms kernel
    rows = breakdown.phase_table(m).filter((pl.col("phase") == "backward") & (pl.col("micro_step") == 1))
    assert rows["gpu_idle_ns"].to_list() == [9 * MS]
    assert rows["kernel_busy_ns"].to_list() == [0]


def step_with_sub_ranges() -> SyntheticTrace:
    """One iteration whose step (44..64 ms) holds cpu_adam 45..55 ms with a nested copy_back 52..54 ms."""
    t = SyntheticTrace()
    ds_iteration(t, 0)
    tid = gtid(1, MAIN)
    t.range("cpu_adam", 45 * MS, 55 * MS, tid, "DeepSpeed")
    t.range("copy_back", 52 * MS, 54 * MS, tid, "DeepSpeed")
    return t


def test_sub_phase_is_innermost_range_on_launching_thread(tmp_path):
    t = step_with_sub_ranges()
    t.copy(53 * MS, 54 * MS, 8, 1, pid=1, tid=MAIN, launch=53 * MS)
    t.copy(60 * MS, 61 * MS, 16, 1, pid=1, tid=MAIN, launch=56 * MS)
    # an autograd-thread range cannot be the sub-phase of a main-thread launch
    t.range("other_thread", 40 * MS, 70 * MS, gtid(1, AUTOGRAD), "DeepSpeed")
    m, _ = build(t, tmp_path)
    sub = m.ops.filter(pl.col("phase") == "update").sort("start")["sub_phase"].to_list()
    assert sub == ["copy_back", None]
    st = breakdown.sub_phase_table(m, "update")
    walls = dict(zip(st["sub_phase"], st["wall_ns"]))
    assert walls == {"cpu_adam": 8 * MS, "copy_back": 2 * MS, "(none)": 10 * MS}
    idle = dict(zip(st["sub_phase"], st["gpu_idle_ns"]))
    assert idle == {"cpu_adam": 8 * MS, "copy_back": 1 * MS, "(none)": 9 * MS}


def test_anomalies_are_counted_and_do_not_break(tmp_path):
    t = SyntheticTrace()
    end = ds_iteration(t, 0)
    tid = gtid(1, MAIN)
    t.stop_time = end + 100 * MS
    t.range("never_closed", 5 * MS, None, tid)
    t.range("closed_by_capture_end", 6 * MS, t.stop_time, tid)
    t.range("async_io", 1 * MS, 30 * MS, tid, event_type=START_END)
    t.mark("checkpoint", 2 * MS, tid)
    t.range("popped_elsewhere", 3 * MS, 4 * MS, tid, end_tid=gtid(1, 9))
    t.kernel(end - 5 * MS, end - 4 * MS, pid=1, tid=MAIN, launch=end - 6 * MS)
    m, path = build(t, tmp_path)
    assert m.anomalies == {"unclosed_ranges": 2, "start_end_ranges": 1, "marks": 1, "cross_thread_ranges": 1,
                           "unusable_ranges": 0}
    assert analyze_path(path)["nvtx_anomalies"]["marks"] == 1
    assert m.windows.filter(pl.col("phase") == "update").height == 1


@pytest.mark.parametrize("gas_option", [None, 2])
def test_inferred_update_without_step_ranges(tmp_path, gas_option):
    t = SyntheticTrace()
    now = 0
    for _ in range(3):  # ZeRO-2 style: no step range; the optimizer runs 30 ms after the boundary backward
        now = ds_iteration(t, now, with_step=False) + 30 * MS
    t.kernel(now - 2 * MS, now - 1 * MS, pid=1, tid=MAIN, launch=now - 3 * MS)
    m, _ = build(t, tmp_path, gas=gas_option)
    w = m.windows.filter(pl.col("phase") != "other").sort("start")
    upd = w.filter(pl.col("phase") == "update")
    assert upd["inferred"].all() and upd.height == 3
    # each inferred update spans end of boundary backward -> next forward (or last GPU activity)
    b = w.filter(pl.col("boundary"))
    assert b.height == 3 and b["micro_step"].to_list() == [1, 1, 1]
    assert (upd["start"] == b["end"]).all()
    assert upd["end"].to_list()[:2] == w.filter((pl.col("phase") == "forward") & (pl.col("micro_step") == 0))["start"].to_list()[1:]
    assert upd["end"].to_list()[2] == now - 1 * MS
    assert m.source[1 << 24].endswith("+inferred-update")


def test_infer_boundaries_rule():
    gaps = [1, 30, 1, 30, 1, 31]
    assert phases.infer_boundaries(gaps).tolist() == [False, True] * 3
    assert phases.infer_boundaries([5, 6, 5]).tolist() == [True, True, True]  # gas 1
    assert phases.infer_boundaries([1, 1, 1, 1], gas=2).tolist() == [False, True, False, True]


def test_tracekit_ranges_win_and_phase_map(tmp_path):
    t = SyntheticTrace()
    tid = gtid(1, MAIN)
    ds_iteration(t, 0)  # DeepSpeed ranges, 0..64 ms
    t.range("iteration 7", 0, 64 * MS, tid, "tracekit")
    t.range("forward", 0, 10 * MS, tid, "tracekit")
    t.range("backward", 11 * MS, 21 * MS, tid, "tracekit")
    t.range("forward", 22 * MS, 32 * MS, tid, "tracekit")
    t.range("backward boundary", 33 * MS, 43 * MS, tid, "tracekit")
    t.range("update", 44 * MS, 60 * MS, tid, "tracekit")
    t.range("my_step", 40 * MS, 62 * MS, tid, "user")
    t.kernel(1 * MS, 2 * MS, pid=1, tid=MAIN, launch=1 * MS)
    m, path = build(t, tmp_path)
    assert m.source[1 << 24] == "tracekit"
    w = m.windows.filter(pl.col("phase") != "other").sort("start")
    assert w["iteration"].unique().to_list() == [7]
    assert w.filter(pl.col("phase") == "update")["end"].to_list() == [60 * MS]
    assert w.filter(pl.col("phase") == "backward")["boundary"].to_list() == [False, True]
    with Export.open(path) as e:
        m2 = phases.build(e, phase_map=["update=^my_step$", "forward=^DeepSpeedEngine\\.forward$"])
    w2 = m2.windows.filter(pl.col("phase") != "other").sort("start")
    # backward, which the map does not name, keeps the built-in names (tracekit's ranges here);
    # my_step (40-62 ms) overlaps the boundary backward (33-43 ms): clipped to start at its end
    assert m2.source[1 << 24] == "phase-map+tracekit"
    assert w2["phase"].to_list() == ["forward", "backward", "forward", "backward", "update"]
    assert w2.filter(pl.col("phase") == "backward")["start"].to_list() == [11 * MS, 33 * MS]
    assert w2.filter(pl.col("phase") == "update")["start"].to_list() == [43 * MS]


def test_bad_phase_map():
    from tracekit.errors import TracekitError

    with pytest.raises(TracekitError, match="PHASE=REGEX"):
        phases.parse_phase_map(["step"])
    with pytest.raises(TracekitError, match="bad regular expression"):
        phases.parse_phase_map(["update=("])


def test_two_ranks_per_process_and_device(tmp_path):
    t = SyntheticTrace()
    for pid, dev, extra in ((1, 0, 0), (2, 1, 5 * MS)):
        ds_iteration(t, 0, pid=pid)
        # the step of rank 2 is 5 ms slower: its copy runs longer inside a longer step range
        t.range("DeepSpeedZeroOptimizer_Stage3.step", 44 * MS, 64 * MS + extra, gtid(pid, MAIN), "DeepSpeed")
        t.copy(45 * MS, 46 * MS + extra, 1 << 20, 1, pid=pid, tid=MAIN, launch=45 * MS, device=dev)
    path = t.write(tmp_path / "synthetic_ranks.sqlite")
    res = analyze_path(path)
    assert [(r["pid"], r["device"]) for r in res["ranks"]] == [(1, 0), (2, 1)]
    h2d = [r["totals"]["update"]["h2d_busy_ns"] for r in res["ranks"]]
    assert h2d == [1 * MS, 6 * MS]
    s = res["summary"]["per_phase"]["update"]
    assert s["slowest_rank_pid"] == 2 and s["spread_ns"] == 5 * MS


def test_phase_map_that_matches_nothing_is_an_error(tmp_path):
    from tracekit.errors import TracekitError

    t = SyntheticTrace()
    ds_iteration(t, 0)
    t.kernel(1 * MS, 2 * MS, pid=1, tid=MAIN, launch=1 * MS)
    path = t.write(tmp_path / "synthetic_map.sqlite")
    with Export.open(path) as e, pytest.raises(TracekitError, match="matched no NVTX range"):
        phases.build(e, phase_map=["update=^my_step$"])
    with pytest.raises(TracekitError, match="PHASE=REGEX"):
        phases.parse_phase_map(["update="])
