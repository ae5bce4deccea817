"""The streamed PCIe reduction (issue 13) against a plain, non-streamed polars computation:
every sample read at once with sqlite3, ordered, attributed with a join, grouped. On the
fixture and on synthetic traces whose saturation runs cross chunk edges, for many chunk
sizes (down to one rowid per chunk), with the samples out of time order (the exact
fallback) and with typeIds that TARGET_INFO_GPU_METRICS does not list."""

import sqlite3

import numpy as np
import polars as pl
import pytest
from conftest import ZERO3_CUT
from polars.testing import assert_frame_equal
from synthetic import SyntheticTrace, gtid

from tracekit.analyze.model import phases
from tracekit.analyze.model.intervals import spread_cumulative
from tracekit.analyze.sections import pcie_metrics
from tracekit.analyze.sections.transfers import PER_WINDOW, analyze_transfers
from tracekit.analyze.trace.export import Export

MS = 1_000_000
RANK = ["global_pid", "device"]


# --------------------------------------------------------------------------- the plain computation
def plain(path, model: phases.PhaseModel, threshold: float) -> dict[str, pl.DataFrame]:
    """``series``, ``pcie`` (per window), ``pcie_phase``, ``pcie_saturation`` from all samples at once."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ids = {mid: ("H2D" if " RX " in f" {name} " else "D2H") for mid, name in con.execute(
        "SELECT metricId, metricName FROM TARGET_INFO_GPU_METRICS WHERE metricName LIKE 'PCIe RX Throughput%' "
        "OR metricName LIKE 'PCIe TX Throughput%'")}
    rows = con.execute("SELECT typeId, metricId, timestamp, value FROM GPU_METRICS ORDER BY rowid").fetchall()
    gpus = sorted({r[0] for r in con.execute("SELECT id FROM TARGET_INFO_GPU")})
    con.close()
    s = pl.DataFrame(rows, schema={"type_id": pl.Int64, "metric_id": pl.Int64, "time": pl.Int64,
                                   "value_pct": pl.Float64}, orient="row").with_row_index("rid")
    s = s.filter(pl.col("metric_id").is_in(list(ids))).with_columns(
        direction=pl.col("metric_id").replace_strict(ids, return_dtype=pl.String))
    s = s.sort("type_id", "direction", "time", "rid")
    s = s.with_columns(start=pl.col("time").shift(1).over("type_id", "direction"))
    step = int(s.select((pl.col("time") - pl.col("start")).median()).item() or 0)
    s = s.with_columns(start=pl.col("start").fill_null(pl.col("time") - step))
    types = sorted(s["type_id"].unique().to_list())
    assert len(types) == len(gpus) == 1
    s = s.with_columns(device=pl.lit(gpus[0], pl.Int64))
    ranks = model.ops.select(RANK).unique().drop_nulls()
    s = ranks.join(s, on="device")
    copies = model.ops.filter((pl.col("kind") == "memcpy") & pl.col("direction").is_in(["H2D", "D2H"]))
    parts = []
    for (gp, dev, d), g in s.group_by([*RANK, "direction"]):
        c = copies.filter((pl.col("global_pid") == gp) & (pl.col("device") == dev) & (pl.col("direction") == d))
        a, b = g["start"].to_numpy(), g["time"].to_numpy()
        args = (c["start"].to_numpy(), c["end"].to_numpy(), c["bytes"].to_numpy())
        moved = spread_cumulative(*args, b) - spread_cumulative(*args, a)
        parts.append(g.with_columns(copy_gbps=pl.Series(np.maximum(moved, 0.0) / np.maximum(b - a, 1))))
    s = pl.concat(parts)
    # window of each sample: the last window of its process starting at or before it, if it ends after it
    w = model.windows.select("global_pid", "window_id", "iteration", "phase", "micro_step", "boundary",
                             w_start="start", w_end="end").sort("w_start")
    s = s.sort("time").join_asof(w, left_on="time", right_on="w_start", by="global_pid", strategy="backward",
                                      check_sortedness=False)
    inside = pl.col("w_end").is_not_null() & (pl.col("time") < pl.col("w_end"))
    s = s.with_columns(
        *[pl.when(inside).then(pl.col(c)).otherwise(None).alias(c) for c in ("window_id", "iteration", "micro_step")],
        phase=pl.when(inside).then(pl.col("phase")).otherwise(pl.lit("other")),
        boundary=pl.when(inside).then(pl.col("boundary")).otherwise(False),
    ).drop("w_start", "w_end")
    s = s.sort([*RANK, "direction", "time", "rid"])
    out = {"series": s.select("global_pid", "device", "type_id", "direction", "start", "time", "value_pct",
                              "copy_gbps", "window_id", "iteration", "phase", "micro_step", "boundary")}
    base = s.filter(pl.col("copy_gbps") == 0).group_by([*RANK, "direction"]).agg(
        baseline_pct=pl.col("value_pct").median())
    wins = model.windows.join(ranks, on="global_pid")
    wparts = []
    for (gp, dev), ww in wins.group_by(RANK):
        for d in ("H2D", "D2H"):
            c = copies.filter((pl.col("global_pid") == gp) & (pl.col("device") == dev) & (pl.col("direction") == d))
            args = (c["start"].to_numpy(), c["end"].to_numpy(), c["bytes"].to_numpy())
            cb = spread_cumulative(*args, ww["end"].to_numpy()) - spread_cumulative(*args, ww["start"].to_numpy())
            wparts.append(ww.with_columns(direction=pl.lit(d), copy_bytes=pl.Series(np.maximum(cb, 0.0))))
    wins = pl.concat(wparts)
    for name, by in (("pcie", list(PER_WINDOW)), ("pcie_phase", ["phase"])):
        keys = [*RANK, *by, "direction"]
        st = s.group_by(keys).agg(samples=pl.len().cast(pl.Int64), mean_pct=pl.col("value_pct").mean(),
                                  peak_pct=pl.col("value_pct").max())
        cb = wins.group_by(keys).agg(wall_ns=(pl.col("end") - pl.col("start")).sum(), copy_bytes=pl.col("copy_bytes").sum())
        f = cb.join(st, on=keys, how="left", nulls_equal=True).join(base, on=[*RANK, "direction"], how="left")
        f = f.with_columns(samples=pl.col("samples").fill_null(0), baseline_pct=pl.col("baseline_pct").fill_null(0.0),
                           copy_gbps=pl.when(pl.col("wall_ns") > 0).then(pl.col("copy_bytes") / pl.col("wall_ns")))
        above = pl.col("mean_pct") - pl.col("baseline_pct")
        f = f.with_columns(implied_peak_gbps=pl.when(above > 0).then(pl.col("copy_gbps") / (above / 100)))
        out[name] = f
    hi = s.with_columns(hi=pl.col("value_pct") >= threshold)
    hi = hi.with_columns(run=pl.struct(*RANK, "direction", "hi").rle_id()).filter(pl.col("hi"))
    runs = hi.group_by([*RANK, "direction", "run"]).agg(
        start=pl.col("start").min(), end=pl.col("time").max(), samples=pl.len().cast(pl.Int64),
        mean_pct=pl.col("value_pct").mean(), peak_pct=pl.col("value_pct").max()).drop("run")
    out["pcie_saturation"] = runs.with_columns(duration_ns=pl.col("end") - pl.col("start"))
    return out


def same(got: pl.DataFrame, want: pl.DataFrame) -> None:
    """Equal as sets of rows (column order and row order aside), exactly."""
    cols = sorted(want.columns)
    assert set(got.columns) >= set(cols), set(cols) - set(got.columns)
    g, w = got.select(cols), want.select(cols)
    assert_frame_equal(g.sort(cols, nulls_last=True), w.sort(cols, nulls_last=True), check_exact=True)


def check(path, threshold=80.0, chunk=None, monkeypatch=None, streamed=True):
    if chunk is not None:
        monkeypatch.setattr(pcie_metrics, "CHUNK_ROWIDS", chunk)
    with Export.open(path) as e:
        m = phases.build(e)
        want = plain(path, m, threshold)
        red = pcie_metrics.reduce_pcie(e, m, threshold, keep_samples=True)
        assert red.streamed is streamed
        same(red.series, want["series"])
        assert red.samples == want["series"].height
        same(pcie_metrics.pcie_phase_stats(e, m, by=PER_WINDOW, reduction=red), want["pcie"])
        same(pcie_metrics.pcie_phase_stats(e, m, by=("phase",), reduction=red), want["pcie_phase"])
        sat = pcie_metrics.pcie_saturation(e, m, threshold, reduction=red)
        same(sat, want["pcie_saturation"])
        # the reduction without the samples gives the same frames
        lean = pcie_metrics.reduce_pcie(e, m, threshold)
        assert lean.series is None
        same(pcie_metrics.pcie_phase_stats(e, m, by=PER_WINDOW, reduction=lean), want["pcie"])
        same(pcie_metrics.pcie_saturation(e, m, threshold, reduction=lean), want["pcie_saturation"])
    return want, sat


# --------------------------------------------------------------------------- the fixture
@pytest.mark.parametrize("chunk", [None, 4093, 333])
def test_fixture_streamed_equals_plain(chunk, monkeypatch):
    want, sat = check(ZERO3_CUT, 80.0, chunk, monkeypatch)
    assert want["series"].height > 20_000 and sat.height > 10


def test_fixture_chunks_cross_saturation_runs(monkeypatch):
    """Chunks of 9 rowids hold at most 6 samples of one metric (the fixture keeps the RX and TX
    rows, one of each per tick), so every saturation run of 7 samples or more crosses a chunk edge."""
    with sqlite3.connect(ZERO3_CUT) as con:
        rows, rx = con.execute("SELECT count(*), sum(metricId = (SELECT metricId FROM TARGET_INFO_GPU_METRICS "
                               "WHERE metricName LIKE 'PCIe RX%')) FROM GPU_METRICS").fetchone()
    per_chunk = -(-9 * rx // rows) + 1
    assert per_chunk <= 6
    want, sat = check(ZERO3_CUT, 50.0, 9, monkeypatch)
    assert (sat["samples"] > per_chunk).sum() > 20


def test_fixture_analyze_transfers_uses_one_reduction(monkeypatch):
    calls = []
    orig = pcie_metrics.reduce_pcie
    monkeypatch.setattr(pcie_metrics, "reduce_pcie", lambda *a, **k: calls.append(1) or orig(*a, **k))
    with Export.open(ZERO3_CUT) as e:
        m = phases.build(e)
        tr = analyze_transfers(e, m, ("pcie",))
        assert len(calls) == 1 and "pcie_series" not in tr.frames  # samples only when asked for
        want = plain(ZERO3_CUT, m, 80.0)
        same(tr.frames["pcie"], want["pcie"])
        tr = analyze_transfers(e, m, ("pcie",), keep_samples=True)
        same(tr.frames["pcie_series"], want["series"])


# --------------------------------------------------------------------------- synthetic traces
def synthetic(tmp_path, name="pcie.sqlite", shuffle=False, info_type=None) -> str:
    """One DeepSpeed iteration of 2 micro-steps (0..65 ms: forward 0-10, backward 11-21, forward
    22-32, backward 33-43, step 44-64 ms) and samples every ~100 us (jittered) from -3 to 75 ms
    (before the first window and after the last): RX and TX of typeId 7 interleaved with another
    metric. RX saturates (85.5 %) during 50-58 ms and in bursts of 1-3 samples near 30 ms; TX
    from the very first sample and during 14-21 ms. H2D copies in the step, D2H in backward."""
    t = SyntheticTrace()
    tid = gtid(1, 1)
    for a, b, n in ((0, 10, "DeepSpeedEngine.forward"), (11, 21, "DeepSpeedEngine.backward"),
                    (22, 32, "DeepSpeedEngine.forward"), (33, 43, "DeepSpeedEngine.backward"),
                    (44, 64, "DeepSpeedZeroOptimizer_Stage3.step")):
        t.range(n, a * MS, b * MS, tid, "DeepSpeed")
    t.copy(50 * MS, 55 * MS, 5_000_000, 1, pid=1, tid=1, launch=50 * MS - 10_000)
    t.copy(56 * MS + 3_333, 57 * MS, 1_000_001, 1, pid=1, tid=1, launch=56 * MS)
    t.copy(15 * MS, 20 * MS, 4_000_000, 2, pid=1, tid=1, launch=14 * MS)
    t.kernel(1 * MS, 9 * MS, pid=1, tid=1, launch=1 * MS - 5000)
    path = t.write(tmp_path / name)
    rng = np.random.default_rng(13)
    times = np.cumsum(rng.integers(99_990, 100_012, size=780)) - 3 * MS
    rows = []
    for i, ts in enumerate(times.tolist()):
        ms = ts / MS
        rx = 85.5 if 50 <= ms < 58 else (80.0 if 29 <= ms < 31 and i % 4 else 1.25)
        tx = 90.0 if i < 7 or 14 <= ms < 21 else (1.0 if i % 3 else 1.5)
        rows += [(ts, 7, 5, float(i % 100)), (ts, 7, 20, rx), (ts + 1, 7, 21, tx)]
    if shuffle:  # two RX samples swapped in rowid order: not in time order
        k = [i for i, r in enumerate(rows) if r[2] == 20]
        rows[k[100]], rows[k[101]] = rows[k[101]], rows[k[100]]
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT, totalMemory INTEGER, busLocation TEXT);
        INSERT INTO TARGET_INFO_GPU VALUES (0, 'H200', 150000000000, '0000:01:00.0');
        CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT, metricId INTEGER,
                                              metricName TEXT);
        CREATE TABLE GPU_METRICS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER, metricId INTEGER,
                                  value INTEGER);""")
    con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 1, 'GH100', ?, ?)",
                    [(info_type or 7, 5, "SMs Active [Throughput %]"), (info_type or 7, 20, "PCIe RX Throughput [Throughput %]"),
                     (info_type or 7, 21, "PCIe TX Throughput [Throughput %]")])
    con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?, ?)", [(r[0], r[0], r[1], r[2], r[3]) for r in rows])
    con.commit()
    con.close()
    return str(path)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 50, 97, 1000, 10**9])
