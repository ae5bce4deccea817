"""Per rank, iteration and phase: wall time, GPU busy time, copy bytes and busy time.

Definitions (units: ns, bytes; GB/s = 1e9 B/s, which is bytes per ns):

- ``wall_ns``: length of the phase's NVTX window(s); ``other`` inside an iteration sums the
  gaps between its phase windows.
- ``kernel_busy_ns``: length of the union of the GPU intervals of the compute kernels
  *attributed* to the phase (launched inside it, see :mod:`tracekit.analyze.model.phases`), on the
  rank's device; ``comm_busy_ns`` / ``comm_count``: the same for communication kernels (NCCL
  and the like, :mod:`tracekit.analyze.model.communication`), which ``kernel_busy_ns`` leaves out.
- ``h2d_bytes`` / ``h2d_busy_ns`` / ``h2d_count`` (and ``d2h_*``): bytes, union length and
  count of the attributed host-to-device (device-to-host) memcpys; ``h2d_gbps`` =
  bytes / busy ns.
- ``memset_bytes``: bytes of attributed memsets.
- ``gpu_idle_ns``: time inside the window(s) in which no kernel, memcpy or memset of the rank
  was executing on the device (whatever launched it); ``gpu_idle_share`` = idle / wall. Inside
  ``update`` this is the CPU-bound time (e.g. the CPU Adam step). Communication kernels do not
  count as activity (a rank waiting in a collective is idle for the model).

A rank is one (process, device) pair with GPU work; ``pid`` is the OS process id.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyze.model.communication import comm_expr, kernel_frames
from tracekit.analyze.model.intervals import busy_in_windows, grouped_union_length
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.transfer_common import model_compute_ops, rank_rows
from tracekit.vocab import os_pid_expr as os_pid

#: Numeric keys of a phase row, in output order.
METRICS = [
    "wall_ns",
    "kernel_busy_ns",
    "kernel_count",
    "comm_busy_ns",
    "comm_count",
    "h2d_bytes",
    "h2d_busy_ns",
    "h2d_count",
    "d2h_bytes",
    "d2h_busy_ns",
    "d2h_count",
    "memset_bytes",
    "gpu_idle_ns",
]

KEYS = ["global_pid", "device", "iteration", "phase", "micro_step"]


def ranks(model: PhaseModel) -> pl.DataFrame:
    """Ranks of the trace: ``global_pid, pid, device`` for each process/device with GPU work,
    sorted by pid then device. Computed once per model and kept on it."""
    def compute() -> pl.DataFrame:
        r = model.scan_ops().select("global_pid", "device").unique().drop_nulls()
        return r.with_columns(pid=os_pid(pl.col("global_pid"))).sort("pid", "device").select(
            "global_pid", "pid", "device"
        ).collect()

    return model.derived("ranks", compute)


def rank_windows(model: PhaseModel) -> pl.DataFrame:
    """The windows of :attr:`PhaseModel.windows` once per rank: their columns plus ``device``."""
    return model.windows.join(ranks(model).select("global_pid", "device"), on="global_pid")


def window_metrics(model: PhaseModel) -> pl.DataFrame:
    """Metrics of every window of every rank: the window columns plus ``device`` and
    :data:`METRICS` (ns and bytes). Computed once per model and kept on it."""
    return model.derived("window_metrics", lambda: _window_metrics(model))


#: the busy times of :data:`METRICS` (union lengths), by the category code of :func:`_busy_category`
BUSY = ("kernel_busy_ns", "comm_busy_ns", "h2d_busy_ns", "d2h_busy_ns")


def _busy_category(has_comm: bool) -> pl.Expr:
    """Per op: the index in :data:`BUSY` of the busy time it counts in (compute kernels,
    communication kernels, H2D and D2H memcpys), null for the others (memsets, other copies)."""
    is_k = pl.col("kind") == "kernel"
    comm = comm_expr() if has_comm else pl.lit(False)
    memcpy = pl.col("kind") == "memcpy"
    return (pl.when(is_k & ~comm).then(0).when(is_k & comm).then(1)
            .when(memcpy & (pl.col("direction") == "H2D")).then(2)
            .when(memcpy & (pl.col("direction") == "D2H")).then(3)
            .otherwise(None).cast(pl.Int8))


def _union_lengths(ops: pl.LazyFrame, by: list[str]) -> pl.LazyFrame:
    """Per group of ``by``: ``busy_ns`` (Int64), the length in ns of the union of the [start, end)
    intervals of ``ops`` (empty ones ignored; no row for a group without any), as part of a lazy
    query: one aggregation per group, no window function. In start order, an interval opens a new merged piece when it starts
    after every earlier end (touching intervals merge); a piece ends at the running maximum of
    the ends just before the next piece opens, and the union is the sum of the pieces."""
    f = ops.select(*by, "start", "end").filter(pl.col("end") > pl.col("start"))
    # (sort_by, not gather(arg_sort): on an empty input polars 2.1 types the gather as null).
    # The order among equal starts does not matter: such an interval never opens a piece, and
    # the running end where the start value changes is the same in every such order
    s = pl.col("start").sort()
    run_end = pl.col("end").sort_by("start").cum_max()
    first = (s > run_end.shift(1)).fill_null(True)
    last = first.shift(-1).fill_null(True)
    return f.group_by(by).agg(busy_ns=(run_end.filter(last) - s.filter(first)).sum().cast(pl.Int64))


def _busy_of_windows(model: PhaseModel, pairs: pl.DataFrame) -> pl.DataFrame:
    """The four :data:`BUSY` union lengths of groups of windows: ``pairs`` (``window_id,
    device, _k``; each (window, device) in one group ``_k``) -> ``_k`` and the :data:`BUSY`
    columns (Int64 ns, 0 without such ops; one row per ``_k`` of ``pairs``), over the ops of
    each group's windows on its device.

    One category at a time, the ops' rows of that category carry only a (window, device) code
    and their times, numbered by group with a binary search in the sorted codes of ``pairs``,
    and their unions are measured per group in numpy
    (:func:`tracekit.analyze.model.intervals.grouped_union_lengths`): about a third of the
    transient memory of one polars aggregation of all categories (issue 24)."""
    import numpy as np

    from tracekit.analyze.model.intervals import grouped_union_lengths

    nk = int(pairs["_k"].max()) + 1 if pairs.height else 0
    busy = {label: np.zeros(nk, np.int64) for label in BUSY}
    p = pairs.filter(pl.col("window_id").is_not_null() & pl.col("device").is_not_null())
    if p.height:
        dmin, dmax = int(p["device"].min()), int(p["device"].max())
        width = dmax - dmin + 1
        code = (pl.col("window_id") * width + (pl.col("device") - dmin)).cast(pl.Int64)
        p = p.select(code=code, _k="_k").sort("code")
        pcode, pk = p["code"].to_numpy(), p["_k"].to_numpy()
        cat = _busy_category("comm" in model.ops_schema)
        for i, label in enumerate(BUSY):
            f = model.scan_ops().filter(
                pl.col("window_id").is_not_null() & pl.col("device").is_between(dmin, dmax) & (cat == i)
                & (pl.col("end") > pl.col("start"))
            ).select(code=code, start="start", end="end").collect()
            if not f.height:
                continue
            oc = f["code"].to_numpy()
            j = np.minimum(np.searchsorted(pcode, oc), len(pcode) - 1)
            hit = pcode[j] == oc
            del oc
            k = pk[j]
            s, e = f["start"].to_numpy(), f["end"].to_numpy()
            if not hit.all():
                k, s, e = k[hit], s[hit], e[hit]
            del f, j, hit
            g, length = grouped_union_lengths(k, s, e)
            busy[label][g] = length
    return pl.DataFrame({"_k": np.arange(nk, dtype=np.int64), **busy})


def _window_metrics(model: PhaseModel) -> pl.DataFrame:
    win = rank_windows(model)
    has_comm = "comm" in model.ops_schema
    # (the columns read below, picked first: the plan reads ``ops`` twice, and the shared part
    # would otherwise be gathered with every column of the ops)
    ops = model.scan_ops().select("window_id", "device", "kind", "bytes", "start", "end",
                                  cat=_busy_category(has_comm)).filter(pl.col("window_id").is_not_null())
    by = ["window_id", "device"]
    counts = ops.group_by(by).agg(
        kernel_count=(pl.col("cat") == 0).sum(),
        comm_count=(pl.col("cat") == 1).sum(),
        h2d_bytes=pl.col("bytes").filter(pl.col("cat") == 2).sum(),
        h2d_count=(pl.col("cat") == 2).sum(),
        d2h_bytes=pl.col("bytes").filter(pl.col("cat") == 3).sum(),
        d2h_count=(pl.col("cat") == 3).sum(),
        memset_bytes=pl.col("bytes").filter(pl.col("kind") == "memset").sum(),
    )
    win = win.with_columns(_k=pl.int_range(pl.len(), dtype=pl.Int64))
    busy = _busy_of_windows(model, win.select("window_id", "device", "_k"))
    out = win.lazy().join(counts, on=by, how="left").join(busy.lazy(), on="_k", how="left").drop("_k")
    out = out.with_columns(wall_ns=pl.col("end") - pl.col("start")).collect()
    win = win.drop("_k")
    # GPU idle: executing ops of the rank, whatever window launched them
    idle = []
    active = model_compute_ops(model)  # communication kernels are not activity
    for (gpid, dev), w in out.group_by(["global_pid", "device"]):
        o = rank_rows(active, gpid, dev, "start", "end")  # (two columns, no copy for one rank)
        busy = busy_in_windows(o["start"].to_numpy(), o["end"].to_numpy(), w["start"].to_numpy(), w["end"].to_numpy())
        idle.append(w.select("window_id", "device").with_columns(gpu_busy_ns=pl.Series(busy)))
    # no window (every phase range of the trace unusable): the column all the same, empty
    out = (out.join(pl.concat(idle), on=["window_id", "device"], how="left") if idle
           else out.with_columns(gpu_busy_ns=pl.lit(None, pl.Int64)))
    out = out.with_columns(gpu_idle_ns=pl.col("wall_ns") - pl.col("gpu_busy_ns").fill_null(0))
    fill = {m: pl.col(m).fill_null(0).cast(pl.Int64) for m in METRICS}
    return out.with_columns(**fill).drop("gpu_busy_ns").sort("global_pid", "device", "start").select(
        *win.columns, *[c for c in _WM_ORDER], "gpu_idle_ns")


#: the metric columns of :func:`window_metrics` after the window columns, in their order
_WM_ORDER = ("kernel_busy_ns", "kernel_count", "comm_busy_ns", "comm_count", "h2d_busy_ns", "h2d_bytes", "h2d_count",
             "d2h_busy_ns", "d2h_bytes", "d2h_count", "memset_bytes", "wall_ns")


def _aggregate(model: PhaseModel, wm: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Sum window metrics over ``by``, recomputing unions over the merged windows.

    A group of one window (of one device: ``by`` holds ``device``) keeps that window's busy
    times from ``wm``: the union over its ops is the window's own union (the same ops, those
    of that window and device). Only groups of several windows (``other`` merged per
    iteration, whole-trace phases) have their ops' unions computed again (issue 13)."""
    one = {b: pl.col(b).first() for b in BUSY}
    sums = wm.lazy().group_by(by).agg(
        start_ns=pl.col("start").min(),
        end_ns=pl.col("end").max(),
        wall_ns=pl.col("wall_ns").sum(),
        boundary=pl.col("boundary").any(),
        inferred=pl.col("inferred").any(),
        complete=pl.col("complete").all(),
        unclosed=pl.col("unclosed").any() if "unclosed" in wm.columns else pl.lit(False),
        windows=pl.len(),
        **{m: pl.col(m).sum() for m in METRICS if m not in ("wall_ns", *BUSY)},
        **{f"_one_{b}": v for b, v in one.items()},
    )
    # busy times of several windows: union over all ops of the group (kernels of two windows may overlap)
    keys = wm.filter(pl.len().over(by) > 1).select("window_id", *[b for b in by if b != "window_id"])
    groups = keys.select(by).unique().with_columns(_k=pl.int_range(pl.len(), dtype=pl.Int64))
    pairs = keys.join(groups, on=by, how="inner", nulls_equal=True).select("window_id", "device", "_k")
    busy = groups.join(_busy_of_windows(model, pairs), on="_k").drop("_k")
    out = sums.join(busy.lazy(), on=by, how="left", nulls_equal=True).with_columns(
        **{b: pl.col(b).fill_null(0) for b in BUSY})
    out = out.with_columns(**{b: pl.when(pl.col("windows") == 1).then(pl.col(f"_one_{b}")).otherwise(pl.col(b))
                              for b in BUSY})
    return out.drop([f"_one_{b}" for b in BUSY]).collect()


