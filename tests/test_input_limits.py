"""Reading and limits (issue 25): NVTX domain ids per process (e02), ``--ranks`` bounded by the
ranks present (e03), the memory guard under tight limits (e04), damaged cache entries (d02), and
the low items (the memory advice per command, long trace names, a swapped-in cache folder).

Expected values come from plain SQL on the fixture, hand-made cases or counting by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, ZERO3_CUT, run_cli

MS = 1_000_000
LIMIT_NAME = "address-space limit (ulimit -v, prlimit --as)"


def _err_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


# ------------------------------------------------------------------ e02: NVTX domains per process
def _sql_forward(path: Path, pid: int) -> list[tuple[int, int]]:
    """(start, end) of ``DeepSpeedEngine.forward`` ranges of ``pid`` in the domain that pid created
    as "DeepSpeed" (joined on process and domainId), by plain SQL."""
    con = sqlite3.connect(path)
    rows = con.execute(
        """SELECT n.start, n."end" FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
           JOIN NVTX_EVENTS d ON d.eventType = 75 AND d.text = 'DeepSpeed' AND d.domainId = n.domainId
                AND (d.globalTid >> 24) & 16777215 = (n.globalTid >> 24) & 16777215
           WHERE n.eventType = 59 AND coalesce(n.text, s.value) = 'DeepSpeedEngine.forward'
             AND (n.globalTid >> 24) & 16777215 = ? ORDER BY n.start""", (pid,)).fetchall()
    con.close()
    return rows


def test_other_process_domain_id_keeps_deepspeed_phases(tmp_path):
    """A second process (pid 643) creates its own domain 2, "dataloader", after DeepSpeed's domain
    2 of pid 642: pid 642's phases still come from DeepSpeed, its forward phases are exactly its
    DeepSpeed forward ranges (SQL), and pid 643's range is in "dataloader"."""
    t = tmp_path / "t.sqlite"
    shutil.copy(ZERO3_CUT, t)
    con = sqlite3.connect(t)
    con.executescript(
        """INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, domainId)
             SELECT start + 1000, NULL, 75, 'dataloader', globalTid + 16777216, domainId FROM NVTX_EVENTS
             WHERE eventType = 75 AND text = 'DeepSpeed';
           INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, domainId)
             SELECT start + 2000, start + 3000, 59, 'load batch', globalTid + 16777216, domainId FROM NVTX_EVENTS
             WHERE eventType = 75 AND text = 'DeepSpeed';""")
    con.commit()
    con.close()
    rc, out, err = run_cli("analyze", t, "--no-cache", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["phase_source"]["642"] == "DeepSpeed"
    forwards = [(p["start_ns"], p["end_ns"]) for r in d["ranks"] if r["pid"] == 642
                for it in r["iterations"] for p in it["phases"] if p["phase"] == "forward"]
    expected = _sql_forward(t, 642)
    assert len(expected) == 4 and forwards == expected

    from tracekit.analyze.model import nvtx
    from tracekit.analyze.trace.export import Export

    with Export.open(t, cache=False) as ex:
        r = nvtx.load_ranges(ex)
    by_pid = {(int(p) >> 24) & 0xFFFFFF: set(g["domain"]) for (p,), g in r.group_by("global_pid")}
    assert by_pid[643] == {"dataloader"}
    assert "dataloader" not in by_pid[642]


def test_real_fixture_domain_one_per_process():
    """superoffload_cut: pid 685 created domain 1 as "NCCL", the CPU worker pid 879 created its
    domain 1 as "tracekit" (checked by SQL): each process's domain-1 ranges carry its own name
    (keyed by domainId alone, the worker's later create row renamed pid 685's NCCL ranges)."""
    path = FIXTURES / "superoffload_cut.sqlite"
    con = sqlite3.connect(path)
    created = {((t >> 24) & 0xFFFFFF, d): n for t, d, n in
               con.execute("SELECT globalTid, domainId, text FROM NVTX_EVENTS WHERE eventType = 75")}
    counts = dict(((p, d), c) for p, d, c in con.execute(
        """SELECT (globalTid >> 24) & 16777215, domainId, count(*) FROM NVTX_EVENTS
           WHERE eventType IN (59, 60) AND start IS NOT NULL GROUP BY 1, 2"""))
    con.close()
    assert created[(685, 1)] == "NCCL" and created[(879, 1)] == "tracekit"

    from tracekit.analyze.model import nvtx
    from tracekit.analyze.trace.export import Export

    with Export.open(path, cache=False) as ex:
        r = nvtx.load_ranges(ex)
    got = {}
    for (p, dom), g in r.group_by("global_pid", "domain"):
        got[((int(p) >> 24) & 0xFFFFFF, dom)] = g.height
    for (pid, did), n in counts.items():
        name = created.get((pid, did), "")
        assert got.get((pid, name)) == n, (pid, did, name, got)


def test_domains_lookup_synthetic():
    """The lookup rules of nvtx.Domains, hand-made: own process first, then a create row without
    a thread, then one name shared by every process (a forked child without its own row), else ""."""
    from synthetic import gtid

    from tracekit.analyze.model.nvtx import Domains
    from tracekit.vocab import global_pid_of

    d = Domains([(gtid(10, 1), 1, "NCCL"), (gtid(11, 5), 1, "tracekit"), (gtid(10, 2), 2, "DeepSpeed"),
                 (None, 7, "anywhere")])
    p10, p11, p12 = (global_pid_of(gtid(p, 1)) for p in (10, 11, 12))
    assert d.name(p10, 1) == "NCCL" and d.name(p11, 1) == "tracekit"
    assert d.name(p12, 1) == ""  # two processes disagree: unknown
    assert d.name(p12, 2) == "DeepSpeed" and d.name(p11, 2) == "DeepSpeed"  # one name for id 2
    assert d.name(p10, 7) == "anywhere" and d.name(p10, 0) == "" and d.name(p10, None) == ""
    assert d.by_id() is None
    assert Domains([(gtid(1, 1), 1, "a"), (gtid(2, 1), 1, "a")]).by_id() == {1: "a"}
    import polars as pl

    col = d.column(pl.Series([p10, p11, p12, None], dtype=pl.Int64), pl.Series([1, 1, 2, 7], dtype=pl.Int64))
    assert col.to_list() == ["NCCL", "tracekit", "DeepSpeed", "anywhere"]


def test_rank_record_domain_per_process(tmp_path):
    """The capture hook's rank record is preferred in the tracekit domain; another process's domain
    of the same id named "tracekit" must not make pid 20's record (in its "DeepSpeed" domain 1)
    count as tracekit's (synthetic, two processes)."""
    from synthetic import DOMAIN, MARK, SyntheticTrace, gtid

    t = SyntheticTrace()
    t.nvtx.append((0, None, DOMAIN, "DeepSpeed", gtid(20, 1), None, None, 1))
    t.nvtx.append((1, None, DOMAIN, "tracekit", gtid(21, 1), None, None, 1))
    t.nvtx.append((5, None, MARK, "rank 0 local_rank 0 world 2", gtid(20, 1), None, None, 1))
    t.nvtx.append((6, None, MARK, "rank 1 local_rank 1 world 2", gtid(21, 1), None, None, 1))
    t.kernel(10, 20, pid=20, tid=1)
    path = t.write(tmp_path / "r.sqlite")

    from tracekit.analyze.model.rank_ids import rank_records
    from tracekit.analyze.trace.export import Export

    with Export.open(path, cache=False) as ex:
        recs = rank_records(ex)
    assert dict(zip(((p >> 24) & 0xFFFFFF for p in recs["global_pid"]), recs["domain"])) == {
        20: "DeepSpeed", 21: "tracekit"}


# ------------------------------------------------------------------ e03: --ranks
def test_missing_ranges_brute_force():
    """missing_ranges against a brute-force set difference on small spans."""
    import random

    from tracekit.analyze.multi import listed_ranks, missing_ranges

    rng = random.Random(25)
    for _ in range(300):
        upto = rng.randrange(0, 40)
        present = {rng.randrange(-3, 50) for _ in range(rng.randrange(0, 12))}
        want = sorted(set(range(upto)) - present)
        got = missing_ranges(present, upto)
        assert [n for a, b in got for n in range(a, b + 1)] == want
        assert all(b >= a for a, b in got) and all(b1 + 1 < a2 for (_, b1), (a2, _) in zip(got, got[1:]))
        assert listed_ranks(got, 5) == want[:5]


def test_huge_expected_ranks_is_bounded():
    """--ranks 10^11 with two ranks present: the summary is computed from the two (no range of
    10^11 numbers is built), the count is exact and only the first numbers are listed."""
    from tracekit.analyze.multi import MAX_LISTED_MISSING, summarize_ranks

    results = [{"trace": f"rank{i}.sqlite", "ranks": [{"pid": 1, "device": 0, "iterations": []}]} for i in (0, 1)]
    s = summarize_ranks(results, [Path("rank0.sqlite"), Path("rank1.sqlite")], expected_ranks=10**11)
    assert s["missing_ranks_count"] == 10**11 - 2
    assert s["missing_rank_ranges"] == [[2, 10**11 - 1]]
    assert s["missing_ranks"] == list(range(2, 2 + MAX_LISTED_MISSING))
    # file names alone: rank0 and rank7 -> 1..6 missing
    s = summarize_ranks(results, [Path("rank0.sqlite"), Path("rank7.sqlite")])
    assert s["missing_ranks"] == [1, 2, 3, 4, 5, 6] and s["missing_ranks_count"] == 6


def test_huge_ranks_cli_fast_and_small(tmp_path):
    """``analyze rank0 rank1 --ranks 100000000000``: exit 0, the missing ranks as one range."""
    for i in (0, 1):
        shutil.copy(ZERO3_CUT, tmp_path / f"rank{i}.sqlite")
    rc, out, err = run_cli("analyze", tmp_path / "rank0.sqlite", tmp_path / "rank1.sqlite", "--no-cache",
                           "--jobs", "1", "--ranks", "100000000000")
    assert rc == 0, err
    assert "missing ranks: 2-99999999999 (99,999,999,998 ranks)" in out
    assert len(out) < 100_000


@pytest.mark.parametrize("value", ["0", "-1", "-100000000000"])
def test_ranks_below_one_rejected(tmp_path, value):
    """--ranks N is the number of ranks (0..N-1): 0 and negative numbers are one line, exit 2,
    before any analysis."""
    for i in (0, 1):
        shutil.copy(ZERO3_CUT, tmp_path / f"rank{i}.sqlite")
    rc, out, err = run_cli("analyze", tmp_path / "rank0.sqlite", tmp_path / "rank1.sqlite", "--ranks", value)
    lines = _err_lines(err)
    assert rc == 2 and len(lines) == 1, err
    assert lines[0] == (f"tracekit: error: --ranks {value}: give the number of ranks in the run, a positive "
                        "integer N (ranks 0..N-1)")
    assert out == "" and not (tmp_path / "rank0.sqlite.tracekit-cache").exists()


def test_missing_text_ranges():
    from tracekit.render.many import missing_text

    assert missing_text({"missing_rank_ranges": [[1, 1], [4, 5]], "missing_ranks_count": 3}) == "1, 4, 5"
    assert missing_text({"missing_rank_ranges": [[3, 3], [7, 12]], "missing_ranks_count": 7}) == "3, 7-12 (7 ranks)"


# ------------------------------------------------------------------ e04: the memory guard under tight limits
needs_prlimit = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit")


@needs_prlimit
@pytest.mark.parametrize("limit", [150_000_000, 200_000_000, 250_000_000, 300_000_000])
def test_tight_limit_one_line(limit):
    """``prlimit --as`` of 150-300 MB (the guard's child cannot load polars/numpy: OpenBLAS' own
    message and exit 1, "Polars binary is missing!", SystemError tracebacks, jemalloc's endless
    "background thread creation failed" before): one ``tracekit:`` line naming the limit, exit 2."""

    p = _run_or_describe(["prlimit", f"--as={limit}", sys.executable, "-m", "tracekit.cli", "analyze",
                          str(ZERO3_CUT), "--no-cache"], timeout=120)
    lines = _err_lines(p.stderr)
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr[-3000:])
    assert lines[0].startswith("tracekit: error: out of memory under the " + LIMIT_NAME + f" of {limit / 1e6:.0f} MB")
    assert p.stdout == ""


