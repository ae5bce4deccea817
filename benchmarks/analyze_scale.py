#!/usr/bin/env python
"""Benchmark ``tracekit analyze`` with every analysis against a bare SQLite scan (issue 6).

For a trace and cuts of half and a quarter of it (made with ``tracekit trim --time-range``
when absent), prints medians over ``--repeat`` runs of:

- **bare scan**: a fresh Python process that runs, with the standard library's ``sqlite3``,
  every query the analysis sends through ``Export.query`` (recorded from a real run), as
  ``SELECT count(*), max(col1), ..., max(colN) FROM (query)``: the same tables, columns and
  filters, every value read, nothing built from them;
- **analyze, no cache**: ``tracekit analyze TRACE --all --no-cache`` (every section; output
  to /dev/null), and the ratio of its wall time to the bare scan's;
- **analyze, first run**: ``--all`` with an empty cache directory (reads the trace and writes
  the Parquet + result cache);
- **analyze, cached**: the same command again (the stored tables answer); and
  **frames cached**: the same with the stored results and tables deleted first, so every
  query is read from Parquet but the whole analysis runs;
- peak RSS (``ru_maxrss`` of each child process) for all of the above;
- scaling: time and memory against trace size over the full trace and the cuts, with the
  least-squares line ``t = a + b * size`` and its R^2;
- CPU time (user + system) of the bare scan and the analysis, less sensitive than wall time
  to other work on the machine;
- where the time of one run goes (imports, SQLite reads, phase model, transfer sections,
  JSON rows, terminal tables), from an in-process run with timers around those functions.

Everything runs with the trace in the OS page cache (one discarded warm-up run first): it
measures tracekit, not the disk. Timings on a shared machine are noisy; medians are reported.

Usage::

    python benchmarks/analyze_scale.py /work/scratch/ds3.sqlite [--repeat 3] [--cuts-dir DIR]
        [--no-cuts] [--json OUT.json]
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

TRACEKIT = [sys.executable, "-m", "tracekit.cli"]
ANALYZE_ARGS = ["--all"]
GOAL_RATIO = 1.5
GOAL_RSS_MB = 1024
GOAL_CACHE_SPEEDUP = 5.0

_RECORDER = r"""
import json, sys, contextlib, io, threading
from tracekit.analyze import export as ex
seen, out = set(), []
orig = ex.Export.query
def query(self, sql, params=(), schema=None):
    key = (sql, tuple(params))
    # the main thread asks for every query the analysis needs; prefetch threads only read
    # pieces of those (rowid ranges), which must not be scanned twice by the bare scan
    if key not in seen and threading.current_thread() is threading.main_thread():
        seen.add(key)
        out.append({"sql": sql, "params": list(params)})
    return orig(self, sql, params, schema)
ex.Export.query = query
from tracekit.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["analyze", sys.argv[1], *sys.argv[3:], "--no-cache"])
json.dump({"rc": rc, "queries": out}, open(sys.argv[2], "w"))
"""

_BARE = r"""
import json, sqlite3, sys
from urllib.parse import quote
path, queries = sys.argv[1], json.load(open(sys.argv[2]))
conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
rows = 0
for q in queries:
    cur = conn.execute(f"SELECT * FROM ({q['sql']}) LIMIT 0", q["params"])
    cols = [d[0] for d in cur.description]
    aggs = ", ".join(f'max("{c}")' for c in cols)
    rows += conn.execute(f"SELECT count(*), {aggs} FROM ({q['sql']})", q["params"]).fetchone()[0]
print(rows)
"""


def measure(cmd: list[str], env: dict | None = None) -> tuple[float, float, str, float]:
    """Run ``cmd`` and return (wall s, peak RSS MB, stdout, CPU s = user + system), RSS and CPU
    from ``os.wait4`` of that child."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {err.read().decode()[-2000:]}")
        return wall, usage.ru_maxrss / 1024, out.read().decode(), usage.ru_utime + usage.ru_stime


def median_of(runs: list[tuple[float, float, str, float]]) -> dict:
    walls = [r[0] for r in runs]
    rss = [r[1] for r in runs]
    cpu = [r[3] for r in runs]
    return {"wall_s": statistics.median(walls), "wall_min_s": min(walls), "wall_max_s": max(walls),
            "cpu_s": statistics.median(cpu), "rss_mb": statistics.median(rss), "rss_max_mb": max(rss),
            "runs": len(runs)}


def cache_dir(trace: Path) -> Path:
    from tracekit.analyze.cache import default_cache_dir

    return default_cache_dir(trace)


