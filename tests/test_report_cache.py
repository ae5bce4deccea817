"""``tracekit report`` and ``compare`` read through the trace's cache (issue 13, item 4).

A second identical report writes the stored files (byte-identical to the first run's, and
equal to what a run without the cache computes) without importing polars or matplotlib; a
changed trace or other options are a miss; another ``--iteration`` reads no query from SQLite;
writing into ``--out`` never writes through a link; a forged entry never writes outside
``--out`` nor prints a control character.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, ZERO3_CUT, run_cli

from tracekit.analyze.trace.cache import TraceCache

#: runs the CLI, then names the heavy modules the run imported (on stderr's last line); the
#: code fingerprint is pinned, so that an edit of tracekit's files by someone else between two
#: runs of a test is no miss (test_other_iteration_reads_no_query_from_sqlite checks that
#: another fingerprint is one)
PROBE = ("import sys\nimport tracekit.analyze.trace.cache as c\nc._code_fingerprint = 'pinned-by-test'\n"
         "from tracekit.cli import main\nrc = main(sys.argv[1:])\n"
         "print('IMPORTED', ','.join(m for m in ('polars', 'matplotlib', 'numpy') if m in sys.modules), "
         "file=sys.stderr)\nsys.exit(rc)\n")


def probe(tmp_path, *args):
    """Run ``tracekit ARGS``; returns (exit code, stdout, stderr less the probe's line, set of
    heavy modules imported)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TRACEKIT_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    p = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, env=env)
    lines = p.stderr.splitlines()
    assert lines and lines[-1].startswith("IMPORTED "), p.stderr
    mods = {m for m in lines[-1][len("IMPORTED "):].split(",") if m}
    return p.returncode, p.stdout, "\n".join(lines[:-1]), mods


def here(tmp_path, *args):
    """``tracekit ARGS`` run as :func:`probe` runs it (no ``TRACEKIT_CACHE_DIR``, the same
    ``XDG_CACHE_HOME``, the code fingerprint pinned), but in this process (conftest's
    ``run_cli``): for the runs that compute, where a subprocess only adds ~1.5 s of imports;
    the runs that must use the stored report without importing polars or matplotlib stay
    probes. Returns (exit code, stdout, stderr, set of heavy modules the run would import):
    polars and matplotlib when it calls ``write_report`` (the stored report not used), which
    is where a probe imports them (``tracekit.render.report``)."""
    import tracekit.analyze.trace.cache as cache_mod
    import tracekit.render.report as R

    mods = set()
    real = R.write_report

    def write_report(*a, **k):
        mods.update(("polars", "matplotlib"))
        return real(*a, **k)

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TRACEKIT_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cache_mod, "_code_fingerprint", "pinned-by-test")
        mp.setattr(R, "write_report", write_report)
        rc, out, err = run_cli(*args, env=env)
    return rc, out, err, mods


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(autouse=True)
def _cache_beside_the_trace(monkeypatch):
    """The tests here read the cache folder beside their trace copy, where the probe's children
    put it (they run without ``TRACEKIT_CACHE_DIR``); what runs in this process does the same,
    not the session's cache folder (conftest)."""
    monkeypatch.delenv("TRACEKIT_CACHE_DIR", raising=False)


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "t.sqlite"
    shutil.copy(ZERO3_CUT, p)
    return p


def entries(trace: Path, prefix: str) -> list[Path]:
    return sorted((trace.parent / (trace.name + ".tracekit-cache")).glob(f"{prefix}-*"))


def report_entries(trace: Path) -> list[Path]:
    """The stored reports of ``trace`` (``o-`` entries but those of single figures)."""
    out = []
    for p in entries(trace, "o"):
        index = json.loads(p.read_bytes().split(b"\n", 2)[1])  # line 1: the TKC2 header; line 2: the index
        if "figure" not in index["meta"]:
            out.append(p)
    return out


