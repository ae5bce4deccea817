#!/usr/bin/env python
"""``analyze --dask`` on a local cluster of worker processes against ``--jobs``, and what the
per-trace cost and memory predict for a real cluster (issue 13, item 6).

What it does:

1. makes hard links of TRACE (the large trace, default ``/work/scratch/ds.sqlite``) and of
   SMALL (a small fixture, to see the per-task overhead) in ``--work-dir`` (``rank0.sqlite``,
   ... ; one inode, so every "rank" is read from the OS page cache after the first: the runs
   measure computation, not disk reads; a hard link has its own path, so tracekit treats each
   as a trace of its own, and every run uses ``--no-cache``);
2. starts a local cluster in a separate process: ``distributed.LocalCluster(processes=True,
   n_workers=W, threads_per_worker=1)`` (a scheduler and W nanny-supervised worker processes,
   as ``dask scheduler`` + ``dask worker`` would give), warms its workers up (imports), and
   runs ``tracekit analyze FILES --no-cache --dask tcp://...`` for each N, interleaved with
   ``--jobs W`` and ``--jobs 1`` on the same files (each a fresh CLI process, output to
   /dev/null);
3. for each run prints wall time, CPU time (the CLI process tree from ``wait4``, plus the
   worker and scheduler processes' CPU for ``--dask``), peak RSS per worker (``VmHWM`` of each
   worker process, reset through ``/proc/PID/clear_refs`` before the run; for ``--jobs`` the
   largest process of the tree, ``ru_maxrss``), the client's peak RSS (the CLI process alone:
   its ``VmHWM``, which it writes as it exits), bytes read per trace (``rchar`` of the workers)
   and the load average; for ``--dask`` also the tasks' compute times from the scheduler's task
   stream;
4. fits the model ``wall = F + ceil(N / W) * tW + N * s`` (see :func:`fit_and_predict`: each
   parameter from its own runs, N = 1 and N = W), prints its error on the runs with N > W (out
   of sample), and the prediction for ``--ranks`` traces of ``--rank-mb`` MB on ``--nodes`` x
   ``--workers-per-node`` workers with the read bandwidth it needs (``--options --all``: the
   full analysis, which reads the PCIe samples, most of a trace's bytes; the default view
   reads a few percent of them).

Usage::

    python benchmarks/dask_scale.py [--trace /work/scratch/ds.sqlite] [--counts 1,2,4,8]
        [--small tests/fixtures/ds_zero3_offload_iter1-2.sqlite] [--small-counts 1,16,32]
        [--workers 2] [--repeat 1] [--work-dir /work/scratch/D] [--skip jobs1] [--options --all]
        [--ranks 512 --rank-mb 600 --nodes 16 --workers-per-node 8 --cores-per-node 16]
        [--json OUT.json] [--pythonpath DIR]
    python benchmarks/dask_scale.py --from-json OUT.json   # the tables and the model again

The links are removed at the end (``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the CLI, run so that it writes its own peak RSS (``VmHWM``, this process alone: not the
#: ``--jobs`` workers it spawns) to the file ``$DASK_SCALE_HWM`` as it exits
_CLIENT = ("import atexit, os, runpy, sys\n"
           "def _hwm():\n"
           "    with open('/proc/self/status') as fh, open(os.environ['DASK_SCALE_HWM'], 'w') as out:\n"
           "        out.write(next(ln for ln in fh if ln.startswith('VmHWM:')).split()[1])\n"
           "atexit.register(_hwm)\n"
           "sys.argv = ['tracekit', *sys.argv[1:]]\n"
           "runpy.run_module('tracekit.cli', run_name='__main__')\n")
TRACEKIT = [sys.executable, "-c", _CLIENT]
#: where the CLI and the cluster's workers import tracekit from (``--pythonpath``)
TREE = {"cwd": ROOT, "env": None}
MiB = 1 << 20


# ---------------------------------------------------------------- the cluster (own process)
def serve_cluster(workers: int) -> None:
    """Run a LocalCluster of ``workers`` processes; print one JSON line (address, pids) and
    stay until stdin closes."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        pids = client.run(os.getpid)
        nannies = [w.process.process.pid for w in cluster.workers.values()] if hasattr(
            next(iter(cluster.workers.values())), "process") else []
        print(json.dumps({"address": cluster.scheduler_address, "workers": pids,
                          "nannies": nannies, "scheduler_pid": os.getpid()}), flush=True)
        sys.stdin.read()


