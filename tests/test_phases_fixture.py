"""Phases, iterations and per-phase numbers on the real ZeRO-3 offload cut, checked against
plain SQL on the same file and brute-force Python loops."""

import sqlite3

import polars as pl
import pytest
from conftest import ZERO3_CUT
from conftest import union_length_loop as _union_loop

from tracekit.analyze.model import phases
from tracekit.analyze.result import Options, analyze_path
from tracekit.analyze.sections import breakdown
from tracekit.analyze.trace.export import Export

DS_NAMES = {
    "DeepSpeedEngine.forward": "forward",
    "DeepSpeedEngine.backward": "backward",
    "DeepSpeedZeroOptimizer_Stage3.step": "update",
}


@pytest.fixture(scope="module")
def con():
    c = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    yield c
    c.close()


@pytest.fixture(scope="module")
def model():
    with Export.open(ZERO3_CUT) as e:
        yield phases.build(e)


@pytest.fixture(scope="module")
def sql_windows(con):
    """Phase windows straight from NVTX_EVENTS + StringIds, fully inside the cut."""
    rows = con.execute(
        """SELECT s.value, n.start, n."end" FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId
           WHERE s.value IN (?, ?, ?) AND n.start >= (SELECT CAST(value AS INTEGER) FROM TRACEKIT_TRIM
                 WHERE name = 'window_start_ns')
           ORDER BY n.start""",
        tuple(DS_NAMES),
    ).fetchall()
    return [(DS_NAMES[name], s, e) for name, s, e in rows]


def _launch_sql(table):
    # launch time = start of the runtime call with the same correlationId in the same process
    return f"""SELECT m.*, coalesce(
                   (SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                    WHERE r.correlationId = m.correlationId AND (r.globalTid >> 24) = (m.globalPid >> 24)),
                   m.start) AS launch
               FROM {table} m"""


def test_iterations_and_phase_sequence(model, sql_windows):
    w = model.windows.filter(pl.col("phase") != "other").sort("start")
    assert [(r["phase"], r["start"], r["end"]) for r in w.iter_rows(named=True)] == sql_windows
    seq = [(r["iteration"], r["phase"], r["micro_step"], r["boundary"]) for r in w.iter_rows(named=True)]
    per_iteration = [
        ("forward", 0, False), ("backward", 0, False), ("forward", 1, False),
        ("backward", 1, True), ("update", None, False),
    ]
    assert seq == [(i, *p) for i in (1, 2) for p in per_iteration]  # trim kept iterations 1-2


def test_bytes_per_phase_and_direction_match_sql(con, model, sql_windows):
    rows = con.execute(_launch_sql("CUPTI_ACTIVITY_KIND_MEMCPY")).fetchall()
    cols = [d[0] for d in con.execute(_launch_sql("CUPTI_ACTIVITY_KIND_MEMCPY")).description]
    i_kind, i_bytes, i_launch = cols.index("copyKind"), cols.index("bytes"), cols.index("launch")
    expected: dict[tuple, int] = {}
    for r in rows:
        for phase, s, e in sql_windows:
            if s <= r[i_launch] < e:
                key = (phase, {1: "H2D", 2: "D2H"}.get(r[i_kind]))
                expected[key] = expected.get(key, 0) + r[i_bytes]
    tot = breakdown.totals(model)
    for phase in ("forward", "backward", "update"):
        row = tot.filter(pl.col("phase") == phase).row(0, named=True)
        assert row["h2d_bytes"] == expected.get((phase, "H2D"), 0), phase
        assert row["d2h_bytes"] == expected.get((phase, "D2H"), 0), phase
    # the study's facts: gradient D2H in backward, parameter H2D of the step in update
    assert expected[("backward", "D2H")] > 2e9
    assert expected[("update", "H2D")] > 5e8