def test_second_report_is_stored_files(trace, tmp_path):
    rc, out1, err1, mods1 = here(tmp_path, "report", trace, "-o", tmp_path / "r1")
    assert rc == 0, err1
    assert {"polars", "matplotlib"} <= mods1  # the first run draws
    (entry,) = report_entries(trace)
    rc, out2, err2, mods2 = probe(tmp_path, "report", trace, "-o", tmp_path / "r2")
    assert rc == 0, err2
    assert mods2 == set()  # nothing drawn, nothing computed
    first, second = files_of(tmp_path / "r1"), files_of(tmp_path / "r2")
    assert sorted(first) == sorted(second) and len(first) == 21  # 6 figures x (png, svg, csv), key numbers, md, html
    assert all(first[n] == second[n] for n in first)  # byte-identical
    assert out2.replace("r2", "r1") == out1  # the same summary line, naming the new folder
    # what is stored is what the trace gives: equal to a run that reads no cache
    rc, _, err, mods = here(tmp_path, "report", trace, "-o", tmp_path / "r3", "--no-cache")
    assert rc == 0, err
    assert {"polars", "matplotlib"} <= mods
    fresh = files_of(tmp_path / "r3")
    for name in ("report.md", "data/key_numbers.csv", "data/1_iteration_breakdown.csv",
                 "data/2_iteration_timeline.csv", "data/3_copy_sizes.csv"):
        assert second[name] == fresh[name], name
    assert report_entries(trace) == [entry]  # --no-cache wrote nothing


@pytest.mark.usefixtures("cheap_figures")
def test_report_json_on_a_hit(trace, tmp_path):
    rc, out1, err, _ = here(tmp_path, "report", trace, "-o", tmp_path / "r", "--json")
    assert rc == 0, err
    rc, out2, err, mods = probe(tmp_path, "report", trace, "-o", tmp_path / "r", "--json")
    assert rc == 0 and mods == set(), err
    a, b = json.loads(out1), json.loads(out2)
    assert a == b and a["iteration"] == 1 and a["rank"]["pid"] == 642
    assert sorted(a["files"]) == sorted(str(p) for p in (tmp_path / "r").rglob("*") if p.is_file())


@pytest.mark.usefixtures("cheap_figures")
def test_changed_trace_or_options_are_a_miss(trace, tmp_path):
    assert here(tmp_path, "report", trace, "-o", tmp_path / "r")[0] == 0
    (old,) = report_entries(trace)
    for extra in (["--iteration", "2"], ["--format", "pdf"], ["--rank", "0", "--gas", "2"]):
        rc, _, err, mods = here(tmp_path, "report", trace, "-o", tmp_path / "x", *extra)
        assert rc == 0 and "matplotlib" in mods, (extra, err)
    assert len(report_entries(trace)) == 4
    assert (tmp_path / "x" / "1_iteration_breakdown.pdf").exists()
    # a manifest (DeepSpeed config) appearing beside the trace changes what the advice says
    cfg = FIXTURES / "advice_pair_pin.json"
    shutil.copy(cfg, trace.with_suffix(".json"))
    rc, _, err, mods = here(tmp_path, "report", trace, "-o", tmp_path / "c")
    assert rc == 0 and "matplotlib" in mods, err
    assert b"From the capture manifest" in (tmp_path / "c" / "report.md").read_bytes()
    trace.with_suffix(".json").unlink()
    # the trace touched: every stored report is deleted, the next one recomputed
    st = trace.stat()
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    rc, _, err, mods = here(tmp_path, "report", trace, "-o", tmp_path / "r")
    assert rc == 0 and "matplotlib" in mods, err
    assert old.exists()  # same key again, written anew for the new identity
    header = json.loads(old.read_bytes().split(b"\n", 1)[0][5:])
    assert header["identity"] == TraceCache(trace)._id_digest
    assert len(report_entries(trace)) == 1