def phase_table(model: PhaseModel) -> pl.DataFrame:
    """One row per rank, iteration, phase and micro-step (``other`` merged per iteration).

    Columns: ``global_pid, pid, device, iteration, phase, micro_step, boundary, inferred,
    complete, unclosed, start_ns, end_ns, windows`` and :data:`METRICS`, plus ``gpu_idle_share``,
    ``h2d_gbps``, ``d2h_gbps``. Rows outside any iteration (start-up, tail) have a null
    iteration. ``complete`` is false for an iteration without an update or with a window whose
    NVTX range never closed; ``unclosed`` marks such a window (its wall time ends at the
    process's last activity, :func:`tracekit.analyze.model.phases.set_aside_unclosed`). Sorted by
    rank, then time. Computed once per model and kept on it (the result, the advice, the
    opportunities and the multi-GPU sections all read it).
    """
    return model.derived("phase_table", lambda: _finish(_aggregate(model, window_metrics(model), KEYS)).sort(
        "global_pid", "device", "start_ns"))


def totals(model: PhaseModel) -> pl.DataFrame:
    """Whole-trace totals per rank and phase: ``global_pid, pid, device, phase`` and the
    columns of :func:`phase_table` summed over all windows (``other`` includes start-up)."""
    wm = window_metrics(model)
    t = _aggregate(model, wm, ["global_pid", "device", "phase"])
    return _finish(t).sort("global_pid", "device", "phase")


