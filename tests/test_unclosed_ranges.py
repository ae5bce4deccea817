"""d03: NVTX ranges that were never popped are set aside, in all three forms nsys writes them.

nsys ends a never-popped range at ``ANALYSIS_DETAILS.duration`` (seen on an H200 with nsys
2025.3), leaves ``end`` NULL, or ends it at the capture's stop time. Such a range must not be a
phase window: its window is cut at the process's last recorded activity, its iteration is
marked incomplete and left out of the steady-state figures (report key numbers, compare,
findings), and the output says so. Expected values are computed by hand (synthetic traces)
or with plain SQL on the fixture.
"""

import re
import shutil
import sqlite3

import polars as pl
import pytest
from conftest import ZERO3_CUT, run_cli
from synthetic import SyntheticTrace, gtid

from tracekit.analyze.model import phases
from tracekit.analyze.result import analyze_path
from tracekit.analyze.trace.export import Export

MS = 1_000_000
MAIN = 1
STEP = "DeepSpeedZeroOptimizer_Stage3.step"
# ANALYSIS_DETAILS of the synthetic traces: the session clock starts at 1 s, lasts 500 ms
START_TIME, DURATION = 1000 * MS, 500 * MS
STOP_TIME = START_TIME + DURATION


def _synthetic(tmp_path, form: str):
    """Two DeepSpeed iterations (gas 2); the second step range never closed, in ``form``."""
    t = SyntheticTrace()
    tid = gtid(1, MAIN)
    now = 0
    for it in range(2):
        for _ in range(2):
            t.range("DeepSpeedEngine.forward", now, now + 10 * MS, tid, "DeepSpeed")
            t.kernel(now + 2 * MS, now + 3 * MS, pid=1, tid=MAIN, launch=now + 1 * MS)
            now += 11 * MS
            t.range("DeepSpeedEngine.backward", now, now + 10 * MS, tid, "DeepSpeed")
            now += 11 * MS
        if it == 0:
            t.range(STEP, now, now + 20 * MS, tid, "DeepSpeed")  # 44..64 ms
            t.copy(now + 5 * MS, now + 7 * MS, 4000, 1, pid=1, tid=MAIN, launch=now + 4 * MS, src=0)
            now += 21 * MS
        else:  # step 2 starts at 109 ms; its last GPU work ends at 118 ms; never popped
            end = {"duration": DURATION, "null": None, "stop": STOP_TIME}[form]
            t.range(STEP, now, end, tid, "DeepSpeed")
            t.copy(now + 6 * MS, now + 9 * MS, 4000, 1, pid=1, tid=MAIN, launch=now + 3 * MS, src=0)
    path = t.write(tmp_path / f"synthetic_unclosed_{form}.sqlite")
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER, duration INTEGER, startTime INTEGER, stopTime INTEGER)")
    con.execute("INSERT INTO ANALYSIS_DETAILS VALUES (0, ?, ?, ?)", (DURATION, START_TIME, STOP_TIME))
    con.commit()
    con.close()
    return path


FORMS = ["duration", "null", "stop"]


@pytest.mark.parametrize("form", FORMS)
def test_synthetic_unclosed_step_is_cut_and_its_iteration_incomplete(tmp_path, form):
    path = _synthetic(tmp_path, form)
    with Export.open(path) as e:
        m = phases.build(e)
    assert m.anomalies["unclosed_ranges"] == 1
    upd = m.windows.filter(pl.col("phase") == "update").sort("start")
    # by hand: step 1 is its range 44..64 ms; step 2 opens at 109 ms, the last activity of the
    # process is the end of its copy at 118 ms (not 500 ms, 1,500 ms or the NULL)
    assert upd.select("iteration", "start", "end", "unclosed").rows() == [
        (0, 44 * MS, 64 * MS, False), (1, 109 * MS, 118 * MS, True)]
    its = m.windows.filter(pl.col("iteration").is_not_null()).group_by("iteration").agg(pl.col("complete").all())
    assert dict(its.rows()) == {0: True, 1: False}
    # nothing of the process reaches past its last activity
    assert m.windows["end"].max() == 118 * MS
    # the copy of the unclosed step still belongs to that update
    assert m.ops.filter(pl.col("kind") == "memcpy").sort("start")["iteration"].to_list() == [0, 1]