def bench_trace(trace: Path, repeat: int, work: Path) -> dict:
    size_mb = trace.stat().st_size / 1e6
    qfile = work / f"{trace.name}.queries.json"
    subprocess.run([sys.executable, "-c", _RECORDER, str(trace), str(qfile), *ANALYZE_ARGS], check=True)
    recorded = json.loads(qfile.read_text())
    if recorded["rc"] != 0:
        raise RuntimeError(f"tracekit analyze {trace} exited {recorded['rc']}")
    queries = recorded["queries"]
    qonly = work / f"{trace.name}.q.json"
    qonly.write_text(json.dumps(queries))
    analyze = [*TRACEKIT, "analyze", str(trace), *ANALYZE_ARGS]
    env = dict(os.environ)

    # warm-up: page cache, .pyc files
    measure([*analyze, "--no-cache"], env)
    bare, nocache = [], []
    for _ in range(repeat):  # interleaved, so that both see the same load on a shared machine
        bare.append(measure([sys.executable, "-c", _BARE, str(trace), str(qonly)], env))
        nocache.append(measure([*analyze, "--no-cache"], env))
    rows = int(bare[0][2].strip())

    first, cached, frames = [], [], []
    for _ in range(repeat):
        shutil.rmtree(cache_dir(trace), ignore_errors=True)
        first.append(measure(analyze, env))
        cached.append(measure(analyze, env))
        for pattern in ("r-*.json", "t-*.txt"):  # keep the Parquet frames, drop results and tables
            for p in cache_dir(trace).glob(pattern):
                p.unlink()
        frames.append(measure(analyze, env))
    measure(analyze, env)  # the frames run stored the result again; size the complete cache
    cache_mb = sum(p.stat().st_size for p in cache_dir(trace).iterdir()) / 1e6
    out = {
        "trace": str(trace),
        "size_mb": size_mb,
        "queries": len(queries),
        "rows_read": rows,
        "bare_scan": median_of(bare),
        "analyze_no_cache": median_of(nocache),
        "analyze_first_run": median_of(first),
        "analyze_cached": median_of(cached),
        "analyze_frames_cached": median_of(frames),
        "cache_mb": cache_mb,
    }
    out["ratio_to_bare"] = out["analyze_no_cache"]["wall_s"] / out["bare_scan"]["wall_s"]
    out["ratio_to_bare_min"] = out["analyze_no_cache"]["wall_min_s"] / out["bare_scan"]["wall_min_s"]
    out["cpu_ratio_to_bare"] = out["analyze_no_cache"]["cpu_s"] / out["bare_scan"]["cpu_s"]
    out["cache_speedup"] = out["analyze_first_run"]["wall_s"] / out["analyze_cached"]["wall_s"]
    out["frames_cache_speedup"] = out["analyze_first_run"]["wall_s"] / out["analyze_frames_cached"]["wall_s"]
    return out


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
            return fn(*a, **k)  # the prefetch thread: its time overlaps the main thread's
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            timers[label] = timers.get(label, 0.0) + time.perf_counter() - t0
    setattr(obj, name, timed)