def _finish(t: pl.DataFrame) -> pl.DataFrame:
    return t.with_columns(
        pid=os_pid(pl.col("global_pid")),
        gpu_idle_share=pl.when(pl.col("wall_ns") > 0).then(pl.col("gpu_idle_ns") / pl.col("wall_ns")).otherwise(None),
        h2d_gbps=pl.when(pl.col("h2d_busy_ns") > 0).then(pl.col("h2d_bytes") / pl.col("h2d_busy_ns")).otherwise(None),
        d2h_gbps=pl.when(pl.col("d2h_busy_ns") > 0).then(pl.col("d2h_bytes") / pl.col("d2h_busy_ns")).otherwise(None),
    )


def sub_phase_table(model: PhaseModel, phase: str) -> pl.DataFrame:
    """Break ``phase`` down by sub-phase (innermost NVTX range), per rank and iteration.

    For each window of ``phase`` that comes from an NVTX range, the time on the thread that
    pushed it is split into the *self time* of each range nested inside it (a range's own
    time minus its children's), so the sub-phases tile the window; time directly in the phase
    range is the sub-phase ``(none)``. Inferred windows are all ``(none)``.

    Columns: ``global_pid, pid, device, iteration, sub_phase, wall_ns`` (self time),
    ``gpu_busy_ns`` (some op of the rank executing during that self time), ``gpu_idle_ns``
    (wall minus busy: CPU-only time), ``kernel_busy_ns`` (compute kernels), ``comm_busy_ns``
    (communication kernels), ``h2d_bytes``, ``h2d_busy_ns``,
    ``h2d_count``, ``d2h_bytes``, ``d2h_busy_ns``, ``d2h_count``, ``h2d_gbps``, ``d2h_gbps`` of
    the ops attributed to that sub-phase (launched during it, on any thread).
    """
    wm = rank_windows(model).filter(pl.col("phase") == phase)
    segs = self_segments(model, wm)
    rows = []
    active = model_compute_ops(model)  # communication kernels are not activity
    for (gpid, dev), s in segs.group_by(["global_pid", "device"]):
        o = rank_rows(active, gpid, dev, "start", "end")  # (two columns, no copy for one rank)
        s = s.sort("s")
        busy = busy_in_windows(o["start"].to_numpy(), o["end"].to_numpy(), s["s"].to_numpy(), s["e"].to_numpy())
        rows.append(s.with_columns(gpu_busy_ns=pl.Series(busy)))
    if not rows:
        return pl.DataFrame()
    segs = pl.concat(rows)
    by = ["global_pid", "device", "iteration", "sub_phase"]
    t = segs.group_by(by).agg(
        wall_ns=(pl.col("e") - pl.col("s")).sum(), gpu_busy_ns=pl.col("gpu_busy_ns").sum()
    )
    # (the columns read below, picked before the phase's rows are gathered)
    need = [c for c in ("global_pid", "device", "iteration", "sub_phase", "kind", "comm", "direction", "start", "end",
                        "bytes") if c in model.ops_schema]
    ops = model.scan_ops().filter(pl.col("phase") == phase).select(need).with_columns(
        pl.col("sub_phase").fill_null("(none)")).collect()
    k, comm = kernel_frames(ops)
    stats = [
        grouped_union_length(k, by).rename({"busy_ns": "kernel_busy_ns"}),
        grouped_union_length(comm, by).rename({"busy_ns": "comm_busy_ns"}),
    ]
    for d in ("H2D", "D2H"):
        lo = d.lower()
        c = ops.filter((pl.col("kind") == "memcpy") & (pl.col("direction") == d))
        stats.append(grouped_union_length(c, by).rename({"busy_ns": f"{lo}_busy_ns"}))
        stats.append(c.group_by(by).agg(pl.col("bytes").sum().alias(f"{lo}_bytes"), pl.len().alias(f"{lo}_count")))
    for s in stats:
        t = t.join(s, on=by, how="full", coalesce=True, nulls_equal=True)
    cols = ["wall_ns", "gpu_busy_ns", "kernel_busy_ns", "comm_busy_ns", "h2d_bytes", "h2d_busy_ns", "h2d_count", "d2h_bytes", "d2h_busy_ns", "d2h_count"]
    t = t.with_columns(**{c: pl.col(c).fill_null(0).cast(pl.Int64) for c in cols})
    t = t.with_columns(gpu_idle_ns=pl.col("wall_ns") - pl.col("gpu_busy_ns"))
    return _finish(t).sort("global_pid", "device", "iteration", "wall_ns", descending=[False, False, False, True])


