"""The reader: read-only opening, schema recognition, missing tables, enums, bad input."""

import hashlib
import sqlite3

import pytest
from conftest import PUBLIC, ZERO3_CUT, public_exports

from tracekit.analyze.trace.export import Export
from tracekit.errors import MissingDataError, TracekitError


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_open_is_read_only_and_leaves_file_untouched():
    before = (sha(ZERO3_CUT), ZERO3_CUT.stat().st_mtime_ns)
    with Export.open(ZERO3_CUT) as e:
        with pytest.raises(TracekitError, match="readonly"):  # SQLite refuses: opened read-only
            e.conn.execute("CREATE TABLE x (a INTEGER)")
    from tracekit.analyze.result import analyze_path

    analyze_path(ZERO3_CUT)
    assert (sha(ZERO3_CUT), ZERO3_CUT.stat().st_mtime_ns) == before
    assert not ZERO3_CUT.with_name(ZERO3_CUT.name + "-journal").exists()


@pytest.mark.parametrize("path", public_exports(), ids=lambda p: p.name)
def test_schema_version_of_every_public_export(path):
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    expected = "pre-2022"
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if t in tables:
            expected = con.execute(f"SELECT value FROM {t} WHERE name='EXPORT_SCHEMA_VERSION'").fetchone()[0]
            break
    con.close()
    with Export.open(path) as e:
        assert e.schema_version == expected
        assert set(e.tables) == tables


def test_known_versions():
    versions = {p.name: Export.open(p).schema_version for p in public_exports()}
    if not versions:
        pytest.skip("shared public exports not present")
    assert versions["kmeans-parallel__report1.sqlite"] == "pre-2022"
    assert versions["DLProf__nsys_profile.sqlite"] == "2.9.1"
    assert versions["SC23-OpenMP-Tutorial__report3.sqlite"] == "3.4.0"
    assert versions["nsys-ai__mfu_2gpu_before.sqlite"] == "3.25.0"


def test_missing_table_is_empty_frame_until_required():
    path = PUBLIC / "DLProf__nsys_profile.sqlite"
    if not path.exists():
        pytest.skip("shared public exports not present")
    with Export.open(path) as e:
        f = e.load("CUDA_GPU_MEMORY_USAGE_EVENTS", ["start", "bytes"])
        assert f.height == 0 and f.columns == ["start", "bytes"]
        with pytest.raises(MissingDataError, match=r"CUDA_GPU_MEMORY_USAGE_EVENTS.*--cuda-memory-usage=true"):
            e.require("CUDA_GPU_MEMORY_USAGE_EVENTS", "the memory timeline")
        with pytest.raises(MissingDataError, match=r"GPU_METRICS.*--gpu-metrics-devices=all"):
            e.require("GPU_METRICS", "PCIe throughput")


def test_builtin_enums_for_exports_without_enum_tables():
    path = PUBLIC / "DLProf__nsys_profile.sqlite"
    if not path.exists():
        pytest.skip("shared public exports not present")
    from tracekit.analyze.model.gpu_ops import load_gpu_ops

    con = sqlite3.connect(path)
    assert not con.execute("SELECT name FROM sqlite_master WHERE name LIKE 'ENUM_%'").fetchall()
    expected = dict(con.execute(
        "SELECT copyKind, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind").fetchall())
    with Export.open(path) as e:
        ops = load_gpu_ops(e)
    copies = ops.filter(ops["kind"] == "memcpy")
    got = copies.group_by("direction").len()
    names = {1: "H2D", 2: "D2H", 8: "D2D", 10: "P2P"}
    assert {names[k]: v for k, v in expected.items()} == dict(zip(got["direction"], got["len"]))


def test_nvtx_names_from_text_and_textid_per_row(tmp_path):
    from synthetic import SyntheticTrace

    from tracekit.analyze.model.nvtx import load_ranges

    t = SyntheticTrace()
    t.range("from_text", 0, 10, 1 << 24 | 1, use_text=True)
    t.range("from_id", 20, 30, 1 << 24 | 1)
    t.kernel(0, 5, pid=1, tid=1, launch=0)
    with Export.open(t.write(tmp_path / "synthetic_names.sqlite")) as e:
        names = load_ranges(e)["name"].to_list()
    assert names == ["from_text", "from_id"]


