"""Messages and claims on public exports (issue 25): what a missing-CUDA message says, the
whole-trace report of an export without NVTX, and the one significance rule of every comparing
claim (tracekit.analyze.significance)."""

import sqlite3
from pathlib import Path

import pytest
from conftest import PUBLIC, assert_one_line_error
from conftest import run_cli as run
from synthetic import SyntheticTrace

from tracekit.analyze.model import phases
from tracekit.analyze.result import analyze_export
from tracekit.analyze.trace import recording
from tracekit.analyze.trace.export import Export
from tracekit.errors import MissingDataError
from tracekit.vocab import NO_NVTX

# the public exports: ../shared beside the checkout, or the workplace's shared folder
_PUB = next((p for p in (PUBLIC, Path(__file__).resolve().parents[3] / "shared" / "traces" / "public")
             if p.is_dir()), None)
needs_public = pytest.mark.skipif(_PUB is None, reason="shared public exports not present")


# ---------------------------------------------------------------------- 1. missing CUDA work
def _no_gpu_work(path: Path, capture: list[tuple[str, str]] | None = None, overhead: list[str] | None = None,
                 runtime_calls: int = 0) -> Path:
    """synthetic: an export with NVTX ranges, ``runtime_calls`` CUDA runtime calls and no kernel
    or copy; ``capture`` rows of META_DATA_CAPTURE, ``overhead`` names of PROFILER_OVERHEAD."""
    t = SyntheticTrace()
    t.range("DeepSpeedEngine.forward", 0, 1000, tid=(7 << 24) + 1, domain="DeepSpeed")
    for i in range(runtime_calls):
        t.runtime.append((10 * i, 10 * i + 5, (7 << 24) + 1, 100 + i, t.sid("cudaStreamSynchronize")))
    for name in overhead or []:
        t.sid(name)
    t.write(path)
    con = sqlite3.connect(path)
    if capture is not None:
        con.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT)")
        con.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)", capture)
    if overhead is not None:
        con.execute("CREATE TABLE PROFILER_OVERHEAD (start INTEGER, \"end\" INTEGER, globalTid INTEGER, "
                    "nameId INTEGER, domainId INTEGER)")
        ids = dict(con.execute("SELECT value, id FROM StringIds").fetchall())
        con.executemany("INSERT INTO PROFILER_OVERHEAD VALUES (0, 10, 1, ?, 0)", [(ids[n],) for n in overhead])
    con.commit()
    con.close()
    return path


def _error(path: Path) -> str:
    with Export.open(path) as e, pytest.raises(MissingDataError) as exc:
        phases.build(e)
    return str(exc.value)


def test_synthetic_cuda_on_by_capture_settings_does_not_suggest_t_cuda(tmp_path):
    p = _no_gpu_work(tmp_path / "on.sqlite", capture=[("CAPTURE_EVENT_TYPE", "NvtxEvents"),
                                                       ("CAPTURE_EVENT_TYPE", "Cuda")], runtime_calls=3)
    msg = _error(p)
    assert "CUDA tracing was on (META_DATA_CAPTURE lists Cuda)" in msg
    assert "-t cuda" not in msg
    # what the export holds, counted by SQL: 3 runtime calls, 2 NVTX rows (domain create + range)
    assert "3 CUDA runtime calls, 2 NVTX events and no kernel or copy" in msg
    assert msg.startswith(f"{p}: CUPTI_ACTIVITY_KIND_KERNEL has no rows in this trace")  # the path as given


def test_synthetic_cuda_on_by_per_process_setting_or_runtime_rows_or_overhead(tmp_path):
    a = _no_gpu_work(tmp_path / "a.sqlite", capture=[("PROCESS_0:COLLECT_CUDA_TRACE", "true")])
    assert recording.traced(Export.open(a)) == recording.Traced(True, "META_DATA_CAPTURE says COLLECT_CUDA_TRACE true")
    b = _no_gpu_work(tmp_path / "b.sqlite", runtime_calls=1)  # no settings, but CUDA runtime calls recorded
    assert recording.traced(Export.open(b)) == recording.Traced(True, "CUPTI_ACTIVITY_KIND_RUNTIME has rows")
    c = _no_gpu_work(tmp_path / "c.sqlite", overhead=["NVTX profiling initialization", "CUPTI: Buffer flush"])
    assert recording.traced(Export.open(c)) == recording.Traced(True, "PROFILER_OVERHEAD has 'CUPTI: Buffer flush'")
    for p in (a, b, c):
        assert "-t cuda" not in _error(p)