def _tree_state(pid: int) -> list[str]:
    """``pid`` and its descendants: state, threads and kernel wait channel of each (/proc)."""
    rows, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            stat = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            wchan = Path(f"/proc/{p}/wchan").read_text()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:120].decode(errors="replace")
        except OSError:
            continue
        rows.append(f"{p} state={stat[0]} threads={stat[17]} wchan={wchan} {cmd}")
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == p:
                        todo.append(int(d.name))
                except OSError:
                    pass
    return rows


def _run_or_describe(cmd: list[str], timeout: float):
    """``subprocess.run(cmd)`` with output captured; past ``timeout`` the process tree's state
    and the stderr so far go into the failure (a CI run once timed out here, unreproduced)."""
    import subprocess

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = _tree_state(proc.pid)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"no exit after {timeout} s; processes: {state}; stderr (last 3000): {err[-3000:]!r}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _stand_in(tmp_path, monkeypatch, script: str, limit=2e8):
    from tracekit import memlimit

    child = tmp_path / "fake_python"
    child.write_text("#!/bin/sh\n" + script)
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    monkeypatch.setattr(memlimit, "current_limit", lambda: (LIMIT_NAME, int(limit)))
    monkeypatch.delenv(memlimit.CHILD_ENV, raising=False)
    return memlimit


