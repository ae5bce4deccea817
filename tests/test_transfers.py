"""Transfer analyses checked against independent computations: plain SQL on the fixture and
brute-force Python loops over rows read with sqlite3, and a hand-computed synthetic model."""

import sqlite3
from collections import defaultdict

import polars as pl
import pytest
from conftest import ZERO3_CUT
from conftest import union_length_loop as loop_union

from tracekit.analyze.model import phases
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections import (
    contention,
    copy_sizes,
    findings,
    memory,
    opportunities,
    overlap,
    pageable,
    pcie_metrics,
    throughput,
)
from tracekit.analyze.trace.export import Export
from tracekit.errors import MissingDataError

STEP = "DeepSpeedZeroOptimizer_Stage3.step"
BWD = "DeepSpeedEngine.backward"
FWD = "DeepSpeedEngine.forward"


@pytest.fixture(scope="module")
def sql():
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    yield con
    con.close()


@pytest.fixture(scope="module")
def em():
    e = Export.open(ZERO3_CUT)
    return e, phases.build(e)


def ranges(sql, name):
    return sql.execute(
        """SELECT n.start, n."end" FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId
           WHERE s.value = ? ORDER BY n.start""", (name,)).fetchall()


def copies_launched_in(sql, rngs, where="1"):
    """(copyKind, srcKind, dstKind, bytes, start, end, api_start, api_end) of memcpys whose
    launching runtime call starts inside one of ``rngs``."""
    out = []
    for a, b in rngs:
        out += sql.execute(
            f"""SELECT m.copyKind, m.srcKind, m.dstKind, m.bytes, m.start, m."end", r.start, r."end"
                FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                  ON r.correlationId = m.correlationId
                WHERE r.start >= ? AND r.start < ? AND ({where})""", (a, b)).fetchall()
    return out


def loop_union_list(iv):
    out = []
    for s, e in sorted(iv):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def loop_intersection(a, b):
    ua, ub = loop_union_list(a), loop_union_list(b)
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in ua for s2, e2 in ub)


# --------------------------------------------------------------------------- real fixture
def test_overlap_update_and_backward_match_loops(sql, em):
    _, m = em
    o = overlap.overlap(m, by=("phase",))
    kernels = sql.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    for phase, name in (("update", STEP), ("backward", BWD)):
        rows = copies_launched_in(sql, ranges(sql, name), "m.copyKind IN (1, 2)")
        row = o.filter(pl.col("phase") == phase).row(0, named=True)
        for kind, d in ((1, "h2d"), (2, "d2h")):
            iv = [(r[4], r[5]) for r in rows if r[0] == kind]
            assert row[f"{d}_count"] == len(iv)
            assert row[f"{d}_bytes"] == sum(r[3] for r in rows if r[0] == kind)
            assert row[f"{d}_busy_ns"] == loop_union(iv)
            assert row[f"{d}_overlap_ns"] == loop_intersection(iv, kernels)
            assert row[f"{d}_exposed_ns"] == row[f"{d}_busy_ns"] - row[f"{d}_overlap_ns"]
        h2d = [(r[4], r[5]) for r in rows if r[0] == 1]
        d2h = [(r[4], r[5]) for r in rows if r[0] == 2]
        assert row["bidir_ns"] == loop_intersection(h2d, d2h)
    assert o.filter(pl.col("phase") == "backward")["d2h_busy_ns"][0] > 20e6


def test_copy_sizes_match_sql_buckets(sql, em):
    _, m = em
    got = copy_sizes.copy_sizes(m, by=())
    want = defaultdict(lambda: [0, 0, 0])
    labels = {0: "pageable", 1: "pinned", 2: "device"}
    for ck, sk, dk, b, s, e in sql.execute(
            'SELECT copyKind, srcKind, dstKind, bytes, start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind IN (1,2,8)'):
        d = {1: "H2D", 2: "D2H", 8: "D2D"}[ck]
        kind = labels[dk if ck == 2 else sk]
        k = b.bit_length() - 1 if b > 0 else -1
        w = want[(d, kind, k)]
        w[0] += 1
        w[1] += b
        w[2] += e - s
    have = {(r["direction"], r["host_kind"], r["bucket"]): [r["count"], r["bytes"], r["copy_ns"]]
            for r in got.iter_rows(named=True)}
    assert have == dict(want)
    for r in got.iter_rows(named=True):
        assert r["bucket_lo"] <= r["bytes"] / r["count"] < r["bucket_hi"]


