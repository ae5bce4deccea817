"""Host-level copy contention: copies of different GPUs of one host in flight at once (issue 12).

Offload is paid per host: with data parallelism every GPU of a node copies its gradients to
host memory and its parameters back at the same moments, through the same host memory and
PCIe root complexes. :mod:`tracekit.analyze.sections.contention` looks at one device; this module looks
across the devices of a host.

Definitions (per host; a *GPU* is one device of the host, ``gpu`` label; times ns, bytes,
GB/s = 1e9 B/s = bytes per ns; intervals half-open, touching copies are not concurrent):

- ``H(g)``, ``D(g)``: union of GPU g's H2D (D2H) host copies; ``A(g) = H(g) u D(g)``.
- **concurrent** time: points where ``A(g)`` holds for two or more GPUs (any direction);
  **h2d**: ``H(g)`` for two or more GPUs; **d2h**: ``D(g)`` for two or more GPUs; **mixed**: an
  H2D on one GPU and a D2H on another (``#H >= 1``, ``#D >= 1`` and ``#A >= 2``). The three
  kinds may overlap each other inside the concurrent time.
- A **window** is a maximal interval of concurrent time. Per window: its length, the h2d / d2h
  / mixed ns inside it, the GPUs with a copy in flight during it, and the bytes moved inside
  it per direction (each copy's bytes spread evenly over its duration); the iteration, phase
  and sub-phase of the copy that opened it (the latest copy of the host starting at or before
  the window's start), with its GPU.
- Per copy: ``concurrent_ns`` = its time inside windows (another GPU of the host had a copy in
  flight then). A copy is **concurrent** when more than half of its duration is, **alone**
  when no other host copy of the host (any GPU, this one included) overlaps it at all.
- **Bandwidth against the same size class alone**: per direction, host memory kind and size
  class (power-of-two bucket ``[2^k, 2^(k+1))`` bytes), median bytes/duration of the
  concurrent copies against the median of the alone copies of the same class (the nearest
  class with alone copies when that one has none: ``alone_bucket`` says which);
  ``slower_share`` = 1 - concurrent GB/s / alone GB/s (0.31 = 31 % slower).

One export holds the processes of one node (or of several, distinguished by the machine part
of ``globalPid``, :mod:`tracekit.analyze.model.rank_ids`). The per-rank exports of one run are put
on one clock (:mod:`tracekit.analyze.run_clock`) and their copies joined per host before the
functions below run on them (:mod:`tracekit.analyze.run_join`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.model.intervals import at_least, covered_length, spread_cumulative, union
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.transfer_common import host_copies_query

#: Columns of the copies frame the functions below take (:func:`copies_of_model`).
COPY_COLUMNS = ["host", "gpu", "global_pid", "device", "direction", "host_kind", "bytes", "start", "end",
                "iteration", "phase", "sub_phase"]

WINDOW_COLUMNS = ["host", "start", "end", "duration_ns", "h2d_ns", "d2h_ns", "mixed_ns", "gpus", "h2d_bytes",
                  "d2h_bytes", "gbps", "opener_gpu", "iteration", "phase", "sub_phase"]


def copies_of_model(model: PhaseModel, ranks: pl.DataFrame) -> pl.DataFrame:
    """The H2D/D2H copies of ``model`` with their ``host`` and ``gpu`` (the device id) from
    ``ranks`` (:func:`tracekit.analyze.model.rank_ids.distributed_ranks`): :data:`COPY_COLUMNS`."""
    # (the columns read, picked before the join gathers the rows)
    c = host_copies_query(model).select(*(k for k in COPY_COLUMNS if k not in ("host", "gpu"))).collect()
    c = c.join(ranks.select("global_pid", "device", "host"), on=["global_pid", "device"], how="inner")
    return c.with_columns(gpu=pl.col("device")).select(COPY_COLUMNS)


def _hosts(copies: pl.DataFrame):
    """``(host, its copies)`` per host, in order of first appearance (as a ``group_by`` keeping
    the order gives them); the frame itself, not a copy of its rows, when it holds one host."""
    h = copies["host"]
    if copies.height and h.null_count() == 0 and h.n_unique() == 1:
        yield h[0], copies
        return
    for (host,), c in copies.group_by(["host"], maintain_order=True):
        yield host, c


def _inside(us: np.ndarray, ue: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each time t, whether it lies in the sorted disjoint union (us, ue)."""
    if us.size == 0:
        return np.zeros(t.size, dtype=bool)
    i = np.searchsorted(us, t, side="right") - 1
    ok = i >= 0
    ii = np.maximum(i, 0)
    return ok & (t < ue[ii])