def test_synthetic_cuda_off_or_unknown_suggests_t_cuda(tmp_path):
    off = _no_gpu_work(tmp_path / "off.sqlite", capture=[("CAPTURE_EVENT_TYPE", "NvtxEvents"),
                                                         ("PROCESS_0:COLLECT_CUDA_TRACE", "false")])
    msg = _error(off)
    assert "CUDA tracing was off (META_DATA_CAPTURE lists NvtxEvents, not Cuda" in msg
    assert msg.endswith("record it with `nsys profile -t cuda`")
    # only NVTX's own start-up in PROFILER_OVERHEAD: CUDA unknown
    unk = _no_gpu_work(tmp_path / "unk.sqlite", overhead=["NVTX profiling initialization"])
    assert recording.traced(Export.open(unk)) == recording.Traced(None)
    msg = _error(unk)
    assert "does not say whether CUDA tracing was on" in msg and msg.endswith("`nsys profile -t cuda`")


@needs_public
def test_public_exports_recording_settings():
    """Each public export's CUDA setting, against what its tables say (checked by hand with sqlite3)."""
    want = {"kmeans-parallel__report1.sqlite": None,  # no metadata, no CUDA table
            "DLProf__nsys_profile.sqlite": True,  # 2022.1: runtime rows
            "SC23-OpenMP-Tutorial__report3.sqlite": True,  # META_DATA_CAPTURE lists Cuda
            "nsys-ai__mfu_2gpu_before.sqlite": True}  # lists Cuda; its PROCESS_0:COLLECT_CUDA_TRACE is false
    for name, on in want.items():
        with Export.open(_PUB / name) as e:
            assert recording.traced(e).on is on, name
    rc, out, err = run("analyze", _PUB / "kmeans-parallel__report1.sqlite")
    assert_one_line_error(rc, out, err, "2 GPU descriptions and no kernel or copy, and does not say whether CUDA "
                                        "tracing was on; record it with `nsys profile -t cuda`")


# ---------------------------------------------------------------------- 2. no NVTX: whole-trace report
def _gpu_work(path: Path, nvtx: str) -> tuple[Path, SyntheticTrace]:
    """synthetic: 4 kernels and 3 copies of one process; ``nvtx``: "none" (no NVTX_EVENTS
    table), "empty" (the table, no rows) or "other" (ranges that are no phase)."""
    t = SyntheticTrace()
    tid = 1
    for i in range(4):
        t.kernel(1_000_000 * i, 1_000_000 * i + 400_000, pid=9, tid=tid, launch=1_000_000 * i - 10_000)
    t.copy(5_000_000, 5_300_000, 3 << 20, 1, pid=9, tid=tid, launch=4_990_000)
    t.copy(5_400_000, 5_500_000, 1 << 20, 2, pid=9, tid=tid, launch=5_390_000)
    t.copy(5_600_000, 5_700_000, 1000, 1, pid=9, tid=tid, launch=5_590_000)
    if nvtx == "other":
        t.range("my_loop", 0, 6_000_000, tid=(9 << 24) + tid)
    t.write(path)
    if nvtx == "none":
        con = sqlite3.connect(path)
        con.execute("DROP TABLE NVTX_EVENTS")
        con.commit()
        con.close()
    return path, t


