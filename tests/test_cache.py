"""The Parquet cache beside a trace and the SQLite->Arrow reader: same frames as a cold read,
invalidated when the trace changes, never writing into the trace."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3

import polars as pl
import pytest

from tracekit.analyze.model.gpu_ops import load_gpu_ops
from tracekit.analyze.model.nvtx import load_ranges
from tracekit.analyze.multi import analyze_one
from tracekit.analyze.result import analyze_export
from tracekit.analyze.trace import fetch as export_mod
from tracekit.analyze.trace.cache import MANIFEST, SUFFIX, TraceCache, default_cache_dir
from tracekit.analyze.trace.export import Export
from tracekit.analyze.trace.fetch import _inline_params
from tracekit.cli import main


@pytest.fixture
def trace(tmp_path, zero3_cut, monkeypatch):
    monkeypatch.delenv("TRACEKIT_CACHE_DIR", raising=False)
    p = tmp_path / "run.sqlite"
    shutil.copy(zero3_cut, p)
    return p


def _sha(p) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _load_all(path, cache):
    with Export.open(path, cache=cache) as e:
        frames = (load_gpu_ops(e), load_ranges(e))
        result = analyze_export(e)
        stats = (e.cache.hits, e.cache.misses, e.cache.writes) if e.cache else None
    return frames, result, stats


def test_cache_hit_equals_cold_load(trace):
    cold_frames, cold_result, _ = _load_all(trace, cache=False)
    first_frames, first_result, (hits1, misses1, writes1) = _load_all(trace, cache=True)
    assert misses1 > 0 and writes1 == misses1  # (hits1: queries repeated within the run)
    again_frames, again_result, (hits2, misses2, writes2) = _load_all(trace, cache=True)
    assert misses2 == 0 and writes2 == 0 and hits2 == hits1 + misses1
    for cold, first, again in zip(cold_frames, first_frames, again_frames):
        assert cold.equals(first) and cold.equals(again)
        assert cold.schema == again.schema
    assert cold_result == first_result == again_result
    d = trace.with_name(trace.name + SUFFIX)
    assert d.is_dir() and (d / MANIFEST).exists() and list(d.glob("q-*.parquet"))


def test_cache_never_writes_into_the_trace(trace):
    before = (_sha(trace), os.stat(trace).st_mtime_ns, sorted(p.name for p in trace.parent.iterdir()))
    analyze_one(trace, cache=True)
    analyze_one(trace, cache=True)
    assert _sha(trace) == before[0]
    assert os.stat(trace).st_mtime_ns == before[1]
    # only the cache directory appeared: no -journal, -wal or -shm beside the trace
    assert sorted(p.name for p in trace.parent.iterdir()) == sorted(before[2] + [trace.name + SUFFIX])


def test_cache_invalidated_by_touch(trace):
    _load_all(trace, cache=True)
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    _, _, (hits, misses, writes) = _load_all(trace, cache=True)
    assert misses > 0 and writes == misses
    _, _, (hits_cold, misses_cold, _) = _load_all(trace, cache=True)
    assert misses_cold == 0


def test_cache_invalidated_by_changed_content(trace):
    base = analyze_one(trace, cache=True)
    assert analyze_one(trace, cache=True) == base  # served from the cache
    # change the trace: drop the kernels of the last iteration's update
    last_update = max(
        (p for r in base["ranks"] for it in r["iterations"] for p in it["phases"] if p["phase"] == "update"),
        key=lambda p: p["start_ns"],
    )
    with sqlite3.connect(trace) as conn:
        n = conn.execute(
            "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE start >= ? AND start < ?",
            (last_update["start_ns"], last_update["end_ns"]),
        ).rowcount
    conn.close()
    assert n > 0
    changed = analyze_one(trace, cache=True)
    fresh = analyze_one(trace, cache=False)
    assert changed == fresh
    assert changed != base


def test_result_cache_and_no_cache(trace, tmp_path):
    first = analyze_one(trace, {"phase": "update"}, cache=True)
    tc = TraceCache(trace)
    from tracekit.options import Options

    key = tc.result_key(Options(phase="update").key(), str(trace))  # every option keys a result
    assert tc.get_result(key) == first
    assert analyze_one(trace, {"phase": "update"}, cache=True) == first
    other = tmp_path / "other.sqlite"
    shutil.copy(trace, other)
    assert analyze_one(other, {"phase": "update"}, cache=False) | {"trace": str(trace)} == first
    assert analyze_one(trace, {"phase": "update"}, cache=True) == first
    assert not other.with_name(other.name + SUFFIX).exists()


def test_corrupt_entry_falls_back_to_the_trace(trace):
    _, cold_result, _ = _load_all(trace, cache=True)
    d = trace.with_name(trace.name + SUFFIX)
    for p in d.glob("q-*.parquet"):
        p.write_bytes(b"not parquet")
    _, result, (hits, misses, _) = _load_all(trace, cache=True)
    assert misses > 0
    assert result == cold_result


def test_cache_dir_env_root(trace, tmp_path, monkeypatch):
    root = tmp_path / "caches"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(root))
    d = default_cache_dir(trace)
    assert d.parent == root and d.name.endswith(trace.name + SUFFIX)
    analyze_one(trace, cache=True)
    assert (d / MANIFEST).exists()
    assert not trace.with_name(trace.name + SUFFIX).exists()


def test_cli_cache_flags(trace, capsys):
    assert main(["analyze", str(trace), "--json", "--no-cache"]) == 0
    assert not trace.with_name(trace.name + SUFFIX).exists()
    out1 = capsys.readouterr().out
    assert main(["analyze", str(trace), "--json"]) == 0
    out2 = capsys.readouterr().out
    assert main(["analyze", str(trace), "--json"]) == 0
    out3 = capsys.readouterr().out
    assert out2 == out3  # the second run is served from the cache, byte for byte
    # (the phase breakdown is deterministic; some tables order ties arbitrarily run to run)
    def phases(out):
        return [{k: r[k] for k in ("pid", "device", "iterations", "totals")} for r in json.loads(out)["ranks"]]

    assert phases(out1) == phases(out2)
    assert trace.with_name(trace.name + SUFFIX).is_dir()


def test_adbc_and_sqlite3_readers_agree(trace, monkeypatch):
    pytest.importorskip("adbc_driver_sqlite")
    got = {}
    for reader in ("sqlite3", "adbc"):
        monkeypatch.setattr(export_mod, "_READER", reader)
        got[reader] = _load_all(trace, cache=False)
    (f1, r1, _), (f2, r2, _) = got["sqlite3"], got["adbc"]
    for a, b in zip(f1, f2):
        assert a.schema == b.schema and a.equals(b)
    assert r1 == r2


def test_adbc_falls_back_on_mixed_types(tmp_path, zero3_cut, monkeypatch):
    pytest.importorskip("adbc_driver_sqlite")
    p = tmp_path / "mixed.sqlite"
    shutil.copy(zero3_cut, p)
    with sqlite3.connect(p) as conn:  # ADBC infers INT64 from the first rows, then meets text
        conn.execute("CREATE TABLE T (a INTEGER, b TEXT)")
        conn.executemany("INSERT INTO T VALUES (?, ?)", [(None, None)] * 3000 + [(1, "x"), (2, "y")])
    conn.close()
    monkeypatch.setattr(export_mod, "_READER", "adbc")
    with Export.open(p) as e:
        got = e.query("SELECT a, b FROM T WHERE a IS NOT NULL OR ? = 1", (1,), {"a": pl.Int64, "b": pl.String})
    assert got.height == 3002 and got["b"].drop_nulls().to_list() == ["x", "y"]


def test_inline_params():
    assert _inline_params("a = ? AND b = ?", (1, "it's")) == "a = 1 AND b = 'it''s'"
    assert _inline_params("a IN (?, ?)", (None, 2.5)) == "a IN (NULL, 2.5)"
    assert _inline_params("a = ?", (b"x",)) is None
    assert _inline_params("a = '?' AND b = ?", (1,)) is None


def test_prefetch_in_parts_equals_one_read(trace):
    from tracekit.analyze.sections import pcie_metrics

    with Export.open(trace) as e:
        ids = pcie_metrics.pcie_metric_ids(e)
        sql, params, schema = pcie_metrics._series_query(ids)
        one = e.query(sql, params, schema)
    for parts in (1, 2, 3, 7):
        with Export.open(trace) as e:
            assert e.prefetch(sql, params, schema, table="GPU_METRICS", parts=parts)
            assert not e.prefetch(sql, params, schema, table="GPU_METRICS", parts=parts)  # already pending
            assert e._pending
            got = e.query(sql, params, schema)
            assert not e._pending  # consumed
        assert got.equals(one)


def test_rowid_split_only_plain_selects():
    from tracekit.analyze.trace.export import _rowid_split

    q = _rowid_split("SELECT a, b FROM T WHERE x = 1 OR y = 2", "T")
    assert q == "SELECT a, b FROM T WHERE (x = 1 OR y = 2) AND rowid BETWEEN {a} AND {b}"
    for sql in ("SELECT a FROM T", "SELECT a FROM T WHERE x ORDER BY a", "SELECT a FROM T t JOIN U ON 1 WHERE x",
                "SELECT a FROM T WHERE x IN (SELECT 1)", "SELECT a FROM U WHERE x", "SELECT a FROM T WHERE x LIMIT 3"):
        assert _rowid_split(sql, "T") is None, sql


def test_cli_tables_cached_as_printed(trace, capsys):
    assert main(["analyze", str(trace), "--no-cache"]) == 0
    direct = capsys.readouterr().out
    assert main(["analyze", str(trace)]) == 0  # computes, prints, stores the text
    first = capsys.readouterr().out
    d = trace.with_name(trace.name + SUFFIX)
    assert len(list(d.glob("t-*.txt"))) == 1
    assert main(["analyze", str(trace)]) == 0  # printed from the cache
    again = capsys.readouterr().out
    assert "per iteration (--wide: phases)" in direct  # the default screen's per-iteration table
    assert direct.splitlines()[:20] == first.splitlines()[:20] and first == again
    # a changed trace: the stored text is not served (not even once), and is replaced
    (old,) = d.glob("t-*.txt")
    old.write_text("STALE\n")
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert main(["analyze", str(trace)]) == 0
    assert "STALE" not in capsys.readouterr().out
    (new,) = d.glob("t-*.txt")  # one entry, holding what was printed (behind its checksum header)
    assert TraceCache(trace).get_text(new.name[2:-4]) == first