t0 = time.perf_counter()
from tracekit.cli import main
from tracekit.analyze import export, phases, pcie_metrics, transfers, result, render, multi
timers["import (tracekit, polars, numpy)"] = time.perf_counter() - t0
wrap(export.Export, "query", "SQLite reads in the main thread (Export.query, incl. waiting for the prefetch)")
wrap(phases, "build", "phase model (phases.build)")
wrap(transfers, "analyze_transfers", "transfer sections (transfers.analyze_transfers)")
wrap(pcie_metrics, "pcie_series", "  of which pcie_series (GPU_METRICS, incl. its read)")
wrap(transfers.TransferResult, "rank_sections", "frames -> JSON rows (TransferResult.rank_sections)")
wrap(render, "render", "terminal tables (render.render)")
wrap(result, "analyze_export", "whole analysis (result.analyze_export)")
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["analyze", sys.argv[1], *sys.argv[2:], "--no-cache"])
timers["total in process"] = time.perf_counter() - t_start
print(json.dumps(timers))
"""


def stages(trace: Path) -> dict:
    """Seconds spent per stage in one in-process run of ``analyze --all --no-cache``."""
    _, _, out, _ = measure([sys.executable, "-c", _STAGES, str(trace), *ANALYZE_ARGS])
    return json.loads(out.strip().splitlines()[-1])


def make_cuts(trace: Path, cuts_dir: Path) -> list[Path]:
    cuts = []
    for label, rng in (("half", "50%:100%"), ("quarter", "75%:100%")):
        dst = cuts_dir / f"{trace.stem}.{label}.sqlite"
        if not dst.exists() or dst.stat().st_mtime < trace.stat().st_mtime:
            print(f"cutting {dst} (--time-range {rng}) ...", file=sys.stderr)
            subprocess.run([*TRACEKIT, "trim", str(trace), str(dst), "--time-range", rng, "--force"],
                           check=True, stdout=subprocess.DEVNULL)
        cuts.append(dst)
    return cuts


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


def report(results: list[dict]) -> None:
    w = print
    w("\n== tracekit analyze " + " ".join(ANALYZE_ARGS) + " vs bare SQLite scan (medians) ==")
    hdr = f"{'trace':28} {'MB':>7} {'rows read':>10} {'bare s':>7} {'bare MB':>8} {'analyze s':>9} " \
          f"{'RSS MB':>7} {'ratio':>6} {'1st s':>6} {'cached s':>8} {'x':>6} {'frames s':>8} {'x':>5}"
    w(hdr)
    for r in results:
        w(f"{Path(r['trace']).name[:28]:28} {r['size_mb']:7.1f} {r['rows_read']:10d} "
          f"{r['bare_scan']['wall_s']:7.2f} {r['bare_scan']['rss_mb']:8.0f} "
          f"{r['analyze_no_cache']['wall_s']:9.2f} {r['analyze_no_cache']['rss_mb']:7.0f} "
          f"{r['ratio_to_bare']:6.2f} {r['analyze_first_run']['wall_s']:6.2f} "
          f"{r['analyze_cached']['wall_s']:8.2f} {r['cache_speedup']:6.1f} "
          f"{r['analyze_frames_cached']['wall_s']:8.2f} {r['frames_cache_speedup']:5.1f}")
    w("columns: bare = sqlite3 scan of the analysis' queries; analyze = --no-cache; ratio = analyze / bare;")
    for r in results:
        w(f"  {Path(r['trace']).name}: fastest runs ratio {r['ratio_to_bare_min']:.2f}; CPU (user+sys) "
          f"bare {r['bare_scan']['cpu_s']:.2f} s, analyze {r['analyze_no_cache']['cpu_s']:.2f} s, "
          f"ratio {r['cpu_ratio_to_bare']:.2f}")
    w("         1st = first run with the cache on (writes it); cached = second run (result cache);")
    w("         frames = results deleted, Parquet frames kept; x = 1st / that run")
    if len(results) >= 2:
        xs = [r["size_mb"] for r in results]
        for key, label in (("analyze_no_cache", "analyze time"), ("bare_scan", "bare scan time")):
            f = linear_fit(xs, [r[key]["wall_s"] for r in results])
            w(f"scaling, {label}: {f['a']:.2f} s + {f['b'] * 100:.3f} s per 100 MB (R^2 {f['r2']:.3f})")
        f = linear_fit(xs, [r["analyze_no_cache"]["cpu_s"] for r in results])
        w(f"scaling, analyze CPU time: {f['a']:.2f} s + {f['b'] * 100:.3f} s per 100 MB (R^2 {f['r2']:.3f})")
        f = linear_fit(xs, [r["analyze_no_cache"]["rss_mb"] for r in results])
        w(f"scaling, analyze peak RSS: {f['a']:.0f} MB + {f['b'] * 100:.1f} MB per 100 MB (R^2 {f['r2']:.3f})")
        full = max(results, key=lambda r: r["size_mb"])
        for r in results:
            w(f"  {Path(r['trace']).name:28} size {r['size_mb'] / full['size_mb']:5.2f} of full, "
              f"time {r['analyze_no_cache']['wall_s'] / full['analyze_no_cache']['wall_s']:5.2f}, "
              f"CPU {r['analyze_no_cache']['cpu_s'] / full['analyze_no_cache']['cpu_s']:5.2f}, "
              f"RSS {r['analyze_no_cache']['rss_mb'] / full['analyze_no_cache']['rss_mb']:5.2f}")
    full = max(results, key=lambda r: r["size_mb"])
    w("\ngoals on the largest trace:")
    ok = lambda c: "met" if c else "NOT met"  # noqa: E731
    w(f"  time <= {GOAL_RATIO}x bare scan: {full['ratio_to_bare']:.2f}x ({ok(full['ratio_to_bare'] <= GOAL_RATIO)})")
    w(f"  peak RSS <= {GOAL_RSS_MB} MB: {full['analyze_no_cache']['rss_mb']:.0f} MB "
      f"({ok(full['analyze_no_cache']['rss_mb'] <= GOAL_RSS_MB)})")
    w(f"  cached run >= {GOAL_CACHE_SPEEDUP}x faster: {full['cache_speedup']:.1f}x "
      f"({ok(full['cache_speedup'] >= GOAL_CACHE_SPEEDUP)}); Parquet frames only: "
      f"{full['frames_cache_speedup']:.1f}x; cache size {full['cache_mb']:.1f} MB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cuts-dir", type=Path, help="where the half/quarter cuts live (default: beside the trace)")
    ap.add_argument("--no-cuts", action="store_true", help="only the trace itself")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    traces = [args.trace]
    if not args.no_cuts:
        traces += make_cuts(args.trace, args.cuts_dir or args.trace.parent)
    results = []
    with tempfile.TemporaryDirectory() as work:
        for t in traces:
            print(f"benchmarking {t} ...", file=sys.stderr)
            results.append(bench_trace(t, args.repeat, Path(work)))
    report(results)
    st = stages(args.trace)
    print(f"\nwhere the time goes, {args.trace.name} (one in-process run; stages nest):")
    for label, sec in st.items():
        print(f"  {sec:6.2f} s  {label}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "stages": st}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
