"""Property test (issue 9, "Beyond the list"): whatever is wrong with a trace, tracekit either
analyzes it (exit 0, a report on stdout, nothing on stderr) or refuses it with one line
(exit 2, ``tracekit: error: ...``), never a traceback or an internal error, and never changes
the trace's bytes.

Each case is a synthetic mutation of the fixture ``tests/fixtures/ds_zero3_offload_iter1.sqlite``
(iteration 1 of the ZeRO-3 cut alone: a third less to read per case than the two-iteration cut,
and a mutation that spoils that one iteration leaves the analysis no usable window at all):
every table tracekit reads dropped, every column it reads dropped (and the required ones also
renamed), NULLs, negative and huge values (each in a different tenth of the rows) in every
column it reads, text in its numeric columns, and the file truncated at many offsets. The
cases run in-process through :func:`tracekit.cli.main` with ``--no-cache``.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import ZERO3_ONE_ITERATION as BASE
from test_robustness import cli

#: Tables and columns tracekit reads (tracekit/analyze/*.py), as the fixture has them.
READ: dict[str, list[str]] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ["start", "end", "globalPid", "deviceId", "streamId", "correlationId",
                                   "demangledName", "shortName"],
    "CUPTI_ACTIVITY_KIND_MEMCPY": ["start", "end", "globalPid", "deviceId", "streamId", "correlationId",
                                   "bytes", "copyKind", "srcKind", "dstKind"],
    "CUPTI_ACTIVITY_KIND_MEMSET": ["start", "end", "globalPid", "deviceId", "streamId", "correlationId", "bytes"],
    "CUPTI_ACTIVITY_KIND_RUNTIME": ["start", "end", "globalTid", "correlationId", "nameId"],
    "NVTX_EVENTS": ["start", "end", "eventType", "globalTid", "endGlobalTid", "domainId", "text", "textId"],
    "StringIds": ["id", "value"],
    "GPU_METRICS": ["timestamp", "metricId", "value", "typeId"],
    "TARGET_INFO_GPU_METRICS": ["metricId", "metricName"],
    "CUDA_GPU_MEMORY_USAGE_EVENTS": ["start", "globalPid", "deviceId", "bytes", "memKind", "memoryOperationType"],
    "TARGET_INFO_GPU": ["id", "totalMemory", "name", "busLocation"],
    "ANALYSIS_DETAILS": ["startTime", "stopTime", "duration"],
    "META_DATA_EXPORT": ["name", "value"],
    "TRACEKIT_TRIM": ["name", "value"],
    "ENUM_CUDA_MEMCPY_OPER": ["id", "name"],
    "ENUM_CUDA_MEM_KIND": ["id", "name"],
}
TEXT_COLUMNS = {"text", "value", "name", "metricName", "busLocation"}
REQUIRED = {  # as tracekit.analyze.trace.export.REQUIRED_COLUMNS says (written out: an independent list)
    "CUPTI_ACTIVITY_KIND_KERNEL": ["start", "end", "globalPid"],
    "CUPTI_ACTIVITY_KIND_MEMCPY": ["start", "end", "bytes", "copyKind"],
    "NVTX_EVENTS": ["start", "end", "globalTid", "eventType"],
    "StringIds": ["id", "value"],
}


def _fixture_columns() -> dict[str, dict[str, bool]]:
    """{table: {column: is the INTEGER PRIMARY KEY}} of the fixture."""
    con = sqlite3.connect(f"file:{BASE}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: {r[1]: bool(r[5]) for r in con.execute(f'PRAGMA table_info("{t}")')} for t in tables}
    finally:
        con.close()


HAVE = _fixture_columns()
PRESENT = {t: [c for c in cols if c in HAVE.get(t, {})] for t, cols in READ.items() if t in HAVE}
HUGE = 9223372036854775000


def _cases() -> list[tuple[str, tuple]]:
    cases = []
    for t, cols in PRESENT.items():
        cases.append((f"drop-table-{t}", ("sql", f'DROP TABLE "{t}"', None)))
        for c in cols:
            cases.append((f"drop-column-{t}.{c}", ("drop", t, c)))
            if HAVE[t][c]:  # an INTEGER PRIMARY KEY holds unique integers only
                cases.append((f"values-{t}.{c}", ("sql", f'UPDATE "{t}" SET "{c}" = -"{c}" - 1000000 '
                                                         "WHERE rowid % 10 = 5", None)))
                continue
            if c in TEXT_COLUMNS:
                sql = (f'UPDATE "{t}" SET "{c}" = NULL WHERE rowid % 10 = 3; '
                       f'UPDATE "{t}" SET "{c}" = 12345 WHERE rowid % 10 = 5; '
                       f'UPDATE "{t}" SET "{c}" = \'\' WHERE rowid % 10 = 7;')
                cases.append((f"values-{t}.{c}", ("sql", sql, t)))
                continue
            # NULLs, negative and huge values, each in a tenth of the rows
            sql = (f'UPDATE "{t}" SET "{c}" = NULL WHERE rowid % 10 = 3; '
                   f'UPDATE "{t}" SET "{c}" = -abs("{c}") - 1 WHERE rowid % 10 = 5; '
                   f'UPDATE "{t}" SET "{c}" = {HUGE} WHERE rowid % 10 = 7;')
            cases.append((f"values-{t}.{c}", ("sql", sql, t)))
            cases.append((f"text-in-{t}.{c}", ("sql", f'UPDATE "{t}" SET "{c}" = \'x\' WHERE rowid = 2', None)))
    for t, cols in REQUIRED.items():
        for c in cols:
            cases.append((f"rename-column-{t}.{c}", ("sql", f'ALTER TABLE "{t}" RENAME COLUMN "{c}" TO "{c}_x"', None)))
    size = BASE.stat().st_size
    for k in range(1, 16):
        cases.append((f"truncate-{k}of16", ("truncate", size * k // 16, None)))
    cases.append(("truncate-header", ("truncate", 100, None)))
    return cases


CASES = _cases()


def _mutate(dst: Path, how: tuple) -> None:
    kind, a, b = how
    if kind == "truncate":
        with open(dst, "r+b") as f:
            f.truncate(a)
        return
    con = sqlite3.connect(dst)
    try:
        if kind == "drop":
            try:
                con.execute(f'ALTER TABLE "{a}" DROP COLUMN "{b}"')
            except sqlite3.OperationalError:  # indexed or part of a key: rename it away instead
                con.execute(f'ALTER TABLE "{a}" RENAME COLUMN "{b}" TO "{b}_dropped"')
        else:
            if b is not None:  # NULLs: drop NOT NULL from the declaration first
                con.execute("PRAGMA writable_schema=ON")
                con.execute("UPDATE sqlite_master SET sql=replace(sql,'NOT NULL','') WHERE name=?", (b,))
                con.commit()
                con.close()
                con = sqlite3.connect(dst)
            con.executescript(a)
        con.commit()
    finally:
        con.close()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module", autouse=True)
def _one_command_tree():
    """typer turns the app into click commands afresh on every call (~0.1 s of the ~0.5 s of a
    case); the cases all run the one app, so its command tree is built once for this module
    (the same tree typer would build each time; no case changes it)."""
    import typer.main

    real, built = typer.main.get_command, {}

    def get_command(app):
        if id(app) not in built:
            built[id(app)] = (app, real(app))
        return built[id(app)][1]

    mp = pytest.MonkeyPatch()
    mp.setattr(typer.main, "get_command", get_command)
    yield
    mp.undo()


@pytest.mark.slow
@pytest.mark.parametrize("how", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_mutated_trace_gives_a_report_or_one_line(tmp_path, how):
    p = tmp_path / "synthetic_mutated.sqlite"
    shutil.copyfile(BASE, p)
    _mutate(p, how)
    before = _sha(p)
    # findings run every analysis; the timeline is the one section they do not need
    rc, out, err = cli("analyze", p, "--section", "timeline", "--no-cache")
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 0:
        assert err == "", err
        assert "phases from:" in out and "findings" in out, out[:500]
    else:
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("tracekit: error: "), (rc, err)
    assert _sha(p) == before
    assert sorted(f.name for f in tmp_path.iterdir()) == ["synthetic_mutated.sqlite"]


def test_the_cases_cover_every_table_and_column_read():
    """The list above matches the fixture: a renamed table or column in a future fixture must
    not silently shrink the property test."""
    missing = {t: [c for c in cols if c not in HAVE.get(t, {})] for t, cols in READ.items()}
    assert {t: m for t, m in missing.items() if m and t in HAVE} == {}
    assert len(PRESENT) >= 13
    assert len(CASES) > 150
