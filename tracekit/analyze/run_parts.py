"""What one export of a many-exports run contributes to the run seen as one job (issue 24).

``tracekit analyze a.sqlite b.sqlite ...`` analyzes every export on its own (a worker
process or a Dask worker each) and, when the exports are one run
(:mod:`tracekit.analyze.run_groups`), joins their ranks (:mod:`tracekit.analyze.run_join`).
The join does not need the exports' whole results: each worker sends back the **run part**
of its export (:func:`run_part`), the few frames the cross-export numbers are computed from:

- ``ranks``: :func:`tracekit.analyze.model.rank_ids.distributed_ranks` (``global_pid, pid,
  device, host_id, host, rank, local_rank, world, source``);
- ``collectives``: the communication kernels,
  :data:`tracekit.analyze.sections.waiting_ranks.KERNEL_COLUMNS` (ns, the export's clock);
- ``copies``: the H2D/D2H host copies,
  :data:`tracekit.analyze.sections.host_contention.COPY_COLUMNS` (ns, bytes);
- ``table``: per (global_pid, device, iteration, phase) the reasons' metrics of
  :func:`tracekit.analyze.sections.waiting_ranks.slowest_ranks`: :data:`TABLE_COLUMNS` (ns,
  bytes);
- ``clock``: ``{"utc_start_ns": int | None, "host": str | None}``: the capture's start in UTC ns
  (``TARGET_INFO_SESSION_START_TIME.utcEpochNs``) and the export's host name
  (``TARGET_INFO_SYSTEM_ENV`` ``Hostname``), read by :mod:`tracekit.analyze.run_clock`.

Its size grows with the communication kernels and host copies of the export, not with its
other operations; it is kept in the export's cache beside its result
(:mod:`tracekit.analyze.trace.cache`), so that a second run of the folder builds no phase model.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

#: Columns of the ``table`` frame of a run part.
TABLE_COLUMNS = ["global_pid", "device", "iteration", "phase", "gpu_idle_ns", "kernel_busy_ns", "h2d_bytes",
                 "d2h_bytes", "h2d_busy_ns", "d2h_busy_ns"]

#: The frames of a run part, by name.
FRAMES = ("ranks", "collectives", "copies", "table")


def clock_info(path: str | Path) -> dict:
    """``{"utc_start_ns": int | None, "host": str | None}`` of the export at ``path`` (see
    module doc); what cannot be read is None (never raises)."""
    out = {"utc_start_ns": None, "host": None}
    try:
        con = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    except sqlite3.Error:
        return out
    try:
        for key, sql in (("utc_start_ns", "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1"),
                         ("host", "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1")):
            try:
                row = con.execute(sql).fetchone()
            except sqlite3.Error:
                continue
            if row and row[0] is not None:
                out[key] = int(row[0]) if key == "utc_start_ns" else str(row[0])
    finally:
        con.close()
    return out


def _cache_key(result_key: str, name: str) -> str:
    return hashlib.sha1(f"run-part\0{name}\0{result_key}".encode()).hexdigest()


def _compute(analysis) -> dict:
    """The frames of the run part from the analysis (its model, built when it was read from
    the cache)."""
    from tracekit.analyze.model import rank_ids
    from tracekit.analyze.sections import host_contention, waiting_ranks

    tr = analysis._parts.get("transfers")
    mg = getattr(tr, "multi_gpu", None) or {}
    model = analysis.model
    ranks = mg.get("rank_ids")
    if ranks is None:
        with analysis._export() as export:
            ranks = rank_ids.distributed_ranks(export, model)
    if "host_copies" in mg:
        copies = mg["host_copies"].select(host_contention.COPY_COLUMNS)
    else:
        copies = host_contention.copies_of_model(model, ranks)
    if "collectives" in mg:
        coll = mg["collectives"].select(waiting_ranks.KERNEL_COLUMNS)
    else:
        coll = waiting_ranks.comm_kernels(model, ranks)
    table = analysis.part("table").select(TABLE_COLUMNS)
    return {"ranks": ranks, "collectives": coll, "copies": copies, "table": table}


def run_part(analysis) -> dict:
    """The run part of one analyzed export (see module doc): ``{"trace": str, "clock": dict,
    "ranks", "collectives", "copies", "table": polars frames}``. ``analysis``: a
    :class:`tracekit.analysis.Analysis`. Read from (and stored in) the export's cache when
    caching is on."""
    from tracekit.analyze.trace.cache import open_trace_cache

    tc = open_trace_cache(analysis.path, analysis.options.cache)
    frames = None
    if tc is not None:
        rkey = tc.result_key(analysis.options.key(), str(analysis.path))  # the result's key
        got = {n: tc.get_frame(_cache_key(rkey, n)) for n in FRAMES}
        if all(f is not None for f in got.values()):
            frames = got
    if frames is None:
        frames = _compute(analysis)
        if tc is not None:
            for n, f in frames.items():
                tc.put_frame(_cache_key(rkey, n), f)
    return {"trace": str(analysis.path), "clock": clock_info(analysis.path), **frames}
