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
from test_robustness import synthetic_copy

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
    # the largest 0 ns copies are set aside as implausibly fast (> 10,000 GB/s, gpu_ops.set_aside) and the
    # rest have no duration: either way no copy-back bandwidth is left to re-time it at
    assert 0 < d["gpu_op_anomalies"]["memcpy_implausible_rate"] <= n
    assert "no parameter copy-back" in sg[0]["why_not"] or "measured duration" in sg[0]["why_not"]
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


# ---------------------------------------------------------------- e08: odd manifests and configs
def _deep(n: int) -> str:
    return '{"zero_optimization": ' + "[" * n + "]" * n + "}"


ODD_MANIFESTS = {
    "deep": (_deep(200_000), "nested too deeply"),
    "versions": ('{"deepspeed_config": {"zero_optimization": {"stage": 3}}, "versions": [1]}',
                 '"versions" is a list, expected an object'),
    "gpus": ('{"deepspeed_config": {"zero_optimization": {"stage": 3}}, "gpus": 5}',
             '"gpus" is a number, expected a list'),
    "ds_list": ('{"deepspeed_config": [1, 2]}', '"deepspeed_config" is a list'),
    "utf16": ('{"zero_optimization": {"stage": 3}}'.encode("utf-16"), "not UTF-8 text"),
}