@pytest.mark.usefixtures("cheap_figures")
def test_other_iteration_reads_no_query_from_sqlite(trace, tmp_path, monkeypatch):
    from tracekit.analyze.trace.export import Export
    from tracekit.render.report import write_report

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TRACEKIT_CACHE_DIR", raising=False)
    first = write_report(trace, tmp_path / "a", cache=True)
    assert not first.cached and first.iteration == 1
    reads = []
    real = Export._read

    def counted(self, sql, params=(), schema=None):
        reads.append(" ".join(sql.split())[:80])
        return real(self, sql, params, schema)

    monkeypatch.setattr(Export, "_read", counted)
    import tracekit.render.report as R

    drawn = []
    real_save = R._savefig
    monkeypatch.setattr(R, "_savefig", lambda fig, ext, dpi: drawn.append(ext) or real_save(fig, ext, dpi))
    res = write_report(trace, tmp_path / "b", iteration=2, cache=True)
    assert not res.cached and res.iteration == 2
    assert reads == []  # the analysis result and every query frame came from the cache
    assert drawn == ["png", "svg"] * 2  # only the two figures of one iteration are drawn again
    assert "iteration shown in time (figures 2 and 5): 2" in (tmp_path / "b" / "report.md").read_text()
    monkeypatch.setattr(Export, "_read", real)
    write_report(trace, tmp_path / "fresh", iteration=2)  # no cache at all
    mixed, fresh = files_of(tmp_path / "b"), files_of(tmp_path / "fresh")
    assert sorted(mixed) == sorted(fresh)
    for name in fresh:  # the stored figures' frames give the same captions, tables and page
        if not name.endswith(".svg"):  # (an SVG holds the time it was drawn)
            assert mixed[name] == fresh[name], name
    reads.clear()
    monkeypatch.setattr(Export, "_read", counted)
    again = write_report(trace, tmp_path / "c", iteration=2, cache=True)
    assert again.cached and files_of(tmp_path / "c") == files_of(tmp_path / "b")
    assert reads == []
    # another version of tracekit: a miss, and the entry is replaced rather than added
    from tracekit.analyze.trace import cache as cache_mod

    before = entries(trace, "o")
    assert len(before) == 2 + 6 + 2  # two reports, the six figures of iteration 1, two of iteration 2
    monkeypatch.setattr(cache_mod, "_code_fingerprint", "0" * 16)
    other = write_report(trace, tmp_path / "d", iteration=2, cache=True)
    assert not other.cached and entries(trace, "o") == before
    assert write_report(trace, tmp_path / "e", iteration=2, cache=True).cached


@pytest.mark.usefixtures("cheap_figures")
def test_library_default_keeps_no_cache(trace, tmp_path):
    from tracekit.render.report import write_report

    write_report(trace, tmp_path / "r")
    assert not (tmp_path / "t.sqlite.tracekit-cache").exists()


@pytest.mark.usefixtures("cheap_figures")
def test_out_files_replaced_never_written_through(trace, tmp_path):
    """A link named like a report file is replaced (its target untouched), a user's own file in
    ``--out`` stays, on the first run and on a hit alike."""
    mine = tmp_path / "mine.md"
    mine.write_text("my notes\n")
    for name in ("r1", "r2"):
        out = tmp_path / name
        out.mkdir()
        (out / "report.md").symlink_to(mine)
        os.link(mine, out / "report.html")
        (out / "keep.txt").write_text("keep\n")
        rc, _, err, _ = (here if name == "r1" else probe)(tmp_path, "report", trace, "-o", out)
        assert rc == 0, err
        assert mine.read_text() == "my notes\n"
        assert not (out / "report.md").is_symlink() and (out / "report.md").read_text().startswith("# tracekit report")
        assert os.stat(out / "report.html").st_ino != os.stat(mine).st_ino
        assert (out / "keep.txt").read_text() == "keep\n"
        assert not [p for p in out.iterdir() if p.name.startswith(".tmp-tk-")]
    # a --out that is a file: one line, nothing written, on a hit too
    (tmp_path / "file").write_text("x")
    rc, _, err, _ = probe(tmp_path, "report", trace, "-o", tmp_path / "file")
    assert rc == 2 and "exists and is not a directory" in err
    assert (tmp_path / "file").read_text() == "x"


