"""The phase model's two large reads (NVTX ranges, CUDA runtime calls): started in background
threads by :func:`tracekit.analyze.model.phases.build`, and the NVTX ranges read once per export
(issue 13). Checked against plain SQL on the zero-3 cut."""

from __future__ import annotations

import sqlite3

import polars as pl
import pytest
from conftest import ZERO3_CUT

from tracekit.analyze.model import gpu_ops, nvtx
from tracekit.analyze.trace.export import Export


def _sql(query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def test_prefetched_ranges_are_the_nvtx_rows_and_read_once():
    (duration,) = _sql("SELECT max(duration) FROM ANALYSIS_DETAILS")[0]
    want = sorted(r[0] for r in _sql(
        'SELECT rowid FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND start IS NOT NULL '
        f'AND ("end" IS NULL OR "end" >= start OR "end" = {duration})'))
    with Export.open(ZERO3_CUT, cache=False) as ex:
        assert nvtx.prefetch_ranges(ex) is True
        first = nvtx.load_ranges(ex)
        assert sorted(first["range_id"].to_list()) == want
        assert nvtx.load_ranges(ex) is first  # kept with the export: not read nor built again
        assert nvtx.prefetch_ranges(ex) is False  # nothing left to read
        assert ex._pending == {}


def test_prefetched_runtime_is_the_runtime_rows():
    want = sorted(_sql('SELECT correlationId, start, "end", nameId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME '
                       'WHERE correlationId > 0'))
    with Export.open(ZERO3_CUT, cache=False) as ex:
        assert gpu_ops.prefetch_runtime(ex, launches_only=False) is True
        rt = gpu_ops.load_runtime(ex)
        assert ex._pending == {}  # the background read was taken over
    got = sorted(rt.select("correlation_id", "api_start", "api_end", "api_name_id", "launch_tid").iter_rows())
    assert got == want  # correlation ids are unique per process in this trace: nothing dropped
    assert rt["global_pid"].to_list() == [t >> 24 << 24 for t in rt["launch_tid"].to_list()]


def test_prefetched_launches_are_the_runtime_rows_of_gpu_ops():
    """The phase model reads only the calls that share a correlation id with a kernel, memcpy
    or memset (issue 13: a quarter of the runtime rows); plain SQL picks the same rows."""
    want = sorted(_sql(
        'SELECT correlationId, start, "end", nameId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME '
        'WHERE correlationId > 0 AND correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL '
        'UNION SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION SELECT correlationId FROM '
        'CUPTI_ACTIVITY_KIND_MEMSET)'))
    (n_all,) = _sql("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId > 0")[0]
    assert 0 < len(want) < n_all  # the filter does drop calls in this trace
    with Export.open(ZERO3_CUT, cache=False) as ex:
        assert gpu_ops.prefetch_runtime(ex) is True  # the launches are what build() prefetches
        rt = gpu_ops.load_runtime(ex, launches_only=True)
        assert ex._pending == {}
    got = sorted(rt.select("correlation_id", "api_start", "api_end", "api_name_id", "launch_tid").iter_rows())
    assert got == want


def test_gpu_ops_launch_columns_match_a_plain_sql_join():
    """``launch``, ``api_end``, ``api_name_id`` and ``launch_tid`` of every kernel and copy, from a
    plain SQL join of the GPU tables to CUPTI_ACTIVITY_KIND_RUNTIME on (process, correlation id)."""
    want = sorted(_sql(
        'SELECT g.start, g.correlationId, coalesce(r.start, g.start), r."end", r.nameId, r.globalTid FROM '
        '(SELECT start, globalPid, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL '
        ' SELECT start, globalPid, correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL '
        ' SELECT start, globalPid, correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET) g '
        'LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId AND r.correlationId > 0 '
        'AND (r.globalTid >> 24) << 24 = g.globalPid'))
    with Export.open(ZERO3_CUT, cache=False) as ex:
        ops = gpu_ops.load_gpu_ops(ex)
    got = sorted(ops.select("start", "correlation_id", "launch", "api_end", "api_name_id", "launch_tid").iter_rows(),
                 key=lambda r: tuple(-1 if v is None else v for v in r))
    want = sorted(want, key=lambda r: tuple(-1 if v is None else v for v in r))
    assert got == want
    assert sum(r[3] is not None for r in got) > 0.9 * len(got)  # nearly every op has its launching call


@pytest.mark.parametrize("chunk_rows", [7, 1000])
def test_launches_read_in_small_chunks_are_the_plain_sql_rows(monkeypatch, chunk_rows):
    """The runtime table read in rowid chunks, each cut to the launches before the next is read
    (issue 24), gives the rows of the plain SQL filter, whatever the chunk size; a correlation id
    given twice within a process keeps its first call."""
    monkeypatch.setattr(gpu_ops, "_CHUNK_ROWS", chunk_rows)
    want = sorted(_sql(
        'SELECT correlationId, start, "end", nameId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME '
        'WHERE correlationId > 0 AND correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL '
        'UNION SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION SELECT correlationId FROM '
        'CUPTI_ACTIVITY_KIND_MEMSET)'))
    with Export.open(ZERO3_CUT, cache=False) as ex:
        rt = gpu_ops.load_runtime(ex, launches_only=True)
        ids = pl.Series(sorted({r[0] for r in want}))
        assert rt.equals(gpu_ops.load_runtime(ex, launches_only=True, ids=ids))
    got = sorted(rt.select("correlation_id", "api_start", "api_end", "api_name_id", "launch_tid").iter_rows())
    assert got == want


def test_repeated_correlation_id_keeps_the_first_call(tmp_path):
    """A synthetic export (built here) whose runtime table gives one
    correlation id twice in one process: the first call in table order is the launch."""
    import sqlite3

    db = tmp_path / "synthetic_repeated_correlation.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute('CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, "end" INT, globalTid INT, '
                'correlationId INT, nameId INT)')
    tid = (7 << 24) + 3
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?)",
                    [(100, 110, tid, 5, 1), (200, 230, tid, 5, 2), (300, 305, tid, 6, 1), (400, 410, tid, 0, 1)])
    con.commit()
    con.close()
    with Export.open(db, cache=False) as ex:
        rt = gpu_ops.load_runtime(ex, launches_only=True, ids=pl.Series([5, 6]))
    assert rt.select("correlation_id", "api_start", "api_end").rows() == [(5, 100, 110), (6, 300, 305)]