def test_gpu_ops_join_runtime_within_the_process(tmp_path):
    """The same correlationId in two processes must join to each process's own API call."""
    from synthetic import SyntheticTrace

    from tracekit.analyze.model.gpu_ops import load_gpu_ops

    t = SyntheticTrace()
    t.kernel(100, 200, pid=1, tid=1, launch=50)
    t.kernel(300, 400, pid=2, tid=5, launch=250)
    t._corr = 0  # reuse correlation ids in process 2
    path = tmp_path / "synthetic_corr.sqlite"
    t.write(path)
    con = sqlite3.connect(path)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = 1")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 1")
    con.commit()
    con.close()
    with Export.open(path) as e:
        ops = load_gpu_ops(e).sort("start")
    assert ops["launch"].to_list() == [50, 250]
    assert ops["launch_tid"].to_list() == [(1 << 24) + 1, (2 << 24) + 5]


def test_bad_input_errors(tmp_path):
    with pytest.raises(TracekitError, match="no such file"):
        Export.open(tmp_path / "nope.sqlite")
    (tmp_path / "empty.sqlite").write_bytes(b"")
    with pytest.raises(TracekitError, match="empty"):
        Export.open(tmp_path / "empty.sqlite")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(TracekitError, match="not an SQLite file"):
        Export.open(tmp_path / "notes.txt")
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00NSYS-REPORT-NOT-SQLITE" * 10)
    with pytest.raises(TracekitError, match="nsys export --type sqlite"):
        Export.open(rep)
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    with pytest.raises(TracekitError, match="not an Nsight Systems export"):
        Export.open(other)
    nvprof = tmp_path / "nvprof_synthetic.sqlite"
    con = sqlite3.connect(nvprof)
    con.execute("CREATE TABLE StringTable (_id_ INTEGER PRIMARY KEY, value TEXT)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (_id_ INTEGER, start INTEGER, \"end\" INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(TracekitError, match="nvprof"):
        Export.open(nvprof)
    truncated = tmp_path / "truncated.sqlite"
    data = ZERO3_CUT.read_bytes()
    truncated.write_bytes(data[: len(data) // 3])
    with pytest.raises(TracekitError, match="truncated or corrupt"):
        Export.open(truncated)


def _synthetic_strings(tmp_path):
    import shutil

    p = tmp_path / "synthetic_odd_strings.sqlite"
    shutil.copyfile(ZERO3_CUT, p)
    con = sqlite3.connect(p)
    a, b, c = [r[0] for r in con.execute("SELECT id FROM StringIds ORDER BY id LIMIT 3")]
    con.execute("UPDATE StringIds SET value = CAST(X'41D6E542' AS TEXT) WHERE id = ?", (a,))  # 'A', cp1251, 'B'
    con.execute("UPDATE StringIds SET value = X'C3A9' WHERE id = ?", (b,))  # a blob holding UTF-8 'é'
    con.execute("UPDATE StringIds SET value = 123 WHERE id = ?", (c,))
    con.commit()
    con.close()
    return p, (a, b, c)


def test_strings_decode_with_replacement_and_stringify_odd_values(tmp_path):
    p, (a, b, c) = _synthetic_strings(tmp_path)
    raw = b"A\xd6\xe5B"
    with Export.open(p) as e:
        s = e.strings()
        assert s[a] == raw.decode("utf-8", "replace") == "A\ufffd\ufffdB"
        assert (s[b], s[c]) == ("\u00e9", "123")
        assert e.strings([a, c]) == {a: "A\ufffd\ufffdB", c: "123"}


@pytest.mark.parametrize("reader", ["adbc", "sqlite3"])
def test_query_with_invalid_utf8_gives_replaced_text_through_either_reader(tmp_path, monkeypatch, reader):
    import polars as pl

    from tracekit.analyze.trace import fetch as export_mod

    if reader == "adbc":
        pytest.importorskip("adbc_driver_sqlite")
    monkeypatch.setattr(export_mod, "_READER", reader)
    p, (a, _, _) = _synthetic_strings(tmp_path)
    with Export.open(p) as e:
        f = e.query(f"SELECT id, value FROM StringIds WHERE id = {a}", schema={"id": pl.Int64, "value": pl.String})
    assert f.to_dicts() == [{"id": a, "value": "A\ufffd\ufffdB"}]


def test_quote_ident_and_a_table_named_with_quotes(tmp_path):
    import shutil

    from tracekit.analyze.trace.export import quote_ident

    assert quote_ident('we"ird') == '"we""ird"'
    p = tmp_path / "synthetic_quoted_table.sqlite"
    shutil.copyfile(ZERO3_CUT, p)
    con = sqlite3.connect(p)
    con.execute('CREATE TABLE "we""ird" ("a""b" INTEGER)')
    con.execute('INSERT INTO "we""ird" VALUES (7)')
    con.commit()
    con.close()
    with Export.open(p) as e:
        assert e.tables['we"ird'] == {'a"b': "INTEGER"}
        assert e.has('we"ird', min_rows=1)
        assert e.load('we"ird', {"x": 'a"b'})["x"].to_list() == [7]