def test_guard_openblas_exit_is_the_limit_line(tmp_path, monkeypatch, capfd):
    """OpenBLAS out of memory at numpy's import prints its line and exits 1: the guard hides the
    line and says that the libraries could not be loaded under the limit (exit 2)."""
    memlimit = _stand_in(tmp_path, monkeypatch, "echo 'OpenBLAS error: Memory allocation still failed after 10 "
                                                "retries, giving up.' >&2\nexit 1\n")
    assert memlimit.run_guarded(["analyze", "x.sqlite"]) == 2
    assert capfd.readouterr().err.splitlines() == [
        f"tracekit: error: out of memory under the {LIMIT_NAME} of 200 MB: tracekit's libraries (polars, numpy) "
        "could not be loaded; raise the limit"]
    # the dynamic loader's message when a library's thread-local storage cannot be allocated (exit 127)
    memlimit = _stand_in(tmp_path, monkeypatch, "echo 'cannot allocate memory for thread-local data: ABORT' >&2\n"
                                                "exit 127\n")
    assert memlimit.run_guarded(["analyze", "x.sqlite"]) == 2
    assert len(capfd.readouterr().err.splitlines()) == 1
    # an ordinary exit 1 (no such message) is passed on as it is
    memlimit = _stand_in(tmp_path, monkeypatch, "echo 'tracekit: internal error: X' >&2\nexit 1\n")
    assert memlimit.run_guarded(["analyze", "x.sqlite"]) == 1
    assert capfd.readouterr().err.splitlines() == ["tracekit: internal error: X"]


