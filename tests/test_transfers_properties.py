"""Contention, overlap and the throughput timeline on random synthetic models, against an
integer-grid brute force (hypothesis)."""

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections import contention, overlap, throughput

T = 60
G = 1 << 24


def model_of(ops_rows) -> PhaseModel:
    """ops_rows: (kind, direction, start, end, bytes, host_kind, window 0|1). Windows [0,30), [30,T+1)."""
    ops = pl.DataFrame(ops_rows, schema={"kind": pl.String, "direction": pl.String, "start": pl.Int64,
                                         "end": pl.Int64, "bytes": pl.Int64, "host": pl.String,
                                         "window_id": pl.Int64}, orient="row")
    ops = ops.with_columns(
        src_kind=pl.when(pl.col("direction") == "H2D").then(pl.col("host")).otherwise(pl.lit("device")),
        dst_kind=pl.when(pl.col("direction") == "D2H").then(pl.col("host")).otherwise(pl.lit("device")),
        global_pid=pl.lit(G, pl.Int64), device=pl.lit(0, pl.Int64), stream=pl.lit(1, pl.Int64),
        correlation_id=pl.int_range(pl.len()).cast(pl.Int64), name_id=pl.lit(None, pl.Int64),
        launch=pl.col("start"), api_end=pl.col("start"), api_name_id=pl.lit(None, pl.Int64),
        launch_tid=pl.lit(None, pl.Int64), iteration=pl.lit(0, pl.Int64),
        phase=pl.when(pl.col("window_id") == 0).then(pl.lit("forward")).otherwise(pl.lit("backward")),
        micro_step=pl.lit(0, pl.Int64), boundary=pl.lit(False), inferred=pl.lit(False),
        sub_phase=pl.lit(None, pl.String),
    ).drop("host")
    windows = pl.DataFrame({"window_id": [0, 1], "global_pid": [G, G], "iteration": [0, 0],
                            "phase": ["forward", "backward"], "micro_step": [0, 0], "boundary": [False, False],
                            "inferred": [False, False], "complete": [True, True], "start": [0, 30],
                            "end": [30, T + 1], "range_index": [None, None]},
                           schema_overrides={"range_index": pl.Int64})
    return PhaseModel(windows=windows, ops=ops, ranges=pl.DataFrame(), source={G: "test"}, anomalies={})


@st.composite
def ops(draw):
    n = draw(st.integers(1, 9))
    rows = []
    for _ in range(n):
        s = draw(st.integers(0, T - 1))
        e = draw(st.integers(s + 1, T))
        kind = draw(st.sampled_from(["memcpy", "memcpy", "kernel"]))
        d = draw(st.sampled_from(["H2D", "D2H"])) if kind == "memcpy" else None
        b = draw(st.integers(1, 50)) * (e - s) if kind == "memcpy" else 0  # whole bytes per ns
        host = draw(st.sampled_from(["pinned", "pageable"])) if kind == "memcpy" else None
        rows.append((kind, d, s, e, b, host, 0 if s < 30 else 1))
    return rows


def depth(rows, pred):
    g = np.zeros(T + 1, dtype=np.int64)
    for r in rows:
        if pred(r):
            g[r[2]:r[3]] += 1
    return g


def runs(mask):
    """Maximal runs of True cells as (start, end)."""
    out, start = [], None
    for t, v in enumerate(list(mask) + [False]):
        if v and start is None:
            start = t
        if not v and start is not None:
            out.append((start, t))
            start = None
    return out


