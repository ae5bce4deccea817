"""The idle section reads the CUDA API calls a time span at a time (issue 24, item 4: flat memory):
the ds_zero3 fixture cut into hundreds of spans gives the frames of the whole read, and a synthetic
trace whose runtime rows are in start order (streamed) or reversed (read whole) gives what a walk
over every microsecond gives."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from synthetic import SyntheticTrace, gtid

from tracekit.analyze.model import phases as ph
from tracekit.analyze.sections import idle
from tracekit.analyze.trace.export import Export

FIXTURE = Path(__file__).parent / "fixtures" / "ds_zero3_offload_iter1-2.sqlite"
US, MS = 1_000, 1_000_000
MAIN, OTHER = 1, 2


def _spy(monkeypatch) -> list[tuple]:
    """Record ``(lo, hi, calls)`` of every span :func:`idle._stream_spans` yields."""
    spans: list[tuple] = []
    orig = idle._stream_spans

    def spy(export, model):
        for lo, hi, calls, names, groups in orig(export, model):
            spans.append((lo, hi, calls, list(names)))
            yield lo, hi, calls, names, groups

    monkeypatch.setattr(idle, "_stream_spans", spy)
    return spans


def _bins(model) -> pl.DataFrame:
    """1 ms bins over the rank's windows (the report's timeline bins, coarser)."""
    from tracekit.analyze.sections.breakdown import rank_windows

    w = rank_windows(model)
    lo, hi = w["start"].min(), w["end"].max()
    s = np.arange(lo, hi, MS)
    return pl.DataFrame({"global_pid": w["global_pid"][0], "device": w["device"][0], "bin": np.arange(s.size),
                         "start": s, "end": np.minimum(s + MS, hi)})


def test_fixture_in_many_spans_equals_the_whole_read(monkeypatch):
    """200 rowids a chunk: the 32,567 runtime rows in 164 spans; the windows, the update's
    sub-phases and 1 ms bins equal those of the whole read (the path of an export out of start
    order), exactly."""
    with Export.open(FIXTURE) as e:
        whole = ph.build(e)
        whole.cache[idle._UNORDERED] = True  # the whole read, as for an export out of order
        want = idle.idle_frames(whole, e)
        want_bins = idle.breakdown_of(whole, e, _bins(whole), ("bin",))
        monkeypatch.setattr(idle, "_CALL_CHUNK", 200)
        spans = _spy(monkeypatch)
        m = ph.build(e)
        got = idle.idle_frames(m, e)
        n_frames = len(spans)
        got_bins = idle.breakdown_of(m, e, _bins(m), ("bin",))
    assert not m.cache.get(idle._UNORDERED)
    assert n_frames == 164 and len(spans) == 2 * n_frames  # the bins: a read of their own
    # the spans follow each other and cover all time
    assert spans[0][0] == np.iinfo(np.int64).min and spans[n_frames - 1][1] == np.iinfo(np.int64).max
    assert all(a[1] == b[0] for a, b in zip(spans[:n_frames - 1], spans[1:n_frames]))
    # (one thread makes nearly every call here, so no call is in flight at a span edge: the
    # synthetic test below carries a long call through many spans)
    for a, b in zip(got, want):
        assert a.equals(b)
    assert got_bins.equals(want_bins)
    w, api, sub = got
    assert w.height == 13 and sub.height > 2
    assert (w.select(sum(pl.col(c) for c in idle.CATEGORIES) == pl.col("wall_ns"))).to_series().all()
    assert w["in_api_ns"].sum() == api["ns"].sum() > 100 * MS
    assert sub["wall_ns"].sum() == w.filter(pl.col("phase") == "update")["wall_ns"].sum()


def _synthetic(path: Path, order: str) -> Path:
    """Three phases with compute, NCCL and a second thread's kernel; 60 short calls on the main
    thread, a 25 ms synchronize on the other thread crossing every phase, overlapping calls. The
    runtime rows written in start order (``order`` "start"), in reverse ("reverse"), or in start
    order but the last two swapped ("last_swapped")."""
    t = SyntheticTrace()
    tid = gtid(1, MAIN)
    t.range("DeepSpeedEngine.forward", 1 * MS, 11 * MS, tid, "DeepSpeed")
    t.range("DeepSpeedEngine.backward", 12 * MS, 22 * MS, tid, "DeepSpeed")
    t.range("DeepSpeedZeroOptimizer_Stage3.step", 23 * MS, 43 * MS, tid, "DeepSpeed")
    t.range("zero_grad", 30 * MS, 35 * MS, tid)  # a sub-phase of the update

    def kernel(start, end, launch, thread=MAIN, name="k"):
        c = t._launch(gtid(1, thread), launch, launch + 70 * US, "cudaLaunchKernel_v7000")
        t.kernels.append((start, end, 0, 7, c, 1 << 24, t.sid(name)))

    def call(start, end, thread, api):
        t._launch(gtid(1, thread), start, end, api)

    kernel(2 * MS, 3 * MS, 1010 * US)
    kernel(5 * MS, 5500 * US, 3510 * US)
    kernel(7 * MS, 8 * MS, 6510 * US, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    kernel(13 * MS, 14 * MS, 12020 * US, thread=OTHER)
    kernel(24 * MS, 26 * MS, 23030 * US)
    kernel(36 * MS, 39 * MS, 35040 * US, name="ncclDevKernel_AllGather_RING_LL")
    for k in range(60):  # every 700 us from 1.15 ms, 130 us each
        call(1150 * US + k * 700 * US, 1280 * US + k * 700 * US, MAIN, "cudaEventQuery_v3020")
    call(4 * MS + 20 * US, 6 * MS, MAIN, "cudaStreamSynchronize_v3020")
    call(9 * MS + 30 * US, 34 * MS + 10 * US, OTHER, "cudaStreamSynchronize_v3020")  # the long one
    call(9500 * US, 9800 * US, MAIN, "cudaMemcpyAsync_v3020")  # inside the long one: goes to it
    call(40 * MS + 40 * US, 42 * MS, MAIN, "cudaMalloc_v3020")
    t.runtime.sort(key=lambda r: r[0], reverse=order == "reverse")
    if order == "last_swapped":
        t.runtime[-2:] = t.runtime[:-3:-1]
    return t.write(path)


def _walk(path: Path, model) -> tuple[dict, dict]:
    """Per phase row: the categories and the in-API time per call name, from a walk over every
    microsecond of each window (every time of the synthetic trace is a whole microsecond)."""
    import sqlite3

    from tracekit.analyze.sections.breakdown import rank_windows

    con = sqlite3.connect(path)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    kern = con.execute('SELECT start, "end", demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    calls = sorted(con.execute('SELECT start, "end", nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME').fetchall())
    con.close()
    cats: dict = {}
    api: dict = {}
    for r in rank_windows(model).iter_rows(named=True):
        key = (r["iteration"], r["phase"], r["micro_step"])
        c = cats.setdefault(key, dict.fromkeys(idle.CATEGORIES, 0))
        for t in range(r["start"], r["end"], US):
            if any(s <= t < e and "nccl" not in names[n] for s, e, n in kern):
                c["gpu_busy_ns"] += US
            elif any(s <= t < e for s, e, n in kern):
                c["waiting_ns"] += US
            else:
                inside = [idle.short_name(names[n]) for s, e, n in calls if s <= t < e]  # the first begun first
                if inside:
                    c["in_api_ns"] += US
                    api[key, inside[0]] = api.get((key, inside[0]), 0) + US
                else:
                    c["between_api_ns"] += US
    return cats, api


@pytest.mark.parametrize("order", ["start", "reverse", "last_swapped"])
def test_synthetic_streamed_or_read_whole_equals_a_walk(monkeypatch, tmp_path, order):
    """In start order, 3 rowids a chunk: 25 spans, the 25 ms synchronize carried through 13 of
    them. Reversed (synthetic_idle_unordered), the order check fails at the first chunk; with the
    last two rows swapped, at the last chunk, after 23 spans were classified: the calls are then
    read whole. All three give the walk's numbers."""
    path = _synthetic(tmp_path / f"synthetic_idle_{'ordered' if order == 'start' else 'unordered'}.sqlite", order)
    monkeypatch.setattr(idle, "_CALL_CHUNK", 3)
    spans = _spy(monkeypatch)
    with Export.open(path) as e:
        m = ph.build(e)
        w, by_api, sub = idle.idle_frames(m, e)
        again = idle.idle_windows(m, e)
    assert again[0] is w  # kept on the model
    assert bool(m.cache.get(idle._UNORDERED)) == (order != "start")
    # 70 rows: 24 chunks, a span each and the last one; reversed, the first chunk fails the check
    assert len(spans) == {"start": 25, "reverse": 0, "last_swapped": 23}[order]
    if order != "reverse":  # the 25 ms synchronize, carried through the spans from 9.03 to 34.01 ms
        carried = [lo for lo, _hi, c, names in spans
                   if c.filter((pl.col("start") < lo) & (pl.col("end") - pl.col("start") > 20 * MS)).height]
        assert len(carried) == 13 and min(carried) > 9030 * US and max(carried) < 34010 * US
    cats, api = _walk(path, m)
    got = {(r["iteration"], r["phase"], r["micro_step"]): {c: r[c] for c in idle.CATEGORIES}
           for r in w.iter_rows(named=True)}
    assert got == cats
    assert {((r["iteration"], r["phase"], r["micro_step"]), r["name"]): r["ns"]
            for r in by_api.iter_rows(named=True)} == api
    fwd = got[(0, "forward", 0)]
    # forward [1, 11) ms: 1.5 ms compute, 1 ms NCCL; the first synchronize [4.02, 6) ms less the
    # event query begun before it (to 4.08) and the kernel [5, 5.5), the long one from 9.03 ms
    assert fwd["gpu_busy_ns"] == 1500 * US and fwd["waiting_ns"] == 1 * MS
    assert api[(0, "forward", 0), "cudaStreamSynchronize"] == 1420 * US + 1970 * US
    upd = sub.sort("sub_phase")
    assert upd["sub_phase"].to_list() == ["(none)", "zero_grad"]
    assert upd["wall_ns"].to_list() == [15 * MS, 5 * MS]
    # zero_grad [30, 35) ms: the long synchronize until 34.01 ms, then two event queries
    zg = upd.row(1, named=True)
    assert zg["in_api_ns"] == 4010 * US + 2 * 130 * US and zg["between_api_ns"] == 730 * US