def _forge(trace: Path, meta: dict, files: list[tuple[str, bytes]]) -> None:
    """Replace the stored report of ``trace`` by an entry with a valid header and checksum."""
    (entry,) = report_entries(trace)
    tc = TraceCache(trace)
    index = json.dumps({"meta": meta, "files": [[n, len(b)] for n, b in files]}).encode()
    tc._write_entry(entry.name, index + b"\n" + b"".join(b for _, b in files))


#: a report on a cache hit, killed by SIGKILL as it is about to rename a file into folder argv[1]
KILLED = ("import os,signal,sys\n"
          "import tracekit.analyze.trace.cache as c\nc._code_fingerprint = 'pinned-by-test'\n"
          "real = os.replace\n"
          "def rep(src, dst, *a, **k):\n"
          "    if os.path.dirname(os.path.abspath(dst)) == sys.argv[1]: os.kill(os.getpid(), signal.SIGKILL)\n"
          "    return real(src, dst, *a, **k)\n"
          "os.replace = rep\n"
          "from tracekit.cli import main\nsys.exit(main(sys.argv[2:]))\n")


@pytest.mark.usefixtures("cheap_figures")
def test_killed_report_temporaries_removed_by_the_next(trace, tmp_path):
    """A report killed between writing a temporary and renaming it leaves
    ``.tmp-tk-<pid>-<random>-<host>`` in ``--out``, ``data/`` or the ``--perfetto`` folder; the
    next report there removes it by the cache's rule (pid gone on this host, or untouched for an
    hour), and keeps a live pid's fresh temporary, another host's fresh one, and every file,
    link and folder of other names or kinds."""
    from tracekit.analyze.trace import cache as cache_mod

    out, pf = tmp_path / "r", tmp_path / "pf"
    args = ["report", trace, "-o", out, "--perfetto", pf / "t.json"]
    rc, _, err, _ = here(tmp_path, *args)
    assert rc == 0, err
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TRACEKIT_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    dead = {}
    for folder in (out, out / "data", pf):
        p = subprocess.Popen([sys.executable, "-c", KILLED, str(folder), *map(str, args)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
        _, perr = p.communicate(timeout=120)
        assert p.returncode == -signal.SIGKILL, perr
        # killed at the first rename into this folder: the set's temporaries are all written by then
        orphans = [n for n in os.listdir(folder) if n.startswith(".tmp-tk-")]
        assert orphans and all(o.startswith(f".tmp-tk-{p.pid}-") and o.endswith(f"-{cache_mod._HOST}")
                               for o in orphans)
        dead[folder] = orphans
    # what must stay: a live writer's fresh temporary (this process), another host's fresh one
    # (its pid means nothing here), names not of our naming, a link and a folder named like ours
    live = out / f".tmp-tk-{os.getpid()}-{'0' * 16}-{cache_mod._HOST}"
    other_host = out / "data" / f".tmp-tk-{p.pid}-{'1' * 16}-not-this-{cache_mod._HOST}"
    for f in (live, other_host):
        f.write_bytes(b"being written")
    mine = tmp_path / "mine.txt"
    mine.write_text("mine\n")
    kept = {out / ".tmp-tk-notes": b"user", out / "keep.txt": b"keep", pf / ".t.json.tmp": b"user"}
    for f, b in kept.items():
        f.write_bytes(b)
    link = out / f".tmp-tk-{p.pid}-{'2' * 16}-{cache_mod._HOST}"
    link.symlink_to(mine)
    folder_like = pf / f".tmp-tk-{p.pid}-{'3' * 16}-{cache_mod._HOST}"
    folder_like.mkdir()

    rc, _, err, mods = probe(tmp_path, *args)
    assert rc == 0 and mods == set(), err  # a hit: cleaned all the same
    for folder, orphans in dead.items():
        assert not any((folder / orphan).exists() for orphan in orphans)
    assert live.read_bytes() == other_host.read_bytes() == b"being written"
    assert all(f.read_bytes() == b for f, b in kept.items())
    assert link.is_symlink() and mine.read_text() == "mine\n" and folder_like.is_dir()
    # an hour untouched: stale whoever wrote it, the live pid's and the other host's too
    old = time.time() - 2 * 3600
    for f in (live, other_host):
        os.utime(f, (old, old))
    rc, _, err, _ = probe(tmp_path, *args)
    assert rc == 0, err
    assert not live.exists() and not other_host.exists()
    assert all(f.read_bytes() == b for f, b in kept.items())
    assert link.is_symlink() and folder_like.is_dir()
    assert sorted(n for n in os.listdir(out) if n.startswith(".tmp-tk-")) == sorted([".tmp-tk-notes", link.name])


def test_forged_entries_are_a_miss(trace, tmp_path):
    assert here(tmp_path, "report", trace, "-o", tmp_path / "r")[0] == 0
    good = {"iteration": 1, "rank": {"index": 0, "pid": 642, "device": 0, "global_pid": 1}, "notes": [],
            "figures": {"1_iteration_breakdown": "1_iteration_breakdown.png"}}
    forged = [
        (good, [("../evil.md", b"x"), ("1_iteration_breakdown.png", b"png")]),     # outside --out
        (good, [("data/../../evil.csv", b"x"), ("1_iteration_breakdown.png", b"png")]),
        (good, [(".bashrc", b"x"), ("1_iteration_breakdown.png", b"png")]),         # hidden
        (good, [("evil.sh", b"x"), ("1_iteration_breakdown.png", b"png")]),         # no report file
        ({**good, "notes": ["\x1b]0;owned\x07"]}, [("1_iteration_breakdown.png", b"png")]),  # terminal escape
    ]
    for meta, files in forged:
        _forge(trace, meta, files)
        out = tmp_path / "o"
        rc, _, err, mods = here(tmp_path, "report", trace, "-o", out)
        assert rc == 0 and "matplotlib" in mods, (files, err)  # recomputed
        assert "\x1b" not in err and not (tmp_path / "evil.md").exists() and not (tmp_path / "evil.csv").exists()
        assert not (out / "evil.sh").exists() and not (out / ".bashrc").exists()
        assert (out / "1_iteration_breakdown.png").read_bytes()[:4] == b"\x89PNG"
    # a truncated entry (a full disk) is a miss as well
    (entry,) = report_entries(trace)
    entry.write_bytes(entry.read_bytes()[:1000])
    rc, _, err, mods = here(tmp_path, "report", trace, "-o", tmp_path / "t")
    assert rc == 0 and "matplotlib" in mods, err


@pytest.mark.usefixtures("cheap_figures")
def test_perfetto_file_is_stored_too(trace, tmp_path):
    rc, _, err, _ = here(tmp_path, "report", trace, "-o", tmp_path / "r", "--perfetto", tmp_path / "p1.json")
    assert rc == 0, err
    rc, _, err, mods = probe(tmp_path, "report", trace, "-o", tmp_path / "r", "--perfetto", tmp_path / "p2.json")
    assert rc == 0 and mods == set(), err
    assert (tmp_path / "p1.json").read_bytes() == (tmp_path / "p2.json").read_bytes()
    doc = json.loads((tmp_path / "p2.json").read_text())
    con = __import__("sqlite3").connect(f"file:{trace}?mode=ro", uri=True)
    n_copies = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()[0]
    con.close()
    copies = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("tid") in (3, 4, 5)]
    assert len(copies) == n_copies  # every memcpy of the trace is one event
    # without --perfetto: another key (the stored report has no Perfetto file)
    rc, _, err, mods = here(tmp_path, "report", trace, "-o", tmp_path / "r")
    assert rc == 0 and "matplotlib" in mods, err


@pytest.fixture
def pair(tmp_path):
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    shutil.copy(FIXTURES / "advice_pair_pin.sqlite", a)
    shutil.copy(FIXTURES / "advice_pair_base.sqlite", b)
    return a, b


def test_second_compare_is_stored(pair, tmp_path):
    a, b = pair
    rc, out1, err, mods = probe(tmp_path, "compare", a, b, "--json")
    assert rc == 0 and "polars" in mods, err
    assert entries(a, "r") and entries(b, "r")  # each trace's analysis is kept in its own cache
    rc, out2, err, mods = probe(tmp_path, "compare", a, b, "--json")
    assert rc == 0 and mods == set(), err
    rc, fresh, err, _ = probe(tmp_path, "compare", a, b, "--json", "--no-cache")
    assert rc == 0, err
    assert json.loads(out2) == json.loads(out1) == json.loads(fresh)
    # the table view and --fail-above work from the stored comparison too
    rc, table, err, mods = probe(tmp_path, "compare", a, b, "--fail-above", "1000")
    assert rc == 0 and mods == set() and "per phase" in table, err
    # B changed: the stored comparison no longer applies
    st = b.stat()
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    rc, out3, err, mods = probe(tmp_path, "compare", a, b, "--json")
    assert rc == 0 and "polars" in mods, err
    assert json.loads(out3) == json.loads(fresh)
    # another rank or B in the A slot: other keys
    rc, _, err, mods = probe(tmp_path, "compare", b, a, "--json")
    assert rc == 0 and "polars" in mods, err


@pytest.mark.usefixtures("cheap_figures")
def test_key_follows_every_manifest_the_report_reads(tmp_path):
    """The key hashes every path where the trace's manifest may lie
    (dsconfig.manifest_candidates, which titles and advice both follow): a manifest appearing,
    changing, or an earlier candidate appearing over it is a miss; a file the rule does not
    read (``my_capture.json`` beside ``my_run.sqlite``) is not."""
    from tracekit.render import report_cache as RC

    trace = tmp_path / "my_run.sqlite"
    shutil.copy(ZERO3_CUT, trace)
    tc = TraceCache(trace)
    opts = dict(rank=0, iteration=None, fmt="svg", phase_map=None, gas=None, ds_config=None, dpi=None, html=True,
                perfetto=False)
    before = RC.report_key(tc, trace, **opts)
    assert RC.report_key(tc, trace, **opts) == before
    (tmp_path / "my_capture.json").write_text('{"deepspeed_config": {"zero_optimization": {"stage": 3}}}')
    assert RC.report_key(tc, trace, **opts) == before
    (tmp_path / "my_run_capture.json").write_text('{"deepspeed_config": {"zero_optimization": {"stage": 3}}}')
    after = RC.report_key(tc, trace, **opts)
    assert after != before
    (tmp_path / "my_run_capture.json").write_text('{"deepspeed_config": {"zero_optimization": {"stage": 2}}}')
    edited = RC.report_key(tc, trace, **opts)
    assert edited not in (before, after)
    (tmp_path / "my_run.json").write_text('{"deepspeed_config": {"zero_optimization": {"stage": 1}}}')
    assert RC.report_key(tc, trace, **opts) not in (before, after, edited)
    assert RC.figure_key(tc, trace, "1_iteration_breakdown", rank=0, iteration=1, fmt="svg", phase_map=None, gas=None,
                         ds_config=None, dpi=150) == RC.figure_key(tc, trace, "1_iteration_breakdown", rank=0,
                                                                   iteration=2, fmt="svg", phase_map=None, gas=None,
                                                                   ds_config=None, dpi=150)
    assert RC.figure_key(tc, trace, "2_iteration_timeline", rank=0, iteration=1, fmt="svg", phase_map=None, gas=None,
                         ds_config=None, dpi=150) != RC.figure_key(tc, trace, "2_iteration_timeline", rank=0,
                                                                   iteration=2, fmt="svg", phase_map=None, gas=None,
                                                                   ds_config=None, dpi=150)