@pytest.mark.parametrize("name", sorted(ODD_MANIFESTS))
def test_odd_manifest_beside_trace_is_ignored_with_a_note(tmp_path, name):
    text, why = ODD_MANIFESTS[name]
    t = tmp_path / "t.sqlite"
    shutil.copyfile(ZERO3_CUT, t)
    (tmp_path / "t.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    from tracekit.analyze.sections.cpu_update import worker_parents
    from tracekit.analyze.trace import dsconfig
    from tracekit.render.config import run_config

    loaded = dsconfig.load(t)
    assert loaded["source"] is None and loaded["deepspeed_config"] is None
    assert loaded["note"].startswith("capture manifest ") and "t.json" in loaded["note"]
    assert why in loaded["note"] and "manifest ignored" in loaded["note"]
    assert run_config(t).manifest is None and run_config(t).versions == {} and run_config(t).gpus == []
    assert worker_parents(t) == {}
    rc, out, err = cli("analyze", t, "--no-cache", "--json")
    assert rc == 0, err
    assert why in strict_json(out)["config"]["note"]


@pytest.mark.parametrize("name", sorted(ODD_MANIFESTS))
def test_odd_ds_config_is_one_line_error(tmp_path, name):
    text, why = ODD_MANIFESTS[name]
    cfg = tmp_path / "cfg.json"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    rc, out, err = cli("analyze", ZERO3_CUT, "--no-cache", "--ds-config", cfg)
    assert_one_line_error(rc, out, err, why)
    assert f"--ds-config {cfg}" in err


def test_config_depth_limit_is_exact(tmp_path):
    from tracekit.analyze.trace.dsconfig import MAX_CONFIG_DEPTH, read_json_object
    from tracekit.errors import TracekitError

    p = tmp_path / "c.json"
    # depth counted by hand: the outer object is level 1, each list one more
    p.write_text(_deep(MAX_CONFIG_DEPTH - 1))
    assert isinstance(read_json_object(p, "--ds-config"), dict)
    p.write_text(_deep(MAX_CONFIG_DEPTH))
    with pytest.raises(TracekitError, match="nested too deeply"):
        read_json_object(p, "--ds-config")


def test_manifest_problem_shapes():
    from tracekit.analyze.trace.dsconfig import manifest_problem

    ok = {"deepspeed_config": {"a": 1}, "versions": {"deepspeed": "0.19.8", "torch": 2}, "gpus": [{"name": "H200"}],
          "hook": {"processes": []}, "command_line": "python t.py", "nsys": {"version": "2025.3"}}
    assert manifest_problem(ok) is None
    assert manifest_problem({"zero_optimization": {"stage": 3}, "versions": [1]}) is None  # a plain DS config
    assert manifest_problem({**ok, "versions": {"torch": [2]}}) == '"versions"."torch" is a list, expected a version string'
    assert manifest_problem({**ok, "hook": {"processes": 3}}) == '"hook"."processes" is a number, expected a list'
    assert manifest_problem({**ok, "command_line": ["python"]}) == '"command_line" is a list, expected a string'
    assert manifest_problem({**ok, "nsys": None, "gpus": None}) is None  # null is absent


# ---------------------------------------------------------------- e09: a huge manifest
def test_huge_sparse_manifest_refused_by_size(tmp_path):
    t = tmp_path / "t.sqlite"
    shutil.copyfile(ZERO3_CUT, t)
    m = tmp_path / "t.json"
    with open(m, "wb") as fh:
        fh.truncate(3 << 30)  # 3 GiB, sparse: no disk used
    start = time.monotonic()
    rc, out, err = cli("analyze", t, "--no-cache", "--json")
    took = time.monotonic() - start
    assert rc == 0, err
    note = strict_json(out)["config"]["note"]
    assert note.startswith(f"capture manifest {m}: 3,221,225,472 bytes, over the 16 MiB limit"), note
    assert took < 60
    from tracekit.render.report_cache import beside

    assert beside(t)["t.json"] == f"too large: {3 << 30}"  # the report cache does not hash it either


def test_read_limited_refuses_one_byte_over(tmp_path):
    from tracekit.errors import TracekitError
    from tracekit.userfiles import read_limited

    p = tmp_path / "c.json"
    p.write_bytes(b"x" * 11)
    assert read_limited(p, "--ds-config", 11) == b"x" * 11
    with pytest.raises(TracekitError, match=r"11 bytes, over the 10 bytes limit"):
        read_limited(p, "--ds-config", 10)


# ---------------------------------------------------------------- e14: --bin-ms out of range
@pytest.mark.parametrize("value", ["1e15", "1e300", "1000000001"])
def test_huge_bin_ms_one_line_error(value):
    rc, out, err = cli("analyze", ZERO3_CUT, "--section", "timeline", "--bin-ms", value, "--no-cache")
    assert_one_line_error(rc, out, err, "--bin-ms")
    assert "ceiling" in err


def test_largest_bin_ms_fits_int64():
    from tracekit.options import MAX_BIN_MS, Options

    assert Options(bin_ms=MAX_BIN_MS).bin_ns == 10**15 < 2**63


# ---------------------------------------------------------------- e15, e20: pipes and FIFOs
def test_pipe_as_trace_one_line_error():
    r, w = os.pipe()  # what `analyze <(cat t.sqlite)` passes: /dev/fd/N, a pipe
    os.close(w)  # no writer: a read returns at once (before, the 16 bytes read passed as "empty")
    try:
        rc, out, err = cli("analyze", f"/dev/fd/{r}", "--no-cache")
    finally:
        os.close(r)
    assert_one_line_error(rc, out, err, "a pipe or FIFO, not a regular file")
    assert "SQLite" in err and f"/dev/fd/{r}" in err


@pytest.mark.parametrize("where", ["trace", "ds-config", "ds-config-a"])
def test_fifo_refused_at_once(tmp_path, where):
    import subprocess
    import sys

    fifo = tmp_path / "f.sqlite"
    os.mkfifo(fifo)
    args = {"trace": ["analyze", fifo, "--no-cache"],
            "ds-config": ["analyze", ZERO3_CUT, "--no-cache", "--ds-config", fifo],
            "ds-config-a": ["compare", ZERO3_CUT, ZERO3_CUT, "--no-cache", "--ds-config-a", fifo]}[where]
    p = subprocess.run([sys.executable, "-m", "tracekit.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=60)  # blocked for ever before
    assert_one_line_error(p.returncode, p.stdout, p.stderr, "a pipe or FIFO, not a regular file")


# ---------------------------------------------------------------- e16: a path over PATH_MAX
def test_path_too_long_one_short_line(tmp_path, monkeypatch):
    d = "d" * 200
    monkeypatch.chdir(tmp_path)
    fd = os.open(".", os.O_RDONLY)
    try:
        for _ in range(22):
            os.mkdir(d, dir_fd=fd)
            nfd = os.open(d, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    path = "/".join([d] * 22) + "/t.sqlite"
    assert len(path) == 4430
    rc, out, err = cli("analyze", path)
    assert_one_line_error(rc, out, err, "path too long (4,430 characters")
    assert len(err) < 1000 and err.rstrip().endswith("move or link the file to a shorter path")
    assert "d" * 60 + "..." in err and "/t.sqlite: path too long" in err


def test_shown_path_keeps_head_and_tail():
    from tracekit.userfiles import MAX_SHOWN, shown

    p = "a" * 100 + "/" + "b" * 300 + "/name.sqlite"
    s = shown(p)
    assert len(s) == MAX_SHOWN and s == p[:60] + "..." + p[-(MAX_SHOWN - 63):]
    assert shown("short/x.sqlite") == "short/x.sqlite"
    assert shown("a\x1b[2Jb") == "a\\x1b[2Jb"


# ---------------------------------------------------------------- e19: strict JSON out
def test_format_json_writes_null_for_nan_and_inf():
    from tracekit.analyze.trace.cache import dumps_strict, format_json

    obj = {"rows": [{"a": float("nan"), "b": 1.5}], "x": float("inf"), "y": {"z": [float("-inf"), 2]}}
    for text in (format_json(obj), dumps_strict(obj, indent=1)):
        assert strict_json(text) == {"rows": [{"a": None, "b": 1.5}], "x": None, "y": {"z": [None, 2]}}


def test_nan_ds_config_read_and_written_as_null(tmp_path):
    cfg = tmp_path / "nan.json"  # Python's json and DeepSpeed's json.load take NaN; strict JSON has none
    cfg.write_text('{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": NaN}}}')
    rc, out, err = cli("analyze", ZERO3_CUT, "--no-cache", "--ds-config", cfg, "--json")
    assert rc == 0, err
    rows = {r["key"]: r for r in strict_json(out)["config"]["settings"]}
    assert rows["zero_optimization.offload_optimizer.ratio"]["value"] is None
    assert rows["zero_optimization.offload_optimizer.ratio"]["source"] == "config"
    assert rows["zero_optimization.stage"]["value"] == 3


def test_manifest_with_infinity_still_read():
    # HF Trainer's DeepSpeed config has "steps_per_print": Infinity (float("inf")): the fixture's manifest
    from tracekit.analyze.trace import dsconfig

    m = ZERO3_CUT.parent / "hf_trainer_zero3_capture.json"
    assert "Infinity" in m.read_text()
    loaded = dsconfig.load(ZERO3_CUT.parent / "hf_trainer_zero3_cut.sqlite")
    assert loaded["source"] == "manifest" and loaded["note"] is None
    assert loaded["deepspeed_config"]["steps_per_print"] == float("inf")


def test_compare_fail_above_inf_strict_json(tmp_path):
    rc, out, err = cli("compare", ZERO3_CUT, ZERO3_CUT, "--fail-above", "inf", "--json", "-o", tmp_path / "cmp",
                       "--no-cache")
    assert rc == 0, err
    for text in (out, (tmp_path / "cmp" / "compare.json").read_text()):
        d = strict_json(text)
        assert d["regressions"] == {"fail_above_pct": None, "slower": []}


# ---------------------------------------------------------------- low: --dask ""
@pytest.mark.parametrize("value", ["", "  "])
def test_empty_dask_address_rejected(value):
    rc, out, err = cli("analyze", ZERO3_CUT, "--dask", value)
    assert_one_line_error(rc, out, err, f"--dask {value!r}: give the Dask scheduler's address")
    from tracekit.analyze.multi import analyze_many
    from tracekit.errors import TracekitError

    with pytest.raises(TracekitError, match="--dask"):
        analyze_many([ZERO3_CUT], dask=value)


# ---------------------------------------------------------------- low: file names in errors
def test_error_names_the_trace_as_given_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("sub")
    nok = synthetic_copy(tmp_path / "sub", "no_kernels", "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL",
                         f"DELETE FROM {MEMCPY}", "DELETE FROM CUPTI_ACTIVITY_KIND_MEMSET")
    assert sql_one(nok, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL") == 0
    given = "sub/synthetic_no_kernels.sqlite"
    rc, out, err = cli("analyze", given, "--no-cache")
    assert_one_line_error(rc, out, err, f"tracekit: error: {given}: CUPTI_ACTIVITY_KIND_KERNEL has no rows")
    shutil.copyfile(ZERO3_CUT, "sub/good.sqlite")
    rc, out, err = cli("analyze", "sub", "--no-cache", "--jobs", "1")  # several traces: each error names its own
    assert rc == 2
    lines = err.strip().splitlines()
    # the rest of the line says what the export holds (tracekit.analyze.trace.recording)
    assert lines[0].startswith(f"tracekit: error: {given}: CUPTI_ACTIVITY_KIND_KERNEL has no rows in this trace, "
                               "and phase attribution needs it; CUDA tracing was on"), lines
    assert lines[0].count("synthetic_no_kernels") == 1, lines
    rc, out, err = cli("trim", "sub/good.sqlite", tmp_path / "o.sqlite", "--iterations", "1-1", "--drop", "NOPE")
    assert_one_line_error(rc, out, err, "no such table in sub/good.sqlite")


def test_dumps_strict_keeps_layout_of_finite_values():
    from tracekit.analyze.trace.cache import dumps_strict

    obj = {"b": [1, 2.5, "x"], "a": {"c": None}}
    assert dumps_strict(obj, indent=1) == json.dumps(obj, indent=1)
    assert dumps_strict(obj, sort_keys=True, separators=(",", ":")) == '{"a":{"c":null},"b":[1,2.5,"x"]}'
    assert dumps_strict([float("nan")], separators=(",", ":")) == "[null]"


def test_long_but_valid_path_shortened_in_errors(tmp_path):
    d = tmp_path / ("e" * 200) / ("f" * 200)
    d.mkdir(parents=True)
    bad = d / "t.sqlite"
    bad.write_text("not a database\n")
    good = tmp_path / "good.sqlite"
    shutil.copyfile(ZERO3_CUT, good)
    rc, out, err = cli("analyze", bad, "--no-cache")
    assert_one_line_error(rc, out, err, "...")
    assert len(err) < 300 and "f" * 40 + "/t.sqlite: not an SQLite file" in err
    rc, out, err = cli("analyze", bad, good, "--no-cache", "--jobs", "1")  # several traces: named once
    assert rc == 2
    first = err.strip().splitlines()[0]
    assert first.count("t.sqlite") == 1 and len(first) < 300, first
