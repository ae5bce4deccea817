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
from tracekit.analyze.sections.transfer_common import PHASE_KEYS, RANK, check_by, host_copies, ratio, sort_groups

WINDOW_COLUMNS = [
    "global_pid", "device", "kind", "direction", "start", "end", "duration_ns",
    "h2d_bytes", "d2h_bytes", "h2d_gbps", "d2h_gbps", "gbps", "copy_ns", "expected_ns", "slowdown",
    "iteration", "phase", "micro_step", "boundary", "sub_phase",
]


def contended_time(model: PhaseModel) -> pl.DataFrame:
    """Host copies (:func:`~tracekit.analyze.sections.transfer_common.host_copies`) with
    ``contended_ns``: how long another H2D/D2H copy of the same device was in flight during it."""
    c = host_copies(model).with_row_index("_row")
    parts = []
    for _, g in c.group_by(RANK):
        s, e = g["start"].to_numpy(), g["end"].to_numpy()
        busy2 = at_least(s, e, 2)
        parts.append(g.with_columns(contended_ns=pl.Series(covered_length(*busy2, s, e), dtype=pl.Int64)))
    if not parts:
        return c.with_columns(contended_ns=pl.lit(0, pl.Int64)).drop("_row")
    return pl.concat(parts).sort("_row").drop("_row")


def uncontended_bandwidth(model: PhaseModel, copies: pl.DataFrame | None = None) -> pl.DataFrame:
    """Median GB/s of uncontended copies per ``direction, host_kind`` over the whole trace.

    Columns: ``direction, host_kind, copies`` (uncontended copies with a duration),
    ``median_gbps``. A copy is uncontended when no other H2D/D2H copy of its device overlaps
    it (``contended_ns == 0`` in :func:`contended_time`).
    """
    c = copies if copies is not None else contended_time(model)
    u = c.filter((pl.col("contended_ns") == 0) & (pl.col("duration_ns") > 0))
    return u.group_by("direction", "host_kind").agg(
        copies=pl.len().cast(pl.Int64), median_gbps=pl.col("gbps").median()
    ).sort("direction", "host_kind")


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
    c = c.join(base.select("direction", "host_kind", "median_gbps"), on=["direction", "host_kind"], how="left")
    c = c.with_columns(expected=pl.col("bytes") / pl.col("median_gbps"))
    rows = []
    for (gpid, dev), g in c.group_by(RANK):
        sets = {}
        for d in ("H2D", "D2H"):
            gd = g.filter(pl.col("direction") == d)
            sets[d] = (gd["start"].to_numpy(), gd["end"].to_numpy())
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
    out = []
    for (gpid, dev), wg in w.group_by(RANK):
        g = c.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev))
        s, e = wg["start"].to_numpy(), wg["end"].to_numpy()
        cols = {}
        copy_ns = np.zeros(s.size)
        expected = np.zeros(s.size)
        missing = np.zeros(s.size, dtype=bool)
        for d in ("H2D", "D2H"):
            gd = g.filter(pl.col("direction") == d)
            gs, ge = gd["start"].to_numpy(), gd["end"].to_numpy()
            def between(amount):
                return spread_cumulative(gs, ge, amount, e) - spread_cumulative(gs, ge, amount, s)
            cols[f"{d.lower()}_bytes"] = between(gd["bytes"].to_numpy())
            copy_ns += between(gd["duration_ns"].to_numpy())
            exp = gd["expected"].to_numpy()
            known = np.isfinite(exp.astype(np.float64))
            expected += between(np.where(known, exp, 0.0))
            missing |= between((~known).astype(np.float64)) > 0
        wg = wg.with_columns(
            **{k: pl.Series(v) for k, v in cols.items()},
            copy_ns=pl.Series(copy_ns),
            expected_ns=pl.Series(np.where(missing, np.nan, expected)).fill_nan(None),
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
    from tracekit.analyze.model.intervals import grouped_union

    busy = grouped_union(c, keys).group_by(keys).agg(copy_busy_ns=(pl.col("end") - pl.col("start")).sum())
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
