"""Output safety (issue 25): every output file old complete or new complete, a half-written set
never left in place, a full disk is one line and exit 2, SIGINT/SIGTERM stop cleanly (no
worker, guarded child or temporary left), and where output goes is checked before any work.

The full disk is made three ways, each real: a small tmpfs (root only), ``RLIMIT_FSIZE`` on the
child (``ulimit -f``: the kernel cuts the write at the limit and fails the next one, the same
short write a filling disk gives) and ``/dev/full``."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ZERO3_CUT, assert_one_line_error, run_cli

LINUX = sys.platform.startswith("linux")
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(extra)
    return env


def _cli(*args, fsize: int | None = None, stdout=None, env=None, **kw) -> subprocess.CompletedProcess:
    """``tracekit ARGS`` in a subprocess, under ``ulimit -f`` of ``fsize`` bytes when given."""

    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, "-m", "tracekit.cli", *map(str, args)], env=env or _env(),
                          stdout=stdout if stdout is not None else subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, preexec_fn=limit, **kw)


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".tmp-tk-*")) if folder.exists() else []


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def trace(tmp_path) -> Path:
    t = tmp_path / "t.sqlite"
    shutil.copy(ZERO3_CUT, t)
    return t


# ---------------------------------------------------------------------- the writer, in process
def test_output_set_renames_in_only_at_commit(tmp_path):
    from tracekit.output import OutputSet

    out = tmp_path / "o"
    out.mkdir()
    (out / "a.csv").write_bytes(b"old a")
    (out / "b.csv").write_bytes(b"old b")
    s = OutputSet("--out o")
    s.folder(out)
    s.add(out / "a.csv", b"new a")
    s.add(out / "b.csv", lambda fh: fh.write(b"new b"))  # a library writing the open file itself
    sub = s.folder(out / "data" / "deep")  # created, with its parent
    s.add(sub / "c.csv", b"new c")
    # nothing in place yet: the old files whole, the new ones only as tracekit's temporaries
    assert (out / "a.csv").read_bytes() == b"old a" and (out / "b.csv").read_bytes() == b"old b"
    assert not (sub / "c.csv").exists()
    assert len(_temporaries(out)) == 3
    s.commit()
    assert [(out / n).read_bytes() for n in ("a.csv", "b.csv", "data/deep/c.csv")] == [b"new a", b"new b", b"new c"]
    assert _temporaries(out) == []


def test_output_set_abort_leaves_old_files_and_no_new_folder(tmp_path):
    from tracekit.output import OutputSet

    out = tmp_path / "o"
    out.mkdir()
    (out / "a.csv").write_bytes(b"old a")
    with pytest.raises(KeyboardInterrupt):
        with OutputSet("--out o") as s:
            s.add(s.folder(out) / "a.csv", b"new a")
            s.add(s.folder(tmp_path / "made" / "here") / "b.csv", b"new b")
            raise KeyboardInterrupt  # ^C while the set is written
    assert (out / "a.csv").read_bytes() == b"old a"
    assert _temporaries(out) == [] and not (tmp_path / "made").exists()  # the folders it made: gone again


def test_output_set_full_disk_is_one_line_and_removes_what_it_wrote(tmp_path, monkeypatch):
    from tracekit.analyze.trace import cache
    from tracekit.errors import TracekitError
    from tracekit.output import OutputSet

    out = tmp_path / "o"
    out.mkdir()
    (out / "big.csv").write_bytes(b"old")
    real = os.write
    room = [1000]  # bytes left on the "disk": then write(2) fails as a full disk does

    def write(fd, data):
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(data), room[0])
        room[0] -= n
        return real(fd, bytes(data[:n]))  # a short write first, as the kernel gives

    monkeypatch.setattr(cache.os, "write", write)
    s = OutputSet("--out o")
    s.add(s.folder(out) / "small.csv", b"x" * 600)
    with pytest.raises(TracekitError) as e:
        s.add(out / "big.csv", b"y" * 5000)
    assert str(e.value).startswith("disk full writing --out o (big.csv: No space left on device)")
    assert (out / "big.csv").read_bytes() == b"old" and not (out / "small.csv").exists()
    assert _temporaries(out) == []


def test_signal_during_commit_waits_for_the_whole_set(tmp_path, monkeypatch):
    from tracekit import output
    from tracekit.output import OutputSet

    out = tmp_path / "o"
    s = OutputSet("-o o")
    names = [f"f{i}.csv" for i in range(5)]
    for n in names:
        s.add(s.folder(out) / n, n.encode())
    real = os.replace
    calls = []

    def replace(a, b, **kw):
        if not calls:
            signal.raise_signal(signal.SIGINT)  # ^C after the first rename, to this thread
        calls.append(b)
        return real(a, b, **kw)

    monkeypatch.setattr(output.os, "replace", replace)
    # the handler a user's process has (an xdist worker may run with SIGINT ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            s.commit()
    finally:
        signal.signal(signal.SIGINT, before)
    assert len(calls) == 5 and [(out / n).read_bytes() for n in names] == [n.encode() for n in names]


# ---------------------------------------------------------------------- analyze --out
def test_out_file_size_limit_keeps_every_earlier_file_whole(trace, tmp_path):
    out = tmp_path / "o"
    rc, _, err = run_cli("analyze", trace, "--section", "timeline", "--out", out)  # the earlier files
    assert rc == 0, err
    before = _snapshot(out)
    sizes = {k: len(v) for k, v in before.items()}
    assert len(sizes) >= 4 and sizes["throughput_timeline.csv"] > 100_000, sizes
    # --bin-ms 0.1 makes the timeline ~10x larger: it cannot be written under the limit, the
    # other files (written first or after) can
    limit = 2 * max(sizes.values())
    p = _cli("analyze", trace, "--section", "timeline", "--bin-ms", "0.1", "--out", out, fsize=limit)
    assert_one_line_error(p.returncode, p.stdout, p.stderr, "file size limit (ulimit -f) reached writing --out")
    assert _snapshot(out) == before  # every file the old one, whole
    assert _temporaries(out) == []


@pytest.mark.skipif(not (ROOT and LINUX), reason="mounts a small tmpfs (root)")
def test_out_and_report_on_a_full_tmpfs(trace, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount a tmpfs")
    try:
        p = _cli("analyze", trace, "--all", "--out", disk / "o")
        assert_one_line_error(p.returncode, p.stdout, p.stderr, "disk full writing --out")
        p = _cli("report", trace, "-o", disk / "rep", "--no-cache")
        assert_one_line_error(p.returncode, p.stdout, p.stderr, "disk full writing -o")
        assert os.listdir(disk) == []  # neither o/ nor rep/ (nor data/, nor a temporary) left
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def test_trim_over_an_existing_output_keeps_it_on_a_full_disk(trace, tmp_path):
    dst = tmp_path / "cut.sqlite"
    dst.write_bytes(b"an earlier cut")
    p = _cli("trim", trace, dst, "--iterations", "1-1", "--force", fsize=200_000)
    assert p.returncode == 2 and "tracekit: error:" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert dst.read_bytes() == b"an earlier cut"
    assert _temporaries(tmp_path) == [] and not list(tmp_path.glob("*journal*"))


# ---------------------------------------------------------------------- report -o
_PAUSE = """
import os, time
_mark = os.environ.get("TK_TEST_PAUSE_MARK")
if _mark and (not os.environ.get("TK_TEST_PAUSE_CHILD_ONLY") or os.environ.get("TRACEKIT_MEMLIMIT_CHILD")):
    import tracekit.output as _output

    def _pausing(write):
        def wrapped(self, *args, **kwargs):
            path = write(self, *args, **kwargs)
            if not os.path.exists(_mark):  # the first file's temporary is written: wait for a signal
                open(_mark, "w").close()
                time.sleep(120)
            return path
        return wrapped

    _output.OutputSet.add = _pausing(_output.OutputSet.add)
    _output.OutputSet.add_by_path = _pausing(_output.OutputSet.add_by_path)
