"""The command line: exit codes, one-line errors, JSON output, trim."""

import hashlib
import json
import sqlite3

import pytest
from conftest import PUBLIC, ZERO3_CUT, assert_one_line_error, public_exports
from conftest import run_cli as run


def test_analyze_json_matches_fixture_sql():
    rc, out, err = run("analyze", ZERO3_CUT, "--json")
    assert rc == 0, err
    res = json.loads(out)
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    kernels_total = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    rank = res["ranks"][0]
    assert sum(t["kernel_count"] for t in rank["totals"].values()) == kernels_total


def test_analyze_table_output_names_phases_and_boundary():
    rc, out, err = run("analyze", ZERO3_CUT, "--wide")  # every phase: --wide (issue 23)
    assert rc == 0, err
    assert "backward 1 *" in out and "update" in out and "forward 0" in out
    rc, out, err = run("analyze", ZERO3_CUT, "--phase", "update")
    assert rc == 0, err
    assert "by sub-phase" in out and "_reassign_or_swap_out_partitioned_parameters" in out
    assert "no GPU activity at all" in out


@pytest.mark.parametrize(
    "make,pattern",
    [
        (lambda d: d / "missing.sqlite", "no such file"),
        (lambda d: (d / "x.txt").write_text("not a db") and d / "x.txt", "not an SQLite file"),
        (lambda d: (d / "r.nsys-rep").write_bytes(b"\x01\x02junk") and d / "r.nsys-rep", "nsys export --type sqlite"),
        (lambda d: (d / "cut.sqlite").write_bytes(ZERO3_CUT.read_bytes()[:200000]) and d / "cut.sqlite",
         "truncated or corrupt"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, make, pattern):
    assert_one_line_error(*run("analyze", make(tmp_path)), pattern)


def test_bad_options():
    assert_one_line_error(*run("analyze", ZERO3_CUT, "--phase", "optimizer"), "--phase")
    assert_one_line_error(*run("analyze", ZERO3_CUT, "--phase-map", "nonsense"), "PHASE=REGEX")


@pytest.mark.skipif(not PUBLIC.exists(), reason="shared public exports not present")
def test_real_report_and_traces_without_cuda_or_nvtx():
    assert_one_line_error(*run("analyze", PUBLIC / "DLProf__nsys_profile.nsys-rep"), "nsys export --type sqlite")
    assert_one_line_error(*run("analyze", PUBLIC / "kmeans-parallel__report1.sqlite"), "-t cuda")
    # kernels and copies but no NVTX: the whole-trace report with its note (issue 25;
    # tests/test_claims.py checks its numbers)
    rc, out, err = run("analyze", PUBLIC / "SC23-OpenMP-Tutorial__report3.sqlite")
    assert rc == 0 and "no NVTX ranges in this trace" in out and "-t cuda,nvtx" in out, err


@pytest.mark.parametrize("path", public_exports(), ids=lambda p: p.name)
def test_every_public_export_reports_or_says_what_it_lacks(path):
    rc, out, err = run("analyze", path, "--json")
    assert "Traceback" not in err
    if rc == 0:
        res = json.loads(out)
        assert res["ranks"], "a trace with CUDA work has at least one rank"
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        n = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        con.close()
        # compute and communication kernels (issue 12) together are every kernel of the trace
        assert sum(t["kernel_count"] + t["comm_count"] for r in res["ranks"] for t in r["totals"].values()) == n
    else:
        assert_one_line_error(rc, out, err, "record it with `nsys profile")  # CUDA tracing unknown or off


def test_trim_cuts_one_iteration(tmp_path):
    out = tmp_path / "one.sqlite"
    before = hashlib.sha256(ZERO3_CUT.read_bytes()).hexdigest()
    rc, stdout, err = run("trim", ZERO3_CUT, out, "--iterations", "2-2", "--drop", "GPU_METRICS")
    assert rc == 0, err
    assert hashlib.sha256(ZERO3_CUT.read_bytes()).hexdigest() == before
    src = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    dst = sqlite3.connect(out)
    meta = dict(dst.execute("SELECT name, value FROM TRACEKIT_TRIM").fetchall())
    t0, t1 = int(meta["window_start_ns"]), int(meta["window_end_ns"])
    # the window: from the end of iteration 1's update to the end of iteration 2's update
    steps = src.execute(
        """SELECT n.start, n."end" FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId
           WHERE s.value = 'DeepSpeedZeroOptimizer_Stage3.step' ORDER BY n.start""").fetchall()
    assert (t0, t1) == (steps[0][1], steps[1][1])
    q = 'SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start < ? AND "end" > ?'
    assert dst.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == src.execute(q, (t1, t0)).fetchone()[0]
    assert dst.execute("SELECT count(*) FROM GPU_METRICS").fetchone()[0] == 0
    # every string id used by kept NVTX/kernels is still resolvable
    missing = dst.execute(
        """SELECT count(*) FROM (SELECT textId AS id FROM NVTX_EVENTS WHERE textId IS NOT NULL
           UNION SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL) u
           WHERE u.id NOT IN (SELECT id FROM StringIds)""").fetchone()[0]
    assert missing == 0
    # and the kept strings are rows of the source table, unchanged
    kept = dst.execute("SELECT id, value FROM StringIds").fetchall()
    assert set(kept) <= set(src.execute("SELECT id, value FROM StringIds").fetchall())
    rc, stdout, err = run("analyze", out, "--json")
    res = json.loads(stdout)
    assert [it["index"] for it in res["ranks"][0]["iterations"]] == [2]
    assert [p["phase"] for p in res["ranks"][0]["iterations"][0]["phases"]][:5] == [
        "forward", "backward", "forward", "backward", "update"]


def test_trim_refuses_to_overwrite(tmp_path):
    out = tmp_path / "o.sqlite"
    out.write_text("keep me")
    assert_one_line_error(*run("trim", ZERO3_CUT, out, "--iterations", "1-1"), "--force")
    assert out.read_text() == "keep me"
    assert_one_line_error(*run("trim", ZERO3_CUT, ZERO3_CUT, "--iterations", "1-1"), "overwrite the input")
    assert_one_line_error(*run("trim", ZERO3_CUT, tmp_path / "n.sqlite", "--iterations", "7-9"), "no iteration 7-9")
    assert_one_line_error(*run("trim", ZERO3_CUT, tmp_path / "n.sqlite", "--iterations", "x"), "expected A-B")
    assert not (tmp_path / "n.sqlite").exists()


def test_trim_drops_strings_only_used_outside_the_window(tmp_path):
    from synthetic import SyntheticTrace, gtid
    from test_phases_synthetic import MS, ds_iteration

    t = SyntheticTrace()
    now = ds_iteration(t, 0)
    t.range("only_in_iteration_0", 1 * MS, 2 * MS, gtid(1, 1), "DeepSpeed")
    end = ds_iteration(t, now)
    t.kernel(now + 1 * MS, now + 2 * MS, pid=1, tid=1, launch=now + 1 * MS)
    t.kernel(1 * MS, 2 * MS, pid=1, tid=1, launch=1 * MS, name="kernel_of_iteration_0")
    src = t.write(tmp_path / "synthetic_two_iterations.sqlite")
    out = tmp_path / "cut.sqlite"
    rc, _, err = run("trim", src, out, "--iterations", "1-1")
    assert rc == 0, err
    con = sqlite3.connect(out)
    values = {v for (v,) in con.execute("SELECT value FROM StringIds")}
    assert "only_in_iteration_0" not in values and "kernel_of_iteration_0" not in values
    assert {"DeepSpeedEngine.forward", "DeepSpeedZeroOptimizer_Stage3.step", "k"} <= values
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == 1
    assert end > now
