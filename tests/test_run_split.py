"""Proof by splitting (issue 24): a multi-GPU export split into one file per process
(benchmarks/split_ranks.py) gives, in the top-level "run" of the folder, the waiting ranks and
the host contention of the export itself, exactly (the splits share one clock); and the clock
alignment of run_clock on hand-made end times, and different runs kept apart."""

import importlib.util
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from conftest import PUBLIC
from synthetic import SyntheticTrace, gtid
from test_waiting_ranks import _skew_trace

from tracekit.analyze import multi, run_clock

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("split_ranks", ROOT / "benchmarks" / "split_ranks.py")
split_ranks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(split_ranks)
MS = 1_000_000
FAST = {"sections": ()}  # the multi-GPU frames are computed for every analysis


def _copy_back_trace(path: Path) -> Path:
    """Both GPUs copy back 50 MB of pageable H2D at once in the update (10 ms together), then
    alone 7 ms each (the trace of test_waiting_ranks.test_host_contention_finding), plus an
    AllGather per rank so that waiting ranks are there too."""
    t = SyntheticTrace()
    for pid in (1, 2):
        tid = gtid(pid, 1)
        t.range("DeepSpeedEngine.backward", 0, 10 * MS, tid, "DeepSpeed")
        t.range("DeepSpeedZeroOptimizer_Stage3.step", 10 * MS, 60 * MS, tid, "DeepSpeed")
        dev = pid - 1
        t.kernel(1 * MS + dev * 300_000, 3 * MS, pid=pid, tid=1, launch=MS // 2, device=dev, stream=20,
                 name="ncclDevKernel_AllGather_RING_LL(x)")
        t.copy(12 * MS, 22 * MS, 50_000_000, 1, pid=pid, tid=1, launch=11 * MS, device=dev, src=0, dst=2)
        start = (30 + 10 * dev) * MS
        t.copy(start, start + 7 * MS, 50_000_000, 1, pid=pid, tid=1, launch=start - 1000, device=dev, src=0, dst=2)
    return t.write(path)


def _check(whole: Path, tmp_path: Path) -> dict:
    parts = split_ranks.split(whole, tmp_path / "split")
    assert len(parts) == 2
    for p in parts:  # each split holds one process's kernels only (plain SQL)
        with sqlite3.connect(p) as con:
            assert con.execute("SELECT COUNT(DISTINCT globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == 1
    one = multi.analyze_one(whole, FAST, cache=False)
    run = multi.analyze_many([tmp_path / "split"], FAST, cache=False, jobs=1, want="compact")["run"]
    assert run["one_run"] is True and run["files"] == [str(p) for p in parts]
    assert run["clock"]["method"] == "one clock" and run["clock"]["residual_skew_ns"] == 0
    assert [f["shift_ns"] for f in run["clock"]["files"]] == [0, 0]
    assert run["waiting_ranks"] == one["waiting_ranks"]
    assert [h["host"] for h in run["hosts"]] == sorted({h["host"] for h in run["hosts"]})
    got = {h["host"]: h["host_contention"] for h in run["hosts"] if h["host_contention"] is not None}
    assert got == {h["host"]: h["host_contention"] for h in one["hosts"]}
    topics = ("host-contention", "communication", "waiting-rank")
    assert run["findings"] == [f for f in one["findings"] if f["topic"] in topics]
    return run


def test_split_waits_equal_the_export(tmp_path):
    run = _check(_skew_trace(tmp_path, "synthetic_split_waits.sqlite"), tmp_path)
    per = {r["rank"]: r["wait_ns"] for r in run["waiting_ranks"]["per_rank"]}
    assert per == {0: 2500, 1: 200}  # test_waiting_ranks.test_waits_match_hand_values, by hand
    assert run["waiting_ranks"]["unmatched_collectives"] == 1


def test_split_host_contention_equals_the_export(tmp_path):
    run = _check(_copy_back_trace(tmp_path / "synthetic_split_copy_back.sqlite"), tmp_path)
    (host,) = run["hosts"]
    assert [r["rank"] for r in host["ranks"]] == [0, 1] and run["ranks_per_host"] == {host["host"]: 2}
    hc = host["host_contention"]
    assert [f["topic"] for f in run["findings"]] == ["host-contention", "communication", "communication"]
    assert hc["concurrent_ns"] == 10 * MS == hc["h2d_ns"]  # the two copy-backs in flight together
    assert hc["copy_busy_ns"] == 10 * MS + 2 * 7 * MS
    per = {r["rank"]: r["wait_ns"] for r in run["waiting_ranks"]["per_rank"]}
    assert per == {0: 300_000, 1: 0}  # rank 1's AllGather starts 0.3 ms later


def test_split_public_two_gpu(tmp_path):
    path = PUBLIC / "nsys-ai__mfu_2gpu_before.sqlite"
    if not path.exists():
        pytest.skip(f"{path} not present")
    _check(path, tmp_path)


def test_different_runs_are_not_joined(tmp_path):
    paths = []
    for i, utc in enumerate((1_796_000_000_000_000_000, 1_796_000_000_000_000_000 + 600 * 10**9)):
        p = _skew_trace(tmp_path, f"synthetic_other_run{i}.sqlite")
        with sqlite3.connect(p) as con:
            con.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, "
                        "localTime TEXT)")
            con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (utc,))
        paths.append(p)
    run = multi.analyze_many(paths, FAST, cache=False, jobs=1, want="compact")["run"]
    assert run["one_run"] is False and "2 different runs" in run["note"]
    assert run["hosts"] is None and run["waiting_ranks"] is None
    assert run["run_groups"] == [[str(paths[0])], [str(paths[1])]]