"""


def _paused_env(tmp_path: Path, child_only: bool = False) -> tuple[dict, Path]:
    """An environment whose tracekit pauses (120 s) once the first file of an output set is
    written, and the file that says it has: a ``sitecustomize`` on ``PYTHONPATH``, so that the
    signal lands mid-write whatever the machine's load (a poll for the temporary raced the
    rest of the report on a busy CI machine, which then finished, exit 0). ``child_only``:
    only in the memory guard's child."""
    site = tmp_path / "pause_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_PAUSE)
    mark = tmp_path / "paused"
    extra = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
             "TK_TEST_PAUSE_MARK": str(mark)}
    if child_only:
        extra["TK_TEST_PAUSE_CHILD_ONLY"] = "1"
    return _env(**extra), mark


def _wait_for(mark: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mark.exists() and proc.poll() is None, "the command never paused after its first file"


def test_report_stopped_mid_write_leaves_the_old_report_whole(trace, tmp_path):
    rep = tmp_path / "rep"
    rc, _, err = run_cli("report", trace, "-o", rep, "--iteration", "1")  # the old report
    assert rc == 0, err
    before = _snapshot(rep)
    env, mark = _paused_env(tmp_path)
    child = subprocess.Popen([sys.executable, "-m", "tracekit.cli", "report", str(trace), "-o", str(rep),
                              "--iteration", "2", "--no-cache"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    _wait_for(mark, child)
    assert _temporaries(rep)  # the first iteration-2 file is written, not yet in place
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 143 and err.strip().splitlines()[-1] == "tracekit: terminated", err
    assert _snapshot(rep) == before  # the iteration-1 report, every file of it (SVGs included)
    assert _temporaries(rep) == []


def test_unwritable_perfetto_path_found_before_the_report(trace, tmp_path):
    (tmp_path / "afile").write_text("x")
    t0 = time.monotonic()
    p = _cli("report", trace, "-o", tmp_path / "rep", "--perfetto", tmp_path / "afile" / "p.json", "--no-cache")
    assert_one_line_error(p.returncode, p.stdout, p.stderr, "is not a directory")
    assert p.stderr.startswith(f"tracekit: error: --perfetto {tmp_path / 'afile' / 'p.json'}: cannot write it")
    assert not (tmp_path / "rep").exists()  # nothing drawn, nothing created
    assert time.monotonic() - t0 < 20


@pytest.fixture()
def unwritable(tmp_path):
    """A folder this user cannot write: mode 0555, or a read-only tmpfs for root (whom modes do
    not stop)."""
    d = tmp_path / "locked"
    d.mkdir()
    if ROOT:
        if not LINUX or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(d)]).returncode:
            pytest.skip("cannot make a folder unwritable for root")
        yield d
        subprocess.run(["umount", "-l", str(d)])
    else:
        d.chmod(0o555)
        yield d
        d.chmod(0o755)


def test_existing_unwritable_folder_is_said_not_writable(trace, unwritable):
    for args in (("report", trace, "-o", unwritable), ("analyze", trace, "--out", unwritable)):
        rc, out, err = run_cli(*args)
        assert_one_line_error(rc, out, err, "is not writable")
        assert "cannot create" not in err
    rc, out, err = run_cli("report", trace, "-o", unwritable / "sub")
    assert_one_line_error(rc, out, err, f"-o {unwritable / 'sub'}: cannot create the directory ({unwritable} is not writable)")


# ---------------------------------------------------------------------- stdout
def test_json_to_a_full_device_is_one_line(trace):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    for args in (("analyze", trace, "--all", "--json"), ("analyze", trace, "--all", "--json", "--no-cache")):
        with open("/dev/full", "w") as full:
            p = _cli(*args, stdout=full)
        assert p.returncode == 2 and "internal error" not in p.stderr, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tracekit: error: disk full writing stdout"), p.stderr


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_json_cut_mid_write_is_never_exit_0(trace, tmp_path, unbuffered):
    rc, full, err = run_cli("analyze", trace, "--all", "--json")  # (and the result cached)
    assert rc == 0, err
    full = full.encode()
    assert len(full) > 300_000
    out = tmp_path / "out.json"
    with open(out, "w") as fh:
        p = _cli("analyze", trace, "--all", "--json", stdout=fh, fsize=100_000,
                 env=_env(PYTHONUNBUFFERED=unbuffered))
    assert_one_line_error(p.returncode, "", p.stderr, "file size limit (ulimit -f) reached writing stdout")
    assert out.read_bytes() == full[:100_000]  # what was written is the start of the output, nothing else


# ---------------------------------------------------------------------- signals and child processes
def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from /proc)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parent.items() if pp == p}
        out |= kids
        todo.extend(kids)
    return out


