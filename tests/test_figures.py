"""Every figure renders on the real ZeRO-3 fixture, and what it plots equals numbers computed
independently with plain SQL on the fixture (or, for plot fidelity, the bars drawn equal the
frame returned). No pixels are compared."""

from __future__ import annotations

import sqlite3

import numpy as np
import polars as pl
import pytest
from conftest import union_length_loop as union_len

from tracekit.render import data as D
from tracekit.render import figures as F
from tracekit.render import style as S
from tracekit.render.data import ReportData

COPY_KIND = {1: "H2D", 2: "D2H"}


@pytest.fixture(scope="module")
def data(zero3_report_data):
    return zero3_report_data  # conftest: loaded once per session


@pytest.fixture(scope="module")
def sql():
    from conftest import ZERO3_CUT

    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    yield con
    con.close()


# ------------------------------------------------------------------ independent SQL helpers
def ds_ranges(sql) -> list[tuple[str, int, int]]:
    """DeepSpeed phase ranges (phase, start, end) in time order, straight from NVTX_EVENTS."""
    rows = sql.execute(
        """SELECT coalesce(e.text, s.value) AS name, e.start, e."end" FROM NVTX_EVENTS e
           LEFT JOIN StringIds s ON s.id = e.textId
           WHERE e.eventType = 59 AND coalesce(e.text, s.value) IN
             ('DeepSpeedEngine.forward', 'DeepSpeedEngine.backward', 'DeepSpeedZeroOptimizer_Stage3.step')
           ORDER BY e.start"""
    ).fetchall()
    names = {"DeepSpeedEngine.forward": "forward", "DeepSpeedEngine.backward": "backward",
             "DeepSpeedZeroOptimizer_Stage3.step": "update"}
    return [(names[n], s, e) for n, s, e in rows]


def iterations_from_sql(sql, first: int = 1) -> dict[int, list[tuple[str, int, int]]]:
    """Group the ranges into iterations: each ends with an update (the fixture starts at iteration 1)."""
    out: dict[int, list] = {}
    it = first
    for r in ds_ranges(sql):
        out.setdefault(it, []).append(r)
        if r[0] == "update":
            it += 1
    return out


def copies(sql, launch_in: tuple[int, int] | None = None) -> list[tuple]:
    """(direction, start, end, bytes, host_kind) of H2D/D2H memcpys; with ``launch_in``, only
    those whose launching runtime call starts in [lo, hi)."""
    q = """SELECT m.copyKind, m.start, m."end", m.bytes, m.srcKind, m.dstKind, r.start FROM CUPTI_ACTIVITY_KIND_MEMCPY m
           LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
           WHERE m.copyKind IN (1, 2)"""
    out = []
    kinds = {0: "pageable", 1: "pinned"}
    for kind, s, e, b, src, dst, launch in sql.execute(q):
        launch = s if launch is None else launch
        if launch_in and not (launch_in[0] <= launch < launch_in[1]):
            continue
        d = COPY_KIND[kind]
        out.append((d, s, e, b, kinds.get(src if d == "H2D" else dst, "other")))
    return out


def gids(fig) -> dict[str, object]:
    """Every artist with a gid in the figure."""
    out = {}
    for ax in fig.axes:
        for p in ax.patches:
            if p.get_gid():
                out[p.get_gid()] = p
    return out


# ------------------------------------------------------------------ figure 1
def test_iteration_breakdown_equals_nvtx_ranges(data, sql):
    fig, frame = F.iteration_breakdown(data)
    its = iterations_from_sql(sql)
    assert sorted(frame["iteration"].unique().to_list()) == sorted(its)
    for it, ranges in its.items():
        f = frame.filter(pl.col("iteration") == it)
        # each forward/backward micro-step and the update: wall = NVTX range length
        for k, phase in enumerate(["forward", "backward"]):
            got = f.filter(pl.col("phase") == phase).sort("micro_step")["wall_ns"].to_list()
            want = [e - s for p, s, e in ranges if p == phase]
            assert got == want
        assert f.filter(pl.col("phase") == "update")["wall_ns"].to_list() == [e - s for p, s, e in ranges if p == "update"]
        # the stack is the whole iteration: from the previous update's end (the data-loading gap
        # belongs to the next iteration; the first one starts at its forward) to its update's end
        start = its[it - 1][-1][2] if it - 1 in its else ranges[0][1]
        assert f["wall_ns"].sum() == ranges[-1][2] - start
        # boundary = the last backward
        b = f.filter(pl.col("boundary"))
        assert b["phase"].to_list() == ["backward"] and b["micro_step"][0] == 1
    S.close(fig)


