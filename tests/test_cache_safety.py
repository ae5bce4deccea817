"""The result cache is a convenience, never a risk (issue 9: d01 d02 d05 d06 d07 d16 d17 d23).

Each test rebuilds one reproduction script of ../shared/repro/ on a copy of the fixture and
checks the numbers against a run that does not use the cache (``--no-cache``, which reads the
trace itself) or against plain SQL on the trace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time

import polars as pl
import pytest
from conftest import run_cli

from tracekit.analyze.trace import cache as cache_mod
from tracekit.analyze.trace.cache import MANIFEST, SUFFIX, TraceCache, remove_cache, trace_identity
from tracekit.cli import main


@pytest.fixture
def trace(tmp_path, zero3_cut, monkeypatch):
    monkeypatch.delenv("TRACEKIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    p = tmp_path / "t.sqlite"
    shutil.copy(zero3_cut, p)
    return p


def _env(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("TRACEKIT_CACHE_DIR", None)
    return env


def _cli(capsys, *args):
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _h2d_backward(out: str) -> int:
    return json.loads(out)["ranks"][0]["totals"]["backward"]["h2d_bytes"]


def _gpu_key(trace) -> str:
    """The key of the entry d02 damages: the tiny query of TARGET_INFO_GPU's ids (its one
    column named "id"), found among the entries of the trace's cache."""
    tc = TraceCache(trace)
    keys = [p.name[2:-8] for p in sorted(tc.directory.glob("q-*.parquet"))]
    found = [k for k in keys if (f := tc.get_frame(k)) is not None and f.columns == ["id"]]
    assert len(found) == 1, found
    return found[0]


def _sql_gpu_ids(trace) -> list[int]:
    with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM TARGET_INFO_GPU")]


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------- d01: deletes only its own files
def test_d01_symlinked_cache_folder_is_not_followed(trace, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "settings.json").write_text('{"keep": 1}\n')
    (elsewhere / "notes.txt").write_text("notes\n")
    (elsewhere / "q-0000000000000000000000000000000000000000.parquet").write_bytes(b"user data")
    link = trace.with_name(trace.name + SUFFIX)
    link.symlink_to(elsewhere)
    before = _files(elsewhere)
    rc, out, err = _cli(capsys, "analyze", trace, "--json")
    assert rc == 0
    assert _files(elsewhere) == before  # nothing deleted, nothing written there
    assert link.is_symlink()
    assert "symbolic link" in err and "elsewhere" in err  # said so
    rc2, ref, _ = _cli(capsys, "analyze", trace, "--json", "--no-cache")
    assert json.loads(out)["ranks"] == json.loads(ref)["ranks"]
    # the cache went to the user's cache folder instead, and is used there
    tc = TraceCache(trace)
    assert tc.directory.parent == tmp_path / "xdg" / "tracekit" and (tc.directory / MANIFEST).is_file()
    assert list(tc.directory.glob("r-*.json")) and list(tc.directory.glob("q-*.parquet"))


def test_d01_folder_it_did_not_create_is_left_alone(trace, tmp_path, capsys):
    own = trace.with_name(trace.name + SUFFIX)
    own.mkdir()
    (own / "mine.json").write_text("{}\n")
    before = _files(own)
    rc, _, err = _cli(capsys, "analyze", trace, "--json")
    assert rc == 0
    assert _files(own) == before
    assert "not a cache folder" in err


def test_d01_invalidation_deletes_only_its_own_entries(trace, capsys):
    assert _cli(capsys, "analyze", trace, "--json")[0] == 0
    d = trace.with_name(trace.name + SUFFIX)
    ours = {p.name for p in d.iterdir()}
    assert MANIFEST in ours and any(n.startswith("q-") for n in ours) and any(n.startswith("r-") for n in ours)
    # the user drops files of their own into the cache folder, some named like entries
    user = {"notes.txt": b"mine\n", "plot.parquet": b"PAR1 mine", "settings.json": b"{}\n",
            "t-" + "a" * 40 + "-" + "b" * 16 + ".txt": b"looks like an entry\n"}
    for name, data in user.items():
        (d / name).write_bytes(data)
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the trace changed: invalidate
    tc = TraceCache(trace)
    tc.clear()
    left = _files(d)
    assert left == user  # every entry of ours gone (manifest too), every file of the user kept
    # and through the CLI: invalidation at the next run keeps them as well
    assert _cli(capsys, "analyze", trace, "--json")[0] == 0
    assert all((d / n).read_bytes() == b for n, b in user.items())
    assert remove_cache(trace) is True
    assert _files(d) == user  # remove_cache too: the folder stays because it holds the user's files