@pytest.mark.parametrize("nvtx", ["none", "empty", "other"])
def test_synthetic_kernels_and_copies_without_phase_ranges_get_the_whole_trace(tmp_path, nvtx):
    path, t = _gpu_work(tmp_path / f"{nvtx}.sqlite", nvtx)
    with Export.open(path) as e:
        res = analyze_export(e)
    assert res["phase_source"] == {"9": NO_NVTX if nvtx in ("none", "empty") else "none"}
    (rank,) = res["ranks"]
    assert rank["iterations"] == [] and list(rank["totals"]) == ["other"]
    other = rank["totals"]["other"]
    # independent: the rows the synthetic trace wrote
    assert other["kernel_count"] == len(t.kernels) == 4
    assert other["h2d_bytes"] == sum(c[6] for c in t.memcpy if c[7] == 1) == (3 << 20) + 1000
    assert other["d2h_bytes"] == 1 << 20
    rc, out, err = run("analyze", path)
    assert rc == 0, err
    flat = " ".join(out.split())
    if nvtx == "other":
        assert "no phase ranges (tracekit capture or DeepSpeed NVTX)" in flat
    else:
        assert ("pid 9: no NVTX ranges in this trace: phases cannot be told apart, so the report covers the whole "
                "trace and all its GPU work is 'other'; record with `nsys profile -t cuda,nvtx` and "
                "`tracekit capture`") in flat


def test_synthetic_report_and_compare_without_nvtx_say_why(tmp_path):
    """report and compare need iterations: one line saying the trace has no NVTX at all (not
    "see --phase-map", which cannot help), and that analyze reports the whole trace."""
    path, _ = _gpu_work(tmp_path / "none.sqlite", "none")
    for args in (("compare", path, path), ("report", path, "--out", tmp_path / "rep")):
        rc, out, err = run(*args)
        assert_one_line_error(rc, out, err, f"{path}: no iteration found")
        assert "no NVTX ranges in this trace" in err and "--phase-map" not in err
    other, _ = _gpu_work(tmp_path / "other.sqlite", "other")
    rc, out, err = run("compare", other, other)
    assert_one_line_error(rc, out, err, "(no forward/backward/update NVTX ranges; see --phase-map)")


def test_synthetic_phase_map_on_a_trace_without_nvtx(tmp_path):
    path, _ = _gpu_work(tmp_path / "none.sqlite", "none")
    rc, out, err = run("analyze", path, "--phase-map", "forward=fwd")
    assert_one_line_error(rc, out, err, f"{path} has no NVTX ranges to match")


@needs_public
def test_public_openmp_export_without_nvtx_whole_trace_numbers():
    """SC23-OpenMP-Tutorial: 100 H2D + 100 D2H copies, 50 kernels, no NVTX_EVENTS table."""
    path = _PUB / "SC23-OpenMP-Tutorial__report3.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    h2d, n_h2d = con.execute("SELECT sum(bytes), count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1").fetchone()
    kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    with Export.open(path) as e:
        res = analyze_export(e)
    assert set(res["phase_source"].values()) == {NO_NVTX}
    other = res["ranks"][0]["totals"]["other"]
    assert (other["kernel_count"], other["h2d_bytes"], other["h2d_count"]) == (kernels, h2d, n_h2d)


# ---------------------------------------------------------------------- 3. the significance rule
from tracekit.analyze import significance as sig  # noqa: E402

MS = 1_000_000
MIB = 1 << 20


def test_amounts_at_the_size_edge():
    # 1 ms is the smallest time difference; the relative part is large here (b = 0)
    assert not sig.differs(MS - 1, 0, "ns")
    assert sig.differs(MS, 0, "ns")
    assert not sig.differs(MIB - 1, 0, "bytes")
    assert sig.differs(MIB, 0, "bytes")
    assert sig.differs(0, MS, "ns")  # either direction


def test_relative_difference_at_the_5_percent_edge():
    assert sig.differs(105 * MS, 100 * MS, "ns")  # exactly 5 %
    assert not sig.differs(104_999_999, 100 * MS, "ns")  # just under
    assert sig.differs(95 * MS, 100 * MS, "ns")
    assert not sig.differs(256.1e6, 253.7e6, "ns")  # 0.95 %: the waiting-rank reason of nsys-ai's export
    assert sig.differs(120, 100, "ns", min_rel=0.1) .why == "too small"  # size first


