"""Reading damaged, odd and hostile exports: one test per reproduction of issue 9 in
``../shared/repro/`` (d04, d07, d14, d15, d18, d21, d22), each on a mutated copy of the fixture.

Every expected number is computed here with plain SQL on the mutated copy, never from
tracekit's own earlier output. The mutated files are synthetic: their names say so.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import ZERO3_CUT, assert_one_line_error, run_cli

from tracekit.cli import main

MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"


def cli(*args):
    """``tracekit ARGS`` in this process: (exit code, stdout, stderr). A numpy/polars
    RuntimeWarning is an error here (it reached the user's stderr before)."""
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def synthetic_copy(tmp_path: Path, name: str, *sql: str, relax: tuple[str, ...] = ()) -> Path:
    """A copy of the fixture named ``synthetic_NAME.sqlite`` with ``sql`` applied; ``relax``
    drops NOT NULL from those tables' declarations first (as the repro scripts do)."""
    dst = tmp_path / f"synthetic_{name}.sqlite"
    shutil.copyfile(ZERO3_CUT, dst)
    con = sqlite3.connect(dst)
    if relax:
        con.execute("PRAGMA writable_schema=ON")
        for t in relax:
            con.execute("UPDATE sqlite_master SET sql=replace(sql,'NOT NULL','') WHERE name=?", (t,))
        con.commit()
        con.close()
        con = sqlite3.connect(dst)
    for s in sql:
        con.executescript(s)
    con.commit()
    con.close()
    return dst


def sql1(path: Path, query: str, params=()):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query, params).fetchone()[0]
    finally:
        con.close()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def total_bytes(result: dict, key: str) -> int:
    """Sum of ``key`` over the whole-trace totals of every phase and rank."""
    return sum(t[key] for r in result["ranks"] for t in r["totals"].values())


def analyze_json(path: Path, *extra) -> dict:
    rc, out, err = cli("analyze", path, "--json", "--no-cache", *extra)
    assert rc == 0, err
    assert "Traceback" not in err
    return json.loads(out)


# ---------------------------------------------------------------- d21: non-UTF-8 text
def test_d21_non_utf8_metadata_is_replaced_and_analysis_runs(tmp_path):
    p = synthetic_copy(tmp_path, "cp1251_meta",
                       "UPDATE META_DATA_EXPORT SET value = CAST(X'D6E5EDF2' AS TEXT) WHERE name='EXPORT_TIME_LOCAL'")
    rc, out, err = cli("analyze", p, "--no-cache")
    assert rc == 0, err
    assert "update" in out


def test_d21_non_utf8_range_name_is_replaced_and_counted(tmp_path):
    like = "%_reassign_or_swap_out_partitioned_parameters"
    p = synthetic_copy(tmp_path, "cp1251_names",
                       f"UPDATE StringIds SET value = value || CAST(X'D6E5' AS TEXT) WHERE value LIKE '{like}'")
    res = analyze_json(p, "--phase", "update")
    subs = {s["sub_phase"] for s in res["ranks"][0]["sub_phases"]["update"]}
    name = "DeepSpeedZeroOptimizer_Stage3._reassign_or_swap_out_partitioned_parameters\ufffd\ufffd"
    assert name in subs
    # the renamed range still gets the copies launched inside it (docs/attribution.md: the
    # launching CUDA call's start, on the thread of the range): plain SQL on the copy
    expected = sql1(p, f"""SELECT sum(m.bytes) FROM {MEMCPY} m
                          JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
                          JOIN NVTX_EVENTS n ON r.globalTid = n.globalTid
                                             AND r.start >= n.start AND r.start < n."end"
                          JOIN StringIds s ON s.id = n.textId
                          WHERE m.copyKind = 1 AND s.value LIKE '{like}%'""")
    got = sum(s["h2d_bytes"] for s in res["ranks"][0]["sub_phases"]["update"] if s["sub_phase"] == name)
    assert got == expected > 0


# ---------------------------------------------------------------- d04: NULL start/end
@pytest.mark.parametrize("column", ["start", "end"])
def test_d04_null_times_in_gpu_ops_are_set_aside_and_counted(tmp_path, column):
    p = synthetic_copy(tmp_path, f"null_{column}",
                       f'UPDATE {MEMCPY} SET "{column}" = NULL WHERE rowid % 10 = 0', relax=(MEMCPY,))
    nulls = sql1(p, f'SELECT count(*) FROM {MEMCPY} WHERE "{column}" IS NULL')
    assert nulls > 100
    res = analyze_json(p)
    assert res["gpu_op_anomalies"]["memcpy_without_time"] == nulls
    kept_h2d = sql1(p, f'SELECT sum(bytes) FROM {MEMCPY} WHERE copyKind = 1 AND start IS NOT NULL AND "end" IS NOT NULL')
    assert total_bytes(res, "h2d_bytes") == kept_h2d
    for r in res["ranks"]:
        for it in r["iterations"]:
            for ph in it["phases"]:
                assert ph["gpu_idle_share"] is None or 0 <= ph["gpu_idle_share"] <= 1
    rc, out, err = cli("analyze", p, "--all", "--no-cache")
    assert rc == 0 and err == "", err
    assert f"{nulls} memcpy without time" in " ".join(out.split())  # piped: 80 wide (issue 23)
    assert "nanx" not in out


