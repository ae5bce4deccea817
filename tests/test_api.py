"""The Python API and the one pipeline (issue 10): ``tracekit.analyze(path) -> Analysis``.

Checked against independent computations: the ``--json`` the CLI prints (a separate process),
plain SQL on the fixture, and a hand computation on a synthetic trace.
"""

import csv
import json
import sqlite3

import polars as pl
import pytest
from conftest import ZERO3_CUT, sql_indexed
from conftest import run_cli as run

import tracekit

DS_PHASES = {"DeepSpeedEngine.forward": "forward", "DeepSpeedEngine.backward": "backward",
             "DeepSpeedZeroOptimizer_Stage3.step": "update"}


@pytest.fixture(scope="module")
def fixture_analysis(zero3_analysis):
    return zero3_analysis  # conftest: one analysis of the fixture per session


def test_phases_equal_the_json_numbers(fixture_analysis):
    rc, out, err = run("analyze", ZERO3_CUT, "--no-cache", "--json")
    assert rc == 0, err
    j = json.loads(out)
    # (the nested idle_breakdown / launch_stats of each row are the idle section's frames, not columns)
    expected = [{"pid": r["pid"], "device": r["device"], "iteration": it["index"], "complete": it["complete"],
                 **{k: v for k, v in p.items() if not isinstance(v, dict)}}
                for r in j["ranks"] for it in r["iterations"] for p in it["phases"]]
    got = fixture_analysis.phases
    assert got.height == len(expected) == 12
    for row, exp in zip(got.iter_rows(named=True), expected):
        for k, v in exp.items():
            assert row[k] == v, (k, row[k], v)
    # every numeric column of the JSON rows is a column of the frame
    assert set(expected[0]) <= set(got.columns) and {"rank", "micro_step", "boundary", "inferred"} <= set(got.columns)
    assert fixture_analysis.to_json()["ranks"][0]["iterations"][0]["phases"][0]["wall_ns"] == expected[0]["wall_ns"]