def test_spread_must_be_exceeded():
    assert not sig.differs(110 * MS, 100 * MS, "ns", spread=10 * MS)  # equal to the spread
    assert sig.differs(110 * MS, 100 * MS, "ns", spread=10 * MS - 1)
    assert sig.differs(110 * MS, 100 * MS, "ns", spread=None)  # not measurable: rules 1 and 2
    assert sig.differs(110 * MS, 100 * MS, "ns", spread=10 * MS).why == "within the spread"


def test_rates_need_their_samples():
    big = ((100 * MIB, 2 * MS), (100 * MIB, 2 * MS))
    # "slower copies: 0.0 GB/s vs 0.0 GB/s": 16 copies of 8 B
    assert not sig.differs(0.004, 0.006, "GB/s", samples=((128, 30_000), (128, 20_000)))
    # "52.58 vs 52.62 GB/s": 0.08 %
    assert not sig.differs(52.58, 52.62, "GB/s", samples=big)
    assert sig.differs(40.0, 52.62, "GB/s", samples=big)
    assert not sig.differs(40.0, 52.62, "GB/s")  # no samples: never compared
    # each side at the edges: 1 MiB, 0.1 ms
    t = sig.MIN_RATE_NS
    assert t == 100_000
    ok = (MIB, t)
    assert sig.differs(40.0, 52.0, "GB/s", samples=(ok, ok))
    assert not sig.differs(40.0, 52.0, "GB/s", samples=((MIB - 1, t), ok))
    assert not sig.differs(40.0, 52.0, "GB/s", samples=(ok, (MIB, t - 1)))
    # a ratio of times: 0.1 ms on each side
    assert sig.differs(1.2, 1.0, "x", samples=(t, t))
    assert not sig.differs(1.2, 1.0, "x", samples=(t - 1, t))
    assert not sig.differs(1.04, 1.0, "x", samples=(10 * MS, 10 * MS))


def test_not_comparable_and_bad_unit():
    assert sig.differs(None, 1, "ns").why == "not comparable"
    assert not sig.differs(float("nan"), 1, "ns")
    assert not sig.differs(5 * MS, float("inf"), "ns")
    with pytest.raises(ValueError, match="unit"):
        sig.differs(1, 2, "ms")
    assert sig.spread([3, None, 7, 5]) == 4 and sig.spread([3]) is None


def test_slowest_against_the_runner_up():
    assert sig.slowest([(100 * MS, "a"), (106 * MS, "b"), (50 * MS, "c")]) == "b"
    assert sig.slowest([(100 * MS, "a"), (104 * MS, "b"), (50 * MS, "c")]) is None  # 4 % over a
    assert sig.slowest([(5 * MS, "only")]) == "only"  # one: nothing compared
    assert sig.slowest([]) is None
    # b's iteration-to-iteration spread of 7 ms hides a 6 ms lead
    assert sig.slowest([(100 * MS, "a"), (106 * MS, "b")], spreads={"a": 1 * MS, "b": 7 * MS}) is None
    assert sig.slowest([(100 * MS, "a"), (106 * MS, "b")], spreads={"a": 1 * MS, "b": 5 * MS}) == "b"


