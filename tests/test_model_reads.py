"""The phase model's two large reads (NVTX ranges, CUDA runtime calls): started in background
threads by :func:`tracekit.analyze.model.phases.build`, and the NVTX ranges read once per export
(issue 13). Checked against plain SQL on the zero-3 cut."""

from __future__ import annotations

import sqlite3

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
        assert gpu_ops.prefetch_runtime(ex) is True
        rt = gpu_ops.load_runtime(ex)
        assert ex._pending == {}  # the background read was taken over
    got = sorted(rt.select("correlation_id", "api_start", "api_end", "api_name_id", "launch_tid").iter_rows())
    assert got == want  # correlation ids are unique per process in this trace: nothing dropped
    assert rt["global_pid"].to_list() == [t >> 24 << 24 for t in rt["launch_tid"].to_list()]