def test_synthetic_runs_across_chunk_edges(tmp_path, chunk, monkeypatch):
    path = synthetic(tmp_path)
    want, sat = check(path, 80.0, chunk, monkeypatch)
    tx = sat.filter(pl.col("direction") == "D2H").sort("start")
    # the first TX run starts with the trace's first TX sample: its start is time - median interval
    first = want["series"].filter(pl.col("direction") == "D2H").sort("time").row(0, named=True)
    assert tx["start"][0] == first["start"] < first["time"] and tx["samples"][0] == 7
    rx = sat.filter(pl.col("direction") == "H2D")
    assert rx.height > 5 and rx["samples"].max() >= 79  # one run over 50-58 ms, bursts near 30 ms
    # samples outside every window count in phase other; baseline from the samples without copies
    assert want["pcie_phase"].filter(pl.col("phase") == "other")["samples"].sum() > 0


@pytest.mark.parametrize("threshold", [1.25, 80.0, 85.5, 90.0, 101.0])
def test_synthetic_thresholds(tmp_path, threshold, monkeypatch):
    check(synthetic(tmp_path), threshold, 5, monkeypatch)


def test_synthetic_out_of_order_falls_back_exactly(tmp_path, monkeypatch):
    check(synthetic(tmp_path, shuffle=True), 80.0, 50, monkeypatch, streamed=False)