# the users of the rule ---------------------------------------------------------------
def _waiting_case(slow_row: dict, other_row: dict, iterations=(1,), other_spread: dict | None = None):
    """hand-made: two ranks, one collective wait each, rank 1 the slow one (no wait), and their
    phase-table rows (``*_row``: metric -> value, the rest 100 ms / 100 MiB / 50 ms busy)."""
    import polars as pl

    from tracekit.analyze.sections import waiting_ranks

    base = {"gpu_idle_ns": 100 * MS, "kernel_busy_ns": 100 * MS, "h2d_bytes": 100 * MIB, "d2h_bytes": 0,
            "h2d_busy_ns": 50 * MS, "d2h_busy_ns": 0}
    per, table = [], []
    for it in iterations:
        for rank, gpid, row, wait in ((0, 10 << 24, other_row, 5 * MS), (1, 11 << 24, slow_row, 0)):
            per.append({"rank": rank, "global_pid": gpid, "device": rank, "iteration": it, "phase": "backward",
                        "collectives": 1, "collective_ns": 10 * MS, "wait_ns": wait, "wait_share": 0.5,
                        "last_arrivals": 1 - rank})
            vals = base | row
            if rank == 0 and other_spread:
                vals = vals | {k: vals[k] + (d if it == iterations[-1] else 0) for k, d in other_spread.items()}
            table.append({"global_pid": gpid, "device": rank, "iteration": it, "phase": "backward", **vals})
    out = waiting_ranks.slowest_ranks(pl.DataFrame(per), pl.DataFrame(table), pl.DataFrame())
    return out.row(0, named=True)


def test_waiting_rank_reason_of_8_byte_copies_is_not_said():
    # 16 copies of 8 B: 128 B in 30 us against 128 B in 20 us ("0.0 GB/s vs 0.0 GB/s"); also
    # too little time for a rate (0.1 ms)
    tiny = {"h2d_bytes": 128, "h2d_busy_ns": 30_000}
    r = _waiting_case(tiny, {"h2d_bytes": 128, "h2d_busy_ns": 20_000})
    assert r["reason_metric"] is None
    assert r["reason"] == "no significant difference in CPU-only time, compute, copy bytes or copy speed"


def test_waiting_rank_reason_at_the_edges():
    # copy speed 52.58 vs 52.62 GB/s on 100 MiB: 0.08 %, not said
    nb = 100 * MIB
    r = _waiting_case({"h2d_busy_ns": round(nb / 52.58)}, {"h2d_busy_ns": round(nb / 52.62)})
    assert r["reason_metric"] is None
    # 40 vs 52.62 GB/s: said, with both values
    r = _waiting_case({"h2d_busy_ns": round(nb / 40.0)}, {"h2d_busy_ns": round(nb / 52.62)})
    assert (r["reason_metric"], round(r["value"], 2), round(r["others_mean"], 2)) == ("copy_gbps", 40.0, 52.62)
    # compute 104.9 vs 100 ms: under 5 %; 105 ms: said
    assert _waiting_case({"kernel_busy_ns": 104_900_000}, {})["reason_metric"] is None
    assert _waiting_case({"kernel_busy_ns": 105 * MS}, {})["reason_metric"] == "kernel_busy_ns"


def test_waiting_rank_reason_beyond_the_other_ranks_spread():
    # two iterations; the other rank's compute varies by 12 ms between them, rank 1 is 10 ms above
    r = _waiting_case({"kernel_busy_ns": 110 * MS}, {}, iterations=(1, 2), other_spread={"kernel_busy_ns": 12 * MS})
    assert r["reason_metric"] is None
    r = _waiting_case({"kernel_busy_ns": 110 * MS}, {}, iterations=(1, 2), other_spread={"kernel_busy_ns": 2 * MS})
    assert r["reason_metric"] == "kernel_busy_ns"


def test_summary_slowest_rank_pid_needs_a_significant_lead():
    from tracekit.analyze.result import summarize

    def ranks(walls):
        return [{"pid": p, "iterations": [], "totals": {"update": {"wall_ns": w}}} for p, w in walls]

    assert summarize(ranks([(1, 100 * MS), (2, 104 * MS)]))["per_phase"]["update"]["slowest_rank_pid"] is None
    assert summarize(ranks([(1, 100 * MS), (2, 105 * MS)]))["per_phase"]["update"]["slowest_rank_pid"] == 2
    assert summarize(ranks([(7, 3 * MS)]))["per_phase"]["update"]["slowest_rank_pid"] == 7  # one rank


