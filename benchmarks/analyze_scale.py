#!/usr/bin/env python
"""Benchmark ``tracekit analyze`` against the read floor: every row of issue 13's table in one run.

Rows (each from interleaved runs of fresh processes; ratios are taken pair by pair, and their
minimum and median are reported, because on a shared machine wall times vary by up to 2x):

1. ``analyze TRACE --all --no-cache`` / bare scan: wall time against a bare ``sqlite3`` scan of
   the tables the analysis reads (``../shared/tools/bare_all.sql``: every column read, nothing
   built), on the machine as it is (its load average is printed);
2. the same with the machine loaded on purpose: one busy-looping process per core runs
   during the pairs (``--no-loaded`` skips it);
3. CPU time (user + system of the child) of ``analyze --all`` / the bare scan's, from row 1;
4. peak RSS (``ru_maxrss``) of ``analyze --all``, from row 1;
5. peak RSS on larger traces built with ``../shared/tools/make_nx_trace.py`` (which appends
   shifted copies of every event row: ``--sizes 1,4`` = the trace and a 4x one), with the
   least-squares slope per 100 MB and the ratio to the 1x figure (goal: flat); ``--keep`` builds
   them in ``--work-dir`` and later runs reuse them; ``--bin-ms 2`` for ``--sizes 1,4,16`` (a 16x
   trace at 1 ms bins has more timeline bins than ``analyze`` allows);
6. ``analyze TRACE`` (default view, no cache) / a plain polars computation of the per-phase
   copy bytes (ADBC into polars, a join of copies to their launch, an asof join into the NVTX
   phase ranges, a group-by), in a fresh process each;
7. ``tracekit report TRACE``: the first run after the cache is cleared, then the cached runs;
8. ``analyze --jobs 2`` / ``--jobs 1`` on 5 traces (hard links of TRACE), under the load of row 2.

Then where the time of one ``--all`` run goes (an in-process run with timers around the stages).
Everything runs with the trace in the OS page cache (one discarded warm-up run first).

Usage::

    python benchmarks/analyze_scale.py /tmp/full/ds.sqlite [--repeat 5] [--sizes 1,4]
        [--work-dir /tmp] [--keep] [--bin-ms MS] [--no-loaded] [--skip report,jobs,sizes,default]
        [--json OUT.json]
        [--pythonpath DIR]   # e.g. `git archive OLD | tar -x -C DIR`: the same rows for an older tree
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_TOOLS = ROOT.parent / "shared" / "tools"
TRACEKIT = [sys.executable, "-m", "tracekit.cli"]
GOALS = {"ratio_quiet": 1.0, "ratio_loaded": 1.2, "cpu_ratio": 1.2, "rss_mib": 300.0, "rss_flat": 1.2,
         "default_vs_polars": 1.5, "report_cached_s": 1.0, "jobs2_vs_jobs1": 1.0}

_PLAIN_POLARS = r"""
import sys
import adbc_driver_manager, adbc_driver_sqlite
import polars as pl
from urllib.parse import quote
db = adbc_driver_sqlite.connect(f"file:{quote(sys.argv[1])}?mode=ro")
conn = adbc_driver_manager.AdbcConnection(db)
def q(sql):
    st = adbc_driver_manager.AdbcStatement(conn)
    st.set_sql_query(sql)
    stream, _ = st.execute_query()
    f = pl.DataFrame(stream)
    st.close()
    return f
names = {"DeepSpeedEngine.forward": "forward", "DeepSpeedEngine.backward": "backward",
         "DeepSpeedZeroOptimizer_Stage3.step": "update"}
marks = ",".join("'" + n + "'" for n in names)
ranges = q(f'SELECT n.start AS start, n."end" AS "end", s.value AS name FROM NVTX_EVENTS n JOIN StringIds s '
           f'ON s.id = n.textId WHERE s.value IN ({marks})')