# ---------------------------------------------------------------- /proc helpers
def _cpu_s(pid: int) -> float:
    """user + system CPU seconds of process ``pid`` (its own threads, not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _rchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


class PeakRSS:
    """Peak resident memory of some processes during a block: ``VmHWM`` after resetting it
    (``clear_refs`` 5), or, where that is refused, ``VmRSS`` sampled every 20 ms."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self.reset_ok = True
        for pid in pids:
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            except OSError:
                self.reset_ok = False
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.wait(0.02):
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], _status_kib(pid, "VmRSS"))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        for pid in self.pids:
            hwm = _status_kib(pid, "VmHWM") if self.reset_ok else 0
            self.peak[pid] = max(self.peak[pid], hwm)


# ---------------------------------------------------------------- one CLI run
def run_cli(files: list[Path], mode: str, cluster: dict | None, client=None, options: str = "") -> dict:
    """``tracekit analyze FILES --no-cache`` with ``mode`` = ``dask`` | ``jobsN``; figures."""
    extra = ["--dask", cluster["address"]] if mode == "dask" else ["--jobs", mode[4:]]
    worker_pids = list(cluster["workers"].values()) if mode == "dask" else []
    watched = worker_pids + ([cluster["scheduler_pid"]] if mode == "dask" else [])
    cpu0 = {pid: _cpu_s(pid) for pid in watched}
    read0 = {pid: _rchar(pid) for pid in worker_pids}
    base_rss = {pid: _status_kib(pid, "VmRSS") for pid in worker_pids}
    load = os.getloadavg()[0]
    err = tempfile.TemporaryFile()
    hwm = tempfile.NamedTemporaryFile(prefix="dask_scale_hwm")
    stream_start = time.time()
    env = (TREE["env"] or os.environ) | {"DASK_SCALE_HWM": hwm.name}
    with PeakRSS(worker_pids) as peak:
        t0 = time.perf_counter()
        proc = subprocess.Popen([*TRACEKIT, "analyze", *map(str, files), "--no-cache", *options.split(), *extra],
                                stdout=subprocess.DEVNULL, stderr=err, cwd=TREE["cwd"], env=env)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        err.seek(0)
        raise SystemExit(f"{mode} N={len(files)} failed ({proc.returncode}): {err.read().decode()[-2000:]}")
    row = {"n": len(files), "mode": mode, "wall_s": wall, "load": load,
           "cli_cpu_s": ru.ru_utime + ru.ru_stime, "cli_peak_mib": ru.ru_maxrss / 1024,
           "client_mib": int(Path(hwm.name).read_text() or 0) / 1024}  # the CLI process alone
    hwm.close()
    if mode == "dask":
        row["worker_cpu_s"] = sum(_cpu_s(p) - cpu0[p] for p in worker_pids)
        row["scheduler_cpu_s"] = _cpu_s(cluster["scheduler_pid"]) - cpu0[cluster["scheduler_pid"]]
        row["cpu_s"] = row["cli_cpu_s"] + row["worker_cpu_s"] + row["scheduler_cpu_s"]
        row["worker_peak_mib"] = max(peak.peak.values()) / 1024
        row["worker_base_mib"] = max(base_rss.values()) / 1024
        row["read_mb_per_trace"] = sum(_rchar(p) - read0[p] for p in worker_pids) / len(files) / 1e6
        row["task_s"] = _task_times(client, stream_start)
    else:
        row["cpu_s"] = row["cli_cpu_s"]
        row["worker_peak_mib"] = row["cli_peak_mib"]  # the largest process of the tree
    return row


def _task_times(client, since: float) -> list[float]:
    """Compute time of each tracekit task that ran since ``since`` (scheduler's task stream)."""
    out = []
    for rec in client.get_task_stream(start=since):
        if "_analyze" not in str(rec.get("key")):
            continue
        out += [s["stop"] - s["start"] for s in rec["startstops"] if s["action"] == "compute"]
    return out


# ---------------------------------------------------------------- model
def predict(n: int, workers: int, t_task: float, fixed: float, per_task: float) -> float:
    return fixed + math.ceil(n / workers) * t_task + n * per_task