def _compare_result(a_walls, b_walls):
    """hand-made compare result: one phase, per-iteration walls of A and B (ns)."""
    def diff(a, b):
        return {"a": a, "b": b, "delta": b - a, "pct": 100 * (b - a) / a}

    ma, mb = sum(a_walls) / len(a_walls), sum(b_walls) / len(b_walls)
    per_it = [{"position": k, "a_iteration": k, "b_iteration": k, "phase": "update",
               "metrics": {"wall_ns": diff(a, b)}} for k, (a, b) in enumerate(zip(a_walls, b_walls))]
    return {"per_phase": [{"phase": "update", "metrics": {"wall_ns": diff(ma, mb)}}],
            "iteration_total": {"wall_ns": diff(ma, mb)}, "per_iteration": per_it}


def test_compare_fail_above_needs_a_regression_beyond_the_spread():
    from tracekit.render.compare import regressions

    # B 12 % slower on average, its iterations 100 and 124 ms apart by 24 ms: within the spread
    assert regressions(_compare_result([100 * MS, 100 * MS], [100 * MS, 124 * MS]), 10) == []
    # the same mean with iterations 111 and 113 ms: a regression of the phase and the iteration
    slow = regressions(_compare_result([100 * MS, 100 * MS], [111 * MS, 113 * MS]), 10)
    assert [r["what"] for r in slow] == ["update", "iteration"] and slow[0]["pct"] == pytest.approx(12.0)
    # 12 % of 5 ms is 0.6 ms: too small to be a regression
    assert regressions(_compare_result([5 * MS, 5 * MS], [5.6 * MS, 5.6 * MS]), 10) == []


def _host_frames(conc_bytes: int, conc_ns: int, alone_bytes: int, alone_ns: int, n: int = 16) -> dict:
    """hand-made: host h with GPUs 0 and 1, ``n`` concurrent H2D copies of ``conc_bytes`` taking
    ``conc_ns`` each (all inside host windows) and ``n`` alone ones of ``alone_bytes`` in
    ``alone_ns``; the frames :func:`multi_gpu_findings` reads, the bandwidth frame computed by
    host_contention.bandwidth_vs_alone from the per-copy rows."""
    import polars as pl

    from tracekit.analyze.sections import host_contention

    rows = []
    for k in range(n):
        for nbytes, ns, conc in ((conc_bytes, conc_ns, True), (alone_bytes, alone_ns, False)):
            rows.append({"host": "h", "direction": "H2D", "host_kind": "pinned", "bytes": nbytes,
                         "duration_ns": ns, "gbps": nbytes / ns, "concurrent_ns": ns if conc else 0,
                         "shared_ns": ns if conc else 0, "concurrent": conc, "alone": not conc,
                         "bucket": max(nbytes.bit_length() - 1, -1)})
    bw = host_contention.bandwidth_vs_alone(None, pl.DataFrame(rows))
    busy = 100 * MS
    return {
        "rank_ids": pl.DataFrame({"rank": [0, 1], "pid": [1, 2], "device": [0, 1], "host": ["h", "h"]}),
        "host_summary": pl.DataFrame({"host": ["h"], "gpus": [[0, 1]], "concurrent_ns": [20 * MS],
                                      "copy_busy_ns": [busy], "h2d_ns": [20 * MS], "d2h_ns": [0], "mixed_ns": [0]}),
        "host_phase": pl.DataFrame({"host": ["h"], "phase": ["update"], "iteration": [1], "concurrent_ns": [20 * MS],
                                    "h2d_ns": [20 * MS], "d2h_ns": [0]}),
        "host_bandwidth": bw,
    }


