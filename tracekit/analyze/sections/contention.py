"""PCIe contention windows on one device (issue 4).

A contention window is a maximal interval where, on one rank's device,

- kind ``same-direction``: two or more copies of the same direction (H2D or D2H) are in
  flight (``direction`` says which), or
- kind ``bidirectional``: H2D and D2H copies are both in flight (``direction`` = ``both``).

For each window: ``bytes`` moved per direction (each copy's bytes spread evenly over its
duration, the part inside the window), effective GB/s (bytes / window duration), the phase,
iteration and sub-phase of the copy whose start opened the window, and ``slowdown``: the
time the copies actually spent in the window (sum over copies of their time inside it)
divided by the time the same bytes would take at the *uncontended bandwidth* of their
direction and host memory kind — the median of bytes/duration over the trace's copies of
that direction and kind that never ran alongside another H2D/D2H copy of their device
(:func:`uncontended_bandwidth`). 2.0 means its copies ran at half their uncontended speed.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.model.intervals import at_least, covered_length, intersect, spread_cumulative, union
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.transfer_common import (
    PHASE_KEYS,
    RANK,
    check_by,
    group_codes,
    host_copies,
    ratio,
    sort_groups,
)

WINDOW_COLUMNS = [
    "global_pid", "device", "kind", "direction", "start", "end", "duration_ns",
    "h2d_bytes", "d2h_bytes", "h2d_gbps", "d2h_gbps", "gbps", "copy_ns", "expected_ns", "slowdown",
    "iteration", "phase", "micro_step", "boundary", "sub_phase",
]


def contended_time(model: PhaseModel) -> pl.DataFrame:
    """Host copies (:func:`~tracekit.analyze.sections.transfer_common.host_copies`) with
    ``contended_ns``: how long another H2D/D2H copy of the same device was in flight during it.
    (Measured rank by rank on the copies' times only: the copies' other columns are not copied.)"""
    c = host_copies(model)
    start, end = c["start"].to_numpy(), c["end"].to_numpy()
    ns = np.zeros(c.height, np.int64)
    ranks, code = group_codes(c, RANK)
    for i in range(ranks.height):
        rows = slice(None) if ranks.height == 1 else np.flatnonzero(code == i)
        s, e = start[rows], end[rows]
        ns[rows] = covered_length(*at_least(s, e, 2), s, e)
    return c.with_columns(contended_ns=pl.Series(ns, dtype=pl.Int64))


def uncontended_bandwidth(model: PhaseModel, copies: pl.DataFrame | None = None) -> pl.DataFrame:
    """Median GB/s of uncontended copies per ``direction, host_kind`` over the whole trace.

    Columns: ``direction, host_kind, copies`` (uncontended copies with a duration),
    ``median_gbps``. A copy is uncontended when no other H2D/D2H copy of its device overlaps
    it (``contended_ns == 0`` in :func:`contended_time`).
    """
    c = copies if copies is not None else contended_time(model)
    # (one lazy aggregation with the filter inside: no copy of the copies' rows)
    ok = (pl.col("contended_ns") == 0) & (pl.col("duration_ns") > 0)
    return c.lazy().group_by("direction", "host_kind").agg(
        copies=ok.sum().cast(pl.Int64), median_gbps=pl.col("gbps").filter(ok).median()
    ).filter(pl.col("copies") > 0).sort("direction", "host_kind").collect()


def contention_windows(model: PhaseModel) -> pl.DataFrame:
    """All contention windows of the trace, one row each (see module doc).

    Columns: ``global_pid, device, kind`` (same-direction | bidirectional), ``direction``
    (H2D | D2H | both), ``start, end, duration_ns`` (ns), ``h2d_bytes, d2h_bytes`` (Float64,
    bytes moved inside the window), ``h2d_gbps, d2h_gbps, gbps`` (per direction and total,
    bytes / duration), ``copy_ns`` (summed in-window time of the copies), ``expected_ns``
    (same bytes at uncontended bandwidth; null when no uncontended copy of that
    direction/kind exists), ``slowdown`` (copy_ns / expected_ns), ``iteration, phase,
    micro_step, boundary, sub_phase`` of the copy that opened the window. Sorted by rank, start.
    """
    c = contended_time(model)
    base = uncontended_bandwidth(model, c)
    # the copies' columns read below as numpy arrays, a rank's rows picked by position (no copy
    # of the copies' frame per rank and direction)
    ranks, code = group_codes(c, RANK)
    start, end = c["start"].to_numpy(), c["end"].to_numpy()
    is_dir = {d: (c["direction"] == d).to_numpy() for d in ("H2D", "D2H")}
    mine = [slice(None) if ranks.height == 1 else np.flatnonzero(code == i) for i in range(ranks.height)]
    del code
    rows = []
    for (gpid, dev), r in zip(ranks.iter_rows(), mine):
        sets = {}
        for d in ("H2D", "D2H"):
            sel = is_dir[d][r]
            sets[d] = (start[r][sel], end[r][sel])
            ws, we = at_least(*sets[d], 2)
            if ws.size:
                rows.append(pl.DataFrame({"kind": "same-direction", "direction": d, "start": ws, "end": we}).with_columns(
                    global_pid=pl.lit(gpid, pl.Int64), device=pl.lit(dev, pl.Int64)))
        ws, we = intersect(union(*sets["H2D"]), union(*sets["D2H"]))
        if ws.size:
            rows.append(pl.DataFrame({"kind": "bidirectional", "direction": "both", "start": ws, "end": we}).with_columns(
                global_pid=pl.lit(gpid, pl.Int64), device=pl.lit(dev, pl.Int64)))
    if not rows:
        return pl.DataFrame(schema={k: v for k, v in _schema().items()})
    w = pl.concat(rows).cast({"start": pl.Int64, "end": pl.Int64})
    expected = c.select("direction", "host_kind", "bytes").join(
        base.select("direction", "host_kind", "median_gbps"), on=["direction", "host_kind"], how="left",
        maintain_order="left").select(pl.col("bytes") / pl.col("median_gbps")).to_series().to_numpy()
    nbytes, duration = c["bytes"].to_numpy(), c["duration_ns"].to_numpy()
    where = {rank: r for rank, r in zip(ranks.iter_rows(), mine)}
    out = []
    for (gpid, dev), wg in w.group_by(RANK):
        r = where[(gpid, dev)]
        s, e = wg["start"].to_numpy(), wg["end"].to_numpy()
        cols = {}
        copy_ns = np.zeros(s.size)
        expected_ns = np.zeros(s.size)
        missing = np.zeros(s.size, dtype=bool)
        for d in ("H2D", "D2H"):
            sel = is_dir[d][r]
            gs, ge = start[r][sel], end[r][sel]
            def between(amount):
                return spread_cumulative(gs, ge, amount, e) - spread_cumulative(gs, ge, amount, s)
            cols[f"{d.lower()}_bytes"] = between(nbytes[r][sel])
            copy_ns += between(duration[r][sel])
            exp = expected[r][sel]
            known = np.isfinite(exp.astype(np.float64))
            expected_ns += between(np.where(known, exp, 0.0))
            missing |= between((~known).astype(np.float64)) > 0
        wg = wg.with_columns(
            **{k: pl.Series(v) for k, v in cols.items()},
            copy_ns=pl.Series(copy_ns),
            expected_ns=pl.Series(np.where(missing, np.nan, expected_ns)).fill_nan(None),
        )
        out.append(wg)
    w = pl.concat(out).with_columns(duration_ns=pl.col("end") - pl.col("start"))
    w = w.with_columns(
        h2d_gbps=pl.col("h2d_bytes") / pl.col("duration_ns"),
        d2h_gbps=pl.col("d2h_bytes") / pl.col("duration_ns"),
        gbps=(pl.col("h2d_bytes") + pl.col("d2h_bytes")) / pl.col("duration_ns"),
        slowdown=ratio("copy_ns", "expected_ns"),
    )
    # the copy that opened the window: the last relevant copy starting at or before its start
    opener = c.select(*RANK, "direction", o_start="start", iteration="iteration", phase="phase",
                      micro_step="micro_step", boundary="boundary", sub_phase="sub_phase").sort("o_start")
    parts = []
    for kind, cond in (("H2D", pl.col("direction") == "H2D"), ("D2H", pl.col("direction") == "D2H"),
                       ("both", pl.lit(True))):
        ww = w.filter(pl.col("direction") == kind).sort("start")
        op = opener.filter(cond).drop("direction")
        parts.append(ww.join_asof(op, left_on="start", right_on="o_start", by=RANK, strategy="backward",
                                  check_sortedness=False))
    w = pl.concat(parts)
    return w.sort([*RANK, "start", "kind", "end"]).select(WINDOW_COLUMNS)


def _schema() -> dict:
    s = {c: pl.Float64 for c in WINDOW_COLUMNS}
    s.update({"global_pid": pl.Int64, "device": pl.Int64, "kind": pl.String, "direction": pl.String,
              "start": pl.Int64, "end": pl.Int64, "duration_ns": pl.Int64, "iteration": pl.Int64,
              "phase": pl.String, "micro_step": pl.Int64, "boundary": pl.Boolean, "sub_phase": pl.String})
    return s


def contention_summary(model: PhaseModel, by=PHASE_KEYS, windows: pl.DataFrame | None = None) -> pl.DataFrame:
    """Contention per rank and group ``by`` (windows grouped by the copy that opened them).

    Columns: ``global_pid, device``, the ``by`` columns, ``copy_busy_ns`` (union of the group's
    H2D/D2H copies), ``windows`` (count), ``same_direction_ns``, ``bidirectional_ns`` (summed
    window durations per kind), ``contention_ns`` (union of all its windows),
    ``contention_share`` = contention_ns / copy_busy_ns, ``median_slowdown`` (of its windows).
    Every group with H2D/D2H copies has a row (zeros when uncontended).
    """
    by = check_by(by)
    keys = [*RANK, *by]
    w = windows if windows is not None else contention_windows(model)
    c = host_copies(model)
    from tracekit.analyze.model.intervals import grouped_union, grouped_union_lengths

    # (the groups numbered first: the copies' times only go through the sort)
    groups, code = group_codes(c, keys)
    g, length = grouped_union_lengths(code, c["start"].to_numpy(), c["end"].to_numpy())
    busy = groups.with_columns(_g=pl.int_range(pl.len(), dtype=pl.Int64)).join(
        pl.DataFrame({"_g": g, "copy_busy_ns": length}), on="_g").drop("_g")
    if w.height:
        agg = w.group_by(keys).agg(
            windows=pl.len().cast(pl.Int64),
            same_direction_ns=pl.col("duration_ns").filter(pl.col("kind") == "same-direction").sum(),
            bidirectional_ns=pl.col("duration_ns").filter(pl.col("kind") == "bidirectional").sum(),
            median_slowdown=pl.col("slowdown").median(),
        )
        cu = grouped_union(w, keys).group_by(keys).agg(contention_ns=(pl.col("end") - pl.col("start")).sum())
        agg = agg.join(cu, on=keys, how="left", nulls_equal=True)
        out = busy.join(agg, on=keys, how="full", coalesce=True, nulls_equal=True)
    else:
        out = busy.with_columns(windows=pl.lit(0, pl.Int64), same_direction_ns=pl.lit(0, pl.Int64),
                                bidirectional_ns=pl.lit(0, pl.Int64), median_slowdown=pl.lit(None, pl.Float64),
                                contention_ns=pl.lit(0, pl.Int64))
    ints = ["copy_busy_ns", "windows", "same_direction_ns", "bidirectional_ns", "contention_ns"]
    out = out.with_columns(**{k: pl.col(k).fill_null(0).cast(pl.Int64) for k in ints})
    out = out.with_columns(contention_share=ratio("contention_ns", "copy_busy_ns"))
    return sort_groups(out, by).select(*keys, "copy_busy_ns", "windows", "same_direction_ns",
                                                   "bidirectional_ns", "contention_ns", "contention_share",
                                                   "median_slowdown")