def test_guard_one_line_when_child_crashes_after_its_own(tmp_path, monkeypatch, capfd):
    """The child's own error line with jemalloc's complaint written into it, then a crash (SIGABRT)
    while exiting: that one line, cut before ``<jemalloc>``, and no second line from the guard."""
    memlimit = _stand_in(tmp_path, monkeypatch,
                         "printf 'tracekit: error: out of memory (child)<jemalloc>: background thread creation "
                         "failed (11)\\n' >&2\necho '<jemalloc>: background thread creation failed (11)' >&2\n"
                         "kill -ABRT $$\n")
    assert memlimit.run_guarded(["analyze", "x.sqlite"]) == 2
    assert capfd.readouterr().err.splitlines() == ["tracekit: error: out of memory (child)"]
    # a line after the child's own error: the crash is reported by the guard as before
    memlimit = _stand_in(tmp_path, monkeypatch, "echo 'tracekit: error: a.sqlite: not an export' >&2\n"
                                                "echo 'analyzing b.sqlite' >&2\nkill -ABRT $$\n")
    assert memlimit.run_guarded(["analyze", "a.sqlite", "b.sqlite"]) == 2
    err = capfd.readouterr().err.splitlines()
    assert err[:2] == ["tracekit: error: a.sqlite: not an export", "analyzing b.sqlite"]
    assert len(err) == 3 and err[2].startswith("tracekit: error: out of memory under the")