def test_host_contention_speed_needs_enough_bytes_and_5_percent():
    from tracekit.analyze.sections.multi_gpu import multi_gpu_findings

    def text(*a):
        (f,) = [f for f in multi_gpu_findings(_host_frames(*a)) if f["topic"] == "host-contention"]
        return f

    # 16 copies of 8 B at once and alone: "0.0 GB/s then vs 0.0 GB/s alone" is not said
    f = text(8, 2_000, 8, 1_000)
    assert "GB/s" not in f["text"] and "gbps" not in f["values"]
    assert "copy at once: 20.0 ms" in f["text"]  # the times stay
    # 16 x 4 MiB: 64 MiB in 16 x 100 us = 1.6 ms each side; 41.9 vs 52.4 GB/s (20 % slower): said
    f = text(4 * MIB, 100_000, 4 * MIB, 80_000)
    bw = _host_frames(4 * MIB, 100_000, 4 * MIB, 80_000)["host_bandwidth"].row(0, named=True)
    assert (bw["alone_bytes"], bw["alone_ns"]) == (16 * 4 * MIB, 16 * 80_000)  # the baseline's sample
    assert f"{4 * MIB / 100_000:.1f} GB/s then vs {4 * MIB / 80_000:.1f} GB/s alone (20 % slower" in f["text"]
    # 52.58 vs 52.62 GB/s: 0.08 %, not said
    f = text(4 * MIB, round(4 * MIB / 52.58), 4 * MIB, round(4 * MIB / 52.62))
    assert "GB/s" not in f["text"]
    # 16 x 64 KiB = 1 MiB in 16 x 6 us = 96 us of copy time on each side: too little time
    f = text(64 << 10, 6_000, 64 << 10, 4_000)
    assert "GB/s" not in f["text"]
    # 16 x 64 KiB in 16 x 7 us = 112 us against 16 x 6.5 us = 104 us (9.4 vs 10.1 GB/s, 7 %): said
    f = text(64 << 10, 7_000, 64 << 10, 6_500)
    assert "9.4 GB/s then vs 10.1 GB/s alone (7 % slower" in f["text"]


def _pageable_frames(nbytes: int, ns: int, pinned_gbps: float, ref_bytes: int, ref_ns: int) -> dict:
    """hand-made frames of one pageable H2D group in update and its pinned reference."""
    import polars as pl

    pinned_ns = nbytes / pinned_gbps
    row = {"global_pid": 5 << 24, "device": 0, "phase": "update", "sub_phase": "(none)", "direction": "H2D",
           "count": 4, "bytes": nbytes, "copy_ns": ns, "gbps": nbytes / ns, "pinned_gbps": pinned_gbps,
           "pinned_ns": pinned_ns, "saving_ns": max(ns - pinned_ns, 0), "blocking_count": 0, "blocking_host_ns": 0,
           "host_ns": 0}
    ref = {"global_pid": 5 << 24, "device": 0, "phase": "update", "sub_phase": "(none)", "direction": "H2D",
           "ref_bytes": ref_bytes, "ref_ns": ref_ns}
    return {"pageable_phase": pl.DataFrame([row]), "pageable_reference": pl.DataFrame([ref])}


