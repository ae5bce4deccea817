"""Many traces and bad ones (issue 9): d13 one unreadable trace must not hide the others,
d19 ``--out`` with two traces of one file name, item 22 ``--format`` checked before the
analysis, d12 a memory limit gives one line (exit 2), never a Rust abort or a traceback.

Synthetic traces (hand-made, small: fast to analyze) stand for the ranks; expected values are
counted by hand or with plain SQL on the files.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import ZERO3_CUT, run_cli
from synthetic import SyntheticTrace, gtid

from tracekit.analyze.multi import analyze_many

MS = 1_000_000


def _synthetic_rank(path: Path, step_ms: int = 20) -> Path:
    """One DeepSpeed iteration (forward, backward, step of ``step_ms``) with one H2D copy."""
    t = SyntheticTrace()
    tid = gtid(1, 1)
    t.range("DeepSpeedEngine.forward", 0, 10 * MS, tid, "DeepSpeed")
    t.kernel(2 * MS, 3 * MS, pid=1, tid=1, launch=1 * MS)
    t.range("DeepSpeedEngine.backward", 11 * MS, 21 * MS, tid, "DeepSpeed")
    t.range("DeepSpeedZeroOptimizer_Stage3.step", 22 * MS, (22 + step_ms) * MS, tid, "DeepSpeed")
    t.copy(23 * MS, 24 * MS, 4096, 1, pid=1, tid=1, launch=22 * MS + 500)
    return t.write(path)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """runs/synthetic_rank{0..4}.sqlite; rank 2 truncated to 1,000 bytes (unreadable), rank 4 not SQLite."""
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "caches"))
    d = tmp_path / "runs"
    d.mkdir()
    for i in range(5):
        _synthetic_rank(d / f"synthetic_rank{i}.sqlite", step_ms=20 + i)
    data = (d / "synthetic_rank2.sqlite").read_bytes()
    (d / "synthetic_rank2.sqlite").write_bytes(data[:1000])
    (d / "synthetic_rank4.sqlite").write_bytes(b"not an sqlite file at all")
    return d


def _err_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_bad_traces_listed_good_ones_reported(runs, jobs):
    rc, out, err = run_cli("analyze", runs, "--jobs", jobs, "--no-cache", env={**os.environ, "COLUMNS": "200"})
    assert rc == 2, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    # every good trace is in the table, with its step's wall time (20 + i ms by construction)
    for i in (0, 1, 3):
        assert f"synthetic_rank{i}.sqlite" in out
    assert "3 ranks in 3 traces" in out
    lines = _err_lines(err)
    assert all(ln.startswith("tracekit: error: ") for ln in lines), err
    bad = [ln for ln in lines if "synthetic_rank2.sqlite" in ln or "synthetic_rank4.sqlite" in ln]
    assert len(bad) == 2  # one line each
    assert "truncated or corrupt" in bad[0] and "not an SQLite file" in bad[1]
    assert "2 of 5 traces could not be analyzed" in lines[-1] and "other 3" in lines[-1]
    assert len(lines) == 3


def test_bad_traces_in_json(runs):
    rc, out, err = run_cli("analyze", runs, "--jobs", "1", "--json", "--no-cache")
    assert rc == 2
    d = json.loads(out)
    assert [Path(t["trace"]).name for t in d["traces"]] == [f"synthetic_rank{i}.sqlite" for i in (0, 1, 3)]
    assert [Path(f["trace"]).name for f in d["failed"]] == ["synthetic_rank2.sqlite", "synthetic_rank4.sqlite"]
    assert all(f["error"] and "\n" not in f["error"] for f in d["failed"])
    # the summary is over the good ranks; the bad ones are not "missing", they are failed
    s = d["summary"]
    assert s["ranks"] == 3 and s["missing_ranks"] == []
    upd = {Path(r["trace"]).name: r["phase_ns"]["update"] for r in s["rank_rows"]}
    assert upd == {f"synthetic_rank{i}.sqlite": (20 + i) * MS for i in (0, 1, 3)}
    assert _err_lines(err)[-1].startswith("tracekit: error: 2 of 5 traces")


def test_analyze_many_api_collects_failures(runs):
    out = analyze_many([runs], jobs=1, cache=False)
    assert len(out["traces"]) == 3 and len(out["failed"]) == 2
    assert out["failed"][0]["exit_code"] == 2


def test_all_traces_bad(tmp_path):
    for i in range(2):
        (tmp_path / f"synthetic_rank{i}.sqlite").write_bytes(b"garbage")
    rc, out, err = run_cli("analyze", tmp_path, "--jobs", "1", "--no-cache")
    assert rc == 2 and "Traceback" not in err
    lines = _err_lines(err)
    assert len(lines) == 3 and "2 of 2 traces could not be analyzed" in lines[-1]


# ------------------------------------------------------------------ d19: --out, same file name
def _h2d_bytes(path: Path) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    v = con.execute("SELECT sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1").fetchone()[0]
    con.close()
    return int(v or 0)


def test_out_same_file_name_kept_apart(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = shutil.copy(ZERO3_CUT, tmp_path / "a" / "rank0.sqlite")
    b = _synthetic_rank(tmp_path / "b" / "rank0.sqlite")
    out = tmp_path / "frames"
    rc, _, err = run_cli("analyze", a, b, "--out", out, "--section", "sizes", "--no-cache")
    assert rc == 0, err
    dirs = sorted(p.name for p in out.iterdir())
    assert dirs == ["a-rank0", "b-rank0"]
    # each folder holds its own trace's frames: H2D bytes of copy_sizes = plain SQL sum
    import polars as pl

    for d, trace in (("a-rank0", a), ("b-rank0", b)):
        f = pl.read_csv(out / d / "copy_sizes.csv")
        assert int(f.filter(pl.col("direction") == "H2D")["bytes"].sum()) == _h2d_bytes(Path(trace))
    # stderr says which folder is which trace
    lines = [ln for ln in err.splitlines() if ln.startswith("wrote")]
    assert any(str(out / "a-rank0") in ln and str(a) in ln for ln in lines), err
    assert any(str(out / "b-rank0") in ln and str(b) in ln for ln in lines), err


def test_out_dirs_unique_names():
    from tracekit.render.files import frame_dirs

    out = Path("o")
    paths = [Path("x/a/rank0.sqlite"), Path("y/a/rank0.sqlite"), Path("b/rank1.sqlite"), Path("rank2.sqlite")]
    assert frame_dirs(paths, out) == [out / "x-a-rank0", out / "y-a-rank0", out / "rank1", out / "rank2"]
    assert frame_dirs([Path("c/run.sqlite")], out) == [out]
    # names that would still collide get a number
    got = frame_dirs([Path("a-b/c.sqlite"), Path("a/b-c.sqlite"), Path("a/b/c.sqlite")], out)
    assert len(set(got)) == 3


# ------------------------------------------------------------------ item 22: --format first
def test_out_format_checked_before_analysis(tmp_path):
    bad_trace = tmp_path / "synthetic_bad.sqlite"
    bad_trace.write_bytes(b"garbage")  # analysing it would fail: the --format error must come first
    rc, out, err = run_cli("analyze", bad_trace, "--out", tmp_path / "f", "--format", "xlsx", "--no-cache")
    lines = _err_lines(err)
    assert rc == 2 and len(lines) == 1 and "--format 'xlsx'" in lines[0], err
    assert not (tmp_path / "f").exists()


# ------------------------------------------------------------------ d12: memory limit
def _limited(limit_bytes: int, *args):
    import subprocess

    cmd = ["prlimit", f"--as={limit_bytes}", sys.executable, "-m", "tracekit.cli", *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RUST_BACKTRACE": "1"})
    return p.returncode, p.stdout, p.stderr


needs_prlimit = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit")


@needs_prlimit
def test_memory_limit_one_line(tmp_path):
    """Under an address-space limit too small for numpy/polars, one line naming the limit and what to do."""
    rc, out, err = _limited(400_000_000, "analyze", ZERO3_CUT, "--all", "--no-cache")
    lines = _err_lines(err)
    assert rc == 2, (rc, err[-2000:])
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith("tracekit: error: ") and "400 MB" in lines[0]
    # what to do: analyze less at once, or (polars/numpy could not even be loaded) raise the limit
    assert ("--section" in lines[0] and "--jobs 1" in lines[0]) or lines[0].endswith(
        "tracekit's libraries (polars, numpy) could not be loaded; raise the limit")
    assert "memory allocation" not in err and "Traceback" not in err and "stack backtrace" not in err


@needs_prlimit
@pytest.mark.parametrize("limit", [800_000_000, 1_000_000_000, 1_200_000_000, 1_600_000_000])
def test_memory_limit_never_aborts(limit):
    """Between "cannot load" and "enough", polars fails in many ways (a thread that cannot
    start, SIGSEGV, Rust's allocation abort with a backtrace, seen at 0.8, 1.0 and 1.2 GB on
    the dev machine): each is exit 2 with the one line, or the analysis succeeds."""
    rc, out, err = _limited(limit, "analyze", ZERO3_CUT, "--all", "--no-cache")
    assert rc in (0, 2), (rc, err[-2000:])
    assert "memory allocation" not in err and "Traceback" not in err and "stack backtrace" not in err
    if rc == 2:
        (line,) = _err_lines(err)
        assert line.startswith("tracekit: error: out of memory") and (f"{limit / 1e9:.1f} GB" if limit >= 1e9 else f"{limit / 1e6:.0f} MB") in line


def test_guard_hides_rust_abort_and_names_limit(tmp_path, monkeypatch, capfd):
    """The guard itself, with a stand-in child that writes a normal line, then Rust's
    allocation-failure message and backtrace, and aborts (SIGABRT) like polars does."""
    from tracekit import memlimit

    child = tmp_path / "fake_python"
    child.write_text("#!/bin/sh\necho 'wrote 3 files to x' >&2\n"
                     "echo 'memory allocation of 6509400 bytes failed' >&2\necho 'stack backtrace:' >&2\n"
                     "echo '   0: rust_begin_unwind' >&2\n"
                     "echo 'note: Some details are omitted, run with RUST_BACKTRACE=full' >&2\nkill -ABRT $$\n")
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    monkeypatch.setattr(memlimit, "current_limit", lambda: ("address-space limit (ulimit -v, prlimit --as)", 2_000_000_000))
    monkeypatch.delenv(memlimit.CHILD_ENV, raising=False)
    assert memlimit.run_guarded(["analyze", "x.sqlite"]) == 2
    err = capfd.readouterr().err
    assert err.splitlines() == [
        "wrote 3 files to x",
        "tracekit: error: out of memory under the address-space limit (ulimit -v, prlimit --as) of 2.0 GB; "
        "analyze less at once: --section with the sections you need instead of --all, fewer traces per run, "
        "--jobs 1, or raise the limit",
    ]
    # capture keeps its terminal: never run in a child
    assert memlimit.run_guarded(["capture", "--", "true"]) is None
    # a Rust panic (polars could not spawn a thread) that the child reports itself, on one line
    child.write_text("#!/bin/sh\necho '' >&2\n"
                     "echo \"thread '<unnamed>' (1698) panicked at library/std/src/thread/functions.rs:131:29:\" >&2\n"
                     "echo 'failed to spawn thread: Os { code: 11 }' >&2\necho 'stack backtrace:' >&2\n"
                     "echo 'note: Some details are omitted' >&2\necho 'tracekit: error: out of memory (child)' >&2\n"
                     "echo '' >&2\necho 'last line' >&2\nexit 2\n")
    assert memlimit.run_guarded(["analyze", "x.sqlite"]) == 2
    assert capfd.readouterr().err.splitlines() == ["tracekit: error: out of memory (child)", "", "last line"]


def test_guard_never_hides_the_childs_own_line(tmp_path, monkeypatch, capfd):
    """The child's own line right where a panic's message is expected, or glued to a dying
    thread's allocation message on one line (threads dying at once interleave): still shown,
    from ``tracekit: `` on (an 800 MB run once exited 2 with no line at all)."""
    from tracekit import memlimit

    child = tmp_path / "fake_python"
    child.write_text("#!/bin/sh\n"
                     "echo \"thread '<unnamed>' (7) panicked at src/lib.rs:1:1:\" >&2\n"
                     "echo 'tracekit: error: out of memory (after a panic)' >&2\n"
                     "printf 'memory allocation of 64 bytes failedtracekit: error: out of memory (glued)\\n' >&2\n"
                     "exit 2\n")
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    monkeypatch.setattr(memlimit, "current_limit", lambda: ("address-space limit (ulimit -v, prlimit --as)", 8e8))
    monkeypatch.delenv(memlimit.CHILD_ENV, raising=False)
    assert memlimit.run_guarded(["analyze", "x.sqlite"]) == 2
    assert capfd.readouterr().err.splitlines() == ["tracekit: error: out of memory (after a panic)",
                                                   "tracekit: error: out of memory (glued)"]


@needs_prlimit
def test_memory_limit_large_enough_runs(tmp_path):
    """A limit that leaves room changes nothing: same JSON as without the limit, exit 0."""
    rc, out, err = _limited(16_000_000_000, "analyze", ZERO3_CUT, "--json", "--no-cache")
    assert rc == 0, err
    rc2, out2, _ = run_cli("analyze", ZERO3_CUT, "--json", "--no-cache")
    assert json.loads(out) == json.loads(out2)


def test_python_memory_error_is_one_line(monkeypatch, capsys):
    from tracekit import analysis, cli

    def boom(*a, **k):
        raise MemoryError()

    monkeypatch.setattr(analysis, "analyze", boom)  # the one pipeline every command goes through
    rc = cli.main(["analyze", str(ZERO3_CUT), "--no-cache"])
    err = capsys.readouterr().err
    lines = _err_lines(err)
    assert rc == 2 and len(lines) == 1 and "out of memory" in lines[0] and "--section" in lines[0]