def test_synthetic_unlisted_type_falls_back_exactly(tmp_path, monkeypatch):
    """TARGET_INFO_GPU_METRICS lists typeId 8, the samples carry 7: the mapping is made from
    the samples seen, as before streaming."""
    check(synthetic(tmp_path, info_type=8), 80.0, 50, monkeypatch, streamed=False)


def test_chunk_reader_gives_the_rows_of_one_query(tmp_path):
    path = synthetic(tmp_path)
    sql = "SELECT typeId, metricId, timestamp, value FROM GPU_METRICS WHERE metricId IN (20, 21)"
    schema = {"type_id": pl.Int64, "metric_id": pl.Int64, "time": pl.Int64, "value_pct": pl.Float64}
    with Export.open(path) as e:
        whole = e.query(sql, (), schema)
        for chunk, workers in ((1, 1), (10, 2), (333, 3), (10**9, 2)):
            parts = list(e.query_chunks(sql, (), schema, table="GPU_METRICS", chunk_rows=chunk, workers=workers))
            assert_frame_equal(pl.concat(parts), whole)
        assert e.prefetch_chunks(sql, (), schema, table="GPU_METRICS", chunk_rows=100, workers=2)
        assert not e.prefetch_chunks(sql, (), schema, table="GPU_METRICS", chunk_rows=100, workers=2)
        got = list(e.query_chunks(sql, (), schema, table="GPU_METRICS", chunk_rows=100, workers=2))
        assert len(got) == 24 and not e._pending
        assert_frame_equal(pl.concat(got), whole)
        # a query that cannot be split comes whole
        (one,) = e.query_chunks(sql + " ORDER BY timestamp", (), schema, table="GPU_METRICS", chunk_rows=100)
        assert one.height == whole.height
        e.prefetch_chunks(sql, (), schema, table="GPU_METRICS", chunk_rows=100, workers=2)
    # closing the export stops a prefetch never consumed