def _segments(c: pl.DataFrame):
    """Elementary segments of one host's copies: (starts, ends, nH, nD, nA, per-GPU any mask)."""
    gpus = sorted(set(c["gpu"].to_list()))
    unions = {}
    pts = []
    for g in gpus:
        cg = c.filter(pl.col("gpu") == g)
        for d in ("H2D", "D2H"):
            x = cg.filter(pl.col("direction") == d)
            u = union(x["start"].to_numpy(), x["end"].to_numpy())
            unions[(g, d)] = u
            pts += [u[0], u[1]]
    if not pts:
        e = np.empty(0, np.int64)
        return e, e, e, e, e, {}
    p = np.unique(np.concatenate(pts))
    s, e = p[:-1], p[1:]
    nh = np.zeros(s.size, np.int64)
    nd = np.zeros(s.size, np.int64)
    na = np.zeros(s.size, np.int64)
    anymask = {}
    for g in gpus:
        h = _inside(*unions[(g, "H2D")], s)
        d = _inside(*unions[(g, "D2H")], s)
        nh += h
        nd += d
        na += h | d
        anymask[g] = h | d
    return s, e, nh, nd, na, anymask


def host_windows(copies: pl.DataFrame) -> pl.DataFrame:
    """Windows of concurrent copies of different GPUs per host (see module doc).

    ``copies``: :data:`COPY_COLUMNS`. Returns :data:`WINDOW_COLUMNS`: ``host``, ``start``,
    ``end``, ``duration_ns``, ``h2d_ns``, ``d2h_ns``, ``mixed_ns`` (ns of each kind inside the
    window), ``gpus`` (list of GPU labels with a copy in flight during it), ``h2d_bytes``,
    ``d2h_bytes`` (Float64, bytes moved inside), ``gbps`` (both directions / duration),
    ``opener_gpu``, ``iteration``, ``phase``, ``sub_phase`` (of the opening copy). Sorted by
    host, start.
    """
    out = []
    for host, c in _hosts(copies):
        if c["gpu"].n_unique() < 2:  # copies of one GPU only: never two GPUs in flight, no window
            continue
        s, e, nh, nd, na, anymask = _segments(c)
        conc = na >= 2
        if not conc.any():
            continue
        ws, we = union(s[conc], e[conc])
        # per window sums over its elementary segments
        idx = np.searchsorted(ws, s, side="right") - 1
        inwin = conc & (idx >= 0)
        length = e - s

        def per_window(mask):
            acc = np.zeros(ws.size, np.int64)
            np.add.at(acc, idx[inwin & mask], length[inwin & mask])
            return acc

        h2d_ns = per_window(nh >= 2)
        d2h_ns = per_window(nd >= 2)
        mixed_ns = per_window((nh >= 1) & (nd >= 1) & (na >= 2))
        gpus = [[] for _ in range(ws.size)]
        for g, m in anymask.items():
            hit = np.zeros(ws.size, bool)
            hit[idx[inwin & m]] = True
            for w in np.flatnonzero(hit):
                gpus[w].append(int(g))
        cols = {}
        for d in ("H2D", "D2H"):
            x = c.filter(pl.col("direction") == d)
            xs, xe, xb = x["start"].to_numpy(), x["end"].to_numpy(), x["bytes"].to_numpy()
            cols[f"{d.lower()}_bytes"] = spread_cumulative(xs, xe, xb, we) - spread_cumulative(xs, xe, xb, ws)
        w = pl.DataFrame({
            "host": host, "start": ws.astype(np.int64), "end": we.astype(np.int64),
            "h2d_ns": h2d_ns, "d2h_ns": d2h_ns, "mixed_ns": mixed_ns,
            "gpus": pl.Series(gpus, dtype=pl.List(pl.Int64)),
            "h2d_bytes": cols["h2d_bytes"], "d2h_bytes": cols["d2h_bytes"],
        })
        opener = c.select(o_start="start", opener_gpu="gpu", iteration="iteration", phase="phase",
                          sub_phase="sub_phase").sort("o_start")
        w = w.sort("start").join_asof(opener, left_on="start", right_on="o_start", strategy="backward",
                                      check_sortedness=False).drop("o_start")
        out.append(w)
    if not out:
        return pl.DataFrame(schema=_window_schema())
    w = pl.concat(out).with_columns(duration_ns=pl.col("end") - pl.col("start"))
    w = w.with_columns(gbps=(pl.col("h2d_bytes") + pl.col("d2h_bytes")) / pl.col("duration_ns"))
    return w.cast(_window_schema()).select(WINDOW_COLUMNS).sort("host", "start")