def self_segments(model: PhaseModel, wm: pl.DataFrame) -> pl.DataFrame:
    """``wm`` are rows of :func:`rank_windows`. Self-time segments ``global_pid, device, iteration, sub_phase, s, e`` of the ranges
    nested in each window of ``wm`` (and of the phase range itself as ``(none)``)."""
    from tracekit.analyze.model.phases import ranges_for

    nested = ranges_for(model, set(wm["phase"].unique().to_list()) if "phase" in wm.columns else None)
    out = []
    plain = wm.filter(pl.col("range_index").is_null())
    out.append(plain.select("global_pid", "device", "iteration", sub_phase=pl.lit("(none)"), s="start", e="end"))
    ranged = wm.filter(pl.col("range_index").is_not_null())
    if ranged.height and nested.height:
        # (the row numbers in the dtype of ``parent``, which they are joined with)
        nested = nested.with_row_index("row").with_columns(pl.col("row").cast(nested.schema["parent"]))
        phase_rows = nested.join(
            ranged.select("range_index", "device", "iteration", w_end="end"), on="range_index"
        )
        # descendants: same thread, inside the window, deeper. A window cut short of its range
        # (a range never popped, phases.set_aside_unclosed) bounds them: later ranges are left
        # out, ranges across the cut end there
        members = []
        for r in phase_rows.iter_rows(named=True):  # one per phase window, not per event
            bound = min(r["end"], r["w_end"])
            m = nested.filter(
                (pl.col("global_tid") == r["global_tid"]) & (pl.col("start") >= r["start"])
                & ((pl.col("end") <= r["end"]) & (pl.col("start") < bound) | (pl.col("row") == r["row"]))
            ).with_columns(end=pl.min_horizontal("end", pl.lit(bound, pl.Int64)))
            m = m.with_columns(
                device=pl.lit(r["device"]), iteration=pl.lit(r["iteration"], pl.Int64),
                global_pid=pl.lit(r["global_pid"]),
                sub_phase=pl.when(pl.col("row") == r["row"]).then(pl.lit("(none)")).otherwise(pl.col("name")),
                key=pl.lit(r["row"], pl.Int64),
            )
            members.append(m)
        mem = pl.concat(members)
        rowset = mem.select("key", "row")
        own = mem.select("key", "row", "global_pid", "device", "iteration", "sub_phase", t="start", is_start=pl.lit(True))
        own_end = mem.select("key", "row", "global_pid", "device", "iteration", "sub_phase", t="end", is_start=pl.lit(False))
        kids = mem.join(rowset.rename({"row": "parent"}), on=["key", "parent"], how="semi")
        par = mem.select("key", "row", "global_pid", "device", "iteration", "sub_phase")
        k_start = kids.select("key", row="parent", t="start").join(par, on=["key", "row"]).with_columns(is_start=pl.lit(False))
        k_end = kids.select("key", row="parent", t="end").join(par, on=["key", "row"]).with_columns(is_start=pl.lit(True))
        marks = pl.concat([own, own_end, k_start.select(own.columns), k_end.select(own.columns)])
        # per owner: S E S E ...; at equal times a start marker precedes an end marker
        marks = marks.sort(["key", "row", "t", "is_start"], descending=[False, False, False, True])
        marks = marks.with_columns(n=pl.int_range(pl.len()).over(["key", "row"]))
        s = marks.filter(pl.col("n") % 2 == 0).with_columns(pair=pl.col("n") // 2)
        e = marks.filter(pl.col("n") % 2 == 1).with_columns(pair=pl.col("n") // 2).select("key", "row", "pair", e="t")
        seg = s.join(e, on=["key", "row", "pair"]).select("global_pid", "device", "iteration", "sub_phase", s="t", e="e")
        out.append(seg.filter(pl.col("e") > pl.col("s")))
    return pl.concat([o.cast({"iteration": pl.Int64, "device": pl.Int64, "global_pid": pl.Int64}) for o in out])