def test_d01_remove_cache_removes_the_folder_it_made(trace, capsys):
    assert _cli(capsys, "analyze", trace, "--json")[0] == 0
    d = trace.with_name(trace.name + SUFFIX)
    assert remove_cache(trace) is True
    assert not d.exists()
    assert remove_cache(trace) is False


def test_foreign_or_group_writable_cache_folder_is_not_trusted(trace, tmp_path, capsys):
    assert _cli(capsys, "analyze", trace, "--json")[0] == 0
    d = trace.with_name(trace.name + SUFFIX)
    # forge the stored result: a cache folder writable by others is not believed
    tc = TraceCache(trace)
    (r,) = d.glob("r-*.json")
    key = r.name[2:-5]
    assert tc.get_result_text(key) is not None
    d.chmod(0o777)
    try:
        assert TraceCache(trace).get_result_text(key) is None
        if os.geteuid() != 0:
            pytest.skip("giving the folder to another user needs root")
        os.chown(d, 12345, 12345)
        d.chmod(0o755)
        before = _files(d)
        st = os.stat(trace)
        os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        rc, out, err = _cli(capsys, "analyze", trace, "--json")
        assert rc == 0 and "another user" in err
        assert _files(d) == before  # another user's folder: neither read, cleared nor written
    finally:
        os.chown(d, 0, 0)
        d.chmod(0o755)