def test_kernel_busy_and_gpu_idle_match_brute_force(con, model, sql_windows):
    kernels = con.execute(f"SELECT start, \"end\", launch FROM ({_launch_sql('CUPTI_ACTIVITY_KIND_KERNEL')})").fetchall()
    all_ops = kernels + [tuple(r) for r in con.execute(
        "SELECT start, \"end\", 0 FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL "
        "SELECT start, \"end\", 0 FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchall()]
    table = breakdown.phase_table(model).filter(pl.col("phase") != "other").sort("start_ns")
    assert table.height == len(sql_windows)
    for row, (phase, s, e) in zip(table.iter_rows(named=True), sql_windows):
        busy = _union_loop([(a, b) for a, b, launch in kernels if s <= launch < e])
        assert row["kernel_busy_ns"] == busy, (phase, s)
        running = _union_loop([(max(a, s), min(b, e)) for a, b, _ in all_ops if a < e and b > s])
        assert row["gpu_idle_ns"] == (e - s) - running, (phase, s)
        assert row["wall_ns"] == e - s


def test_update_sub_phases_tile_the_window_and_find_the_copy_back(con, model, sql_windows):
    sub = breakdown.sub_phase_table(model, "update")
    for it, (_, s, e) in zip((1, 2), [w for w in sql_windows if w[0] == "update"]):
        assert sub.filter(pl.col("iteration") == it)["wall_ns"].sum() == e - s
    # H2D launched inside DeepSpeed's parameter copy-back range, by SQL
    name = "DeepSpeedZeroOptimizer_Stage3._reassign_or_swap_out_partitioned_parameters"
    expected = con.execute(
        f"""SELECT sum(m.bytes) FROM ({_launch_sql('CUPTI_ACTIVITY_KIND_MEMCPY')}) m
            JOIN NVTX_EVENTS n ON n.textId = (SELECT id FROM StringIds WHERE value = ?)
            WHERE m.copyKind = 1 AND m.launch >= n.start AND m.launch < n."end" """,
        (name,),
    ).fetchone()[0]
    got = sub.filter(pl.col("sub_phase") == name)["h2d_bytes"].sum()
    assert got == expected and got > 5e8
    # the unmarked CPU optimizer step: time in update with no range open and no GPU activity
    none = sub.filter(pl.col("sub_phase") == "(none)")
    assert (none["gpu_idle_ns"] == none["wall_ns"]).all() and none["wall_ns"].sum() > 20e6


def test_json_shape_and_totals(sql_windows):
    res = analyze_path(ZERO3_CUT)
    assert len(res["ranks"]) == 1
    r = res["ranks"][0]
    assert (r["pid"], r["device"]) == (642, 0)
    assert [it["index"] for it in r["iterations"]] == [1, 2]
    keys = {"phase", "micro_step", "boundary", "inferred", "start_ns", "end_ns", "wall_ns", "kernel_busy_ns",
            "h2d_bytes", "h2d_busy_ns", "h2d_count", "d2h_bytes", "d2h_busy_ns", "d2h_count"}
    for it in r["iterations"]:
        for p in it["phases"]:
            assert keys <= set(p)
            assert isinstance(p["start_ns"], int) and isinstance(p["boundary"], bool)
    assert set(r["totals"]) == {"forward", "backward", "update", "other"}
    fwd = sum(e - s for ph, s, e in sql_windows if ph == "forward")
    assert r["totals"]["forward"]["wall_ns"] == fwd
    # totals cover the whole span: the four phases add up to first..last activity
    span = max(v["end_ns"] for v in r["totals"].values()) - min(v["start_ns"] for v in r["totals"].values())
    assert sum(v["wall_ns"] for v in r["totals"].values()) == span


def test_phase_and_iteration_filters():
    res = analyze_path(ZERO3_CUT, Options(phase="update", iteration=2))
    its = res["ranks"][0]["iterations"]
    assert [it["index"] for it in its] == [2]
    assert [p["phase"] for p in its[0]["phases"]] == ["update"]
    subs = res["ranks"][0]["sub_phases"]["update"]
    assert {s["iteration"] for s in subs} == {2}
    assert sum(s["wall_ns"] for s in subs) == its[0]["phases"][0]["wall_ns"]


def test_tracekit_sub_steps_are_the_sub_phases_of_a_zero3_capture():
    """With tracekit's capture ranges, DeepSpeed's finer ranges do not hide its sub-steps."""
    path = ZERO3_CUT.with_name("zero3_offload_gas2_cut.sqlite")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    expected = con.execute(
        f"""SELECT sum(m.bytes) FROM ({_launch_sql('CUPTI_ACTIVITY_KIND_MEMCPY')}) m
            JOIN NVTX_EVENTS n ON coalesce(n.text, (SELECT value FROM StringIds WHERE id = n.textId)) = 'param_copy_back'
            WHERE m.copyKind = 1 AND m.launch >= n.start AND m.launch < n."end" """).fetchone()[0]
    con.close()
    with Export.open(path) as e:
        m = phases.build(e)
    sub = breakdown.sub_phase_table(m, "update")
    names = set(sub["sub_phase"])
    assert {"param_copy_back", "cpu_optimizer_step", "grad_norm"} <= names
    assert not any(n.startswith("DeepSpeedZeroOptimizer") for n in names)
    assert sub.filter(pl.col("sub_phase") == "param_copy_back")["h2d_bytes"].sum() == expected > 5e8
    cpu = sub.filter(pl.col("sub_phase") == "cpu_optimizer_step")
    assert (cpu["gpu_idle_ns"] == cpu["wall_ns"]).all()