def test_d04_all_ends_null_is_one_line_error(tmp_path):
    tables = ("CUPTI_ACTIVITY_KIND_KERNEL", MEMCPY, "CUPTI_ACTIVITY_KIND_MEMSET")
    p = synthetic_copy(tmp_path, "all_end_null", *[f'UPDATE {t} SET "end" = NULL' for t in tables], relax=tables)
    assert_one_line_error(*cli("analyze", p, "--all", "--no-cache"), "is unusable")


# ---------------------------------------------------------------- d18: sanity of values
def test_d18_negative_bytes_and_end_before_start_are_set_aside(tmp_path):
    p = synthetic_copy(tmp_path, "negative",
                       f"UPDATE {MEMCPY} SET bytes = -bytes WHERE rowid % 7 = 0",
                       f'UPDATE {MEMCPY} SET "end" = start - 5 WHERE rowid % 11 = 0 AND rowid % 7 != 0')
    neg = sql1(p, f"SELECT count(*) FROM {MEMCPY} WHERE bytes < 0")
    back = sql1(p, f'SELECT count(*) FROM {MEMCPY} WHERE "end" < start')
    res = analyze_json(p)
    a = res["gpu_op_anomalies"]
    assert a["memcpy_negative_bytes"] == neg > 0
    assert a["memcpy_end_before_start"] == back > 0
    kept = sql1(p, f'SELECT sum(bytes) FROM {MEMCPY} WHERE copyKind = 2 AND bytes >= 0 AND "end" >= start')
    assert total_bytes(res, "d2h_bytes") == kept
    for r in res["ranks"]:
        for t in r["totals"].values():
            assert t["h2d_bytes"] >= 0 and t["d2h_bytes"] >= 0


def test_d18_huge_bytes_cannot_wrap_the_sums(tmp_path):
    p = synthetic_copy(tmp_path, "huge", f"UPDATE {MEMCPY} SET bytes = 9223372036854775000 WHERE rowid % 5 = 0")
    huge = sql1(p, f"SELECT count(*) FROM {MEMCPY} WHERE bytes > 1000000000000000")
    res = analyze_json(p)
    assert res["gpu_op_anomalies"]["memcpy_implausible_bytes"] == huge > 0
    kept = sql1(p, f"SELECT sum(bytes) FROM {MEMCPY} WHERE copyKind = 1 AND bytes <= 1000000000000000")
    assert total_bytes(res, "h2d_bytes") == kept
    rc, out, err = cli("analyze", p, "--no-cache")
    assert rc == 0 and "-9,22" not in out


# ---------------------------------------------------------------- d14: bad input, exit 2
D14 = [
    ("memcpy_globalPid_null", [f"UPDATE {MEMCPY} SET globalPid = NULL"], (MEMCPY,), "globalPid"),
    ("kernel_end_renamed", ['ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN "end" TO end_x'], (),
     "CUPTI_ACTIVITY_KIND_KERNEL has no column end"),
    ("memcpy_bytes_text", [f"UPDATE {MEMCPY} SET bytes = 'lots' WHERE rowid = 5"], (), "'lots'"),
    ("stringids_value_renamed", ["ALTER TABLE StringIds RENAME COLUMN value TO v"], (), "StringIds has no column value"),
    ("metricname_renamed", ["ALTER TABLE TARGET_INFO_GPU_METRICS RENAME COLUMN metricName TO m"], (),
     "TARGET_INFO_GPU_METRICS has no column metricName"),
    ("trim_meta_garbage", ["UPDATE TRACEKIT_TRIM SET value = 'abc-def' WHERE name = 'iterations'"], (), "TRACEKIT_TRIM"),
    ("nvtx_globalTid_dropped", ["ALTER TABLE NVTX_EVENTS DROP COLUMN globalTid"], (), "NVTX_EVENTS has no column globalTid"),
    ("nvtx_start_text", ["UPDATE NVTX_EVENTS SET start = 'soon' WHERE rowid = 3"], (), "'soon'"),
]


@pytest.mark.parametrize("name,sql,relax,pattern", D14, ids=[c[0] for c in D14])
def test_d14_bad_values_and_schemas_are_one_line_errors(tmp_path, name, sql, relax, pattern):
    p = synthetic_copy(tmp_path, name, *sql, relax=relax)
    before = sha(p)
    rc, out, err = cli("analyze", p, "--all", "--no-cache")
    assert_one_line_error(rc, out, err, pattern)
    assert sha(p) == before


