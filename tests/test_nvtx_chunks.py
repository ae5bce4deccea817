"""NVTX ranges read in rowid chunks, and the nesting passes over them (issue 13: the phase
model's memory must not grow with the trace). Checked against plain SQL on the zero-3 cut and
against brute force on random nested ranges."""

from __future__ import annotations

import sqlite3

import numpy as np
import polars as pl
import pytest
from conftest import ZERO3_CUT

from tracekit.analyze.model import nvtx
from tracekit.analyze.trace.export import Export


def _sql_ranges() -> list[tuple]:
    """(range_id, start, end, global_tid, domain, name) of the usable push/pop and start/end
    ranges, names from text or StringIds, domains from the domain-create rows, plain SQL."""
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    try:
        (stop,) = con.execute("SELECT max(stopTime) FROM ANALYSIS_DETAILS").fetchone()
        (duration,) = con.execute("SELECT max(duration) FROM ANALYSIS_DETAILS").fetchone()
        return con.execute(
            f"""SELECT n.rowid, n.start, coalesce(n."end", {stop}), n.globalTid,
                       coalesce((SELECT d.text FROM NVTX_EVENTS d WHERE d.eventType = 75
                                 AND d.domainId = coalesce(n.domainId, 0) ORDER BY d.rowid DESC LIMIT 1), ''),
                       coalesce(n.text, s.value, '')
                FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                WHERE n.eventType IN (59, 60) AND n.start IS NOT NULL
                  AND (n."end" IS NULL OR n."end" >= n.start OR n."end" = {duration})"""
        ).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def sql_ranges() -> tuple[tuple, ...]:
    """:func:`_sql_ranges`, queried once for the chunk sizes below (~4 s of CPU: the domain
    subquery runs per row)."""
    return tuple(_sql_ranges())


@pytest.mark.parametrize("chunk_rows", [97, 4096, 1_000_000])
def test_chunked_ranges_equal_plain_sql(monkeypatch, chunk_rows, sql_ranges):
    """Whatever the chunk size (97 rowids: a domain-create row and the ranges of a domain in
    different chunks), the rows, their order (thread, start, -end) and their names and domains
    are those of plain SQL."""
    monkeypatch.setattr(nvtx, "_CHUNK_ROWS", chunk_rows)
    want = list(sql_ranges)
    want.sort(key=lambda r: (r[3], r[1], -r[2], r[0]))
    with Export.open(ZERO3_CUT, cache=False) as ex:
        got = nvtx.load_ranges(ex)
        assert ex.set_aside["nvtx_unusable_ranges"] == 0
    assert got.height == len(want) > 10_000
    rows = list(got.select("range_id", "start", "end", "global_tid", "domain", "name").iter_rows())
    assert rows == want
    assert {r[4] for r in want} >= {"DeepSpeed"}  # the domain names did resolve


def _random_nested(rng, threads: int = 3) -> pl.DataFrame:
    """Properly nested ranges on a few threads (children strictly inside their parent)."""
    rows = []

    def grow(tid, lo, hi, depth):
        t = lo
        while depth < 5 and t < hi - 2 and rng.random() < 0.7:
            s = int(rng.integers(t, hi - 1))
            e = int(rng.integers(s + 1, hi + 1))
            rows.append((tid, s, e))
            grow(tid, s, e, depth + 1)
            t = e
    for tid in range(threads):
        grow(tid, 0, 200, 0)
    f = pl.DataFrame(rows, schema={"global_tid": pl.Int64, "start": pl.Int64, "end": pl.Int64}, orient="row")
    return f.sort(["global_tid", "start", "end"], descending=[False, False, True], maintain_order=True)


def test_nest_and_innermost_match_brute_force():
    rng = np.random.default_rng(7)
    for _ in range(60):
        f = _random_nested(rng)
        n = f.height
        nested = nvtx.nest(f)
        tid, s, e = (f[c].to_list() for c in ("global_tid", "start", "end"))
        # parent: the latest earlier range of the thread that contains the range; depth: chain length
        parent = [max((j for j in range(i) if tid[j] == tid[i] and s[j] <= s[i] and e[j] >= e[i]), default=-1)
                  for i in range(n)]
        depth = []
        for i in range(n):
            d, p = 0, parent[i]
            while p >= 0:
                d, p = d + 1, parent[p]
            depth.append(d)
        assert nested["parent"].to_list() == parent
        assert nested["depth"].to_list() == depth
        # innermost open range at t on a thread, some ranges excluded (their ancestors still count)
        exclude = rng.random(n) < 0.3
        qtid = rng.integers(0, 3, 50)
        qt = rng.integers(-5, 210, 50)
        got = nvtx.innermost_at(nested, qtid, qt, exclude=exclude)
        for k in range(50):
            open_ = [i for i in range(n) if tid[i] == qtid[k] and s[i] <= qt[k] < e[i] and not exclude[i]]
            want = max(open_, key=lambda i: (depth[i], i), default=-1)
            assert got[k] == want, (k, qtid[k], qt[k])