def test_pageable_finding_needs_a_real_pinned_reference():
    from tracekit.analyze.sections.findings import build_findings

    def found(*a):
        return [f for f in build_findings(_pageable_frames(*a), {(5 << 24, 0): {"update": 1}}) if f["topic"] == "pageable"]

    # 100 MiB pageable at 10 GB/s against pinned at 50 GB/s measured on 1 GiB: said
    (f,) = found(100 * MIB, 100 * MIB // 10, 50.0, 1 << 30, (1 << 30) // 50)
    assert f"at {100 * MIB / (100 * MIB // 10):.1f} GB/s vs 50.0 GB/s for pinned copies" in f["text"]
    # the same, but the pinned speed rests on 16 copies of 8 B: not said
    assert found(100 * MIB, 100 * MIB // 10, 50.0, 128, 3) == []
    # or on 16 MiB in 90 us: too little copy time (0.1 ms); in 0.4 ms: said
    assert found(100 * MIB, 100 * MIB // 10, 50.0, 16 * MIB, 90_000) == []
    assert len(found(100 * MIB, 100 * MIB // 10, 50.0, 16 * MIB, 400_000)) == 1
    # pageable 2 % slower than pinned (a 2 ms "saving" on 100 ms of copies): not said
    assert found(100 * MIB, 100 * MS, 100 * MIB / (98 * MS), 1 << 30, 10 * MS) == []


def test_contention_slowdown_needs_5_percent_and_1_ms_each_side():
    import polars as pl

    from tracekit.analyze.sections.findings import build_findings

    def text(slowdown, contention_ns, busy_ns=20 * MS):
        row = {"global_pid": 5 << 24, "device": 0, "phase": "backward", "copy_busy_ns": busy_ns, "windows": 3,
               "same_direction_ns": contention_ns, "bidirectional_ns": 0, "contention_ns": contention_ns,
               "contention_share": contention_ns / busy_ns, "median_slowdown": slowdown}
        (f,) = [f for f in build_findings({"contention_phase": pl.DataFrame([row])}, {(5 << 24, 0): {}})
                if f["topic"] == "contention"]
        return f["text"]

    assert "copies ran 1.5x slower than uncontended (median)" in text(1.5, 5 * MS)
    assert "slower" not in text(1.04, 5 * MS)  # under 5 %
    t = sig.MIN_RATE_NS
    assert "slower" not in text(1.5, t - 1)  # under 0.1 ms of contended copy time
    assert "slower" not in text(1.5, 5 * MS, busy_ns=5 * MS + t - 1)  # under 0.1 ms uncontended
    assert "slower" in text(1.05, t, busy_ns=2 * t)  # at the edges


def test_compare_explains_only_a_significant_difference():
    from rich.console import Console

    from tracekit.render.compare import _render_config

    def said(a_walls, b_walls):
        res = _compare_result(a_walls, b_walls)
        d = res["iteration_total"]["wall_ns"]["delta"]
        res["explanations"] = [{"key": "zero_optimization.offload_optimizer.pin_memory", "a": True, "b": False,
                                "scenario": "pin_memory", "applicable": True, "why_not": None,
                                "predicted_cost_ms": 9.0, "confidence": "high", "phases": {}, "advice": None,
                                "measured_iteration_delta_ms": d / 1e6}]
        con = Console(record=True, width=400, color_system=None)
        _render_config(res, con)
        return con.export_text()

    assert said([100 * MS, 100 * MS], [111 * MS, 113 * MS]).startswith("explained by advice: ")
    # 12 ms slower on average, but B's iterations are 24 ms apart: nothing significant to explain
    out = said([100 * MS, 100 * MS], [100 * MS, 124 * MS])
    assert out.startswith("advice on a differing key (B - A is no significant difference): ")
    assert "measured B - A: +12.0 ms per iteration" in out


def test_waiting_rank_finding_needs_the_others_to_wait_significantly_longer():
    import polars as pl

    from tracekit.analyze.sections.multi_gpu import multi_gpu_findings

    def found(own_ns, others_ns, ranks=2):
        slow = pl.DataFrame([{"iteration": 1, "phase": "backward", "rank": 1, "global_pid": 2 << 24, "device": 1,
                              "wait_ns": own_ns, "others_wait_ns": others_ns, "ranks": ranks, "reason": "x",
                              "reason_metric": None, "value": None, "others_mean": None}])
        frames = {"rank_ids": pl.DataFrame({"rank": [0, 1], "pid": [1, 2], "device": [0, 1], "host": ["h", "h"]}),
                  "host_summary": pl.DataFrame(schema={"host": pl.String, "gpus": pl.List(pl.Int64)}),
                  "waiting_slowest": slow}
        return [f for f in multi_gpu_findings(frames) if f["topic"] == "waiting-rank"]

    assert len(found(2 * MS, 10 * MS)) == 1  # nsys-ai's 2.5 vs 10.9 ms, in round numbers
    assert found(9.6e6, 10 * MS) == []  # 0.4 ms more: too small
    assert found(100 * MS, 104 * MS) == []  # 4 %: under 5 %
    # three ranks: the two others waited 20 ms together, 10 ms each, against the rank's own 9 ms
    assert len(found(9 * MS, 20 * MS, ranks=3)) == 1
    assert found(9.5e6, 20 * MS, ranks=3) == []  # 10 vs 9.5 ms: 0.5 ms