def test_iteration_breakdown_gpu_busy_is_union_of_gpu_ops(data, sql):
    """GPU busy in the update = union of all kernels/copies/memsets of the GPU inside the step range."""
    fig, frame = F.iteration_breakdown(data)
    ops = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        ops += sql.execute(f'SELECT start, "end" FROM {table}').fetchall()
    for it, ranges in iterations_from_sql(sql).items():
        _, us, ue = ranges[-1]
        clipped = [(max(s, us), min(e, ue)) for s, e in ops if e > us and s < ue]
        want = union_len(clipped)
        got = frame.filter((pl.col("iteration") == it) & (pl.col("phase") == "update"))["gpu_busy_ns"][0]
        assert got == want
    S.close(fig)


def test_iteration_breakdown_bars_equal_frame(data):
    fig, frame = F.iteration_breakdown(data)
    div, unit = S.time_unit(frame.group_by("iteration").agg(pl.col("wall_ns").sum())["wall_ns"].max())
    assert unit == "ms"  # ~0.65 s iterations
    g = gids(fig)
    for r in frame.iter_rows(named=True):
        wall = g[f"wall:{r['iteration']}:{r['label']}"]
        busy = g[f"busy:{r['iteration']}:{r['label']}"]
        assert wall.get_height() == pytest.approx(r["wall_ns"] / div)
        assert wall.get_y() == pytest.approx(r["bottom_ns"] / div)
        assert busy.get_height() == pytest.approx(r["gpu_busy_ns"] / div)
    assert fig.axes[0].get_ylabel() == "wall time (ms)"
    S.close(fig)


# ------------------------------------------------------------------ figure 2
def test_iteration_timeline_series_equal_sql(data, sql):
    fig, frame = F.iteration_timeline(data, iteration=2)
    bands = frame.filter(pl.col("series") == "phase")
    t0, t1 = bands["t_ns"].min(), bands["t_end_ns"].max()
    its = iterations_from_sql(sql)
    # iteration 2 spans from the end of iteration 1's update to the end of its own update
    assert (t0, t1) == (its[1][-1][2], its[2][-1][2])
    # copies: each H2D/D2H memcpy overlapping the iteration is one interval, at bytes / duration
    for d in ("H2D", "D2H"):
        f = frame.filter(pl.col("series") == d)
        want = sorted((s, e, b) for dd, s, e, b, _k in copies(sql) if dd == d and e > t0 and s < t1)
        assert sorted(f.select("t_ns", "t_end_ns", "bytes").rows()) == want
        assert f["value"].to_list() == pytest.approx([b / max(e - s, 1) for s, e, b in
                                                      f.select("t_ns", "t_end_ns", "bytes").rows()])
    # drawn: one collection per direction and host kind, one rectangle per copy, height = GB/s
    colls = {c.get_gid(): c for a in fig.axes for c in a.collections if (c.get_gid() or "").startswith("copies:")}
    for d in ("H2D", "D2H"):
        n = sum(1 for dd, s, e, _b, _k in copies(sql) if dd == d and e > t0 and s < t1)
        assert sum(len(c.get_paths()) for g, c in colls.items() if g.startswith(f"copies:{d}:")) == n
    pageable = frame.filter((pl.col("series") == "H2D") & (pl.col("label") == "pageable")).sort("t_ns")
    heights = [p.vertices[:, 1].max() for p in colls["copies:H2D:pageable"].get_paths()]
    assert heights == pytest.approx(pageable["value"].to_list())
    bin_ns = int((frame.filter(pl.col("series") == "pcie_RX")["t_end_ns"]
                  - frame.filter(pl.col("series") == "pcie_RX")["t_ns"])[0])
    # memory: the level at the iteration start = allocations - deallocations of device memory before it
    mem = frame.filter(pl.col("series") == "memory").sort("t_ns")
    (level,) = sql.execute(
        """SELECT sum(CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END) FROM CUDA_GPU_MEMORY_USAGE_EVENTS
           WHERE memKind IN (2, 4, 5) AND start <= ?""", (t0,)).fetchone()
    assert mem["value"][0] == level
    # PCIe RX: bin means of the raw GPU_METRICS samples
    rx_id = sql.execute("SELECT metricId FROM TARGET_INFO_GPU_METRICS WHERE metricName LIKE 'PCIe RX%'").fetchone()[0]
    raw = np.array(sql.execute("SELECT timestamp, value FROM GPU_METRICS WHERE metricId = ? AND timestamp >= ? "
                               "AND timestamp < ?", (rx_id, t0, t1)).fetchall())
    rx = frame.filter(pl.col("series") == "pcie_RX").sort("t_ns")
    keys = t0 + (raw[:, 0] - t0) // bin_ns * bin_ns
    want = {k: raw[keys == k, 1].mean() for k in np.unique(keys)}
    assert dict(zip(rx["t_ns"].to_list(), rx["value"].to_list())) == pytest.approx(want)
    # sub-phase bands lie inside the update window and tile it
    upd = bands.filter(pl.col("phase") == "update")
    sub = frame.filter(pl.col("series") == "sub_phase")
    assert sub["t_ns"].min() >= upd["t_ns"][0] and sub["t_end_ns"].max() <= upd["t_end_ns"][0]
    assert int((sub["t_end_ns"] - sub["t_ns"]).sum()) == int(upd["t_end_ns"][0] - upd["t_ns"][0])
    S.close(fig)