def test_copies_per_phase_equal_plain_sql(fixture_analysis):
    con = sql_indexed(ZERO3_CUT)
    marks = ",".join("?" * len(DS_PHASES))
    rows = con.execute(
        f"""WITH w AS (SELECT s.value AS name, n.start AS ws, n."end" AS we FROM NVTX_EVENTS n
                        JOIN StringIds s ON s.id = n.textId WHERE s.value IN ({marks})),
                 m AS (SELECT m.bytes, m.copyKind, coalesce(
                         (SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = m.correlationId
                           AND (r.globalTid >> 24) = (m.globalPid >> 24)), m.start) AS launch
                       FROM CUPTI_ACTIVITY_KIND_MEMCPY m)
            SELECT w.name, m.copyKind, sum(m.bytes), count(*) FROM m JOIN w ON m.launch >= w.ws AND m.launch < w.we
            WHERE m.copyKind IN (1, 2) GROUP BY w.name, m.copyKind""", tuple(DS_PHASES)).fetchall()
    total = con.execute("SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()
    con.close()
    expected = {(DS_PHASES[n], {1: "H2D", 2: "D2H"}[k]): (b, c) for n, k, b, c in rows}
    c = fixture_analysis.copies
    assert (c.height, c["bytes"].sum()) == total
    got = c.filter(pl.col("phase") != "other").group_by("phase", "direction").agg(
        pl.col("bytes").sum(), pl.len().alias("n"))
    got = {(r["phase"], r["direction"]): (r["bytes"], r["n"]) for r in got.iter_rows(named=True)
           if r["direction"] in ("H2D", "D2H")}
    assert got == expected
    assert expected[("backward", "D2H")][0] > 2e9 and expected[("update", "H2D")][0] > 5e8
    # names as text, not ids; host memory of the update's copy-back is pageable
    assert c["api_call"].drop_nulls().str.starts_with("cuda").all()
    assert c["thread"].drop_nulls().len() > 0
    upd = c.filter((pl.col("phase") == "update") & (pl.col("direction") == "H2D"))
    assert (upd["host_memory"] == "pageable").all()
    k = fixture_analysis.kernels
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    assert k.height == con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    assert k["name"].null_count() == 0 and k["name"].dtype == pl.String


def test_frames_findings_advice_and_pandas(fixture_analysis):
    a = fixture_analysis
    assert {"overlap_phase", "contention_windows", "pageable_copies", "throughput_timeline"} <= set(a.frames)
    assert all("global_pid" not in f.columns for f in a.frames.values())
    assert a.findings.height == len(a.to_json()["findings"]) > 0
    assert a.advice.height == len(a.to_json()["advice"])
    sub = a.sub_phases.filter(pl.col("phase") == "update")
    # the update's sub-phases tile its windows: their wall times sum to the update's
    upd = a.phases.filter(pl.col("phase") == "update")["wall_ns"].sum()
    assert sub["wall_ns"].sum() == upd
    pytest.importorskip("pandas")
    assert len(a.phases.to_pandas()) == a.phases.height


def test_analyze_many_has_the_single_trace_shape(tmp_path):
    import shutil

    for i in (0, 1):
        shutil.copy(ZERO3_CUT, tmp_path / f"rank{i}.sqlite")
    many = tracekit.analyze_many([tmp_path], cache=False, jobs=1)
    single = tracekit.analyze(tmp_path / "rank0.sqlite", cache=False).to_json()
    assert [set(t) for t in many.to_json()["traces"]] == [set(single)] * 2
    assert many.to_json()["traces"][0]["ranks"] == single["ranks"]
    assert many.phases.height == 24


def test_options_are_checked_once():
    from tracekit.errors import TracekitError

    with pytest.raises(TracekitError, match="pcie-threshold"):
        tracekit.Options(pcie_threshold=0)
    with pytest.raises(TracekitError, match="unknown analysis option"):
        tracekit.analyze(ZERO3_CUT, bogus=1)


# ------------------------------------------------------------------ one overlap ratio, every command
def overlap_trace(path):
    """Two iterations (tracekit ranges); in each update an H2D copy [10, 50) us, a D2H copy
    [30, 70) us (both directions at once: contention) and a kernel [40, 60) us after the update
    starts. By hand: copies' union [10, 70) = 60 us, under the kernel [40, 60) = 20 us, so the
    hidden share is 20/60 = 1/3; the other formula, 1 - (30 + 20) / (40 + 40) = 0.375, differs."""
    from synthetic import SyntheticTrace, gtid

    t = SyntheticTrace()
    pid, tid = 10, 1
    us = 1000
    for it in range(2):
        b = it * 1000 * us
        t.range("forward", b, b + 200 * us, tid=gtid(pid, tid), domain="tracekit")
        t.kernel(b + 20 * us, b + 150 * us, pid, tid, launch=b + 10 * us)
        t.range("backward", b + 200 * us, b + 400 * us, tid=gtid(pid, tid), domain="tracekit")
        t.kernel(b + 220 * us, b + 350 * us, pid, tid, launch=b + 210 * us)
        u = b + 400 * us
        t.range("update", u, u + 300 * us, tid=gtid(pid, tid), domain="tracekit")
        t.copy(u + 10 * us, u + 50 * us, 64 << 20, 1, pid, tid, launch=u + 1 * us, src=1, dst=2, stream=8)
        t.copy(u + 30 * us, u + 70 * us, 64 << 20, 2, pid, tid, launch=u + 2 * us, src=2, dst=1, stream=9)
        t.kernel(u + 40 * us, u + 60 * us, pid, tid, launch=u + 3 * us)
    return t.write(path)


def test_overlap_ratio_is_one_definition_in_every_command(tmp_path):
    path = overlap_trace(tmp_path / "ov.sqlite")
    want = 1 / 3
    # analyze --json: the overlap section, whole trace per phase
    rc, out, err = run("analyze", path, "--no-cache", "--json")
    assert rc == 0, err
    j = json.loads(out)
    upd = [r for r in j["ranks"][0]["transfers"]["overlap"]["overlap_phase"] if r["phase"] == "update"][0]
    assert upd["overlap_ratio"] == pytest.approx(want, abs=1e-6)
    assert upd["bidir_ns"] == 2 * 20_000  # both directions in flight [30, 50) us, in each of two updates
    # report: key numbers per iteration (CSV) and the per-phase means behind report.md
    rc, out, err = run("report", path, "-o", tmp_path / "r")
    assert rc == 0, err
    with open(tmp_path / "r" / "data" / "key_numbers.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["phase"] == "update"]
    assert len(rows) == 2 and all(float(r["overlap_ratio"]) == pytest.approx(want) for r in rows)
    # compare (a run against itself): the per-phase mean of both sides
    rc, out, err = run("compare", path, path, "--json")
    assert rc == 0, err
    c = json.loads(out)
    m = [p for p in c["per_phase"] if p["phase"] == "update"][0]["metrics"]["overlap_ratio"]
    assert m["a"] == pytest.approx(want, abs=1e-6) and m["b"] == pytest.approx(want, abs=1e-6)


# ------------------------------------------------------------------ bug: notes on stdout before the JSON
def test_out_with_json_keeps_stdout_json(tmp_path):
    import shutil

    p = tmp_path / "nomem.sqlite"
    shutil.copy(ZERO3_CUT, p)
    con = sqlite3.connect(p)
    con.execute("DROP TABLE CUDA_GPU_MEMORY_USAGE_EVENTS")
    con.commit()
    con.close()
    rc, out, err = run("analyze", p, "--no-cache", "--out", tmp_path / "o", "--json")
    assert rc == 0, err
    json.loads(out)  # stdout is the JSON and nothing else
    assert "note: memory: skipped" in err and "--cuda-memory-usage=true" in err
    # --out writes the per-iteration phase table and the sub-phase table too
    ph = pl.read_csv(tmp_path / "o" / "phases.csv")
    assert ph.height == 12 and ph["wall_ns"].to_list() == [
        x["wall_ns"] for r in json.loads(out)["ranks"] for it in r["iterations"] for x in it["phases"]]
    sub = pl.read_csv(tmp_path / "o" / "sub_phases.csv")
    assert set(sub["phase"].unique()) >= {"update", "backward"}
    assert "global_pid" not in pl.read_csv(tmp_path / "o" / "overlap_phase.csv").columns


def test_frames_and_out_keep_every_pcie_sample(fixture_analysis, tmp_path):
    """``a.frames`` and ``--out`` hold ``pcie_series``, one row per PCIe sample of the trace
    (the streamed JSON/terminal path keeps only per-window reductions: issue 13)."""
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    n_sql = con.execute(
        "SELECT count(*) FROM GPU_METRICS m JOIN TARGET_INFO_GPU_METRICS t "
        "ON t.metricId = m.metricId AND t.typeId = m.typeId WHERE t.metricName LIKE 'PCIe%'").fetchone()[0]
    assert n_sql > 1000
    assert fixture_analysis.frames["pcie_series"].height == n_sql
    out = tmp_path / "frames"
    rc, _, err = run("analyze", ZERO3_CUT, "--section", "pcie", "--out", out, "--no-cache")
    assert rc == 0, err
    assert rc == 0
    with open(out / "pcie_series.csv") as f:
        assert sum(1 for _ in f) - 1 == n_sql


def test_to_json_is_what_the_cli_prints(zero3_analysis):
    """``tracekit.analyze(path).to_json()`` equals ``tracekit analyze path --json`` (docs/api.md)."""
    a = zero3_analysis  # tracekit.analyze(ZERO3_CUT, cache=False), once per session
    rc, out, err = run("analyze", ZERO3_CUT, "--json", "--no-cache")
    assert rc == 0, err
    assert a.to_json() == json.loads(out)


def test_analyze_many_runs_in_a_plain_script_without_a_main_guard(tmp_path):
    """The default runs in the calling process, so a script without ``if __name__ ==
    "__main__":`` works (spawned workers would re-run its top level)."""
    import subprocess
    import sys

    runs = tmp_path / "runs"
    runs.mkdir()
    for r in ("rank0", "rank1"):
        (runs / f"{r}.sqlite").write_bytes(ZERO3_CUT.read_bytes())
    script = tmp_path / "plain.py"
    script.write_text("import tracekit\nprint('TOP')\n"
                      f"m = tracekit.analyze_many([{str(runs)!r}], cache=False)\n"
                      "print(len(m.traces), len(m.failed))\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["TOP", "2", "0"] and "Traceback" not in p.stderr