def _damage_page_of(path: Path, table: str) -> None:
    con = sqlite3.connect(path)
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    pg = con.execute("SELECT pageno FROM dbstat WHERE name = ? LIMIT 1", (table,)).fetchone()[0]
    con.close()
    with open(path, "r+b") as f:
        f.seek((pg - 1) * page_size + 8)
        f.write(b"\xff" * (page_size - 96))


@pytest.mark.parametrize("table", ["ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "TRACEKIT_TRIM", "ANALYSIS_DETAILS"])
def test_d14_damaged_page_of_a_small_table_is_one_line_error(tmp_path, table):
    p = synthetic_copy(tmp_path, f"damaged_{table}")
    _damage_page_of(p, table)
    assert_one_line_error(*cli("analyze", p, "--no-cache"), "corrupt")


# ---------------------------------------------------------------- d22: option values
@pytest.mark.parametrize("args,pattern", [
    (["--all", "--bin-ms", "nan"], "--bin-ms"),
    (["--all", "--bin-ms", "inf"], "--bin-ms"),
    (["--pcie-threshold", "nan"], "--pcie-threshold"),
    (["--phase-map", "update=(?<=x)step"], "--phase-map"),
    (["--phase-map", r"update=(a)\1"], "--phase-map"),
])
def test_d22_option_values_are_one_line_errors(args, pattern):
    assert_one_line_error(*cli("analyze", ZERO3_CUT, "--no-cache", *args), pattern)


# ---------------------------------------------------------------- d15: messages, quoting
def test_d15_locked_database_is_called_locked_not_corrupt(tmp_path):
    p = synthetic_copy(tmp_path, "locked")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1], isolation_level=None); "
         "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(30)", str(p)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        rc, out, err = cli("analyze", p, "--no-cache")
        assert time.monotonic() - t0 < 25
    finally:
        holder.kill()
        holder.wait()
    assert_one_line_error(rc, out, err, "locked")
    assert "corrupt" not in err


def test_d15_table_named_with_a_quote_is_fine(tmp_path):
    p = synthetic_copy(tmp_path, "quote_table", 'CREATE TABLE "we""ird" (x INTEGER)',
                       'CREATE TABLE "sp ace; --" (x INTEGER)')
    rc, out, err = cli("analyze", p, "--no-cache")
    assert rc == 0, err
    assert "update" in out


# ---------------------------------------------------------------- d07: WAL-mode traces
def _side_files(folder: Path) -> set[str]:
    return {f.name for f in folder.iterdir() if f.name.endswith(("-wal", "-shm", "-journal"))}


def test_d07_wal_trace_opened_without_side_files(tmp_path):
    p = synthetic_copy(tmp_path, "wal")
    con = sqlite3.connect(p)
    assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    con.close()
    assert _side_files(tmp_path) == set()
    before = sha(p)
    res = analyze_json(p)
    assert _side_files(tmp_path) == set()
    assert sha(p) == before
    assert total_bytes(res, "h2d_bytes") == sql1(p, f"SELECT sum(bytes) FROM {MEMCPY} WHERE copyKind = 1")


def test_d07_wal_trace_with_uncheckpointed_changes_is_read_with_them(tmp_path):
    p = synthetic_copy(tmp_path, "wal_pending")
    con = sqlite3.connect(p)
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    expected = 3 * sql1(p, f"SELECT sum(bytes) FROM {MEMCPY} WHERE copyKind = 1")
    # a writer that leaves its change in -wal (no checkpoint, killed before closing)
    subprocess.run([sys.executable, "-c",
                    "import sqlite3,os,sys; c=sqlite3.connect(sys.argv[1]); c.execute('pragma wal_autocheckpoint=0');"
                    f"c.execute('UPDATE {MEMCPY} SET bytes=bytes*3'); c.commit(); os._exit(0)", str(p)], check=True)
    sides = {f: sha(tmp_path / f) for f in _side_files(tmp_path)}
    assert f"{p.name}-wal" in sides
    before = sha(p)
    res = analyze_json(p)
    assert total_bytes(res, "h2d_bytes") == expected
    assert sha(p) == before
    assert {f: sha(tmp_path / f) for f in _side_files(tmp_path)} == sides


@pytest.mark.parametrize("argv, says", [
    (["analyze", "--iteration", "abc", "X"], "'--iteration'"),
    (["analyze", "--bogus-flag", "x"], "--bogus-flag"),
    (["bogus"], "'bogus'"),
    (["compare", "only-one.sqlite"], "Missing argument 'b'"),
])
def test_usage_errors_are_one_line(argv, says):
    """click's usage errors (bad option values, unknown options or commands, missing arguments)
    are one line naming the problem and where the usage is, exit 2 (not click's usage block)."""
    rc, out, err = run_cli(*argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tracekit: error: ") and says in err, err
    assert "--help" in err and "Traceback" not in err