def test_iteration_timeline_default_is_median(data):
    rk = data.rank(0)
    spans = data.iteration_spans(rk).sort("wall_ns")
    assert data.pick_iteration(rk) == spans["iteration"][(spans.height - 1) // 2]


# ------------------------------------------------------------------ figure 3
def _bucket(nbytes: int) -> int:
    return nbytes.bit_length() - 1


@pytest.mark.parametrize("iterations_only", [False, True])
def test_copy_sizes_equal_sql(data, sql, iterations_only):
    fig, frame = F.copy_size_distribution(data, iterations_only=iterations_only)
    its = iterations_from_sql(sql)
    lo = its[min(its)][0][1]  # iteration 1 starts at its first forward (the gap before it is start-up)
    hi = its[max(its)][-1][2]
    want: dict[tuple, list[int]] = {}
    for d, s, e, b, k in copies(sql, (lo, hi) if iterations_only else None):
        if b <= 0:
            continue
        w = want.setdefault((d, k, _bucket(b)), [0, 0])
        w[0] += 1
        w[1] += b
    got = {}
    for r in frame.iter_rows(named=True):  # summed over the phases
        w = got.setdefault((r["direction"], r["host_kind"], r["bucket"]), [0, 0])
        w[0] += r["count"]
        w[1] += r["bytes"]
    assert got == want
    # bars: stacked per bucket and phase, values in copies and GB
    g = gids(fig)
    for (d, k, b), (n, nbytes) in want.items():
        cnt = sum(p.get_height() for gid, p in g.items() if gid.startswith(f"{d}:") and gid.endswith(f":{k}:count:{b}"))
        byt = sum(p.get_height() for gid, p in g.items() if gid.startswith(f"{d}:") and gid.endswith(f":{k}:bytes:{b}"))
        assert cnt == pytest.approx(n)
        assert byt == pytest.approx(nbytes / 1e9)
    # the phase split: pageable H2D bytes launched inside the update ranges (SQL) = the update's pageable bars
    upd = [(s, e) for it in its.values() for p, s, e in it if p == "update"]
    pg = sum(b for lo, hi in upd for d, s, e, b, k in copies(sql, (lo, hi)) if d == "H2D" and k == "pageable" and b > 0)
    assert frame.filter((pl.col("phase") == "update") & (pl.col("direction") == "H2D")
                        & (pl.col("host_kind") == "pageable"))["bytes"].sum() == pg > 0
    S.close(fig)


# ------------------------------------------------------------------ figure 4
def test_update_sub_phases_equal_sql(data, sql):
    fig, frame = F.sub_phase_breakdown(data)
    its = iterations_from_sql(sql)
    steady = data.steady_iterations(data.rank(0))
    assert steady == [1, 2]  # the cut starts at iteration 1: nothing is warm-up
    n = len(steady)
    upd = [r for it in steady for r in its[it] if r[0] == "update"]
    # sub-phases tile the update windows: their mean wall times add up to the mean update time
    assert frame["wall_ns"].sum() == pytest.approx(sum(e - s for _, s, e in upd) / n)
    assert (frame["gpu_busy_ns"] + frame["cpu_only_ns"] - frame["wall_ns"]).abs().max() < 1e-6
    # all H2D bytes launched inside the update ranges
    want = sum(b for _, s, e, b, _k in
               [c for lo, hi in [(s, e) for _, s, e in upd] for c in copies(sql, (lo, hi)) if c[0] == "H2D"])
    assert frame["h2d_bytes"].sum() * n == pytest.approx(want)
    # drawn bars: busy + CPU-only per sub-phase, in ms
    g = gids(fig)
    div, _ = S.time_unit(frame["wall_ns"].max())
    for i, r in enumerate(frame.iter_rows(named=True)):
        assert g[f"busy:{i}"].get_width() == pytest.approx(r["gpu_busy_ns"] / div)
        assert g[f"cpu:{i}"].get_width() == pytest.approx(r["cpu_only_ns"] / div)
        assert g[f"H2D:{i}"].get_width() == pytest.approx(r["h2d_gbps"] or 0)
    S.close(fig)


# ------------------------------------------------------------------ figure 5
def test_overlap_equals_brute_force(data, sql):
    fig, frame = F.overlap_contention(data)
    its = iterations_from_sql(sql)
    steady = [1, 2]
    kernels = sql.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    ov = frame.filter(pl.col("section") == "overlap")
    for phase in ("backward", "update"):
        wins = [(s, e) for it in steady for p, s, e in its[it] if p == phase]
        for d in ("H2D", "D2H"):
            cs = [(s, e) for lo, hi in wins for dd, s, e, _b, _k in copies(sql, (lo, hi)) if dd == d]
            busy = union_len(cs)
            # hidden = |U(copies) n U(kernels)| = |U(c)| + |U(k)| - |U(c u k)| over the copies' span
            lo_, hi_ = min(s for s, _ in cs), max(e for _, e in cs)
            ks = [(max(s, lo_), min(e, hi_)) for s, e in kernels if e > lo_ and s < hi_]
            hidden = busy + union_len(ks) - union_len(cs + ks)
            row = ov.filter((pl.col("phase") == phase) & (pl.col("direction") == d))
            assert row["copy_ns"][0] == pytest.approx(busy / len(steady))
            assert row["hidden_ns"][0] == pytest.approx(hidden / len(steady))
            assert row["exposed_ns"][0] == pytest.approx((busy - hidden) / len(steady))
    # contention: the figure shows no window; check that no two H2D/D2H copies ever overlap
    (n_overlap,) = sql.execute(
        """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY a JOIN CUPTI_ACTIVITY_KIND_MEMCPY b
           ON a.rowid < b.rowid AND a.start < b."end" AND b.start < a."end"
           WHERE a.copyKind IN (1, 2) AND b.copyKind IN (1, 2)""").fetchone()
    assert frame.filter(pl.col("section") == "contention").height == n_overlap == 0
    # busy rows: share of each bin covered by H2D copies, integrated, equals the busy time in the iteration
    busy = frame.filter((pl.col("section") == "busy") & (pl.col("direction") == "H2D"))
    t0, t1 = busy["start_ns"].min(), busy["end_ns"].max()
    cs = [(max(s, t0), min(e, t1)) for d, s, e, _b, _k in copies(sql) if d == "H2D" and e > t0 and s < t1]
    assert float((busy["copy_ns"] * (busy["end_ns"] - busy["start_ns"])).sum()) == pytest.approx(union_len(cs))
    g = gids(fig)
    div, _ = S.time_unit(ov["copy_ns"].max())
    per_phase = ov.group_by("phase").agg(pl.col("copy_ns").sum())
    drawn = set(per_phase.filter(pl.col("copy_ns") >= 0.001 * per_phase["copy_ns"].sum())["phase"].to_list())
    assert drawn == {"backward", "update"}  # "other" (four 4-byte flag copies) is left out, and said so
    assert not any(k.startswith("hidden:other") for k in g)
    for r in ov.filter(pl.col("phase").is_in(list(drawn))).iter_rows(named=True):
        assert g[f"hidden:{r['phase']}:{r['direction']}"].get_height() == pytest.approx(r["hidden_ns"] / div)
        assert g[f"exposed:{r['phase']}:{r['direction']}"].get_height() == pytest.approx(r["exposed_ns"] / div)
    S.close(fig)


def test_contention_windows_drawn_when_copies_overlap(tmp_path):
    """A synthetic trace where an H2D and a D2H copy overlap: one bidirectional window."""
    from synthetic import SyntheticTrace

    t = SyntheticTrace()
    tid = 1
    for i, (name, s, e) in enumerate([("forward", 0, 100_000_000), ("backward", 100_000_000, 200_000_000),
                                      ("update", 200_000_000, 300_000_000)]):
        t.range(name, s, e, tid=(7 << 24) + tid, domain="tracekit")
    t.kernel(10_000_000, 20_000_000, 7, tid, launch=5_000_000)
    t.copy(120_000_000, 160_000_000, 400_000_000, 1, 7, tid, launch=110_000_000)
    t.copy(150_000_000, 180_000_000, 100_000_000, 2, 7, tid, launch=111_000_000, src=2, dst=1)
    path = t.write(tmp_path / "contended.sqlite")
    d = ReportData.load(path)
    fig, frame = F.overlap_contention(d)
    cw = frame.filter(pl.col("section") == "contention")
    assert cw.select("start_ns", "end_ns", "kind").rows() == [(150_000_000, 160_000_000, "bidirectional")]
    S.close(fig)
    d.close()


# ------------------------------------------------------------------ per-rank and units
def test_rank_summary_matches_breakdown(data):
    fig, frame = F.rank_summary(data)
    _, fb = F.iteration_breakdown(data)
    steady = data.steady_iterations(data.rank(0))
    for phase in ("forward", "backward", "update"):
        want = fb.filter(pl.col("iteration").is_in(steady) & (pl.col("phase") == phase))["wall_ns"].sum() / len(steady)
        assert frame.filter(pl.col("phase") == phase)["wall_ns"][0] == pytest.approx(want)
    S.close(fig)


def test_phase_colours_are_shared():
    assert set(S.PHASE_COLORS) == {"forward", "backward", "update", "other"}
    assert len(set(S.PHASE_COLORS.values())) == 4
    assert not set(S.PHASE_COLORS.values()) & set(S.DIRECTION_COLORS.values())


@pytest.mark.parametrize("span_ns, unit", [(1.5e6, "µs"), (1e9, "ms"), (15e9, "ms"), (60e9, "s")])
def test_time_unit_adapts(span_ns, unit):
    assert S.time_unit(span_ns)[1] == unit


@pytest.mark.parametrize("span_ns, bin_ns", [(0.6e9, 1_000_000), (60e9, 100_000_000), (1e6, 100_000)])
def test_bins_adapt(span_ns, bin_ns):
    assert D.nice_bin(span_ns) == bin_ns


def test_iteration_breakdown_many_iterations(tmp_path):
    """Past 100 iterations the bars are drawn as collections (fast); the frame is unchanged."""
    from synthetic import SyntheticTrace, gtid

    t = SyntheticTrace()
    tid = gtid(5, 1)
    T = 10_000_000
    for it in range(120):
        b = it * T
        for name, a, e in [("forward", 0, 0.4), ("backward", 0.4, 0.8), ("update", 0.8, 1.0)]:
            t.range(name, b + int(a * T), b + int(e * T) - 1000, tid=tid, domain="tracekit")
        t.kernel(b + int(0.05 * T), b + int(0.2 * T), 5, 1, launch=b + int(0.01 * T))
    d = ReportData.load(t.write(tmp_path / "many.sqlite"))
    fig, frame = F.iteration_breakdown(d)
    assert frame["iteration"].n_unique() == 120
    assert frame.filter(pl.col("phase") == "forward")["gpu_busy_ns"].to_list() == [int(0.15 * T)] * 120
    verts = fig.axes[0].collections[1].get_paths()  # the GPU-busy layer
    heights = [p.vertices[:, 1].max() - p.vertices[:, 1].min() for p in verts]
    assert heights == pytest.approx((frame["gpu_busy_ns"].to_numpy() / 1e6).tolist())
    S.close(fig)
    d.close()


# ------------------------------------------------------------------ d20: drawing is linear in NVTX ranges
def _artists(fig) -> int:
    return sum(len(a.patches) + len(a.collections) + len(a.texts) + len(a.lines) for a in fig.axes)


def _many_ranges_trace(path, n: int):
    """Three iterations; ``n`` tiny NVTX sub-ranges spread over each update (the d20 repro adds
    50 k such ranges to the fixture)."""
    from synthetic import SyntheticTrace, gtid

    t = SyntheticTrace()
    tid = gtid(9, 1)
    T = 100_000_000
    for it in range(3):
        b = it * T
        for name, a, e in [("forward", 0, 0.3), ("backward", 0.3, 0.6), ("update", 0.6, 1.0)]:
            t.range(name, b + int(a * T), b + int(e * T) - 1000, tid=tid, domain="tracekit")
        lo, hi = b + int(0.6 * T) + 100, b + T - 2000
        step = (hi - lo) // n
        for i in range(n):
            t.range("tiny", lo + i * step, lo + i * step + step // 2, tid=tid, domain="tracekit")
        t.kernel(b + int(0.05 * T), b + int(0.2 * T), 9, 1, launch=b + int(0.01 * T))
        t.copy(b + int(0.7 * T), b + int(0.75 * T), 1 << 26, 1, 9, 1, launch=b + int(0.7 * T), src=0, dst=2)
    return t.write(path)


def test_timeline_draws_nvtx_segments_in_one_collection(tmp_path):
    """d20 (issue 9): figure 2 drew each sub-phase segment as its own artist (50 k ranges: 26 s).
    Now the number of artists does not grow with the ranges, and the sub-phase collections hold
    exactly one rectangle per self-time segment of the frame."""
    counts = {}
    for n in (50, 2000):
        d = ReportData.load(_many_ranges_trace(tmp_path / f"n{n}.sqlite", n))
        fig, frame = F.iteration_timeline(d, iteration=1)
        segs = frame.filter(pl.col("series") == "sub_phase")
        assert segs.filter(pl.col("label") == "tiny").height == n
        assert segs.height in (2 * n, 2 * n + 1)  # tiny ranges and the unmarked time between them
        ax_b = fig.axes[0]
        paths = sum(len(c.get_paths()) for c in ax_b.collections if (c.get_gid() or "").startswith("segments:"))
        bands = frame.filter(pl.col("series") == "phase").height
        assert paths == segs.height + bands
        counts[n] = _artists(fig)
        S.close(fig)
        d.close()
    assert counts[2000] == counts[50]


# ------------------------------------------------------------------ figure 1: warm-up apart
def test_warmup_iteration_drawn_apart(tmp_path):
    """A warm-up iteration 0 five times longer than the others gets its own axis, so the
    steady iterations' axis is scaled to them (their max, +8%). One micro-step per iteration:
    the warm-up is iterations 0 and 1 (they hold the run's first two micro-steps)."""
    from synthetic import SyntheticTrace, gtid

    t = SyntheticTrace()
    tid = gtid(4, 1)
    T = 100_000_000
    b = 0
    for it in range(4):
        L = 5 * T if it == 0 else T
        for name, a, e in [("forward", 0, 0.3), ("backward", 0.3, 0.6), ("update", 0.6, 1.0)]:
            t.range(name, b + int(a * L), b + int(e * L) - 1000, tid=tid, domain="tracekit")
        t.kernel(b + int(0.05 * L), b + int(0.2 * L), 4, 1, launch=b + int(0.01 * L))
        b += L
    d = ReportData.load(t.write(tmp_path / "warm.sqlite"))
    fig, frame = F.iteration_breakdown(d)
    assert len(fig.axes) == 2
    warm_ax, steady_ax = fig.axes
    assert [tk.get_text() for tk in warm_ax.get_xticklabels()] == ["0", "1"]
    assert [tk.get_text() for tk in steady_ax.get_xticklabels()] == ["2", "3"]
    steady_max = (frame.filter(pl.col("iteration") > 1).group_by("iteration").agg(pl.col("wall_ns").sum())
                  ["wall_ns"].max())
    assert steady_ax.get_ylim()[1] == pytest.approx(steady_max / 1e6 * 1.08)
    assert warm_ax.get_ylim()[1] == pytest.approx(frame.filter(pl.col("iteration") == 0)["wall_ns"].sum() / 1e6 * 1.08)
    S.close(fig)
    d.close()


def test_titles_name_the_run():
    """Titles carry the capture manifest's configuration (tests/fixtures/zero3_offload_gas2_capture.json)."""
    import json
    from pathlib import Path

    from conftest import ZERO3_CUT as _  # noqa: F401

    trace = Path(__file__).parent / "fixtures" / "zero3_offload_gas2_cut.sqlite"
    man = json.loads((trace.parent / "zero3_offload_gas2_capture.json").read_text())["deepspeed_config"]
    d = ReportData.load(trace)
    fig, _f = F.iteration_breakdown(d)
    title = fig._suptitle.get_text()
    S.close(fig)
    d.close()
    assert f"ZeRO-{man['zero_optimization']['stage']}" in title
    assert f"optimizer → {man['zero_optimization']['offload_optimizer']['device']} (pinned)" in title
    assert "bf16" in title and man["bf16"]["enabled"]
    assert f"grad. accumulation {man['gradient_accumulation_steps']}" in title