@settings(max_examples=150, deadline=None)
@given(ops())
def test_contention_windows_match_grid(rows):
    m = model_of(rows)
    w = contention.contention_windows(m)
    h = depth(rows, lambda r: r[1] == "H2D")
    d = depth(rows, lambda r: r[1] == "D2H")
    want = {("same-direction", "H2D"): runs(h >= 2), ("same-direction", "D2H"): runs(d >= 2),
            ("bidirectional", "both"): runs((h >= 1) & (d >= 1))}
    for (kind, dirn), expected in want.items():
        got = w.filter((pl.col("kind") == kind) & (pl.col("direction") == dirn)).sort("start")
        assert list(zip(got["start"], got["end"])) == expected
        for r in got.iter_rows(named=True):  # bytes per direction: each copy's bytes per ns in the window
            for dd in ("H2D", "D2H"):
                want_b = sum(x[4] / (x[3] - x[2]) * max(0, min(x[3], r["end"]) - max(x[2], r["start"]))
                             for x in rows if x[1] == dd)
                assert r[f"{dd.lower()}_bytes"] == pytest.approx(want_b, abs=1e-6)
            in_flight = sum(max(0, min(x[3], r["end"]) - max(x[2], r["start"])) for x in rows if x[0] == "memcpy")
            assert r["copy_ns"] == pytest.approx(in_flight)


@settings(max_examples=150, deadline=None)
@given(ops())
def test_overlap_matches_grid(rows):
    o = overlap.overlap(model_of(rows), by=("phase",))
    k = depth(rows, lambda r: r[0] == "kernel") > 0
    for r in o.iter_rows(named=True):
        mine = [x for x in rows if (x[6] == 0) == (r["phase"] == "forward")]
        h = depth(mine, lambda x: x[1] == "H2D") > 0
        d = depth(mine, lambda x: x[1] == "D2H") > 0
        assert (r["h2d_busy_ns"], r["h2d_overlap_ns"]) == (h.sum(), (h & k).sum())
        assert (r["d2h_busy_ns"], r["d2h_overlap_ns"]) == (d.sum(), (d & k).sum())
        assert r["bidir_ns"] == (h & d).sum()
        assert r["copy_exposed_ns"] == ((h | d) & ~k).sum()