def test_guard_child_environment(tmp_path, monkeypatch, capfd):
    """The child gets one OpenBLAS thread and polars' jemalloc without its background thread,
    unless the user set those variables."""
    memlimit = _stand_in(tmp_path, monkeypatch,
                         'echo "[$OPENBLAS_NUM_THREADS] [$_RJEM_MALLOC_CONF] [$TRACEKIT_MEMLIMIT_CHILD]" >&2\n')
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "_RJEM_MALLOC_CONF"):
        monkeypatch.delenv(k, raising=False)
    assert memlimit.run_guarded(["report", "x.sqlite"]) == 0
    assert capfd.readouterr().err.splitlines() == ["[1] [background_thread:false] [1]"]
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "narenas:2")
    assert memlimit.run_guarded(["report", "x.sqlite"]) == 0
    assert capfd.readouterr().err.splitlines() == ["[4] [narenas:2] [1]"]
    # tracekit's own decay setting (memlimit.allocator_defaults) is kept, the background thread off
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
    assert memlimit.run_guarded(["report", "x.sqlite"]) == 0
    own = "dirty_decay_ms:0,muzzy_decay_ms:0,background_thread:false"
    assert capfd.readouterr().err.splitlines() == [f"[4] [{own}] [1]"]


def test_allocator_defaults(monkeypatch):
    """The CLI's entry sets polars' jemalloc to return freed pages at once, unless the user set
    the variable, and only while polars is not loaded yet (jemalloc reads it when it loads)."""
    import subprocess

    import polars  # noqa: F401  (loaded: too late for the setting)

    from tracekit import memlimit

    monkeypatch.setenv("_RJEM_MALLOC_CONF", "")  # recorded, so that monkeypatch restores (or removes) it after
    monkeypatch.delenv("_RJEM_MALLOC_CONF")
    memlimit.allocator_defaults()  # polars is loaded in this process: nothing set
    assert "_RJEM_MALLOC_CONF" not in os.environ
    probe = ("import os, sys; from tracekit import memlimit; memlimit.allocator_defaults(); "
             "print(os.environ.get('_RJEM_MALLOC_CONF'), 'polars' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["dirty_decay_ms:0,muzzy_decay_ms:0", "False"]
    capture = probe.replace("allocator_defaults()", "allocator_defaults(['capture', '--', 'true'])")
    out = subprocess.run([sys.executable, "-c", capture], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["None", "False"]  # not for capture: the training inherits the environment
    env["_RJEM_MALLOC_CONF"] = "narenas:2"  # the user's own setting is kept
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["narenas:2", "False"]


def _options_of(command: str) -> set[str]:
    """The option names (``--x``, ``-o``) of tracekit's ``command``, from the typer app itself."""
    import typer

    from tracekit import cli

    group = typer.main.get_command(cli.app)
    cmd = group.commands[command]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("command", ["analyze", "report", "compare", "trim"])
def test_memory_advice_names_only_the_commands_flags(command, tmp_path, monkeypatch, capfd):
    """The out-of-memory line of each guarded command advises only flags that command has (report
    was told to use --section/--jobs, which only analyze has), through the guard as well."""
    import re

    from tracekit import memlimit

    line = memlimit.message((LIMIT_NAME, 900_000_000), command)
    advice = line.split("; ", 1)[1]  # after the limit (which names prlimit's --as)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", advice))
    assert flags, line
    own = _options_of(command)
    trim_flags = _options_of("trim")
    for f in flags:  # a flag of the command, or of the `tracekit trim` it suggests
        assert f in own or ("tracekit trim" in line and f in trim_flags), (command, f, line)
    memlimit = _stand_in(tmp_path, monkeypatch, "echo 'memory allocation of 64 bytes failed' >&2\nkill -ABRT $$\n")
    assert memlimit.run_guarded([command, "x.sqlite"]) == 2
    assert capfd.readouterr().err.splitlines() == [
        f"tracekit: error: {memlimit.message((LIMIT_NAME, int(2e8)), command)}"]


def test_failed_import_under_limit(tmp_path, monkeypatch):
    """An exception raised while a module is imported counts as the libraries not loading, but
    only under a limit, and never a module that does not exist."""
    from tracekit import memlimit

    (tmp_path / "tk_broken_mod.py").write_text("raise SystemError('error return without exception set')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def exc_of(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            return e

    broken = exc_of(lambda: __import__("tk_broken_mod"))
    missing = exc_of(lambda: __import__("tk_no_such_module_25"))
    plain = exc_of(lambda: int("x"))
    monkeypatch.setattr(memlimit, "current_limit", lambda: (LIMIT_NAME, 200_000_000))
    assert memlimit.failed_import(broken)
    assert not memlimit.failed_import(missing) and not memlimit.failed_import(plain)
    monkeypatch.setattr(memlimit, "current_limit", lambda: None)
    assert not memlimit.failed_import(broken)


def test_handler_out_of_memory_gives_the_prepared_line(monkeypatch, capfd):
    """Under a limit the line is made before the command runs: when the error handler itself runs
    out of memory, that line is written (one write), exit 2, no traceback."""
    from tracekit import analysis, cli, memlimit

    monkeypatch.setattr(memlimit, "current_limit", lambda: (LIMIT_NAME, 300_000_000))
    monkeypatch.setenv(memlimit.CHILD_ENV, "1")  # as the guard's child: no second process
    monkeypatch.delenv("TRACEKIT_DEBUG", raising=False)

    def boom(*a, **k):
        raise RuntimeError("x")

    def no_memory(exc):
        raise MemoryError()

    monkeypatch.setattr(analysis, "analyze", boom)
    monkeypatch.setattr(memlimit, "failed_import", no_memory)
    import warnings

    with warnings.catch_warnings():  # the filter prepare_child adds stays in this block
        rc = cli.main(["analyze", str(ZERO3_CUT), "--no-cache"])
    err = capfd.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert _err_lines(err) == [f"tracekit: error: {memlimit.message((LIMIT_NAME, 300_000_000), 'analyze')}"]


# ------------------------------------------------------------------ d02: damaged cache entries
def _damage(entry: Path, resign: bool) -> bool:
    """Flip bit 4 of payload byte 42 of a cache entry (``TKC2 <header>\\n<payload>``); with
    ``resign`` the header's size and sha256 are recomputed, so that the damaged Parquet reaches
    polars. False when the payload is too short."""
    import hashlib

    b = entry.read_bytes()
    assert b.startswith(b"TKC2 ")
    nl = b.index(b"\n")
    head, pay = json.loads(b[5:nl]), bytearray(b[nl + 1:])
    if len(pay) <= 42:
        return False
    pay[42] ^= 0x10
    if resign:
        head["size"], head["sha256"] = len(pay), hashlib.sha256(pay).hexdigest()
    entry.write_bytes(b"TKC2 " + json.dumps(head, sort_keys=True).encode() + b"\n" + bytes(pay))
    return True


@pytest.mark.parametrize("resign", [False, True])
def test_damaged_query_entries_are_silent_misses(tmp_path, resign, monkeypatch):
    """Every query entry of the cache damaged at once (raw: the checksum fails; re-signed: polars
    gets bytes it cannot decode and panics in Rust): exit 0, the JSON of an analysis without
    cache, and nothing at all on stderr (no panic text). Each entry is rewritten good."""
    monkeypatch.delenv("TRACEKIT_CACHE_DIR", raising=False)  # the cache beside the trace, where it is damaged
    t = tmp_path / "t.sqlite"
    shutil.copy(ZERO3_CUT, t)
    rc, ref, err = run_cli("analyze", t, "--section", "pcie", "--json", "--no-cache")
    assert rc == 0, err
    rc, _, err = run_cli("analyze", t, "--section", "pcie", "--json")
    assert rc == 0, err
    cache = Path(f"{t}.tracekit-cache")
    entries = sorted(cache.glob("q-*.parquet"))
    damaged = [e for e in entries if _damage(e, resign)]
    assert len(damaged) >= 10
    for e in cache.iterdir():
        if e.name[:2] in ("r-", "t-", "o-"):
            e.unlink()  # no stored result: the query entries must be read
    rc, out, err = run_cli("analyze", t, "--section", "pcie", "--json")
    assert rc == 0 and err == "", err[-3000:]
    assert json.loads(out) == json.loads(ref)
    import polars as pl

    from tracekit.analyze.trace.quiet import read_parquet

    for e in damaged:  # each replaced by a good entry: it decodes again
        b = e.read_bytes()
        assert read_parquet(b[b.index(b"\n") + 1:]) is not None
        assert isinstance(read_parquet(b[b.index(b"\n") + 1:]), pl.DataFrame)


def test_drop_panic_text_hand_made():
    from tracekit.analyze.trace.quiet import drop_panic_text

    data = (b"before\n\n"
            b"thread 'async-executor-0' (8169) panicked at crates/x.rs:43:9:\n"
            b"assertion failed: start + length <= self.bytes.len()\nstack backtrace:\n   0: rust_begin_unwind\n"
            b"note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n\n"
            b"thread 'async-executor-1' (8171) panicked at crates/y.rs:1:1:\ncalled `Result::unwrap()`\n"
            b"tracekit: note: kept\nafter\n")
    assert drop_panic_text(data) == b"before\ntracekit: note: kept\nafter\n"
    assert drop_panic_text(b"a\n\nb\n") == b"a\n\nb\n"


def test_panic_text_hidden_delays_other_text(capfd):
    """What other code writes to fd 2 inside the window comes out after it, in order; nested
    windows share one capture; fd 2 is the terminal's again afterwards."""
    from tracekit.analyze.trace.quiet import panic_text_hidden

    before = os.fstat(2)
    with panic_text_hidden():
        os.write(2, b"one\n")
        with panic_text_hidden():
            os.write(2, b"thread 'x' panicked at a.rs:1:1:\nboom\n")
            os.write(2, b"tracekit: note: two\n")
        assert capfd.readouterr().err == ""  # held back until the outer window closes
    after = os.fstat(2)
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
    assert capfd.readouterr().err == "one\ntracekit: note: two\n"


# ------------------------------------------------------------------ low: long names, a swapped-in folder
def test_long_trace_name_keeps_its_cache(tmp_path):
    """A 245-character trace name: the cache folder's name is cut and tagged with a hash so that
    it fits in 255 bytes; the second run is served from it with no note (before: two notes on
    every run, no cache)."""
    from tracekit.analyze.trace.cache import cache_dir_name

    name = "r" * 238 + ".sqlite"
    t = tmp_path / name
    shutil.copy(ZERO3_CUT, t)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TRACEKIT_CACHE_DIR")}
    rc, out1, err = run_cli("analyze", t, "--json", env=env)
    assert rc == 0 and err == "", err
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(folders) == 1 and len(folders[0].name.encode()) == 255
    assert folders[0].name == cache_dir_name(name) and folders[0].name.endswith(".tracekit-cache")
    assert (folders[0] / "manifest.json").is_file() and list(folders[0].glob("r-*.json"))
    rc, out2, err = run_cli("analyze", t, "--json", env=env)
    assert rc == 0 and err == "" and out2 == out1
    # short names are as before; two long names that share their first 200 characters differ
    assert cache_dir_name("run.sqlite") == "run.sqlite.tracekit-cache"
    a, b = cache_dir_name("x" * 250 + "1"), cache_dir_name("x" * 250 + "2")
    assert a != b and len(a.encode()) == len(b.encode()) == 255
    assert len(cache_dir_name("é" * 200, "0123456789abcdef-").encode()) <= 255


def test_swapped_in_folder_receives_no_entries(tmp_path):
    """The cache folder is moved away while a run has it open and a folder of the user's is put
    at its path: nothing is written into the user's folder (before: entries and a manifest)."""
    import polars as pl

    from tracekit.analyze.trace.cache import TraceCache

    t = tmp_path / "t.sqlite"
    shutil.copy(ZERO3_CUT, t)
    tc = TraceCache(t)
    tc.put_frame("k1", pl.DataFrame({"a": [1, 2]}))
    cache = Path(tc.directory)
    assert tc.writes == 1 and (cache / "manifest.json").exists()
    cache.rename(tmp_path / "moved")
    cache.mkdir(mode=0o755)
    (cache / "mine.txt").write_text("user data")
    tc.put_frame("k2", pl.DataFrame({"a": [3]}))
    tc.put_text("k3", "text")
    assert sorted(p.name for p in cache.iterdir()) == ["mine.txt"]
    assert tc.get_frame("k1") is None and not tc.enabled
    assert tc.writes == 1


def test_no_child_runs_in_process_with_the_library_settings(monkeypatch):
    """A child that cannot be started (no memory to exec it): the command runs in this process,
    with the settings the child would have had (without them jemalloc retries its background
    thread for ever under a tight limit)."""
    import subprocess

    from tracekit import memlimit

    def refuse(*a, **k):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(memlimit, "current_limit", lambda: (LIMIT_NAME, 200_000_000))
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "_RJEM_MALLOC_CONF", memlimit.CHILD_ENV):
        monkeypatch.setenv(k, "")  # recorded, so that monkeypatch restores (or removes) it after
        monkeypatch.delenv(k)
    assert memlimit.run_guarded(["analyze", "x.sqlite"]) is None
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert os.environ["_RJEM_MALLOC_CONF"] == "background_thread:false"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the user's own setting is kept
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    assert memlimit.run_guarded(["analyze", "x.sqlite"]) is None
    assert "OPENBLAS_NUM_THREADS" not in os.environ
