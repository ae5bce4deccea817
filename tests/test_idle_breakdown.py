"""Where the idle GPU time goes (issue 22, tracekit.analyze.sections.idle): a synthetic trace with
API calls and kernels on a grid checked against hand-computed categories, and the ds_zero3 fixture
checked against plain SQL and an independent interval computation."""

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from synthetic import SyntheticTrace, gtid

from tracekit.analyze.model import intervals
from tracekit.analyze.result import analyze_path

FIXTURE = Path(__file__).parent / "fixtures" / "ds_zero3_offload_iter1-2.sqlite"
US, MS = 1_000, 1_000_000
MAIN, OTHER = 1, 2
CATS = ("gpu_busy_ns", "in_api_ns", "between_api_ns", "waiting_ns")


def _kernel(t, start, end, tid, launch, api_end, name="k", api="cudaLaunchKernel_v7000"):
    c = t._launch(gtid(1, tid), launch, api_end, api)
    t.kernels.append((start, end, 0, 7, c, 1 << 24, t.sid(name)))


def _call(t, start, end, tid, api):
    c = t._launch(gtid(1, tid), start, end, api)
    return c


def _synthetic(tmp_path):
    t = SyntheticTrace()
    tid = gtid(1, MAIN)
    t.range("DeepSpeedEngine.forward", 0, 10 * MS, tid, "DeepSpeed")
    t.range("DeepSpeedEngine.backward", 11 * MS, 21 * MS, tid, "DeepSpeed")
    t.range("DeepSpeedZeroOptimizer_Stage3.step", 22 * MS, 42 * MS, tid, "DeepSpeed")
    # forward [0, 10 ms): two compute kernels, one NCCL kernel, two synchronizes, an event query
    _kernel(t, 2 * MS, 3 * MS, MAIN, 1 * MS, 1 * MS + 100 * US)
    _kernel(t, 5 * MS, 5 * MS + 500 * US, MAIN, 3500 * US, 3600 * US)
    _kernel(t, 7 * MS, 8 * MS, MAIN, 6500 * US, 6600 * US, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    _call(t, 4 * MS, 6 * MS, MAIN, "cudaStreamSynchronize_v3020")  # [5, 5.5) of it is busy
    _call(t, 7500 * US, 8500 * US, OTHER, "cudaStreamSynchronize_v3020")  # [7.5, 8) waiting
    _call(t, 8200 * US, 8800 * US, MAIN, "cudaEventQuery_v3020")  # [8.2, 8.5) goes to the earlier sync
    # backward [11, 21 ms): a kernel launched by the other thread (which makes it a launching thread)
    _kernel(t, 13 * MS, 14 * MS, OTHER, 12 * MS, 12 * MS + 100 * US)
    # a short kernel: 50 us of GPU time for a 100 us launch
    _kernel(t, 15 * MS, 15 * MS + 50 * US, MAIN, 14 * MS, 14 * MS + 100 * US)
    return t.write(tmp_path / "synthetic_idle.sqlite")


def _phases(result):
    rank = result["ranks"][0]
    return {(it["index"], p["phase"], p["micro_step"]): p for it in rank["iterations"] for p in it["phases"]}


def test_idle_categories_on_a_grid_synthetic(tmp_path):
    res = analyze_path(_synthetic(tmp_path))
    ph = _phases(res)
    fwd = ph[(0, "forward", 0)]
    assert fwd["wall_ns"] == 10 * MS
    b = fwd["idle_breakdown"]
    # busy [2,3) + [5,5.5); waiting: NCCL [7,8); in API: 3 launches x 0.1 ms, sync on MAIN [4,6) minus
    # busy 0.5, sync on OTHER [8,8.5) after the collective, event query [8.5,8.8)
    assert b["gpu_busy_ns"] == 1500 * US
    assert b["waiting_ns"] == 1 * MS
    assert b["by_api"] == {"cudaStreamSynchronize": 2 * MS, "cudaLaunchKernel": 300 * US,
                           "cudaEventQuery": 300 * US}
    assert b["by_api_group"] == {"synchronize": 2 * MS, "event": 300 * US, "launch": 300 * US}
    assert b["in_api_ns"] == 2600 * US
    assert b["between_api_ns"] == 10 * MS - 1500 * US - 1 * MS - 2600 * US
    ls = fwd["launch_stats"]
    assert (ls["kernel_count"], ls["launch_count"], ls["short_kernels"]) == (3, 3, 0)
    assert ls["launch_mean_ns"] == 100 * US and ls["launch_p99_ns"] == 100 * US
    assert ls["queue_p50_ns"] == 900 * US  # queues 0.9, 1.4 and 0.4 ms
    assert ls["kernels_per_ms"] == pytest.approx(0.3)
    bwd = ph[(0, "backward", 0)]["idle_breakdown"]
    assert (bwd["gpu_busy_ns"], bwd["in_api_ns"], bwd["waiting_ns"]) == (1050 * US, 200 * US, 0)
    assert bwd["between_api_ns"] == 10 * MS - 1250 * US
    assert ph[(0, "backward", 0)]["launch_stats"]["short_kernels"] == 1
    upd = ph[(0, "update", None)]["idle_breakdown"]
    assert (upd["gpu_busy_ns"], upd["in_api_ns"], upd["between_api_ns"], upd["by_api"]) == (0, 0, 20 * MS, {})
    other = ph[(0, "other", None)]  # the gaps [10, 11) and [21, 22)
    assert other["wall_ns"] == 2 * MS and other["idle_breakdown"]["between_api_ns"] == 2 * MS
    for p in ph.values():
        assert sum(p["idle_breakdown"][c] for c in CATS) == p["wall_ns"]
    idle = [f for f in res["findings"] if f["topic"] == "idle"]
    assert [f["phase"] for f in idle] == ["forward", "backward", "update"]
    assert idle[0]["text"].startswith("forward is host-bound: 58% of its idle time")  # 4.9 of 8.5 ms
    assert "3 kernels of median 1,000.0 us, launch 100.0 us each" in idle[0]["text"]


def test_findings_rule_synthetic(tmp_path):
    """A phase below 1 ms, and one with the GPU busy more than half the time, get no finding."""
    t = SyntheticTrace()
    tid = gtid(1, MAIN)
    t.range("DeepSpeedEngine.forward", 0, 900 * US, tid, "DeepSpeed")  # short: under 1 ms
    t.range("DeepSpeedEngine.backward", 1 * MS, 11 * MS, tid, "DeepSpeed")  # 60 % busy
    t.range("DeepSpeedZeroOptimizer_Stage3.step", 12 * MS, 22 * MS, tid, "DeepSpeed")  # waits on NCCL
    _kernel(t, 2 * MS, 8 * MS, MAIN, 1100 * US, 1200 * US)
    _kernel(t, 13 * MS, 20 * MS, MAIN, 12100 * US, 12200 * US, name="ncclDevKernel_AllGather_RING_LL")
    res = analyze_path(t.write(tmp_path / "synthetic_rule.sqlite"))
    idle = [f for f in res["findings"] if f["topic"] == "idle"]
    assert [f["phase"] for f in idle] == ["update"]
    # 7 of 10 ms idle (the NCCL kernel is not busy time)
    assert idle[0]["text"].startswith("update waits on collectives: 70% of its idle time")
    assert idle[0]["values"]["waiting_ns"] == 7 * MS


@pytest.fixture(scope="module")
def fixture_result():
    return analyze_path(FIXTURE)


def test_fixture_categories_sum_to_wall(fixture_result):
    n = 0
    for rank in fixture_result["ranks"]:
        for it in rank["iterations"]:
            for p in it["phases"]:
                b = p["idle_breakdown"]
                assert sum(b[c] for c in CATS) == p["wall_ns"], (it["index"], p["phase"])
                assert b["gpu_busy_ns"] == p["wall_ns"] - p["gpu_idle_ns"]
                assert sum(b["by_api"].values()) == b["in_api_ns"] == sum(b["by_api_group"].values())
                assert min(b[c] for c in CATS) >= 0
                n += 1
    assert n == 12


def test_fixture_launch_stats_equal_sql(fixture_result):
    _launch_stats_equal_sql(fixture_result)


def test_launch_stats_one_iteration_at_a_time_equal_sql(monkeypatch):
    """launch_stats groups the kernels a few iterations at a time (issue 24): one at a time, the
    statistics of every window are still those of plain SQL."""
    from tracekit.analyze.sections import idle

    monkeypatch.setattr(idle, "_ITERATIONS_AT_ONCE", 1)
    _launch_stats_equal_sql(analyze_path(FIXTURE))


def _launch_stats_equal_sql(fixture_result):
    con = sqlite3.connect(FIXTURE)
    for it in fixture_result["ranks"][0]["iterations"]:
        for p in it["phases"]:
            if p["phase"] == "other":  # merged gaps: not one interval
                continue
            # kernels whose launching call began in the window, launched by a cudaLaunchKernel-like call
            n_all, n, mean = con.execute(
                """SELECT count(*), sum(s.value LIKE '%Launch%'),
                          avg(CASE WHEN s.value LIKE '%Launch%' THEN r."end" - r.start END)
                   FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                     ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24)
                   JOIN StringIds s ON s.id = r.nameId
                   WHERE r.start >= ? AND r.start < ?""", (p["start_ns"], p["end_ns"])).fetchone()
            ls = p["launch_stats"]
            assert (ls["kernel_count"], ls["launch_count"]) == (n_all, n)
            assert ls["launch_mean_ns"] == pytest.approx(mean, rel=1e-9)
    fwd = fixture_result["ranks"][0]["iterations"][0]["phases"]
    assert [p["launch_stats"]["kernel_count"] for p in fwd if p["phase"] == "forward"] == [506, 506]


def test_fixture_in_api_equals_interval_algebra(fixture_result):
    """in_api_ns of each phase window = |window n calls - GPU work - NCCL kernels|, from SQL rows and
    intervals.subtract / intersect (not the sweep of the section)."""
    con = sqlite3.connect(FIXTURE)
    tids = [r[0] for r in con.execute(
        """SELECT DISTINCT r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN (
             SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT correlationId
             FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET) g
           USING (correlationId)""")]
    calls = np.array(con.execute(
        f'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE globalTid IN ({",".join("?" * len(tids))})',
        tids).fetchall(), dtype=np.int64)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    kern = con.execute('SELECT start, "end", demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    comm = np.array([(s, e) for s, e, n in kern if "nccl" in names[n].lower()] or np.empty((0, 2)), dtype=np.int64)
    busy = np.array([(s, e) for s, e, n in kern if "nccl" not in names[n].lower()]
                    + con.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY').fetchall()
                    + con.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMSET').fetchall(), dtype=np.int64)
    gpu = (np.concatenate([busy[:, 0], comm[:, 0]]), np.concatenate([busy[:, 1], comm[:, 1]]))
    free_calls = intervals.subtract((calls[:, 0], calls[:, 1]), gpu)
    for it in fixture_result["ranks"][0]["iterations"]:
        for p in it["phases"]:
            if p["phase"] == "other":
                continue
            win = (np.array([p["start_ns"]]), np.array([p["end_ns"]]))
            assert p["idle_breakdown"]["in_api_ns"] == intervals.intersection_length(free_calls, win)


def test_larger_micro_batch_advice_synthetic(tmp_path):
    """Three iterations of 2 micro-steps (forward 10 ms with a 1 ms kernel, backward 10 ms with a
    2 ms kernel) and a 20 ms step: per steady iteration W = 40 ms of micro-steps, K = 6 ms of
    kernels, so gradient_accumulation_steps 2 -> 1 saves (W - K) / 2 = 17 ms."""
    t = SyntheticTrace()
    tid = gtid(1, MAIN)
    now = 0
    for _ in range(3):
        for _ in range(2):
            t.range("DeepSpeedEngine.forward", now, now + 10 * MS, tid, "DeepSpeed")
            _kernel(t, now + 5 * MS, now + 6 * MS, MAIN, now + 1 * MS, now + 1 * MS + 10 * US)
            now += 11 * MS
            t.range("DeepSpeedEngine.backward", now, now + 10 * MS, tid, "DeepSpeed")
            _kernel(t, now + 5 * MS, now + 7 * MS, MAIN, now + 1 * MS, now + 1 * MS + 10 * US)
            now += 11 * MS
        t.range("DeepSpeedZeroOptimizer_Stage3.step", now, now + 20 * MS, tid, "DeepSpeed")
        now += 21 * MS
    res = analyze_path(t.write(tmp_path / "synthetic_gas2.sqlite"))
    items = [a for a in res["advice"] if a["scenario"] == "larger_micro_batch"]
    assert len(items) == 1
    a = items[0]
    assert a["saving_ms_per_iteration"] == 17.0
    assert a["change"].startswith("micro-batch x 2, gradient_accumulation_steps 2 -> 1")
    pred = [p for p in res["predictions"] if p["scenario"] == "larger_micro_batch"][0]
    base = [p for p in res["predictions"] if p["scenario"] != "larger_micro_batch"][0]["baseline_ns"]
    assert pred["baseline_ns"] == base and pred["predicted_ns"] == pytest.approx(base - 17 * MS)
    assert pred["lower_bound_ns"] == pytest.approx(base - 40 * MS + 20 * MS)  # max(W, B + K) / 2 = 20 ms
    assert a["predicted_iteration_ms"] == pytest.approx((base - 17 * MS) / 1e6, abs=1e-3)


def test_no_micro_batch_advice_at_gas_1_synthetic(tmp_path):
    res = analyze_path(_synthetic(tmp_path))
    assert not [a for a in res["advice"] if a["scenario"] == "larger_micro_batch"]


def test_iteration_scopes_the_idle_findings_synthetic(tmp_path):
    from tracekit.options import Options

    path = _synthetic(tmp_path)
    res = analyze_path(path, Options(iteration=0))
    assert [f["phase"] for f in res["findings"] if f["topic"] == "idle"] == ["forward", "backward", "update"]
    with pytest.raises(Exception, match="--iteration 5"):
        analyze_path(path, Options(iteration=5))


def test_without_runtime_rows_idle_is_between_api_and_noted_synthetic(tmp_path):
    t = SyntheticTrace()
    tid = gtid(1, MAIN)
    t.range("DeepSpeedEngine.forward", 0, 10 * MS, tid, "DeepSpeed")
    t.range("DeepSpeedZeroOptimizer_Stage3.step", 11 * MS, 20 * MS, tid, "DeepSpeed")
    t.kernel(2 * MS, 3 * MS, pid=1, tid=MAIN, launch=None)  # no runtime record at all
    from tracekit.options import Options

    res = analyze_path(t.write(tmp_path / "synthetic_noruntime.sqlite"), Options(sections=("idle",)))
    fwd = _phases(res)[(0, "forward", 0)]
    b = fwd["idle_breakdown"]
    assert (b["gpu_busy_ns"], b["in_api_ns"], b["waiting_ns"], b["between_api_ns"]) == (1 * MS, 0, 0, 9 * MS)
    assert fwd["launch_stats"]["launch_count"] == 0 and fwd["launch_stats"]["launch_mean_ns"] is None
    assert any(n.startswith("idle: CUPTI_ACTIVITY_KIND_RUNTIME is missing") for n in res["transfer_notes"])


def test_fixture_update_sub_phases_tile_the_update(fixture_result):
    import polars as pl

    from tracekit.analyze.model import phases as ph
    from tracekit.analyze.sections import idle
    from tracekit.analyze.trace.export import Export

    with Export.open(FIXTURE) as e:
        sub = idle.idle_sub_phases(ph.build(e), e)
    per = sub.group_by("iteration").agg(pl.col("wall_ns", *idle.CATEGORIES).sum()).sort("iteration")
    upd = {it["index"]: p for it in fixture_result["ranks"][0]["iterations"] for p in it["phases"]
           if p["phase"] == "update"}
    for r in per.iter_rows(named=True):
        assert r["wall_ns"] == upd[r["iteration"]]["wall_ns"]
        for c in idle.CATEGORIES:
            assert r[c] == upd[r["iteration"]]["idle_breakdown"][c], c


def test_in_api_cause_names_group_and_call_synthetic(tmp_path):
    t = SyntheticTrace()
    tid = gtid(1, MAIN)
    t.range("DeepSpeedEngine.forward", 0, 10 * MS, tid, "DeepSpeed")
    t.range("DeepSpeedZeroOptimizer_Stage3.step", 11 * MS, 12 * MS, tid, "DeepSpeed")
    _kernel(t, 1 * MS, 1100 * US, MAIN, 500 * US, 510 * US)
    _call(t, 2 * MS, 9 * MS, MAIN, "cudaMalloc_v3020")  # 7 ms of the 9.9 ms idle
    res = analyze_path(t.write(tmp_path / "synthetic_inapi.sqlite"))
    f = [f for f in res["findings"] if f["topic"] == "idle" and f["phase"] == "forward"][0]
    assert f["text"].startswith("forward is held in CUDA API calls: 71% of its idle time is the launching thread "
                                "inside them, mostly allocator (cudaMalloc 7.0 ms per iteration)")
    assert f["values"]["in_api_ns"] == 7 * MS + 10 * US


@pytest.mark.parametrize("batch", [1, 5, 1 << 16])
def test_classify_equals_a_brute_force_walk_in_runs_of_intervals(monkeypatch, batch):
    """classify cuts the segments in runs of about ``_SEGMENT_BATCH`` edges: with runs of one
    interval, of a few, and all at once, every nanosecond lands where a walk over each ns puts
    it (busy first, then a communication kernel, then inside the earliest-begun call in flight)."""
    import polars as pl

    from tracekit.analyze.sections import idle

    monkeypatch.setattr(idle, "_SEGMENT_BATCH", batch)
    rng = np.random.default_rng(7)
    span = 2_000

    def spans(n, lo=1, hi=60):
        s = rng.integers(0, span - hi, n)
        return s, s + rng.integers(lo, hi, n)

    # disjoint intervals with gaps, and busy, comm and calls that overlap them and each other
    edges = np.sort(rng.choice(np.arange(1, span), 60, replace=False))
    iv = pl.DataFrame({"iid": np.arange(30), "start": edges[0::2], "end": edges[1::2]})
    bs, be = spans(40)
    cs, ce = spans(15)
    ks, ke = spans(50, hi=120)
    names = rng.choice(["cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync"], 50)
    distinct = sorted(set(names.tolist()))  # the calls as api_call_codes gives them: a code per name
    calls = pl.DataFrame({"start": ks, "end": ke, "code": [distinct.index(n) + 1 for n in names]})
    got = idle.classify(iv, pl.DataFrame({"start": bs, "end": be}), pl.DataFrame({"start": cs, "end": ce}), calls,
                        (distinct, [idle.api_group(n) for n in distinct]))
    expect: dict = {}
    for i, a, b in iv.iter_rows():
        for t in range(a, b):
            if ((bs <= t) & (t < be)).any():
                key = (i, "gpu_busy_ns", None)
            elif ((cs <= t) & (t < ce)).any():
                key = (i, "waiting_ns", None)
            elif ((ks <= t) & (t < ke)).any():
                j = min(np.flatnonzero((ks <= t) & (t < ke)), key=lambda j: (ks[j], j))  # began first
                key = (i, "in_api_ns", str(names[j]))
            else:
                key = (i, "between_api_ns", None)
            expect[key] = expect.get(key, 0) + 1
    assert {(r["iid"], r["cat"], r["name"]): r["ns"] for r in got.iter_rows(named=True)} == expect


def test_iteration_scopes_the_idle_findings_kernel_counts():
    """With ``--iteration N`` the idle finding's kernels per iteration are those of iteration N
    (they summed every iteration's kernels, the warm-up's too, and divided by one): counted
    here by plain SQL, the kernels whose launching call began in the iteration's phase windows."""
    from tracekit.options import Options

    path = Path(__file__).parent / "fixtures" / "ds_zero3_offload_iter0-3.sqlite"
    con = sqlite3.connect(path)
    res = analyze_path(path, Options(iteration=2))
    it = next(i for i in res["ranks"][0]["iterations"] if i["index"] == 2)
    found = {f["phase"]: f["values"]["kernels"] for f in res["findings"] if f["topic"] == "idle"}
    assert set(found) >= {"forward", "backward"}
    for phase, kernels in found.items():
        n = 0
        for p in it["phases"]:
            if p["phase"] == phase:
                n += con.execute(
                    """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                         ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24)
                       WHERE r.start >= ? AND r.start < ?""", (p["start_ns"], p["end_ns"])).fetchone()[0]
        assert kernels == n