def test_cumulative_equals_spread_cumulative():
    rng = np.random.default_rng(5)
    s = np.sort(rng.integers(0, 10**6, 500))
    e = s + rng.integers(0, 5000, 500)
    b = rng.integers(0, 10**7, 500).astype(float)
    at = np.sort(rng.integers(-10, 10**6 + 10**4, 3000))
    f = pcie_metrics.SpreadCumulative(s, e, b)  # prepared once, as the PCIe section uses it
    assert np.array_equal(f(at), spread_cumulative(s, e, b, at))
    # against the definition, brute force: A(t) = sum_i b_i * clip((t - s_i) / (e_i - s_i), 0, 1)
    ee = np.maximum(e, s + 1)
    brute = (b[None, :] * np.clip((at[:, None] - s[None, :]) / (ee - s)[None, :], 0, 1)).sum(axis=1)
    assert np.allclose(f(at), brute, rtol=1e-9, atol=1e-3)
    assert np.array_equal(pcie_metrics.SpreadCumulative([], [], [])(at), np.zeros(at.size))


def test_median_of_counts_is_polars_median():
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 10, 101, 1000):
        for ints in (True, False):
            a = rng.integers(0, 40, n) if ints else rng.random(n) * 100
            c = pcie_metrics._Counts()
            for part in np.array_split(a, 7):
                c.add(part)
            assert c.median(a.dtype) == pl.Series(a).median()


def test_timeline_peaks_equal_the_loop_over_bins():
    from tracekit.analyze.sections import throughput

    with Export.open(ZERO3_CUT) as e:
        tl = throughput.throughput_timeline(phases.build(e))
    want: dict = {}
    for b in tl.iter_rows(named=True):
        k = (b["global_pid"], b["device"], b["phase"], b["direction"])
        n, width, peak = want.get(k, (0, b["bin_end"] - b["bin_start"], 0.0))
        want[k] = (n + 1, width, max(peak, b["gbps"] or 0.0))
    got = throughput.timeline_peaks(tl)
    assert {(r[0], r[1], r[2], r[3]): (r[4], r[5], r[6]) for r in got.iter_rows()} == want
    assert got.height == len(want) == 8