@settings(max_examples=100, deadline=None)
@given(ops(), st.integers(1, 17))
def test_throughput_bins_match_grid(rows, bin_ns):
    tl = throughput.throughput_timeline(model_of(rows), bin_ns=bin_ns)
    for dd in ("H2D", "D2H"):
        per_ns = np.zeros(T + 1)
        for x in rows:
            if x[1] == dd:
                per_ns[x[2]:x[3]] += x[4] / (x[3] - x[2])
        t = tl.filter(pl.col("direction") == dd)
        for r in t.iter_rows(named=True):
            want = per_ns[max(r["bin_start"], 0):max(r["bin_end"], 0)].sum()
            assert r["bytes"] == pytest.approx(want, abs=1e-6)
        assert t["bytes"].sum() == pytest.approx(per_ns.sum(), abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(ops(), st.integers(1, 17), st.integers(1, 9))
def test_timeline_chunks_and_peaks_match_grid(rows, bin_ns, chunk):
    """The chunked Timeline (issue 13): its chunks of ``chunk`` bins, laid end to end, are the
    bins of the per-ns grid (brute force), in rank, direction, bin order; its peaks are the
    per-phase maxima and counts of those bins."""
    tl = throughput.Timeline(model_of(rows), bin_ns=bin_ns)
    parts = list(tl.chunks(rows=chunk))
    assert all(p.height <= chunk for p in parts)
    got = pl.concat(parts) if parts else tl.empty()
    assert got.height == tl.height
    want_peaks: dict = {}
    for dd in ("D2H", "H2D"):  # the frame's order: directions sorted
        per_ns = np.zeros(T + 1)
        for x in rows:
            if x[1] == dd:
                per_ns[x[2]:x[3]] += x[4] / (x[3] - x[2])
        t = got.filter(pl.col("direction") == dd)
        starts = t["bin_start"].to_list()
        assert starts == sorted(starts) and all(b - a == bin_ns for a, b in zip(starts, starts[1:]))
        for r in t.iter_rows(named=True):
            want = per_ns[max(r["bin_start"], 0):max(r["bin_end"], 0)].sum()
            assert r["bytes"] == pytest.approx(want, abs=1e-6)
            k = (r["phase"], dd)
            n, peak = want_peaks.get(k, (0, 0.0))
            want_peaks[k] = (n + 1, max(peak, want / bin_ns))
    pk = tl.peaks()
    assert {(r["phase"], r["direction"]): r["bins"] for r in pk.iter_rows(named=True)} == \
        {k: n for k, (n, _) in want_peaks.items()}
    for r in pk.iter_rows(named=True):
        assert r["bin_ns"] == bin_ns
        assert r["peak_gbps"] == pytest.approx(want_peaks[(r["phase"], r["direction"])][1], abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(ops())
def test_overlap_levels_match_grid(rows):
    """overlap_levels (issue 13: the unions once, summed upward where the finer groups' copies
    are disjoint, else computed directly) against the per-ns grid, for each grouping: per window
    (= per phase here), per phase, whole rank. Copies of the forward window running on past
    t=30 overlap backward copies, so the whole-rank row takes the direct path in some examples."""
    levels = {"window": ("iteration", "phase", "micro_step"), "phase": ("phase",), "total": ()}
    got = overlap.overlap_levels(model_of(rows), levels)
    assert list(got) == list(levels)
    k = depth(rows, lambda r: r[0] == "kernel") > 0
    for name, f in got.items():
        for r in f.iter_rows(named=True):
            mine = [x for x in rows if name == "total" or (x[6] == 0) == (r["phase"] == "forward")]
            h = depth(mine, lambda x: x[1] == "H2D") > 0
            d = depth(mine, lambda x: x[1] == "D2H") > 0
            assert (r["h2d_busy_ns"], r["h2d_overlap_ns"]) == (h.sum(), (h & k).sum())
            assert (r["d2h_busy_ns"], r["d2h_overlap_ns"]) == (d.sum(), (d & k).sum())
            assert r["bidir_ns"] == (h & d).sum()
            assert r["copy_exposed_ns"] == ((h | d) & ~k).sum()
            assert r["h2d_count"] == sum(1 for x in mine if x[1] == "H2D")
            assert r["d2h_bytes"] == sum(x[4] for x in mine if x[1] == "D2H")
        windows = {x[6] for x in rows if x[0] == "memcpy"}
        assert f.height == (min(1, len(windows)) if name == "total" else len(windows))


@settings(max_examples=150, deadline=None)
@given(ops(), st.integers(0, 3))
def test_overlap_comm_cover_matches_grid(rows, salt):
    """Compute and communication kernels apart (issue 13: the three copy sets' unions and both
    covers measured in one pass): per phase, each set's busy time, its part under compute
    kernels and its part under communication kernels, against the per-ns grid. A kernel is a
    communication kernel when (start + salt) is odd."""
    m = model_of(rows)
    m.ops = m.ops.with_columns(comm=(pl.col("kind") == "kernel") & ((pl.col("start") + salt) % 2 == 1))
    o = overlap.overlap(m, by=("phase",))
    is_comm = [r[0] == "kernel" and (r[2] + salt) % 2 == 1 for r in rows]
    k = depth([r for r, c in zip(rows, is_comm) if not c], lambda r: r[0] == "kernel") > 0
    kc = depth([r for r, c in zip(rows, is_comm) if c], lambda r: r[0] == "kernel") > 0
    for r in o.iter_rows(named=True):
        mine = [x for x in rows if (x[6] == 0) == (r["phase"] == "forward")]
        sets = {"h2d": depth(mine, lambda x: x[1] == "H2D") > 0, "d2h": depth(mine, lambda x: x[1] == "D2H") > 0}
        sets["copy"] = sets["h2d"] | sets["d2h"]
        for d, g in sets.items():
            assert (r[f"{d}_busy_ns"], r[f"{d}_overlap_ns"], r[f"{d}_comm_overlap_ns"]) == (
                g.sum(), (g & k).sum(), (g & kc).sum()), d
        assert r["bidir_ns"] == (sets["h2d"] & sets["d2h"]).sum()