# --------------------------------------------------------------------------- run_clock by hand
def _keyed(rows):
    return pl.DataFrame(rows, schema={"part": pl.Int64, "comm_stream": pl.Int64, "collective": pl.String,
                                      "seq": pl.Int64, "end": pl.Int64}, orient="row")


def test_alignment_by_collective_ends_with_residual():
    # export 1's clock reads 1 ms ahead of export 0's capture start (both on hosts of their own);
    # its three AllReduces end 5.1, 5.3 and 5.2 ms after export 0's ones on its own clock
    clocks = [{"utc_start_ns": 10 * MS, "host": "a"}, {"utc_start_ns": 11 * MS, "host": "b"}]
    ends0 = [20 * MS, 30 * MS, 40 * MS]
    lag = [5_100_000, 5_300_000, 5_200_000]
    rows = [(0, 0, "AllReduce", k, e) for k, e in enumerate(ends0)]
    rows += [(1, 0, "AllReduce", k, e + d - MS) for k, (e, d) in enumerate(zip(ends0, lag))]  # own clock
    rows += [(1, 0, "SendRecv", 0, 99 * MS)]  # not a collective that ends together: not used
    out = run_clock.align(clocks, _keyed(rows), 0)
    assert out["method"] == "collective end times" and out["collectives_used"] == 3
    assert out["start_offset_ns"] == [0, MS]
    assert out["correction_ns"] == [0, -5_200_000]  # the median lag
    assert out["shift_ns"] == [0, MS - 5_200_000]
    # after alignment the ends are 100, 100 and 0 us apart: median 100 us, largest 100 us
    assert out["residual_skew_ns"] == 100_000 and out["max_end_spread_ns"] == 100_000


def test_unlinked_group_keeps_its_capture_start():
    clocks = [{"utc_start_ns": 0, "host": "a"}, {"utc_start_ns": 7, "host": "b"}, {"utc_start_ns": 9, "host": "c"}]
    rows = [(0, 0, "AllGather", 0, 100), (1, 0, "AllGather", 0, 50)]  # export 2 has no collective
    out = run_clock.align(clocks, _keyed(rows), 0)
    assert out["aligned_by"] == ["collective end times", "collective end times", "capture start"]
    assert out["correction_ns"] == [0, 100 - (50 + 7), 0] and out["shift_ns"] == [0, 50, 9]
    assert out["residual_skew_ns"] == 0


def test_one_clock_group_is_not_shifted():
    clocks = [{"utc_start_ns": 5, "host": "a"}] * 3
    out = run_clock.align(clocks, _keyed([(0, 0, "AllReduce", 0, 10), (2, 0, "AllReduce", 0, 99)]), 1)
    assert out["method"] == "one clock" and out["shift_ns"] == [0, 0, 0] and out["residual_skew_ns"] == 0