@pytest.mark.parametrize("form", FORMS)
def test_synthetic_result_marks_iteration_and_says_why(tmp_path, form):
    path = _synthetic(tmp_path, form)
    r = analyze_path(path)
    assert r["nvtx_anomalies"]["unclosed_ranges"] == 1
    its = {it["index"]: it for it in r["ranks"][0]["iterations"]}
    assert its[0]["complete"] is True and its[0]["unclosed"] is False
    assert its[1]["complete"] is False and its[1]["unclosed"] is True
    upd1 = [p for p in its[1]["phases"] if p["phase"] == "update"][0]
    assert (upd1["start_ns"], upd1["end_ns"], upd1["wall_ns"], upd1["unclosed"]) == (109 * MS, 118 * MS, 9 * MS, True)
    # totals are totals: both updates, 20 ms + 9 ms
    assert r["ranks"][0]["totals"]["update"]["wall_ns"] == 29 * MS
    (inc,) = r["incomplete_iterations"]
    assert (inc["pid"], inc["iteration"], inc["phase"], inc["range"]) == (1, 1, "update", STEP)
    want = {"duration": "ANALYSIS_DETAILS.duration", "null": "no end", "stop": "stop time"}[form]
    assert want in inc["reason"]
    # findings leave the unclosed iteration out: the update finding is over the one closed update
    (upd,) = [f for f in r["findings"] if f["topic"] == "update"]
    assert upd["values"]["updates"] == 1 and upd["values"]["wall_ns"] == 20 * MS


def test_synthetic_text_output_names_iteration_and_reason(tmp_path):
    path = _synthetic(tmp_path, "duration")
    rc, out, err = run_cli("analyze", path, "--no-cache", "--wide")  # the whole sentence: --wide
    assert rc == 0, err
    flat = " ".join(out.split())  # rich wraps long lines at blanks
    said = re.findall(r"iteration \d+ \(pid 1\) is incomplete: .*? compare\)", flat)
    assert len(said) == 1 and flat.count("never closed") == 1, out
    assert said[0].startswith("iteration 1 ") and STEP in said[0] and "ANALYSIS_DETAILS.duration" in said[0]
    assert "9.00 ms after it opened" in said[0] and "left out of steady-state figures" in said[0]
    # the table marks the iteration
    assert "1 (unclosed)" in out


def test_closed_range_ending_before_duration_is_not_unclosed(tmp_path):
    """Only an end exactly at ANALYSIS_DETAILS.duration (or at/after the stop time, or NULL) marks
    a range unclosed; a step ending 1 ns before it is an ordinary range."""
    path = _synthetic(tmp_path, "duration")
    con = sqlite3.connect(path)
    con.execute('UPDATE NVTX_EVENTS SET "end" = "end" - 1 WHERE "end" = ?', (DURATION,))
    con.commit()
    con.close()
    with Export.open(path) as e:
        m = phases.build(e)
    assert m.anomalies["unclosed_ranges"] == 0
    upd = m.windows.filter(pl.col("phase") == "update").sort("start")
    assert upd.select("end", "unclosed").rows()[-1] == (DURATION - 1, False)
    assert m.windows.filter(pl.col("iteration").is_not_null())["complete"].all()


