"""The GPU operations spilled out of memory (tracekit.analyze.model.op_store, issue 24): what the
store gives back is the frame that was written (the reference: the in-memory frame before it was
spilled, and plain SQL on the fixture), for every query shape the sections use, and the whole
analysis is the same with the ops spilled or held."""

import dataclasses
import os
import sqlite3

import polars as pl
import pytest
from conftest import ZERO3_CUT

from tracekit.analyze.model import phases
from tracekit.analyze.model.op_store import OpStore, frame_blocks, spill_blocks
from tracekit.analyze.trace.export import Export
from tracekit.options import SECTIONS


@pytest.fixture(scope="module")
def model():
    with Export.open(ZERO3_CUT, cache=False) as e:
        return phases.build(e)


def _queries():
    """Query shapes of the sections' reads of ``model.ops`` (filters on Enum, String, null and
    numeric columns; projections; unique; group_by; head)."""
    return [
        lambda f: f,
        lambda f: f.filter((pl.col("kind") == "memcpy") & pl.col("direction").is_in(["H2D", "D2H"])),
        lambda f: f.filter(pl.col("kind") == "kernel").select("global_pid", "device", "start", "end", "phase"),
        lambda f: f.filter(pl.col("phase") == "update").select("sub_phase", "bytes"),
        lambda f: f.filter(pl.col("iteration").is_null()).select("start"),
        lambda f: f.filter(pl.col("sub_phase") == "no such range").select("start"),
        lambda f: f.select("global_pid", "device").unique().sort("global_pid", "device"),
        lambda f: f.select(pl.col("launch_tid").drop_nulls().unique().sort()),
        lambda f: f.filter(pl.col("window_id").is_not_null()).group_by("window_id").agg(
            pl.col("bytes").sum(), pl.len()).sort("window_id"),
        lambda f: f.select(pl.len()),
        lambda f: f.head(0),
        lambda f: f.filter(pl.col("kind") != "kernel").head(7).select("correlation_id"),
    ]


@pytest.mark.parametrize("block_rows", [5_000, 997, 1 << 20])
def test_store_gives_back_the_frame(model, block_rows, tmp_path):
    ops = model.ops
    store = OpStore(frame_blocks(ops, block_rows), folder=str(tmp_path))
    assert store.read().equals(ops) and store.read().schema == ops.schema
    for q in _queries():
        want, got = q(ops.lazy()).collect(), q(store.scan()).collect()
        assert got.schema == want.schema
        assert got.equals(want)
    assert store.height == ops.height and store.columns == ops.columns


def test_store_against_sql(model, tmp_path):
    """H2D bytes and copy count per copy kind from the store, against plain SQL on the fixture."""
    store = OpStore(frame_blocks(model.ops, 500), folder=str(tmp_path))
    got = store.scan().filter(pl.col("kind") == "memcpy").group_by("direction").agg(
        n=pl.len(), b=pl.col("bytes").sum()).sort("direction").collect()
    db = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    rows = db.execute("SELECT e.label, count(*), sum(m.bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
                      "JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = m.copyKind GROUP BY e.label ORDER BY e.label").fetchall()
    db.close()
    labels = {"Host-to-Device": "H2D", "Device-to-Host": "D2H", "Device-to-Device": "D2D"}
    want = {labels.get(lbl, lbl): (n, b) for lbl, n, b in rows}
    assert {d: (n, b) for d, n, b in got.iter_rows()} == {d: v for d, v in want.items() if d in set(got["direction"])}
    assert got["n"].sum() == sum(n for n, _ in want.values())


def test_nulls_and_empty_blocks(tmp_path):
    """A hand-made frame: a filter's null drops the row (as polars' filter does), blocks the filter
    empties are skipped, n_rows stops early, an empty frame keeps its schema."""
    e = pl.Enum(["p", "q"])
    df = pl.DataFrame({"a": [1, None, 3, 4, None, 6, 7], "s": ["p", "q", None, "p", "q", None, "p"],
                       "b": [True, None, False, True, True, None, False]}).with_columns(k=pl.col("s").cast(e))
    store = OpStore(frame_blocks(df, 2), folder=str(tmp_path))
    cases = {
        "a > 2": (pl.col("a") > 2, [3, 4, 6, 7]),
        "b": (pl.col("b"), [1, 4, None]),
        "k == q": (pl.col("k") == "q", [None, None]),
        "a > 100": (pl.col("a") > 100, []),
        "s == p": (pl.col("s") == "p", [1, 4, 7]),
    }
    for label, (cond, want) in cases.items():
        assert store.scan().filter(cond).collect()["a"].to_list() == want, label
    assert store.scan().head(3).collect().equals(df.head(3))
    empty = OpStore(frame_blocks(df.head(0)), folder=str(tmp_path))
    assert empty.read().schema == df.schema and empty.read().height == 0


def test_nothing_left_on_disk(tmp_path):
    store = OpStore(frame_blocks(pl.DataFrame({"a": [1, 2, 3]})), folder=str(tmp_path))
    assert os.listdir(tmp_path) == []  # unlinked at once: read through its descriptor
    fd = store._fd
    os.fstat(fd)
    store.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def _spilled_build():
    with Export.open(ZERO3_CUT, cache=False) as e:
        return phases.build(e, spill=True)


def test_spill_refused_keeps_the_frame(model, tmp_path, monkeypatch):
    import tempfile

    assert spill_blocks(frame_blocks(model.ops), folder=str(tmp_path / "no such folder")) is None
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no such folder"))  # (the store cannot be made)
    m = _spilled_build()
    assert m.ops_store is None and m.ops.equals(model.ops)


def test_spilled_model(model):
    m = _spilled_build()
    ops = model.ops  # (the same build with the ops held)
    assert m.ops_store is not None and m.__dict__["_ops"] is None
    assert m.windows.equals(model.windows)
    assert m.ops_height == ops.height and m.ops_schema == ops.schema
    assert m.scan_ops().collect().equals(ops)
    assert m.ops.equals(ops)  # (read back whole, kept until a section ends)
    assert "ops_frame" in m.cache
    one = dataclasses.replace(m, ops=ops.head(3))  # (a replaced model holds its own ops)
    assert one.ops_store is None and one.ops.equals(ops.head(3))
    m.ops = ops.head(2)  # (a frame set later replaces the spilled one)
    assert m.ops_store is None and m.ops.height == 2 and "ops_frame" not in m.cache


def test_analysis_same_spilled_or_held(monkeypatch):
    """The whole --all JSON of the fixture with the ops spilled equals the one with them held."""
    import tracekit

    spilled = tracekit.analyze(ZERO3_CUT, cache=False, sections=SECTIONS).to_json()
    monkeypatch.setattr("tracekit.analyze.result._may_spill", lambda: False)
    held = tracekit.analyze(ZERO3_CUT, cache=False, sections=SECTIONS).to_json()
    assert spilled == held


def test_no_store_under_a_memory_limit(monkeypatch):
    """Under an address-space limit the ops stay in memory (the store's reads run in polars'
    streaming engine, which can wait for ever there instead of failing into the one line)."""
    import tracekit
    from tracekit import memlimit

    assert tracekit.analyze(ZERO3_CUT, cache=False).model.ops_store is not None
    monkeypatch.setattr(memlimit, "current_limit", lambda: ("address-space limit (ulimit -v, prlimit --as)", 10**10))
    a = tracekit.analyze(ZERO3_CUT, cache=False)
    assert a.model.ops_store is None and a.model.ops.height > 9000