def _merge_loop(s, e):
    """The union of [s, e) intervals by a plain loop (sorted by start, touching ones merged)."""
    out = []
    for a, b in sorted(zip(s.tolist(), e.tolist())):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [a for a, _ in out], [b for _, b in out]


@pytest.mark.parametrize("seed", [1, 3, 7])
def test_sweep_equals_a_merge_loop(seed):
    """The busy unions made a span at a time (idle._Sweep): nested, touching, equal-start and
    disjoint intervals in start order, cut at random times; each answer is sorted and disjoint
    and all of them together make the union a loop makes."""
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n = int(rng.integers(1, 200))
        s = np.sort(rng.integers(0, 400, n)).astype(np.int64)
        e = s + rng.integers(1, 30, n)
        sweep, seen = idle._Sweep((s, e)), ([], [])
        for hi in [*np.sort(rng.integers(0, 450, 5)).tolist(), np.iinfo(np.int64).max]:
            got = sweep.upto(hi)
            assert (got[0][1:] > got[1][:-1]).all() and (got[1] > got[0]).all()
            seen[0].extend(got[0].tolist())
            seen[1].extend(got[1].tolist())
        want = _merge_loop(s, e)
        assert _merge_loop(np.array(seen[0]), np.array(seen[1])) == (want[0], want[1])