def test_pageable_copies_match_sql(sql, em):
    e, m = em
    from tracekit.analyze.sections import whatif

    assert pageable.pageable_copies(m, e)["saving_ns"].null_count() > 0  # no prediction given: no saving
    # no settings: pin_memory is no lever, every steady copy is pageable_to_pinned's per-copy rule
    (p,) = whatif.measure(e, m)
    c = pageable.pageable_copies(m, e, savings=whatif.pinning_by_copy(p, {}))
    n, b, dur, host = sql.execute(
        """SELECT count(*), sum(m.bytes), sum(m."end" - m.start), sum(r."end" - r.start)
           FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
           WHERE (m.copyKind = 1 AND m.srcKind = 0) OR (m.copyKind = 2 AND m.dstKind = 0)""").fetchone()
    assert (c.height, c["bytes"].sum(), c["duration_ns"].sum(), c["host_ns"].sum()) == (n, b, dur, host)
    assert (c.filter(pl.col("direction") == "D2H")["blocking"]).all()
    assert c.filter(pl.col("api_name").str.contains("Async") & (pl.col("direction") == "H2D"))["blocking"].sum() == 0
    # saving (the what-if model's rule, issue 21 "one voice"): pinned GB/s of the same direction and
    # size bucket (nearest bucket with pinned copies; 53 GB/s when there is none or, for a copy of
    # >= 1 MiB, when it is < 5 GB/s), per copy max(max(host, exposed) - bytes / pinned x exposed
    # share, 0), exposed = the copy's time under no kernel; by a loop
    pinned = defaultdict(lambda: [0, 0])
    for ck, b_, d_ in sql.execute('SELECT copyKind, bytes, "end" - start FROM CUPTI_ACTIVITY_KIND_MEMCPY '
                                  "WHERE (copyKind = 1 AND srcKind = 1) OR (copyKind = 2 AND dstKind = 1)"):
        p = pinned[(ck, b_.bit_length() - 1)]
        p[0] += b_
        p[1] += d_
    kern = []  # the union of the kernels, merged by a loop
    for ks, ke in sql.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start'):
        if kern and ks <= kern[-1][1]:
            kern[-1][1] = max(kern[-1][1], ke)
        else:
            kern.append([ks, ke])

    def covered(a, b):
        return sum(max(0, min(b, ke) - max(a, ks)) for ks, ke in kern if ks < b and ke > a)

    total = 0.0
    steady = set(zip(*[c.filter(pl.col("saving_ns").is_not_null())[k].to_list() for k in ("start", "correlation_id")]))
    assert 0 < len(steady) <= c.height  # the copies of the steady iterations (all of them in this cut)
    for ck, b_, s_, e_, hs, he, cid in sql.execute(
            'SELECT m.copyKind, m.bytes, m.start, m."end", r.start, r."end", m.correlationId '
            "FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId "
            "WHERE (m.copyKind = 1 AND m.srcKind = 0) OR (m.copyKind = 2 AND m.dstKind = 0)"):
        d_ = e_ - s_
        if d_ <= 0 or (s_, cid) not in steady:
            continue
        k = b_.bit_length() - 1 if b_ else -1
        cands = sorted((abs(kk - k), kk) for (c_, kk) in pinned if c_ == ck)
        g = pinned[(ck, cands[0][1])][0] / pinned[(ck, cands[0][1])][1] if cands else None
        if g is None or (b_ >= 1 << 20 and g < 5):
            g = 53.0
        exposed = d_ - covered(s_, e_)
        total += max(max(he - hs, exposed) - b_ / g * exposed / d_, 0.0)
    assert c["saving_ns"].sum() == pytest.approx(total, rel=1e-9)
    # the update's parameter copy-back: pageable H2D launched inside the step ranges
    upd = copies_launched_in(sql, ranges(sql, STEP), "m.copyKind = 1 AND m.srcKind = 0")
    s = pageable.pageable_summary(m, by=("phase",), copies=c).filter(
        (pl.col("phase") == "update") & (pl.col("direction") == "H2D")).row(0, named=True)
    assert s["bytes"] == sum(r[3] for r in upd) > 5e8
    assert s["copy_ns"] == sum(r[5] - r[4] for r in upd)
    assert s["gbps"] == pytest.approx(s["bytes"] / s["copy_ns"])
    assert s["gbps"] < 10 < s["pinned_gbps"]