def test_run_part_read_back_from_the_cache(tmp_path):
    """A second analysis of an export (its result from the cache) reads its run part from the
    cache too: no phase model is built, and the frames are the ones computed the first time."""
    from tracekit.analysis import analyze
    from tracekit.analyze import run_parts

    path = _copy_back_trace(tmp_path / "synthetic_cached_part.sqlite")
    first = run_parts.run_part(analyze(path))
    again = analyze(path)
    assert "model" not in again._parts  # the result came from the cache
    part = run_parts.run_part(again)
    assert "model" not in again._parts
    for name in run_parts.FRAMES:
        assert part[name].equals(first[name]), name
    assert part["collectives"]["start"].to_list() == [1 * MS, 1 * MS + 300_000]  # by hand, the two AllGathers


def test_run_from_workers_equals_in_process(tmp_path):
    """The run parts come back from worker processes and from Dask workers (pickled polars
    frames) and give the run computed in this process."""
    parts = split_ranks.split(_copy_back_trace(tmp_path / "synthetic_workers.sqlite"), tmp_path / "split")
    here = multi.analyze_many(parts, FAST, cache=False, jobs=1, want="compact")["run"]
    assert here["waiting_ranks"]["per_rank"]  # something to compare
    assert multi.analyze_many(parts, FAST, cache=False, jobs=2, want="json")["run"] == here
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as c:
        assert multi.analyze_many(parts, FAST, cache=False, dask=c.scheduler_address)["run"] == here


def test_groups_linked_through_another_group():
    # export 2 shares a collective with export 1 only: aligned in the second round, through it
    clocks = [{"utc_start_ns": 0, "host": "a"}, {"utc_start_ns": 7, "host": "b"}, {"utc_start_ns": 9, "host": "c"}]
    rows = [(0, 0, "AllReduce", 0, 100), (1, 0, "AllReduce", 0, 50),
            (1, 1, "AllReduce", 0, 200), (2, 1, "AllReduce", 0, 300)]
    out = run_clock.align(clocks, _keyed(rows), 0)
    assert out["correction_ns"] == [0, 43, (200 + 50) - (300 + 9)]  # 100 - 57; then 250 - 309
    assert out["shift_ns"] == [0, 50, -50] and out["aligned_by"] == ["collective end times"] * 3
    assert out["collectives_used"] == 2 and out["residual_skew_ns"] == 0


def test_terminal_says_the_run(tmp_path):
    import os

    from conftest import run_cli

    parts = split_ranks.split(_copy_back_trace(tmp_path / "synthetic_terminal.sqlite"), tmp_path / "split")
    rc, out, err = run_cli("analyze", *map(str, parts), "--no-cache", "--jobs", "1",
                           env={**os.environ, "COLUMNS": "400"})
    assert rc == 0, err
    lines = out.splitlines()
    assert "one run: 2 ranks on 1 host (host 0: 2); clocks: one clock (residual skew 0 ns)" in lines
    [contention] = [x for x in lines if x.startswith("run: host host 0: GPUs 0, 1 copy at once: 10.0 ms")]
    assert "(30 % slower)" in contention  # 5.0 GB/s together vs 50 MB in 7 ms alone


def test_split_with_clocks_apart_and_no_host_names(tmp_path):
    """The splits given capture starts 5 ms apart (as two nsys sessions would), without host
    names: each split is its own host (named after its file), the AllGathers' common ends take
    the 5 ms back exactly, and the waits are the export's."""
    whole = _skew_trace(tmp_path, "synthetic_split_apart.sqlite")
    parts = split_ranks.split(whole, tmp_path / "split")
    for p, utc in zip(parts, (1_796_000_000_000_000_000, 1_796_000_000_000_000_000 + 5 * MS)):
        with sqlite3.connect(p) as con:
            con.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, "
                        "localTime TEXT)")
            con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (utc,))
    run = multi.analyze_many(parts, FAST, cache=False, jobs=1, want="compact")["run"]
    c = run["clock"]
    assert c["method"] == "collective end times" and c["residual_skew_ns"] == 0 and c["collectives_used"] == 3
    assert [f["start_offset_ns"] for f in c["files"]] == [0, 5 * MS]
    assert [f["correction_ns"] for f in c["files"]] == [0, -5 * MS] and [f["shift_ns"] for f in c["files"]] == [0, 0]
    assert [h["host"] for h in run["hosts"]] == ["rank0.sqlite: host 0", "rank1.sqlite: host 0"]
    assert run["waiting_ranks"] == multi.analyze_one(whole, FAST, cache=False)["waiting_ranks"]