# ------------------------------------------------------------------ the real fixture (repro d03)
def _fixture_sql(path):
    """Plain SQL on the fixture: rowid, start, end of the step ranges, and the last activity of
    the process after the last step's start (GPU op ends, launch API ends, closed NVTX ends)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    steps = con.execute(
        "SELECT n.rowid, n.start, n.\"end\" FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
        "WHERE s.value = ? ORDER BY n.start", (STEP,)).fetchall()
    duration, stop = con.execute("SELECT duration, stopTime FROM ANALYSIS_DETAILS").fetchone()
    con.close()
    return steps, duration, stop


def _unclose(tmp_path, form):
    dst = tmp_path / f"unclosed_{form}.sqlite"
    shutil.copy(ZERO3_CUT, dst)
    steps, duration, stop = _fixture_sql(ZERO3_CUT)
    last = steps[-1][0]
    con = sqlite3.connect(dst)
    value = {"duration": duration, "null": None, "stop": stop}[form]
    con.execute('UPDATE NVTX_EVENTS SET "end" = ? WHERE rowid = ?', (value, last))
    con.commit()
    con.close()
    return dst, steps


def _last_activity(path, after):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    q = []
    for tbl in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        q.append(con.execute(f'SELECT max("end") FROM {tbl}').fetchone()[0])
        q.append(con.execute(
            f"SELECT max(r.\"end\") FROM {tbl} o JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = o.correlationId AND (r.globalTid >> 24) = (o.globalPid >> 24)").fetchone()[0])
    q.append(con.execute('SELECT max("end") FROM NVTX_EVENTS WHERE "end" IS NOT NULL AND "end" < '
                         '(SELECT duration FROM ANALYSIS_DETAILS)').fetchone()[0])
    con.close()
    return max(v for v in q if v is not None and v > after)


@pytest.mark.parametrize("form", FORMS)
def test_fixture_unclosed_last_step(tmp_path, form):
    path, steps = _unclose(tmp_path, form)
    r = analyze_path(path)
    assert r["nvtx_anomalies"]["unclosed_ranges"] == 1
    first_wall = steps[0][2] - steps[0][1]
    cut_wall = _last_activity(path, steps[-1][1]) - steps[-1][1]
    tot = r["ranks"][0]["totals"]["update"]["wall_ns"]
    assert tot == first_wall + cut_wall
    # the cut update is at most the closed one (the pop came after the last activity), and far
    # from the 5,519 ms (duration) or 6,552 ms (stop time) of the unclosed range
    assert cut_wall <= steps[-1][2] - steps[-1][1]
    assert 200 * MS < tot < 260 * MS
    its = {it["index"]: it for it in r["ranks"][0]["iterations"]}
    assert (its[1]["complete"], its[2]["complete"], its[2]["unclosed"]) == (True, False, True)
    (inc,) = r["incomplete_iterations"]
    assert (inc["iteration"], inc["phase"]) == (2, "update")
    # findings over the closed update only
    (upd,) = [f for f in r["findings"] if f["topic"] == "update"]
    assert upd["values"]["updates"] == 1 and upd["values"]["wall_ns"] == first_wall


def test_fixture_unclosed_left_out_of_report_and_compare(tmp_path):
    from tracekit.render.compare import compare_data
    from tracekit.render.data import ReportData

    path, steps = _unclose(tmp_path, "duration")
    b = ReportData.load(path)
    rk = b.rank(0)
    assert b.steady_iterations(rk) == [1]
    a = ReportData.load(ZERO3_CUT)
    c = compare_data(a, b)
    assert c["a"]["iterations"] == [1, 2] and c["b"]["iterations"] == [1]
    upd = [p for p in c["per_phase"] if p["phase"] == "update"][0]["metrics"]["wall_ns"]
    assert upd["b"] == steps[0][2] - steps[0][1]
    assert upd["a"] == pytest.approx(((steps[0][2] - steps[0][1]) + (steps[1][2] - steps[1][1])) / 2)


def test_many_traces_leave_unclosed_iteration_out(tmp_path):
    """``analyze runs/``: the per-rank sums and means are over the iterations whose ranges closed."""
    from tracekit.analyze.multi import analyze_many

    path, steps = _unclose(tmp_path, "duration")
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(ZERO3_CUT, runs / "rank0.sqlite")
    shutil.move(path, runs / "rank1.sqlite")
    out = analyze_many([runs], jobs=1, cache=False)
    closed, cut = out["summary"]["rank_rows"]
    assert closed["unclosed_iterations"] == [] and cut["unclosed_iterations"] == [2]
    assert closed["phase_ns"]["update"] == sum(e - s for _, s, e in steps)
    assert cut["phase_ns"]["update"] == steps[0][2] - steps[0][1]
    assert [d["index"] for d in cut["per_iteration"]] == [1] and cut["iterations"] == 1
    rc, text, err = run_cli("analyze", runs, "--jobs", "1", "--no-cache")
    assert rc == 0, err
    assert "rank1.sqlite pid 642: iteration 2 left out" in " ".join(text.split())


@pytest.mark.usefixtures("cheap_figures")
def test_report_md_names_the_unclosed_iteration(tmp_path):
    path, steps = _unclose(tmp_path, "null")
    out = tmp_path / "rep"
    rc, _, err = run_cli("report", path, "-o", out)
    assert rc == 0, err
    text = (out / "report.md").read_text()
    line = [ln for ln in text.splitlines() if "is incomplete" in ln]
    assert len(line) == 1 and line[0].startswith("- iteration 2 is incomplete and left out of the means")
    assert "never closed (no end recorded)" in line[0]
    assert "means below are per iteration over iteration 1" in text


def test_synthetic_unclosed_step_mid_trace(tmp_path):
    """A step never popped with later iterations after it: its window stops at the next forward,
    the later phases stay their own windows, and its sub-phases tile the cut window (by hand)."""
    from tracekit.analyze.sections import breakdown

    t = SyntheticTrace()
    tid = gtid(1, MAIN)
    t.range("DeepSpeedEngine.forward", 0, 10 * MS, tid, "DeepSpeed")
    t.range("DeepSpeedEngine.backward", 11 * MS, 21 * MS, tid, "DeepSpeed")
    t.range(STEP, 22 * MS, None, tid, "DeepSpeed")  # never popped
    t.range("adam", 23 * MS, 30 * MS, tid)
    t.range("DeepSpeedEngine.forward", 40 * MS, 50 * MS, tid, "DeepSpeed")
    t.range("inner_fwd", 41 * MS, 45 * MS, tid)
    t.range("DeepSpeedEngine.backward", 51 * MS, 61 * MS, tid, "DeepSpeed")
    t.range(STEP, 62 * MS, 80 * MS, tid, "DeepSpeed")
    t.kernel(2 * MS, 3 * MS, pid=1, tid=MAIN, launch=1 * MS)
    t.kernel(70 * MS, 71 * MS, pid=1, tid=MAIN, launch=65 * MS)
    path = t.write(tmp_path / "synthetic_unclosed_mid.sqlite")
    with Export.open(path) as e:
        m = phases.build(e)
    w = m.windows.filter(pl.col("phase") != "other").sort("start")
    assert w.select("iteration", "phase", "start", "end", "unclosed", "complete").rows() == [
        (0, "forward", 0, 10 * MS, False, False), (0, "backward", 11 * MS, 21 * MS, False, False),
        (0, "update", 22 * MS, 40 * MS, True, False),
        (1, "forward", 40 * MS, 50 * MS, False, True), (1, "backward", 51 * MS, 61 * MS, False, True),
        (1, "update", 62 * MS, 80 * MS, False, True)]
    sub = breakdown.sub_phase_table(m, "update").select("iteration", "sub_phase", "wall_ns")
    assert sorted(sub.rows()) == [(0, "(none)", 11 * MS), (0, "adam", 7 * MS), (1, "(none)", 18 * MS)]


def test_synthetic_unclosed_step_opened_after_duration(tmp_path):
    """A capture stopped within ``startTime`` of a step's start: the never-popped step's end
    (``ANALYSIS_DETAILS.duration``) lies *before* its start. It is still an unclosed range, not
    a range to drop: its window runs to the last activity (by hand: 109..118 ms)."""
    path = _synthetic(tmp_path, "duration")
    con = sqlite3.connect(path)
    con.execute("UPDATE ANALYSIS_DETAILS SET duration = ?, startTime = ?", (100 * MS, STOP_TIME - 100 * MS))
    con.execute('UPDATE NVTX_EVENTS SET "end" = ? WHERE "end" = ?', (100 * MS, DURATION))
    con.commit()
    con.close()
    with Export.open(path) as e:
        m = phases.build(e)
    assert m.anomalies["unclosed_ranges"] == 1 and m.anomalies.get("unusable_ranges", 0) == 0
    upd = m.windows.filter(pl.col("phase") == "update").sort("start")
    assert upd.select("start", "end", "unclosed").rows()[-1] == (109 * MS, 118 * MS, True)
    assert m.unclosed["form"].to_list() == ["duration"]