def test_memory_timeline_and_peaks_match_sql(sql, em):
    e, m = em
    tl = memory.memory_timeline(e, m)
    final, peak = sql.execute(
        """SELECT sum(d), max(c) FROM (SELECT CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END AS d,
                  sum(CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END) OVER (ORDER BY start, rowid) AS c
           FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind IN (2, 5))""").fetchone()
    assert tl["bytes_in_use"][-1] == final
    assert tl["bytes_in_use"].max() == peak
    total = sql.execute("SELECT totalMemory FROM TARGET_INFO_GPU WHERE id = 0").fetchone()[0]
    p = memory.memory_peaks(e, m, by=("phase",))
    # every event precedes the cut: the level inside the iterations is the final running total
    assert sql.execute("SELECT max(start) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone()[0] < m.windows["start"].min()
    assert set(p["peak_bytes"]) == {final}
    assert set(p["headroom_bytes"]) == {total - final}


def test_throughput_timeline_conserves_bytes_and_matches_a_bin(sql, em):
    _, m = em
    tl = throughput.throughput_timeline(m, bin_ns=1_000_000)
    rows = sql.execute('SELECT copyKind, bytes, start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind IN (1, 2)').fetchall()
    for ck, d in ((1, "H2D"), (2, "D2H")):
        t = tl.filter(pl.col("direction") == d)
        assert t["bytes"].sum() == pytest.approx(sum(r[1] for r in rows if r[0] == ck), rel=1e-9)
        top = t.sort("bytes", descending=True).row(0, named=True)
        want = 0.0
        for ck2, b, s, e in rows:
            if ck2 == ck:
                e = max(e, s + 1)
                want += b * max(0, min(e, top["bin_end"]) - max(s, top["bin_start"])) / (e - s)
        assert top["bytes"] == pytest.approx(want, rel=1e-9)
        assert top["gbps"] == pytest.approx(want / 1e6)
    assert tl.filter(pl.col("direction") == "D2H")["gbps"].max() > 40  # pinned gradient D2H


def test_pcie_update_stats_and_saturation_match_sql(sql, em):
    e, m = em
    s = pcie_metrics.pcie_series(e, m)
    st = pcie_metrics.pcie_phase_stats(e, m, by=("phase",), series=s)
    rx = sql.execute("SELECT metricId FROM TARGET_INFO_GPU_METRICS WHERE metricName LIKE 'PCIe RX Throughput%'").fetchone()[0]
    vals = []
    for a, b in ranges(sql, STEP):
        vals += [v for (v,) in sql.execute("SELECT value FROM GPU_METRICS WHERE metricId = ? AND timestamp >= ? "
                                           "AND timestamp < ?", (rx, a, b))]
    row = st.filter((pl.col("phase") == "update") & (pl.col("direction") == "H2D")).row(0, named=True)
    assert row["samples"] == len(vals)
    assert row["mean_pct"] == pytest.approx(sum(vals) / len(vals))
    assert row["peak_pct"] == max(vals)
    # saturation runs by a loop over the RX samples
    samples = sql.execute("SELECT timestamp, value FROM GPU_METRICS WHERE metricId = ? ORDER BY timestamp", (rx,)).fetchall()
    runs, total, prev_t, run_start = 0, 0, None, None
    for i, (t, v) in enumerate(samples):
        if v >= 80:
            if run_start is None:
                runs += 1
                run_start = prev_t if prev_t is not None else t
            last = t
        elif run_start is not None:
            total += last - run_start
            run_start = None
        prev_t = t
    if run_start is not None:
        total += last - run_start
    sat = pcie_metrics.pcie_saturation(e, m, 80.0, series=s).filter(pl.col("direction") == "H2D")
    assert (sat.height, sat["duration_ns"].sum()) == (runs, total)
    assert runs > 0


def test_gradient_round_trips_match_sql(sql, em):
    e, m = em
    bwd, fwd, step = ranges(sql, BWD), ranges(sql, FWD), ranges(sql, STEP)
    starts = sorted([(a, "b") for a, _ in bwd] + [(a, "f") for a, _ in fwd] + [(a, "s") for a, _ in step])
    nonb = []
    for a, b in bwd:
        nxt = [k for t, k in starts if t > a]
        if nxt and nxt[0] != "s":
            nonb.append((a, b))
    assert len(nonb) == 2
    rows = copies_launched_in(sql, nonb, "m.copyKind IN (1, 2)")
    s = opportunities.gradient_round_trip_summary(e, m).row(0, named=True)
    assert s["micro_steps"] == len(nonb)
    assert s["h2d_bytes"] == sum(r[3] for r in rows if r[0] == 1)
    assert s["d2h_bytes"] == sum(r[3] for r in rows if r[0] == 2)
    per = [sum(r[3] for r in copies_launched_in(sql, [rg], "m.copyKind = 2")) for rg in nonb]
    assert s["grad_bytes"] == max(per)
    assert s["fits"] is True


def test_update_idle_matches_loop(sql, em):
    e, m = em
    up = opportunities.update_opportunity(e, m)
    ops = sql.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, "end" FROM '
                      'CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMSET').fetchall()
    want = []
    for a, b in ranges(sql, STEP):
        busy = loop_union([(max(s, a), min(t, b)) for s, t in ops if t > a and s < b])
        want.append(b - a - busy)
    assert up["gpu_idle_ns"].to_list() == want
    assert all(0.6 < x < 0.8 for x in up["gpu_idle_share"])
    total = sql.execute("SELECT totalMemory FROM TARGET_INFO_GPU").fetchone()[0]
    assert (up["free_bytes"] <= total).all() and (up["state_params"] == up["free_bytes"] // 16).all()


def test_findings_name_the_problems_with_numbers(em):
    from tracekit.analyze.sections.transfers import analyze_transfers

    e, m = em
    f = analyze_transfers(e, m).findings
    topics = [x["topic"] for x in f]
    assert {"pageable", "update", "gradient-round-trip", "contention", "exposed-copies"} <= set(topics)
    pg = next(x for x in f if x["topic"] == "pageable")
    assert pg["phase"] == "update" and "pageable H2D" in pg["text"] and "GB/s" in pg["text"]
    assert pg["values"]["saving_ns"] > 50e6
    assert next(x for x in f if x["topic"] == "contention")["values"]["contention_ns"] == 0


def test_missing_tables_raise_with_the_nsys_option(tmp_path, em):
    import shutil

    p = tmp_path / "cut.sqlite"
    shutil.copy(ZERO3_CUT, p)
    con = sqlite3.connect(p)
    con.execute("DROP TABLE CUDA_GPU_MEMORY_USAGE_EVENTS")
    con.execute("DELETE FROM GPU_METRICS")
    con.commit()
    con.close()
    e = Export.open(p)
    m = phases.build(e)
    with pytest.raises(MissingDataError, match="--cuda-memory-usage=true"):
        memory.memory_timeline(e, m)
    with pytest.raises(MissingDataError, match="--gpu-metrics-devices=all"):
        pcie_metrics.pcie_series(e, m)
    # opportunities still run, with unknown memory
    up = opportunities.update_opportunity(e, m)
    assert up["free_bytes"].null_count() == up.height


# --------------------------------------------------------------------------- synthetic
def synthetic_model() -> PhaseModel:
    """One backward window [0, 1000) of pid 1 << 24 on device 0 with hand-placed copies:

    H2D A [0,200) 1000 B and B [100,300) 1000 B (same-direction window [100,200)); D2H C
    [250,350) 800 B (bidirectional window [250,300)); uncontended H2D D [400,500) 1000 B
    (10 GB/s) and D2H E [600,700) 800 B (8 GB/s); kernel K [150,260).
    """
    g = 1 << 24
    rows = [  # kind, start, end, direction, bytes, src, dst, sub_phase
        ("memcpy", 0, 200, "H2D", 1000, "pinned", "device", "sa"),
        ("memcpy", 100, 300, "H2D", 1000, "pinned", "device", "sb"),
        ("memcpy", 250, 350, "D2H", 800, "device", "pinned", "sc"),
        ("memcpy", 400, 500, "H2D", 1000, "pinned", "device", None),
        ("memcpy", 600, 700, "D2H", 800, "device", "pinned", None),
        ("kernel", 150, 260, None, 0, None, None, None),
    ]
    ops = pl.DataFrame(rows, schema={"kind": pl.String, "start": pl.Int64, "end": pl.Int64, "direction": pl.String,
                                     "bytes": pl.Int64, "src_kind": pl.String, "dst_kind": pl.String,
                                     "sub_phase": pl.String}, orient="row")
    ops = ops.with_columns(
        global_pid=pl.lit(g, pl.Int64), device=pl.lit(0, pl.Int64), stream=pl.lit(7, pl.Int64),
        correlation_id=pl.int_range(pl.len()).cast(pl.Int64), name_id=pl.lit(None, pl.Int64),
        launch=pl.col("start"), api_end=pl.col("start") + 5, api_name_id=pl.lit(None, pl.Int64),
        launch_tid=pl.lit(g + 1, pl.Int64), window_id=pl.lit(0, pl.Int64), iteration=pl.lit(0, pl.Int64),
        phase=pl.lit("backward"), micro_step=pl.lit(0, pl.Int64), boundary=pl.lit(False), inferred=pl.lit(False),
    )
    windows = pl.DataFrame({"window_id": [0], "global_pid": [g], "iteration": [0], "phase": ["backward"],
                            "micro_step": [0], "boundary": [False], "inferred": [False], "complete": [True],
                            "start": [0], "end": [1000], "range_index": [None]},
                           schema_overrides={"range_index": pl.Int64})
    return PhaseModel(windows=windows, ops=ops, ranges=pl.DataFrame(), source={g: "test"}, anomalies={})


def test_contention_windows_by_hand():
    m = synthetic_model()
    base = {(r["direction"], r["host_kind"]): r for r in contention.uncontended_bandwidth(m).iter_rows(named=True)}
    assert base[("H2D", "pinned")]["copies"] == 1 and base[("H2D", "pinned")]["median_gbps"] == 10.0
    assert base[("D2H", "pinned")]["median_gbps"] == 8.0
    w = contention.contention_windows(m)
    assert w.height == 2
    same = w.filter(pl.col("kind") == "same-direction").row(0, named=True)
    assert (same["direction"], same["start"], same["end"]) == ("H2D", 100, 200)
    assert same["h2d_bytes"] == pytest.approx(1000.0) and same["d2h_bytes"] == pytest.approx(0.0)
    assert same["gbps"] == pytest.approx(10.0)  # 1000 B in 100 ns
    assert same["copy_ns"] == pytest.approx(200.0) and same["slowdown"] == pytest.approx(2.0)
    assert same["sub_phase"] == "sb"
    bi = w.filter(pl.col("kind") == "bidirectional").row(0, named=True)
    assert (bi["direction"], bi["start"], bi["end"]) == ("both", 250, 300)
    assert bi["h2d_bytes"] == pytest.approx(250.0) and bi["d2h_bytes"] == pytest.approx(400.0)
    assert bi["slowdown"] == pytest.approx(100 / 75) and bi["sub_phase"] == "sc"
    s = contention.contention_summary(m, by=("phase",), windows=w).row(0, named=True)
    assert (s["copy_busy_ns"], s["windows"], s["contention_ns"]) == (550, 2, 150)
    assert (s["same_direction_ns"], s["bidirectional_ns"]) == (100, 50)
    assert s["contention_share"] == pytest.approx(150 / 550)


def test_overlap_by_hand():
    o = overlap.overlap(synthetic_model(), by=("phase",)).row(0, named=True)
    assert (o["h2d_busy_ns"], o["h2d_overlap_ns"], o["h2d_exposed_ns"]) == (400, 110, 290)
    assert (o["d2h_busy_ns"], o["d2h_overlap_ns"]) == (200, 10)
    assert o["bidir_ns"] == 50 and o["h2d_overlap_ratio"] == pytest.approx(110 / 400)
    assert (o["copy_busy_ns"], o["copy_overlap_ns"]) == (550, 110)


def test_findings_report_contention_by_hand():
    m = synthetic_model()
    frames = {"contention_phase": contention.contention_summary(m, by=("phase",))}
    f = findings.build_findings(frames, {(1 << 24, 0): {"backward": 1}})
    (c,) = [x for x in f if x["topic"] == "contention"]
    assert "2 PCIe contention windows" in c["text"] and "27%" in c["text"]


def test_overlap_by_sub_phase_matches_sql(sql, em):
    _, m = em
    o = overlap.overlap(m, by=("phase", "sub_phase")).filter(pl.col("phase") == "backward")
    # every backward host copy is launched inside DeepSpeed's partition_grads range (checked by SQL)
    pg = ranges(sql, "DeepSpeedZeroOptimizer_Stage3.partition_grads")
    rows = copies_launched_in(sql, pg, "m.copyKind IN (1, 2)")
    r = o.filter(pl.col("sub_phase") == "DeepSpeedZeroOptimizer_Stage3.partition_grads").row(0, named=True)
    assert r["h2d_bytes"] == sum(x[3] for x in rows if x[0] == 1)
    assert r["d2h_busy_ns"] == loop_union([(x[4], x[5]) for x in rows if x[0] == 2])


def test_uncontended_bandwidth_and_no_windows_match_sql(sql, em):
    import statistics

    _, m = em
    pairs = sql.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY a JOIN CUPTI_ACTIVITY_KIND_MEMCPY b
                           ON a.rowid < b.rowid AND a.start < b."end" AND b.start < a."end"
                           WHERE a.copyKind IN (1, 2) AND b.copyKind IN (1, 2)""").fetchone()[0]
    assert pairs == 0 and contention.contention_windows(m).height == 0
    # no copy overlaps another, so every copy is uncontended: median GB/s per direction and kind by SQL rows
    rows = sql.execute('SELECT copyKind, srcKind, dstKind, bytes, "end" - start FROM CUPTI_ACTIVITY_KIND_MEMCPY '
                       'WHERE copyKind IN (1, 2) AND "end" > start').fetchall()
    want = defaultdict(list)
    for ck, sk, dk, b, d in rows:
        want[("H2D" if ck == 1 else "D2H", {0: "pageable", 1: "pinned"}[sk if ck == 1 else dk])].append(b / d)
    got = {(r["direction"], r["host_kind"]): r for r in contention.uncontended_bandwidth(m).iter_rows(named=True)}
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k]["copies"] == len(v)
        assert got[k]["median_gbps"] == pytest.approx(statistics.median(v), rel=1e-12)


def test_pcie_copy_bytes_in_update_match_loop(sql, em):
    e, m = em
    st = pcie_metrics.pcie_phase_stats(e, m, by=("phase",))
    rows = sql.execute('SELECT bytes, start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1').fetchall()
    want, wall = 0.0, 0
    for a, b in ranges(sql, STEP):
        wall += b - a
        for n, s, t in rows:
            t = max(t, s + 1)
            want += n * max(0, min(t, b) - max(s, a)) / (t - s)
    r = st.filter((pl.col("phase") == "update") & (pl.col("direction") == "H2D")).row(0, named=True)
    assert r["wall_ns"] == wall
    assert r["copy_bytes"] == pytest.approx(want, rel=1e-9)
    assert r["copy_gbps"] == pytest.approx(want / wall)


def test_pcie_baseline_matches_sql(sql, em):
    import statistics

    e, m = em
    st = pcie_metrics.pcie_phase_stats(e, m, by=("phase",))
    for name, kind, d in (("PCIe TX Throughput%", 2, "D2H"), ("PCIe RX Throughput%", 1, "H2D")):
        mid = sql.execute("SELECT metricId FROM TARGET_INFO_GPU_METRICS WHERE metricName LIKE ?", (name,)).fetchone()[0]
        vals = [v for (v,) in sql.execute(
            """WITH s AS (SELECT timestamp AS t, value,
                                 LAG(timestamp) OVER (ORDER BY timestamp) AS p FROM GPU_METRICS WHERE metricId = ?)
               SELECT value FROM s WHERE p IS NOT NULL AND NOT EXISTS (
                 SELECT 1 FROM CUPTI_ACTIVITY_KIND_MEMCPY c WHERE c.copyKind = ? AND c.start < s.t AND c."end" > s.p)""",
            (mid, kind))]
        got = st.filter(pl.col("direction") == d)["baseline_pct"].unique().to_list()
        assert got == [statistics.median(vals)]
    bwd = st.filter(pl.col("phase") == "backward")
    assert all(45 < v < 65 for v in bwd["implied_peak_gbps"])  # copies explain the link traffic


def test_memory_peaks_by_any_grouping_match_a_loop_over_events():
    """memory_peaks by phase, by iteration and phase, and per window (issue 13: the per-window
    levels computed once and kept on the model, each grouping a max/min over them) against a
    loop over the events read with sqlite3: per window, the running total at its start and
    after each event inside it; per group, the max (peak) and min (low) of those."""
    from conftest import FIXTURES

    path = FIXTURES / "zero3_offload_gas2_cut.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    kinds = dict(con.execute("SELECT id, name FROM ENUM_CUDA_MEM_KIND"))
    ev = con.execute("""SELECT start, globalPid, deviceId, CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END,
                               memKind FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memoryOperationType IN (0, 1)
                        ORDER BY start, rowid""").fetchall()
    total = dict(con.execute("SELECT id, totalMemory FROM TARGET_INFO_GPU"))
    con.close()
    level, after = defaultdict(int), defaultdict(list)  # (pid, dev) -> [(t, level after the event)]
    for t, gp, dev, d, k in ev:
        label = kinds[k].removeprefix("CUDA_MEMOPR_MEMORY_KIND_").lower() if k in kinds else "unknown"
        if label not in memory.DEVICE_KINDS:
            continue
        level[(gp, dev)] += d
        after[(gp, dev)].append((t, level[(gp, dev)]))
    e = Export.open(path)
    m = phases.build(e)
    assert len(after) == 1
    (rank, lv), = after.items()
    win = m.windows.filter(pl.col("global_pid") == rank[0]).to_dicts()
    per = []
    for w in win:
        at_start = [v for t, v in lv if t <= w["start"]]
        inside = [v for t, v in lv if w["start"] < t < w["end"]]
        vals = [at_start[-1] if at_start else 0, *inside]
        per.append((w, max(vals), min(vals)))
    assert any(w["start"] < t < w["end"] for w in win for t, _ in lv)  # events inside windows: not constant
    for by in (("phase",), ("iteration", "phase"), ("iteration", "phase", "micro_step")):
        got = memory.memory_peaks(e, m, by=by)
        want = defaultdict(list)
        for w, hi, lo in per:
            want[tuple(w[b] for b in by)].append((hi, lo))
        assert got.height == len(want)
        for r in got.iter_rows(named=True):
            vals = want[tuple(r[b] for b in by)]
            assert (r["peak_bytes"], r["min_bytes"]) == (max(v[0] for v in vals), min(v[1] for v in vals))
            assert r["headroom_bytes"] == total[rank[1]] - r["peak_bytes"]


def test_kernel_union_rank_rows_and_kernel_dtypes_match_sql(sql, em):
    """The helpers that spare the sections a copy of the kernels' rows (issue 24) against plain
    SQL: the union of every kernel of the rank (from the kept compute and communication unions),
    the rows of one rank among two, and the 16-bit kernel counts (counted per name first)."""
    import re

    from tracekit.analyze.sections.transfer_common import all_kernel_union, rank_rows
    from tracekit.analyze.sections.whatif_pieces import DTYPE_PATTERNS, _kernel_dtypes

    e, m = em
    ranks = sql.execute("SELECT DISTINCT globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    assert ranks
    for gp, dev in ranks:
        rows = sql.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE globalPid = ? AND deviceId = ?',
                           (gp, dev)).fetchall()
        s, t = all_kernel_union(m, gp, dev)
        got = [[int(a), int(b)] for a, b in zip(s, t) if b > a]
        assert got == loop_union_list(rows) and len(got) > 100
        names = dict(sql.execute("SELECT id, value FROM StringIds").fetchall())
        want = {"kernels": 0, **dict.fromkeys(DTYPE_PATTERNS, 0)}
        for (nid,) in sql.execute("SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE globalPid = ? "
                                  "AND deviceId = ?", (gp, dev)):
            want["kernels"] += 1
            for label, pat in DTYPE_PATTERNS.items():
                want[label] += bool(re.search(pat, names.get(nid) or ""))
        assert _kernel_dtypes(e, rank_rows(m.ops, gp, dev)) == {dev: want}
        assert want["kernels"] == len(rows)
    # two ranks: the rows of each, only the columns asked for, in their order
    gp, dev = ranks[0]
    two = pl.concat([m.ops.select("global_pid", "device", "start", "end"),
                     m.ops.select("global_pid", device=pl.lit(dev + 1, pl.Int64), start="start", end="end")])
    one = rank_rows(two, gp, dev + 1, "start", "end")
    assert one.columns == ["start", "end"] and one.rows() == m.ops.select("start", "end").rows()
    assert rank_rows(m.ops, gp, dev) is not None and rank_rows(m.ops, gp, dev).height == m.ops.height
    assert rank_rows(m.ops, gp, dev + 7).height == 0


def test_ops_enum_columns_hold_the_sql_labels_and_leave_as_strings(sql, em):
    """``model.ops`` holds kind, direction, src/dst kind and collective as Enums in lexical order
    (issue 24): per row the same labels as the SQL tables give, sorted as strings sort, and every
    frame that leaves the model (host copies, communication kernels, the API's frames) carries
    strings."""
    from tracekit.analyze.model.gpu_ops import ENUM_COLUMNS, with_strings
    from tracekit.analyze.sections.transfer_common import host_copies, model_kernel_frames

    e, m = em
    for c in ENUM_COLUMNS:
        dt = m.ops.schema[c]
        assert isinstance(dt, pl.Enum) and list(dt.categories) == sorted(dt.categories)
    labels = {1: "H2D", 2: "D2H", 8: "D2D"}  # (CUDA's copyKind: the ones this fixture has)
    want = defaultdict(int)
    for kind, table in (("kernel", "KERNEL"), ("memcpy", "MEMCPY"), ("memset", "MEMSET")):
        cols = "copyKind" if kind == "memcpy" else "NULL"
        for (ck,) in sql.execute(f"SELECT {cols} FROM CUPTI_ACTIVITY_KIND_{table}"):
            want[(kind, labels[ck] if ck is not None else None)] += 1
    got = defaultdict(int)
    for k, d in m.ops.select("kind", "direction").iter_rows():  # (Enums give Python strings)
        got[(k, d)] += 1
    assert dict(got) == dict(want) and want[("memcpy", "H2D")] > 0
    strs = with_strings(m.ops.select("kind", "direction", "start"))
    assert strs.schema["kind"] == pl.String and strs.schema["direction"] == pl.String
    assert m.ops.sort("direction", "kind", "start").select("direction", "kind").rows() == \
        strs.sort("direction", "kind", "start").select("direction", "kind").rows()
    hc = host_copies(m)
    assert all(hc.schema[c] == pl.String for c in ("kind", "direction", "src_kind", "dst_kind", "host_kind"))
    assert all(model_kernel_frames(m)[1].schema[c] == pl.String for c in ("kind", "collective"))