def _alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_sigterm_to_jobs_ends_the_workers(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in range(4):
        shutil.copy(ZERO3_CUT, runs / f"rank{i}.sqlite")
    child = subprocess.Popen([sys.executable, "-m", "tracekit.cli", "analyze", str(runs), "--jobs", "2", "--no-cache",
                              "--out", str(tmp_path / "o")], env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    kids: set[int] = set()
    while time.monotonic() < deadline and child.poll() is None:
        kids |= _children(child.pid)
        if len(kids) >= 3:  # two workers and multiprocessing's resource tracker
            break
        time.sleep(0.05)
    assert len(kids) >= 2, kids
    time.sleep(0.5)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 143 and "tracekit: terminated" in err, err
    deadline = time.monotonic() + 5
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [k for k in kids if _alive(k)]
    for k in left:
        os.kill(k, signal.SIGKILL)
    assert left == []
    assert not (tmp_path / "o").exists()  # nothing of an unfinished --out set


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_sigterm_under_the_memory_guard_ends_the_child(trace, tmp_path):
    rep = tmp_path / "rep"

    def limit() -> None:  # a limit: the command runs in a guarded child (tracekit.memlimit)
        resource.setrlimit(resource.RLIMIT_AS, (8_000_000_000, resource.RLIM_INFINITY))

    env, mark = _paused_env(tmp_path, child_only=True)
    parent = subprocess.Popen([sys.executable, "-m", "tracekit.cli", "report", str(trace), "-o", str(rep),
                               "--no-cache"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, preexec_fn=limit)
    _wait_for(mark, parent)  # the child has begun the report: its folder made, one file written
    kids = _children(parent.pid)
    assert kids and rep.exists()
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=60)
    assert parent.returncode == 143, err
    assert [line for line in err.splitlines() if line.startswith("tracekit:")] == ["tracekit: terminated"], err
    time.sleep(0.5)
    assert not any(_alive(k) for k in kids)
    assert not rep.exists()  # nothing written, the folder it made removed again