ranges = ranges.with_columns(phase=pl.col("name").replace_strict(names)).sort("start")
copies = q("SELECT correlationId AS c, bytes, copyKind AS kind FROM CUPTI_ACTIVITY_KIND_MEMCPY")
launch = q("SELECT correlationId AS c, start AS launch FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId > 0")
c = copies.join(launch, on="c").sort("launch")
c = c.join_asof(ranges, left_on="launch", right_on="start").with_columns(
    phase=pl.when(pl.col("launch") < pl.col("end")).then(pl.col("phase")).otherwise(pl.lit("other")))
print(c.group_by("phase", "kind").agg(pl.col("bytes").sum()).sort("phase", "kind"))
"""

_BURN = "import time\nwhile True:\n    pass\n"


def measure(cmd: list[str], stdin: Path | None = None, cwd: Path | None = None) -> dict:
    """Run ``cmd``; wall s, CPU s (user + system of the child) and peak RSS MiB (``ru_maxrss``)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err, open(os.devnull, "wb") as out:
        fin = open(stdin, "rb") if stdin else subprocess.DEVNULL
        try:
            p = subprocess.Popen(cmd, stdin=fin, stdout=out, stderr=err, cwd=cwd)
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            if stdin:
                fin.close()
        wall = time.perf_counter() - t0
        rc = os.waitstatus_to_exitcode(status)
        if rc != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({rc}): {err.read().decode()[-2000:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024}


def stats(xs: list[float]) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def pairs(a_cmd, b_cmd, repeat: int, a_in=None, b_in=None) -> tuple[list[dict], list[dict]]:
    """``repeat`` interleaved runs of A then B (after one warm-up of each)."""
    measure(a_cmd, a_in)
    measure(b_cmd, b_in)
    a, b = [], []
    for _ in range(repeat):
        a.append(measure(a_cmd, a_in))
        b.append(measure(b_cmd, b_in))
    return a, b


def ratio_rows(a: list[dict], b: list[dict], key: str = "wall_s") -> dict:
    return stats([x[key] / y[key] for x, y in zip(a, b)])


class Load:
    """One busy-looping process per core while the block runs."""

    def __enter__(self):
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.procs = [subprocess.Popen([sys.executable, "-c", _BURN]) for _ in range(n)]
        time.sleep(1.0)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def bare_cmd(trace: Path) -> tuple[list[str], Path]:
    sql = SHARED_TOOLS / "bare_all.sql"
    if shutil.which("sqlite3"):
        return ["sqlite3", str(trace)], sql
    code = "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\n[c.execute(s).fetchall() for s in open(sys.argv[2]).read().split(';') if s.strip()]"
    return [sys.executable, "-c", code, str(trace), str(sql)], None


def linear_fit(xs: list[float], ys: list[float]) -> dict:
    """Least squares y = a + b x; returns a, b and R^2."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return {"a": a, "b": b, "r2": 1 - ss_res / ss_tot if ss_tot else 1.0}


def build_nx(trace: Path, copies: int, work: Path, keep_dir: Path | None = None) -> Path:
    """The ``copies``-x trace: one that ``keep_dir`` holds (a run with ``--keep``) when it is newer
    than ``trace``, else built in ``keep_dir`` (kept) or ``work`` (removed at the end)."""
    if keep_dir is not None:
        kept = keep_dir / f"{trace.stem}.x{copies}.sqlite"
        if kept.exists() and kept.stat().st_mtime >= trace.stat().st_mtime:
            return kept
        work = keep_dir
    dst = work / f"{trace.stem}.x{copies}.sqlite"
    if not dst.exists() or dst.stat().st_mtime < trace.stat().st_mtime:
        print(f"building {dst} with make_nx_trace.py ({copies} copies) ...", file=sys.stderr)
        tmp = dst.with_suffix(".part")
        subprocess.run([sys.executable, str(SHARED_TOOLS / "make_nx_trace.py"), str(trace), str(tmp), str(copies)],
                       check=True, stdout=subprocess.DEVNULL)
        tmp.rename(dst)
    return dst


_STAGES = r"""
import contextlib, io, json, sys, threading, time
t_start = time.perf_counter()
timers = {}
def wrap(obj, name, label):
    fn = getattr(obj, name, None)
    if fn is None:  # renamed since: leave it out
        return
    def timed(*a, **k):
        if threading.current_thread() is not threading.main_thread():
            return fn(*a, **k)
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            timers[label] = timers.get(label, 0.0) + time.perf_counter() - t0
    setattr(obj, name, timed)
t0 = time.perf_counter()
from tracekit.cli import main
from tracekit.analyze.trace import export
from tracekit.analyze.model import phases
from tracekit.analyze import sections
from tracekit.analyze.sections import pcie_metrics, transfers
from tracekit.analyze import result
from tracekit.render import tables as render
timers["import (tracekit, polars, numpy)"] = time.perf_counter() - t0
wrap(export.Export, "query", "SQLite reads in the main thread (Export.query)")
wrap(phases, "build", "phase model (phases.build)")
wrap(transfers, "analyze_transfers", "transfer sections (transfers.analyze_transfers)")
wrap(sections, "run", "every section: breakdown, transfers, findings, advice (sections.run, the registry loop)")
wrap(pcie_metrics, "reduce_pcie", "  of which reduce_pcie (GPU_METRICS streamed, incl. waiting for reads)")
wrap(transfers.TransferResult, "rank_sections", "frames -> JSON rows (TransferResult.rank_sections)")
wrap(render, "render", "terminal tables (render.render)")
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["analyze", sys.argv[1], "--all", "--no-cache"])
timers["total in process"] = time.perf_counter() - t_start
print(json.dumps(timers))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default="1,4", help="trace sizes for the RSS slope (copies by make_nx_trace.py)")
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()),
                    help="where the larger traces and the 5 links are made (removed at the end)")
    ap.add_argument("--keep", action="store_true",
                    help="build the larger traces in --work-dir itself and keep them (a later run with the "
                         "same --work-dir and --keep reuses them)")
    ap.add_argument("--bin-ms", type=int, help="--bin-ms for every run of row 5 (a 16x trace needs 2: at 1 ms "
                    "its timeline would have more bins than tracekit allows)")
    ap.add_argument("--no-loaded", action="store_true", help="skip the rows measured under added load")
    ap.add_argument("--skip", default="", help="comma list of: sizes, default, report, jobs")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--pythonpath", type=Path, help="run the tracekit found there (e.g. an unpacked older commit)")
    args = ap.parse_args(argv)
    if args.pythonpath:
        os.environ["PYTHONPATH"] = str(args.pythonpath.resolve())
    # bytecode as an installed tracekit has it: without __pycache__ (PYTHONDONTWRITEBYTECODE set
    # in some environments) every run compiles tracekit's sources again, about 0.2 s; the warm-up
    # run of each pair writes it
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    # children start in a neutral folder: `python -m`/`-c` put the current folder first on
    # sys.path, which would shadow --pythonpath with a checkout's tracekit/
    args.trace, args.work_dir = args.trace.resolve(), args.work_dir.resolve()
    args.json = args.json.resolve() if args.json else None
    os.chdir(tempfile.gettempdir())
    skip = set(filter(None, args.skip.split(",")))
    trace = args.trace.resolve()
    work = Path(tempfile.mkdtemp(prefix="tk-bench-", dir=args.work_dir))
    out: dict = {"trace": str(trace), "size_mb": trace.stat().st_size / 1e6, "repeat": args.repeat,
                 "cores": len(os.sched_getaffinity(0)), "load_before": os.getloadavg()}
    allc = [*TRACEKIT, "analyze", str(trace), "--all", "--no-cache"]
    bare, bare_in = bare_cmd(trace)
    try:
        print("1, 3, 4: --all vs bare scan ...", file=sys.stderr)
        a, b = pairs(allc, bare, args.repeat, None, bare_in)
        out["load_during"] = os.getloadavg()
        out["all"] = {"runs": a, "bare": b, "ratio": ratio_rows(a, b), "cpu_ratio": ratio_rows(a, b, "cpu_s"),
                      "rss_mib": stats([x["rss_mib"] for x in a])}
        if not args.no_loaded:
            print("2: the same under load ...", file=sys.stderr)
            with Load():
                la, lb = pairs(allc, bare, args.repeat, None, bare_in)
            out["all_loaded"] = {"runs": la, "bare": lb, "ratio": ratio_rows(la, lb),
                                 "cpu_ratio": ratio_rows(la, lb, "cpu_s")}
        if "sizes" not in skip:
            sizes = []
            for k in (int(x) for x in args.sizes.split(",")):
                t = trace if k == 1 else build_nx(trace, k, work, args.work_dir if args.keep else None)
                print(f"5: peak RSS, {k}x ...", file=sys.stderr)
                extra = ["--bin-ms", str(args.bin_ms)] if args.bin_ms else []
                runs = [measure([*TRACEKIT, "analyze", str(t), "--all", "--no-cache", *extra]) for _ in range(2)]
                sizes.append({"copies": k, "size_mb": t.stat().st_size / 1e6, "rss_mib": min(r["rss_mib"] for r in runs),
                              "wall_s": min(r["wall_s"] for r in runs), "cpu_s": min(r["cpu_s"] for r in runs)})
            out["sizes"] = sizes
            out["sizes_bin_ms"] = args.bin_ms
            if len(sizes) >= 2:
                out["rss_fit"] = linear_fit([s["size_mb"] for s in sizes], [s["rss_mib"] for s in sizes])
        if "default" not in skip:
            print("6: default analyze vs plain polars ...", file=sys.stderr)
            d, p = pairs([*TRACEKIT, "analyze", str(trace), "--no-cache"],
                         [sys.executable, "-c", _PLAIN_POLARS, str(trace)], args.repeat)
            out["default"] = {"runs": d, "polars": p, "ratio": ratio_rows(d, p)}
        if "report" in skip:
            pass
        else:
            print("7: report, first and cached ...", file=sys.stderr)
            from tracekit.analyze.trace.cache import default_cache_dir

            shutil.rmtree(default_cache_dir(trace), ignore_errors=True)
            rep = [*TRACEKIT, "report", str(trace), "-o", str(work / "report")]
            first = measure(rep)
            cached = [measure(rep) for _ in range(max(2, args.repeat // 2))]
            out["report"] = {"first": first, "cached": cached, "cached_wall": stats([c["wall_s"] for c in cached])}
        if "jobs" not in skip:
            print("8: --jobs 2 vs --jobs 1 on 5 traces, under load ...", file=sys.stderr)
            links = work / "five"
            links.mkdir()
            for i in range(5):
                try:
                    os.link(trace, links / f"rank{i}.sqlite")
                except OSError:
                    os.symlink(trace, links / f"rank{i}.sqlite")
            j = [*TRACEKIT, "analyze", str(links), "--no-cache"]
            import contextlib

            with Load() if not args.no_loaded else contextlib.nullcontext():
                j2, j1 = pairs([*j, "--jobs", "2"], [*j, "--jobs", "1"], max(2, args.repeat // 2))
            out["jobs"] = {"jobs2": j2, "jobs1": j1, "ratio": ratio_rows(j2, j1), "loaded": not args.no_loaded}
        print("where the time goes ...", file=sys.stderr)
        r = subprocess.run([sys.executable, "-c", _STAGES, str(trace)], capture_output=True, text=True, check=True)
        out["stages"] = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def report(o: dict) -> None:
    w = print
    ok = lambda c: "met" if c else "NOT met"  # noqa: E731
    f = lambda s: f"min {s['min']:.2f}, median {s['median']:.2f}"  # noqa: E731
    w(f"\n== tracekit benchmark, {Path(o['trace']).name} ({o['size_mb']:.0f} MB), {o['cores']} cores, "
      f"{o['repeat']} interleaved pairs per row ==")
    w(f"load average before {o['load_before'][0]:.1f}, during rows 1/3/4 {o['load_during'][0]:.1f}")
    a = o["all"]
    med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
    w(f"1. --all --no-cache / bare scan, wall: {f(a['ratio'])}  (goal <= {GOALS['ratio_quiet']} quiet: "
      f"{ok(a['ratio']['min'] <= GOALS['ratio_quiet'])} on the fastest pair)   "
      f"[analyze median {med(a['runs'], 'wall_s'):.2f} s, bare {med(a['bare'], 'wall_s'):.2f} s]")
    if "all_loaded" in o:
        la = o["all_loaded"]
        w(f"2. same, loaded (+1 busy process per core): {f(la['ratio'])}  (goal <= {GOALS['ratio_loaded']}: "
          f"{ok(la['ratio']['median'] <= GOALS['ratio_loaded'])})   [CPU ratio {f(la['cpu_ratio'])}]")
    w(f"3. CPU time / bare scan CPU: {f(a['cpu_ratio'])}  (goal <= {GOALS['cpu_ratio']}: "
      f"{ok(a['cpu_ratio']['median'] <= GOALS['cpu_ratio'])})   [analyze {med(a['runs'], 'cpu_s'):.2f} s, "
      f"bare {med(a['bare'], 'cpu_s'):.2f} s]")
    w(f"4. peak RSS --all: {f(a['rss_mib'])} MiB  (goal <= {GOALS['rss_mib']:.0f}: "
      f"{ok(a['rss_mib']['max'] <= GOALS['rss_mib'])})")
    if "sizes" in o:
        base = o["sizes"][0]["rss_mib"]
        bins = f" (--bin-ms {o['sizes_bin_ms']})" if o.get("sizes_bin_ms") else ""
        for s in o["sizes"]:
            w(f"5. {s['copies']}x trace{bins} {s['size_mb']:.0f} MB: peak RSS {s['rss_mib']:.0f} MiB ({s['rss_mib'] / base:.2f}x "
              f"the 1x figure), wall {s['wall_s']:.2f} s, CPU {s['cpu_s']:.2f} s")
        if "rss_fit" in o:
            fit = o["rss_fit"]
            top = o["sizes"][-1]["rss_mib"] / base
            w(f"   peak RSS fit: {fit['a']:.0f} MiB + {fit['b'] * 100:.1f} MiB per 100 MB (R^2 {fit['r2']:.3f}); "
              f"largest / 1x = {top:.2f} (goal <= {GOALS['rss_flat']}: {ok(top <= GOALS['rss_flat'])})")
    if "default" in o:
        d = o["default"]
        w(f"6. analyze (default) / plain polars per-phase copy bytes: {f(d['ratio'])}  (goal <= "
          f"{GOALS['default_vs_polars']}: {ok(d['ratio']['median'] <= GOALS['default_vs_polars'])})   "
          f"[{med(d['runs'], 'wall_s'):.2f} vs {med(d['polars'], 'wall_s'):.2f} s]")
    if "report" in o:
        r = o["report"]
        w(f"7. report: first {r['first']['wall_s']:.2f} s, cached {f(r['cached_wall'])} s  (goal <= "
          f"{GOALS['report_cached_s']} s: {ok(r['cached_wall']['median'] <= GOALS['report_cached_s'])})")
    if "jobs" in o:
        j = o["jobs"]
        w(f"8. --jobs 2 / --jobs 1 on 5 traces{' (loaded)' if j['loaded'] else ''}: {f(j['ratio'])}  (goal <= "
          f"{GOALS['jobs2_vs_jobs1']}: {ok(j['ratio']['median'] <= GOALS['jobs2_vs_jobs1'])})   "
          f"[{med(j['jobs2'], 'wall_s'):.2f} vs {med(j['jobs1'], 'wall_s'):.2f} s]")
    if "stages" in o:
        w("\nwhere the time goes, one in-process --all --no-cache run (stages nest):")
        for label, sec in o["stages"].items():
            w(f"  {sec:6.2f} s  {label}")


if __name__ == "__main__":
    sys.exit(main())