# ---------------------------------------------------------------- main
def _links(src: Path, folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        dst = folder / f"rank{i}.sqlite"
        if not dst.exists():
            os.link(src, dst)
        out.append(dst)
    return out


def _fmt(rows: list[dict]) -> str:
    head = ("| trace | N | mode | wall s | CPU s | CPU/wall | peak RSS per worker MiB | client MiB "
            "| task s (median) | load |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        task = f"{statistics.median(r['task_s']):.2f}" if r.get("task_s") else ""
        lines.append(f"| {r['trace']} | {r['n']} | {r['mode']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                     f"{r['cpu_s'] / r['wall_s']:.2f} | {r['worker_peak_mib']:.0f} | "
                     f"{r.get('client_mib', r['cli_peak_mib']):.0f} | {task} | {r['load']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=Path("/work/scratch/ds.sqlite"))
    ap.add_argument("--counts", default="1,2,4,8", help="numbers of links of --trace (1 and W calibrate)")
    ap.add_argument("--small", type=Path, default=ROOT / "tests/fixtures/ds_zero3_offload_iter1-2.sqlite")
    ap.add_argument("--small-counts", default="1,2,16,32", help="numbers of links of --small (per-task costs)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of the local cluster and --jobs")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--work-dir", type=Path, default=Path("/work/scratch/D"))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of modes to skip: dask, jobsW, jobs1")
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--rank-mb", type=float, default=600.0)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--workers-per-node", type=int, default=8)
    ap.add_argument("--cores-per-node", type=int, default=16)
    ap.add_argument("--options", default="", help="more analyze options, e.g. --all")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--pythonpath", type=Path, help="run the tracekit found there (e.g. `git archive HEAD | "
                    "tar -x -C DIR`, a tree other sessions do not edit meanwhile)")
    ap.add_argument("--from-json", type=Path, help="print the tables and the model of a run saved with --json")
    ap.add_argument("--serve-cluster", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.from_json:
        saved = json.loads(a.from_json.read_text())
        a.options = saved.get("options", a.options)
        print(_fmt(saved["rows"]))
        print(f"\nload average during the runs: {min(r['load'] for r in saved['rows']):.1f}-"
              f"{max(r['load'] for r in saved['rows']):.1f}")
        fit_and_predict(saved["rows"], saved.get("workers", a.workers), a, saved["cold_first_task_s"])
        return 0
    if a.serve_cluster:
        serve_cluster(a.serve_cluster)
        return 0
    from distributed import Client

    if a.pythonpath:
        TREE.update(cwd=a.pythonpath.resolve(), env=os.environ | {"PYTHONPATH": str(a.pythonpath.resolve())})
    W = a.workers
    skip = {s.strip().replace("jobsW", f"jobs{W}") for s in a.skip.split(",") if s.strip()}
    modes = [m for m in ("dask", f"jobs{W}", "jobs1") if m not in skip]
    sets = [("large", a.trace, [int(x) for x in a.counts.split(",") if x]),
            ("small", a.small, [int(x) for x in a.small_counts.split(",") if x])]
    made = []
    files = {}
    for name, src, counts in sets:
        if counts:
            folder = a.work_dir / name
            made.append(folder)
            files[name] = _links(src, folder, max(counts))
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-cluster", str(W)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, **TREE)
    try:
        cluster = json.loads(server.stdout.readline())
        cluster["workers"] = {k: int(v) for k, v in cluster["workers"].items()}
        client = Client(cluster["address"], set_as_default=False)
        client.get_task_stream(start=time.time())  # installs the scheduler's task-stream plugin
        print(f"cluster {cluster['address']}: {W} worker processes {sorted(cluster['workers'].values())}, "
              f"1 thread each; {os.cpu_count()} cores here", flush=True)
        # warm-up: the first task of each worker imports tracekit and polars (the cold start)
        warm = run_cli(files["small"][:W] if "small" in files else files["large"][:W], "dask", cluster, client, a.options)
        cold_first = max(warm["task_s"]) if warm["task_s"] else float("nan")
        print(f"warm-up (cold workers, {W} small traces): wall {warm['wall_s']:.2f} s, "
              f"slowest first task {cold_first:.2f} s", flush=True)
        rows = []
        for rep in range(a.repeat):
            for name, _, counts in sets:
                for n in counts:
                    for mode in modes:
                        if n == 1 and mode != "dask":
                            continue
                        r = run_cli(files[name][:n], mode, cluster, client, a.options) | {"trace": name, "rep": rep}
                        rows.append(r)
                        print(_fmt([r]).splitlines()[-1], flush=True)
        client.close()
    finally:
        server.stdin.close()
        server.wait(60)
        if not a.keep:
            for folder in made:
                shutil.rmtree(folder, ignore_errors=True)
            try:
                a.work_dir.rmdir()
            except OSError:
                pass
    print()
    print(_fmt(rows))
    print(f"\nload average during the runs: {min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f}")
    fig = fit_and_predict(rows, W, a, cold_first)
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "model": fig, "workers": W, "options": a.options,
                                      "cold_first_task_s": cold_first}, indent=1))
    return 0


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0
    return my - b * mx, b