def _window_schema() -> dict:
    return {"host": pl.String, "start": pl.Int64, "end": pl.Int64, "duration_ns": pl.Int64, "h2d_ns": pl.Int64,
            "d2h_ns": pl.Int64, "mixed_ns": pl.Int64, "gpus": pl.List(pl.Int64), "h2d_bytes": pl.Float64,
            "d2h_bytes": pl.Float64, "gbps": pl.Float64, "opener_gpu": pl.Int64, "iteration": pl.Int64,
            "phase": pl.String, "sub_phase": pl.String}


def copy_concurrency(copies: pl.DataFrame, windows: pl.DataFrame | None = None) -> pl.DataFrame:
    """``copies`` with ``duration_ns``, ``gbps`` (bytes / duration, null for 0 ns),
    ``bucket`` (floor(log2 bytes), -1 for 0 bytes), ``concurrent_ns`` (time inside the host's
    windows), ``shared_ns`` (time any other host copy of the host, same GPU included, was in
    flight), ``concurrent`` (bool: concurrent_ns > duration / 2) and ``alone`` (bool:
    shared_ns == 0)."""
    w = windows if windows is not None else host_windows(copies)
    parts = []
    for host, c in _hosts(copies):
        wh = w.filter(pl.col("host") == host)
        s, e = c["start"].to_numpy(), c["end"].to_numpy()
        conc = covered_length(wh["start"].to_numpy(), wh["end"].to_numpy(), s, e)
        shared = covered_length(*at_least(s, e, 2), s, e)
        parts.append(c.with_columns(concurrent_ns=pl.Series(conc, dtype=pl.Int64),
                                    shared_ns=pl.Series(shared, dtype=pl.Int64)))
    if not parts:
        c = copies.with_columns(concurrent_ns=pl.lit(0, pl.Int64), shared_ns=pl.lit(0, pl.Int64))
    else:
        c = pl.concat(parts)
    c = c.with_columns(duration_ns=pl.col("end") - pl.col("start"))
    return c.with_columns(
        gbps=pl.when(pl.col("duration_ns") > 0).then(pl.col("bytes") / pl.col("duration_ns")).otherwise(None),
        bucket=pl.when(pl.col("bytes") > 0).then(pl.col("bytes").log(2).floor().cast(pl.Int64)).otherwise(-1),
        concurrent=(2 * pl.col("concurrent_ns")) > pl.col("duration_ns"),
        alone=pl.col("shared_ns") == 0,
    )


def bandwidth_vs_alone(copies: pl.DataFrame, concurrency: pl.DataFrame | None = None) -> pl.DataFrame:
    """Concurrent copies' GB/s against alone copies of the same size class, per host.

    Columns: ``host, direction, host_kind, bucket`` (size class: [2^bucket, 2^(bucket+1))
    bytes), ``copies`` (concurrent copies of the class), ``bytes``, ``concurrent_ns`` (their
    summed time inside windows), ``gbps`` (median bytes/duration of those copies),
    ``alone_bucket`` (the class the baseline comes from: the same, else the nearest with alone
    copies of that direction and host kind; null when none), ``alone_copies``, ``alone_gbps``
    (median), ``slower_share`` = 1 - gbps / alone_gbps, ``alone_bytes`` and ``alone_ns`` (the
    baseline's bytes and summed copy durations: the sample its GB/s rests on, for
    :func:`tracekit.analyze.significance.differs`). Only classes with concurrent copies.
    """
    c = concurrency if concurrency is not None else copy_concurrency(copies)
    c = c.filter(pl.col("duration_ns") > 0)
    keys = ["host", "direction", "host_kind"]
    conc = c.filter(pl.col("concurrent")).group_by(*keys, "bucket").agg(
        copies=pl.len().cast(pl.Int64), bytes=pl.col("bytes").sum(), concurrent_ns=pl.col("concurrent_ns").sum(),
        gbps=pl.col("gbps").median())
    alone = c.filter(pl.col("alone")).group_by(*keys, "bucket").agg(
        alone_copies=pl.len().cast(pl.Int64), alone_gbps=pl.col("gbps").median(),
        alone_bytes=pl.col("bytes").sum(), alone_ns=pl.col("duration_ns").sum())
    rows = []
    for r in conc.iter_rows(named=True):
        a = alone.filter((pl.col("host") == r["host"]) & (pl.col("direction") == r["direction"])
                         & (pl.col("host_kind").eq_missing(r["host_kind"])))
        best = None
        if a.height:
            a = a.with_columns(dist=(pl.col("bucket") - r["bucket"]).abs()).sort("dist", "bucket", descending=[False, True])
            best = a.row(0, named=True)
        rows.append({**r, "alone_bucket": best["bucket"] if best else None,
                     "alone_copies": best["alone_copies"] if best else 0,
                     "alone_gbps": best["alone_gbps"] if best else None,
                     "alone_bytes": best["alone_bytes"] if best else 0, "alone_ns": best["alone_ns"] if best else 0})
    schema = {"host": pl.String, "direction": pl.String, "host_kind": pl.String, "bucket": pl.Int64,
              "copies": pl.Int64, "bytes": pl.Int64, "concurrent_ns": pl.Int64, "gbps": pl.Float64,
              "alone_bucket": pl.Int64, "alone_copies": pl.Int64, "alone_gbps": pl.Float64,
              "alone_bytes": pl.Int64, "alone_ns": pl.Int64}
    order = [k for k in schema if k not in ("alone_bytes", "alone_ns")] + ["slower_share", "alone_bytes", "alone_ns"]
    if not rows:
        return pl.DataFrame(schema=schema).with_columns(slower_share=pl.lit(None, pl.Float64)).select(order)
    out = pl.DataFrame(rows, schema=schema)
    out = out.with_columns(slower_share=pl.when(pl.col("alone_gbps") > 0)
                           .then(1 - pl.col("gbps") / pl.col("alone_gbps")).otherwise(None)).select(order)
    return out.sort("host", "direction", "host_kind", "bucket")