# ---------------------------------------------------------------- d02 / d06: damaged Parquet
@pytest.mark.parametrize("where", ["header", "middle", "end"])
def test_d02_flipped_bit_is_a_miss_recomputed_and_replaced(trace, capsys, where):
    assert _cli(capsys, "analyze", trace, "--section", "pcie")[0] == 0
    d = trace.with_name(trace.name + SUFFIX)
    for p in list(d.glob("r-*")) + list(d.glob("t-*")):
        p.unlink()
    key = _gpu_key(trace)
    entry = d / f"q-{key}.parquet"
    data = bytearray(entry.read_bytes())
    off = {"header": 42, "middle": len(data) // 2, "end": len(data) - 10}[where]
    data[off] ^= 0x10
    entry.write_bytes(bytes(data))
    rc, out, err = _cli(capsys, "analyze", trace, "--section", "pcie", "--json")
    assert rc == 0 and "Traceback" not in err and "panic" not in err.lower()
    rc, ref, _ = _cli(capsys, "analyze", trace, "--section", "pcie", "--json", "--no-cache")
    assert json.loads(out) == json.loads(ref)
    assert entry.read_bytes() != bytes(data)  # replaced
    frame = TraceCache(trace).get_frame(key)
    assert frame is not None and frame["id"].to_list() == _sql_gpu_ids(trace)


def test_d02_polars_panic_on_a_checksummed_entry_is_a_miss(trace):
    import io

    from polars.exceptions import PanicException

    tc = TraceCache(trace)
    key = "0" * 40
    frame = pl.DataFrame({"id": _sql_gpu_ids(trace)}, schema={"id": pl.Int64})
    tc.put_frame(key, frame)
    assert TraceCache(trace).get_frame(key).equals(frame)
    # the bytes of d02 (bit 4 of byte 42 of this Parquet file flipped) make polars panic ...
    buf = io.BytesIO()
    frame.write_parquet(buf, compression="zstd", compression_level=1, statistics=False)
    bad = bytearray(buf.getvalue())
    bad[42] ^= 0x10
    with pytest.raises(PanicException):
        pl.read_parquet(io.BytesIO(bytes(bad)))
    # ... and stored under a valid checksum (bypassing it), they are still only a miss
    tc._write_entry(f"q-{key}.parquet", bytes(bad))
    fresh = TraceCache(trace)
    assert fresh.get_frame(key) is None
    assert (fresh.hits, fresh.misses, fresh.errors) == (0, 1, 1)


def test_d06_zeroed_bytes_read_back_as_a_miss(trace, capsys):
    rc, ref, _ = _cli(capsys, "analyze", trace, "--all", "--json")
    assert rc == 0
    d = trace.with_name(trace.name + SUFFIX)
    for p in list(d.glob("r-*")) + list(d.glob("t-*")):
        p.unlink()
    entries = sorted(d.glob("q-*.parquet"))
    assert len(entries) > 5
    for p in entries:
        n = p.stat().st_size
        with open(p, "r+b") as fh:
            fh.seek(n // 2)
            fh.write(b"\0" * min(64, n // 4))
        tc = TraceCache(trace)
        assert tc.get_frame(p.name[2:-8]) is None and tc.errors == 1
    rc, bad, err = _cli(capsys, "analyze", trace, "--all", "--json")
    assert rc == 0 and bad == ref
    rc, cold, _ = _cli(capsys, "analyze", trace, "--all", "--json", "--no-cache")
    assert json.loads(cold) == json.loads(ref)


# ---------------------------------------------------------------- d05: stored text checked
@pytest.mark.parametrize("cut", [0, 1, 100, -2])
def test_d05_truncated_stored_result_is_recomputed(trace, capsys, cut):
    rc, ref, _ = _cli(capsys, "analyze", trace, "--json")
    assert rc == 0
    d = trace.with_name(trace.name + SUFFIX)
    (r,) = d.glob("r-*.json")
    data = r.read_bytes()
    r.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    rc, out, err = _cli(capsys, "analyze", trace, "--json")
    assert rc == 0 and out == ref
    rc, cold, _ = _cli(capsys, "analyze", trace, "--json", "--no-cache")
    assert _h2d_backward(out) == _h2d_backward(cold)
    assert r.read_bytes() == data  # replaced by the recomputed entry


def test_d05_forged_terminal_text_is_not_printed(trace, capsys):
    assert _cli(capsys, "analyze", trace)[0] == 0
    rc, ref, _ = _cli(capsys, "analyze", trace)
    d = trace.with_name(trace.name + SUFFIX)
    (t,) = d.glob("t-*.txt")
    t.write_bytes(b"FORGED \x1b]0;title\x07\n")
    rc, out, _ = _cli(capsys, "analyze", trace)
    assert rc == 0 and "FORGED" not in out and "\x1b]" not in out and out == ref
    # even with a valid checksum, stored text with escapes other than colours is not printed
    tc = TraceCache(trace)
    key = t.name[2:-4]
    tc._write_entry(t.name, "FORGED \x1b]0;title\x07\n".encode())
    assert TraceCache(trace).get_text(key) is None
    tc._write_entry(t.name, "\x1b[1mbold\x1b[0m ok\n".encode())
    assert TraceCache(trace).get_text(key) == "\x1b[1mbold\x1b[0m ok\n"


def test_d05_entries_fsynced_before_the_rename(trace, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(cache_mod.os, "fsync", lambda fd: (calls.append(("fsync", fd)), real_fsync(fd))[1])
    monkeypatch.setattr(cache_mod.os, "replace",
                        lambda a, b, **kw: (calls.append(("replace", str(b))), real_replace(a, b, **kw))[1])
    tc = TraceCache(trace)
    tc.put_result("k" * 40, {"a": 1})
    tc.put_text("a" * 40 + "-" + "b" * 16, "x\n")
    tc.put_frame("c" * 40, pl.DataFrame({"x": [1]}))
    replaces = [i for i, c in enumerate(calls) if c[0] == "replace"]
    assert len(replaces) == 4  # manifest + three entries
    for i in replaces:
        assert calls[i - 1][0] == "fsync"


# ---------------------------------------------------------------- d07 (cache part): the -wal file
def test_d07_wal_file_is_part_of_the_identity(trace):
    base = trace_identity(trace)
    wal = trace.with_name(trace.name + "-wal")
    wal.write_bytes(b"\0" * 100)
    with_wal = trace_identity(trace)
    assert with_wal != base
    wal.write_bytes(b"\0" * 200)
    assert trace_identity(trace) != with_wal
    wal.unlink()
    assert trace_identity(trace) == base


def test_d07_change_left_in_the_wal_is_not_served_stale(trace, capsys):
    conn = sqlite3.connect(trace)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    rc, first, _ = _cli(capsys, "analyze", trace, "--json")
    assert rc == 0
    # a writer leaves its change in the -wal (no checkpoint), as d07 does
    code = ("import sqlite3,os,sys; c=sqlite3.connect(sys.argv[1]); c.execute('pragma wal_autocheckpoint=0');"
            "c.execute('UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET bytes=bytes*3'); c.commit(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(trace)], check=True)
    assert trace.with_name(trace.name + "-wal").stat().st_size > 0
    rc, cached, _ = _cli(capsys, "analyze", trace, "--json")
    rc2, cold, _ = _cli(capsys, "analyze", trace, "--json", "--no-cache")
    assert rc == rc2 == 0
    assert _h2d_backward(cached) == _h2d_backward(cold) == 3 * _h2d_backward(first)


# ---------------------------------------------------------------- d16: same size and mtime
def test_d16_replaced_in_place_with_same_size_and_mtime(trace, tmp_path, capsys):
    other = tmp_path / "other.sqlite"
    shutil.copy(trace, other)
    with sqlite3.connect(other) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET copyKind = CASE copyKind WHEN 1 THEN 2 "
                     "WHEN 2 THEN 1 ELSE copyKind END")
    conn.close()
    assert other.stat().st_size == trace.stat().st_size
    rc, first, _ = _cli(capsys, "analyze", trace, "--json")
    st = os.stat(trace)
    ino = st.st_ino
    time.sleep(0.01)
    with open(trace, "r+b") as fh:  # same inode, same size, mtime put back: only ctime moves
        fh.write(other.read_bytes())
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    st2 = os.stat(trace)
    assert (st2.st_ino, st2.st_size, st2.st_mtime_ns) == (ino, st.st_size, st.st_mtime_ns)
    rc, cached, _ = _cli(capsys, "analyze", trace, "--json")
    rc2, cold, _ = _cli(capsys, "analyze", trace, "--json", "--no-cache")
    assert _h2d_backward(cached) == _h2d_backward(cold) != _h2d_backward(first)


# ---------------------------------------------------------------- d17: only regular files
def test_d17_fifo_planted_as_an_entry_does_not_hang(trace, tmp_path):
    env = _env(tmp_path)
    assert subprocess.run([sys.executable, "-m", "tracekit.cli", "analyze", str(trace)], env=env,
                          capture_output=True, timeout=120).returncode == 0
    d = trace.with_name(trace.name + SUFFIX)
    for p in list(d.glob("r-*")) + list(d.glob("t-*")):
        p.unlink()
    planted = sorted(d.glob("q-*.parquet"))[:3]
    for p in planted:
        p.unlink()
        os.mkfifo(p)
    p = subprocess.run([sys.executable, "-m", "tracekit.cli", "analyze", str(trace), "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    ref = subprocess.run([sys.executable, "-m", "tracekit.cli", "analyze", str(trace), "--json", "--no-cache"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(p.stdout)["ranks"] == json.loads(ref.stdout)["ranks"]
    for q in planted:
        assert stat.S_ISREG(os.lstat(q).st_mode)  # replaced by a real entry
    # a FIFO as the stored result or text, or the manifest: a miss, not a hang
    (r,) = d.glob("r-*.json")
    key = r.name[2:-5]
    assert TraceCache(trace).get_result_text(key) is not None
    r.unlink()
    os.mkfifo(r)
    assert TraceCache(trace).get_result_text(key) is None
    (d / MANIFEST).unlink()
    os.mkfifo(d / MANIFEST)
    assert TraceCache(trace).get_result_text(key) is None


def test_symlinked_entry_is_not_read_nor_its_target_deleted(trace, tmp_path, capsys):
    assert _cli(capsys, "analyze", trace, "--json")[0] == 0
    d = trace.with_name(trace.name + SUFFIX)
    target = tmp_path / "precious.parquet"
    target.write_bytes(b"precious")
    key = _gpu_key(trace)
    entry = d / f"q-{key}.parquet"
    entry.unlink()
    entry.symlink_to(target)
    assert TraceCache(trace).get_frame(key) is None
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    TraceCache(trace).clear()
    assert target.read_bytes() == b"precious"


def test_entry_under_another_name_is_not_served(trace):
    tc = TraceCache(trace)
    tc.put_result("a" * 40, {"x": 1})
    d = tc.directory
    shutil.copy(d / ("r-" + "a" * 40 + ".json"), d / ("r-" + "b" * 40 + ".json"))
    fresh = TraceCache(trace)
    assert fresh.get_result("a" * 40) == {"x": 1}
    assert fresh.get_result("b" * 40) is None


# ---------------------------------------------------------------- d23: stale temporaries
def test_d23_temporary_of_a_killed_writer_is_removed(trace):
    tc = TraceCache(trace)
    tc.put_result("a" * 40, {"x": 1})
    d = tc.directory
    # a real writer, killed by SIGKILL between writing its temporary and renaming it
    code = ("import os,signal,sys\n"
            "from tracekit.analyze.trace import cache as c\n"
            "c.os.replace=lambda *a,**k: os.kill(os.getpid(), signal.SIGKILL)\n"
            "c.TraceCache(sys.argv[1]).put_result('b'*40, {'y': 2})\n")
    p = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True)
    assert p.returncode == -signal.SIGKILL
    orphans = [n for n in os.listdir(d) if n.startswith(".tmp-")]
    assert len(orphans) == 1
    # a temporary of a live writer (this process) and files that only look like ours stay
    live = d / f".tmp-tk-{os.getpid()}-{'0' * 16}-{cache_mod._HOST}"
    live.write_bytes(b"being written")
    keep = d / ".tmp-notes"
    keep.write_bytes(b"user")
    again = TraceCache(trace)  # a valid cache: the orphan goes at the next open
    assert again.get_result("a" * 40) == {"x": 1}
    assert sorted(n for n in os.listdir(d) if n.startswith(".tmp-")) == sorted([live.name, keep.name])
    # an old temporary (an hour without change) goes whoever wrote it
    old = time.time() - 2 * 3600
    os.utime(live, (old, old))
    TraceCache(trace)
    assert sorted(n for n in os.listdir(d) if n.startswith(".tmp-")) == [keep.name]


def test_d23_cli_run_after_kill_leaves_no_temporary(trace, tmp_path):
    env = _env(tmp_path)
    code = ("import os,signal,sys\n"
            "from tracekit.analyze.trace import cache as c\n"
            "n=[0]\n"
            "real=c.os.replace\n"
            "def rep(*a,**k):\n"
            "    n[0]+=1\n"
            "    if n[0]==6: os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return real(*a,**k)\n"
            "c.os.replace=rep\n"
            "from tracekit.cli import main\n"
            "sys.exit(main(['analyze', sys.argv[1], '--all', '--json']))\n")
    p = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True, env=env, timeout=120)
    assert p.returncode == -signal.SIGKILL
    d = trace.with_name(trace.name + SUFFIX)
    assert [n for n in os.listdir(d) if n.startswith(".tmp-")]
    rc, out, err = run_cli("analyze", trace, "--all", "--json", env=env)
    assert rc == 0
    assert not [n for n in os.listdir(d) if n.startswith(".tmp-")]


def test_colour_tables_pass_the_text_check(trace):
    """The tables as a colour terminal gets them (SGR sequences) are stored and served: the
    control-character check rejects forgeries, not what tracekit itself prints."""
    import io

    from rich.console import Console

    from tracekit.analysis import analyze
    from tracekit.render.tables import render

    result = analyze(trace, cache=False).to_json()
    tc = TraceCache(trace)
    for i, system in enumerate(("truecolor", "256", "standard")):
        buf = io.StringIO()
        render(result, console=Console(file=buf, width=120, color_system=system, force_terminal=True))
        text = buf.getvalue()
        assert "\x1b[" in text
        key = f"{i:040x}-{i:016x}"
        tc.put_text(key, text)
        assert TraceCache(trace).get_text(key) == text


def test_format_1_cache_is_cleared_and_tightened(trace, capsys):
    """A cache of the format before checksums (bare files; a folder made by the umask, here
    group-writable) is recognised by its manifest, never read, and cleared at the first write."""
    import tracekit

    d = trace.with_name(trace.name + SUFFIX)
    d.mkdir()
    st = os.stat(trace)
    v1 = {"trace": trace.name, "identity": {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
                                            "format": 1, "tracekit": tracekit.__version__}}
    (d / MANIFEST).write_text(json.dumps(v1))
    old = {"q-" + "1" * 40 + ".parquet": b"PAR1 old", "r-" + "2" * 40 + ".json": b'{"ranks": []}\n',
           "t-" + "3" * 40 + "-" + "4" * 16 + ".txt": b"OLD TABLES\n", ".tmp-ab12cd34.parquet": b"PAR1"}
    for name, data in old.items():
        (d / name).write_bytes(data)
    (d / "notes.txt").write_text("mine\n")
    d.chmod(0o775)
    rc, out, err = _cli(capsys, "analyze", trace, "--json")
    assert rc == 0 and "note" not in err
    rc, cold, _ = _cli(capsys, "analyze", trace, "--json", "--no-cache")
    assert json.loads(out)["ranks"] == json.loads(cold)["ranks"]
    names = set(os.listdir(d))
    assert not names & set(old) and "notes.txt" in names
    assert stat.S_IMODE(d.stat().st_mode) == 0o755
    for n in names - {"notes.txt", MANIFEST}:
        assert (d / n).read_bytes().startswith(cache_mod.MAGIC), n
    assert json.loads((d / MANIFEST).read_text())["identity"] == trace_identity(trace)