def fit_and_predict(rows: list[dict], W: int, a, cold_first: float) -> dict:
    """The model, its error on the --dask runs, and the prediction for a cluster.

    Parameters, each from its own runs: ``t1`` one trace's compute time on a worker alone (task
    stream, N = 1); ``tW`` the same while all W workers compute at once (N = W, one round; on
    a node whose cores the workers share this is what a trace costs); ``F`` the fixed part
    (the N = 1 runs: wall - t1: CLI start, imports, connecting, the summary); ``s`` the serial
    work per task (slope over N of the client's and the scheduler's CPU). Predicted:
    ``F + ceil(N / W) * tW + N * s``, checked on the runs with N > W (out of sample)."""
    dask = [r for r in rows if r["mode"] == "dask"]
    kinds = sorted({r["trace"] for r in dask})

    def med(xs):
        xs = list(xs)
        return statistics.median(xs) if xs else None

    t1 = {k: med(t for r in dask if r["trace"] == k and r["n"] == 1 for t in r["task_s"]) for k in kinds}
    tW = {k: med(t for r in dask if r["trace"] == k and r["n"] == W for t in r["task_s"]) for k in kinds}
    F = med(r["wall_s"] - t1[r["trace"]] for r in dask if r["n"] == 1)
    if F is None or len({r["n"] for r in dask}) < 2 or any(v is None for v in tW.values()):
        print("\n(the model needs --dask runs with N = 1 and N = W of each trace)")
        return {}
    _, s_client = _slope([r["n"] for r in dask], [r["cli_cpu_s"] for r in dask])
    _, s_sched = _slope([r["n"] for r in dask], [r["scheduler_cpu_s"] for r in dask])
    s = max(s_client, 0.0) + max(s_sched, 0.0)  # the scheduler's process also hosts the nannies: an upper bound
    print(f"\nmodel: wall = F + ceil(N/W) x tW + N x s, W = {W}: F = {F:.2f} s (N = 1 runs), "
          f"s = {s * 1000:.1f} ms per task (CPU slopes over N: client {s_client * 1000:.1f} + scheduler "
          f"{s_sched * 1000:.1f}); cold first task of a fresh "
          f"worker {cold_first:.2f} s (imports)")
    for k in kinds:
        print(f"  {k}: t1 (alone) = {t1[k]:.2f} s, tW ({W} at once) = {tW[k]:.2f} s")
    errors = []
    print("| trace | N | measured wall s | predicted s | error |\n|---|---|---|---|---|")
    for r in dask:
        if r["n"] <= W:
            continue
        p = predict(r["n"], W, tW[r["trace"]], F, s)
        err = (p - r["wall_s"]) / r["wall_s"]
        errors.append({"trace": r["trace"], "n": r["n"], "measured": r["wall_s"], "predicted": p, "error": err})
        print(f"| {r['trace']} | {r['n']} | {r['wall_s']:.2f} | {p:.2f} | {err:+.0%} |")
    if errors:
        abs_err = [abs(e["error"]) for e in errors]
        print(f"error: median |{statistics.median(abs_err):.0%}|, max |{max(abs_err):.0%}| over {len(errors)} runs")
    # the same in CPU seconds (client + scheduler + workers), which the load of other work on the
    # machine changes much less: cpu(N) = Fc + N * c, least squares per trace kind over all its
    # --dask runs (c: the CPU of one more trace, everywhere); in sample, so its error is the scatter
    fits = {k: _slope([r["n"] for r in dask if r["trace"] == k], [r["cpu_s"] for r in dask if r["trace"] == k])
            for k in kinds}
    c = {k: fits[k][1] for k in kinds}
    Fc = med(fits[k][0] for k in kinds)
    cpu_err = []
    print(f"CPU model: cpu = Fc + N x c (least squares, in sample): Fc = {Fc:.2f} s; c: "
          + ", ".join(f"{k} {c[k]:.2f} s" for k in kinds))
    print("| trace | N | measured CPU s | predicted s | error |\n|---|---|---|---|---|")
    for r in dask:
        p = fits[r["trace"]][0] + r["n"] * c[r["trace"]]
        cpu_err.append({"trace": r["trace"], "n": r["n"], "measured": r["cpu_s"], "predicted": p,
                        "error": (p - r["cpu_s"]) / r["cpu_s"]})
        print(f"| {r['trace']} | {r['n']} | {r['cpu_s']:.2f} | {p:.2f} | {cpu_err[-1]['error']:+.0%} |")
    if cpu_err:
        abs_err = [abs(e["error"]) for e in cpu_err]
        print(f"error: median |{statistics.median(abs_err):.0%}|, max |{max(abs_err):.0%}| over {len(cpu_err)} runs")
    fig = {"F_s": F, "s_s": s, "s_client_s": s_client, "s_scheduler_s": s_sched, "t1_s": t1, "tW_s": tW, "cold_first_task_s": cold_first, "errors": errors,
           "Fc_s": Fc, "c_s": c, "cpu_errors": cpu_err}
    if "large" not in kinds:
        return fig
    large = [r for r in dask if r["trace"] == "large"]
    cpu = c["large"] - s  # a worker's CPU per trace
    peak = max(r["worker_peak_mib"] for r in large)
    base = med(r["worker_base_mib"] for r in large)
    client = max(r["cli_peak_mib"] for r in large)
    read_mb = med(r["read_mb_per_trace"] for r in large)
    size_mb = a.trace.stat().st_size / 1e6
    print(f"\nlarge trace ({size_mb:.0f} MB{', ' + a.options if a.options else ''}): worker CPU per trace (c - s) "
          f"{cpu:.2f} s, read per trace {read_mb:.0f} MB (rchar), worker peak RSS {peak:.0f} MiB (idle "
          f"{base:.0f} MiB), client peak {client:.0f} MiB")
    n, mb, nodes, wpn, cores = a.ranks, a.rank_mb, a.nodes, a.workers_per_node, a.cores_per_node
    workers = nodes * wpn
    scale = mb / size_mb
    # a trace's time on a worker of a dedicated node: its CPU time (one thread: 1 read thread in a
    # worker process), stretched when the node's workers outnumber its cores
    t_rank = cpu * max(1.0, wpn / cores) * scale
    rounds = math.ceil(n / workers)
    cold = max(0.0, cold_first - t1["small" if "small" in kinds else "large"])
    compute = Fc + cold + rounds * t_rank + n * s
    t_here = tW["large"] * scale  # pessimistic: a trace's time as measured here, cores shared with others
    compute_here = F + cold + rounds * t_here + n * s
    total_gb = n * read_mb * scale / 1e3
    need_gbs = workers * read_mb * scale / 1e3 / t_rank  # every worker reading while it computes
    print(f"\nprediction: {n} ranks x {mb:.0f} MB on {nodes} nodes x {wpn} workers = {workers} ({cores} cores "
          f"per node): t per rank = CPU x max(1, {wpn}/{cores}) x {mb:.0f}/{size_mb:.0f} = {t_rank:.2f} s; "
          f"{rounds} rounds; wall = Fc {Fc:.1f} + cold imports {cold:.1f} + "
          f"{rounds} x {t_rank:.2f} + {n} x {s * 1000:.0f} ms = {compute:.1f} s if the reads keep up; with "
          f"the times measured here instead (F, tW: workers sharing loaded cores): {compute_here:.1f} s")
    print(f"reads: {total_gb:.0f} GB in all ({read_mb * scale:.0f} MB per rank); compute-bound as long as the "
          f"shared file system delivers {need_gbs:.1f} GB/s ({need_gbs / workers * 1e3:.0f} MB/s per worker); "
          f"at B GB/s, wall ~ Fc + cold + max({rounds} x t, {total_gb:.0f} GB / B) + N x s: "
          + ", ".join(f"{Fc + cold + max(rounds * t_rank, total_gb / b) + n * s:.0f} s at {b} GB/s" for b in (10, 1)))
    c0, c1 = _slope([r["n"] for r in large], [r.get("client_mib", r["cli_peak_mib"]) for r in large])
    print(f"memory: {peak:.0f} MiB peak per worker, {wpn} per node: {wpn * peak / 1024:.1f} GiB per node; "
          f"client peak {c0:.0f} MiB + {c1:.1f} MiB per trace "
          f"(least squares over N) -> {(c0 + n * c1) / 1024:.1f} GiB for {n} ranks")
    fig |= {"worker_cpu_per_trace_s": cpu, "worker_peak_mib": peak, "worker_idle_mib": base,
            "client_peak_mib": client, "read_mb_per_trace": read_mb,
            "client_mib_fit": [c0, c1],
            "prediction": {"ranks": n, "rank_mb": mb, "workers": workers, "t_rank_s": t_rank, "rounds": rounds,
                           "wall_s": compute, "wall_here_s": compute_here, "read_gb": total_gb, "needed_gb_s": need_gbs}}
    return fig


if __name__ == "__main__":
    sys.exit(main())
