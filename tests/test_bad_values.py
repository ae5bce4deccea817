"""Bad values, odd files and odd paths (issue 25, repro scripts e07, e08, e09, e14, e15, e16,
e19, e20 in ``../shared/repro/``): each gives a note or one ``tracekit: error:`` line, never
an internal error, a hang or non-standard JSON.

Mutated traces are copies of the fixture changed with plain SQL, named ``synthetic_*``; every
expected count is taken from the mutated file with SQL here, not from tracekit's output.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import ZERO3_CUT, assert_one_line_error

from tracekit.cli import main

MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"


def cli(*args):
    """``tracekit ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def strict_json(text: str):
    """``json.loads`` that refuses NaN / Infinity (what jq, JavaScript and serde refuse)."""
    def refuse(const):
        raise ValueError(f"non-standard JSON constant {const}")

    return json.loads(text, parse_constant=refuse)


def synthetic_copy(tmp_path: Path, name: str, *sql: str) -> Path:
    dst = tmp_path / f"synthetic_{name}.sqlite"
    shutil.copyfile(ZERO3_CUT, dst)
    con = sqlite3.connect(dst)
    for s in sql:
        con.executescript(s)
    con.commit()
    con.close()
    return dst


def sql_one(path: Path, query: str):
    con = sqlite3.connect(path)
    try:
        return con.execute(query).fetchone()[0]
    finally:
        con.close()


# ---------------------------------------------------------------- e07: degenerate timings
def test_synthetic_zero_duration_pageable_h2d_whatif_says_why(tmp_path):
    t = synthetic_copy(tmp_path, "zero_dur_pageable",
                       f'UPDATE {MEMCPY} SET "end" = start WHERE copyKind = 1 AND srcKind = 0')
    n = sql_one(t, f'SELECT count(*) FROM {MEMCPY} WHERE copyKind = 1 AND srcKind = 0 AND "end" = start')
    assert n == 6  # the fixture's pageable H2D copies (the parameter copy-back), all 0 ns now
    rc, out, err = cli("analyze", t, "--no-cache", "--json")
    assert rc == 0, err
    d = strict_json(out)
    sg = [p for p in d["predictions"] if p["scenario"] == "sub_group_size"]
    assert len(sg) == 1 and sg[0]["applicable"] is False and sg[0]["saving_ns"] == 0
    assert "measured duration" in sg[0]["why_not"]
    rc, out, err = cli("analyze", t, "--no-cache")  # the text output
    assert rc == 0 and out, err


@pytest.mark.parametrize("sql", [f'UPDATE {MEMCPY} SET bytes = 0',
                                 f'UPDATE {MEMCPY} SET bytes = 0, "end" = start',
                                 f'UPDATE {MEMCPY} SET "end" = start'], ids=["bytes0", "bytes0_dur0", "dur0"])
def test_synthetic_degenerate_copies_analyze_report_compare(tmp_path, sql):
    t = synthetic_copy(tmp_path, "degenerate", sql)
    rc, out, err = cli("analyze", t, "--no-cache", "--json")
    assert rc == 0, err
    d = strict_json(out)
    if "bytes = 0" in sql:  # no gradient bytes: the host kind is not inferred from a 0/0 share
        assert sql_one(t, f"SELECT sum(bytes) FROM {MEMCPY}") == 0
        assert "zero_optimization.offload_optimizer.pin_memory" not in {r["key"] for r in d["config"]["settings"]}
    rc, out, err = cli("report", t, "-o", tmp_path / "rep", "--no-cache")
    assert rc == 0, err
    assert (tmp_path / "rep" / "report.md").is_file()
    rc, out, err = cli("compare", ZERO3_CUT, t, "--no-cache")
    assert rc == 0 and out, err