def host_summary(copies: pl.DataFrame, windows: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per host with host copies: ``host``, ``gpus`` (list of GPU labels with host
    copies), ``windows`` (count), ``concurrent_ns``, ``h2d_ns``, ``d2h_ns``, ``mixed_ns``
    (totals over the trace, ns), ``h2d_bytes``, ``d2h_bytes`` (moved inside windows, totals),
    ``copy_busy_ns`` (union of all host copies of the host), ``concurrent_share`` =
    concurrent_ns / copy_busy_ns."""
    w = windows if windows is not None else host_windows(copies)
    rows = []
    for host, c in _hosts(copies):
        wh = w.filter(pl.col("host") == host)
        rows.append({
            "host": host, "gpus": sorted(set(int(g) for g in c["gpu"].to_list())), "windows": wh.height,
            "concurrent_ns": int(wh["duration_ns"].sum()), "h2d_ns": int(wh["h2d_ns"].sum()),
            "d2h_ns": int(wh["d2h_ns"].sum()), "mixed_ns": int(wh["mixed_ns"].sum()),
            "h2d_bytes": float(wh["h2d_bytes"].sum()), "d2h_bytes": float(wh["d2h_bytes"].sum()),
            "copy_busy_ns": int((lambda u: (u[1] - u[0]).sum())(union(c["start"].to_numpy(), c["end"].to_numpy()))),
        })
    schema = {"host": pl.String, "gpus": pl.List(pl.Int64), "windows": pl.Int64, "concurrent_ns": pl.Int64,
              "h2d_ns": pl.Int64, "d2h_ns": pl.Int64, "mixed_ns": pl.Int64, "h2d_bytes": pl.Float64,
              "d2h_bytes": pl.Float64, "copy_busy_ns": pl.Int64}
    out = pl.DataFrame(rows, schema=schema)
    return out.with_columns(concurrent_share=pl.when(pl.col("copy_busy_ns") > 0)
                            .then(pl.col("concurrent_ns") / pl.col("copy_busy_ns")).otherwise(None)).sort("host")


def phase_summary(windows: pl.DataFrame) -> pl.DataFrame:
    """Windows per host, iteration and phase of their opening copy: ``host, iteration, phase,
    windows, concurrent_ns, h2d_ns, d2h_ns, mixed_ns, h2d_bytes, d2h_bytes`` (sums, ns and
    bytes); null iteration = outside iterations."""
    return windows.group_by("host", "iteration", "phase").agg(
        windows=pl.len().cast(pl.Int64), concurrent_ns=pl.col("duration_ns").sum(), h2d_ns=pl.col("h2d_ns").sum(),
        d2h_ns=pl.col("d2h_ns").sum(), mixed_ns=pl.col("mixed_ns").sum(), h2d_bytes=pl.col("h2d_bytes").sum(),
        d2h_bytes=pl.col("d2h_bytes").sum(),
    ).sort("host", pl.col("iteration").fill_null(-1), "phase")


def analyze_host_contention(copies: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """All frames of this module for ``copies`` (:data:`COPY_COLUMNS`): ``host_summary``,
    ``host_windows``, ``host_phase``, ``host_bandwidth``, ``host_copies`` (per copy)."""
    w = host_windows(copies)
    conc = copy_concurrency(copies, w)
    return {
        "host_summary": host_summary(copies, w),
        "host_windows": w,
        "host_phase": phase_summary(w),
        "host_bandwidth": bandwidth_vs_alone(copies, conc),
        "host_copies": conc,
    }
