"""GPU memory timeline from ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (nsys ``--cuda-memory-usage=true``).

Definition (issue 4): bytes in use over time per rank (process, device): each allocation
event adds its ``bytes``, each deallocation subtracts them, in event order. This is the CUDA
allocator's view (``cudaMalloc``/``cudaFree`` and module globals), i.e. what PyTorch's caching
allocator has *reserved*, not what tensors use. Device-side kinds only by default (``device``,
``device_static``, ``managed``); pinned host allocations (``cudaHostAlloc``) are host memory
and are left out unless asked for. The CUDA context and memory allocated before the capture
started are not in the events, so headroom (device memory minus peak) is an upper bound.

Device memory comes from ``TARGET_INFO_GPU.totalMemory`` (row ``id`` = CUPTI ``deviceId``).
"""

from __future__ import annotations

import polars as pl

from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.transfer_common import PHASE_KEYS, RANK, attach_window, check_by
from tracekit.analyze.trace.export import Export

DEVICE_KINDS = ("device", "device_static", "managed", "managed_static", "array")
TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"


def device_memory(export: Export) -> pl.DataFrame:
    """``device, total_memory`` (bytes) from ``TARGET_INFO_GPU`` (empty frame when absent)."""
    f = export.load("TARGET_INFO_GPU", {"device": "id", "total_memory": "totalMemory"})
    return f.drop_nulls().unique("device").sort("device")


def memory_timeline(
    export: Export, model: PhaseModel | None = None, kinds: tuple[str, ...] = DEVICE_KINDS
) -> pl.DataFrame:
    """One row per allocation/deallocation event with the running total after it.

    Columns: ``global_pid, device, time`` (ns), ``mem_kind`` (label), ``delta_bytes`` (+ for
    allocation, - for deallocation), ``bytes_in_use`` (running sum per rank after this event),
    and, when ``model`` is given, ``window_id, iteration, phase, micro_step, boundary`` of
    the phase window containing the event (by time). Events with equal times keep the
    export's row order. ``kinds``: memory kinds counted (see module doc).

    Raises :class:`~tracekit.errors.MissingDataError` (naming ``--cuda-memory-usage=true``)
    when the trace has no memory usage events.
    """
    export.require(TABLE, "the GPU memory timeline")
    labels = export.enum_labels("mem")
    ev = export.query(
        f"""SELECT rowid, start, globalPid, deviceId, bytes, memKind, memoryOperationType
            FROM {TABLE} WHERE memoryOperationType IN (0, 1) ORDER BY start, rowid""",
        schema={"row": pl.Int64, "time": pl.Int64, "global_pid": pl.Int64, "device": pl.Int64,
                "bytes": pl.Int64, "mem_kind_id": pl.Int64, "op": pl.Int64},
        # read again by a second caller, not kept in the export's memo for the run (4.6 MiB at 16x
        # the shared trace, from the what-if model to the end; issue 24)
        memo=False,
    )
    # (the columns kept, made before the filter and the sort copy the rows)
    ev = ev.select(*RANK, "time", "row",
                   mem_kind=pl.col("mem_kind_id").replace_strict(labels, default="unknown", return_dtype=pl.String),
                   delta_bytes=pl.when(pl.col("op") == 0).then(pl.col("bytes")).otherwise(-pl.col("bytes")))
    ev = ev.filter(pl.col("mem_kind").is_in(list(kinds)))
    if _one_rank(ev):  # in time and rowid order already (the query's): no sort, one running sum
        out = ev.select(*RANK, "time", "mem_kind", "delta_bytes", bytes_in_use=pl.col("delta_bytes").cum_sum())
    else:
        ev = ev.sort([*RANK, "time", "row"]).with_columns(bytes_in_use=pl.col("delta_bytes").cum_sum().over(RANK))
        out = ev.select(*RANK, "time", "mem_kind", "delta_bytes", "bytes_in_use")
    if model is not None:
        out = attach_window(model, out, "time")
    return out


class DeferredTimeline:
    """The :func:`memory_timeline` of a model, built when :meth:`frame` is called (``--out``,
    :attr:`tracekit.analysis.Analysis.frames`), from the trace opened again: a file-only frame
    (one row per memory event, 6.9 MiB on a 10 GB trace) that the terminal and JSON views never
    read is not held for the run (issue 24)."""

    def __init__(self, model: PhaseModel, kinds: tuple[str, ...] = DEVICE_KINDS):
        self.model, self.kinds = model, kinds

    def frame(self) -> pl.DataFrame:
        """The frame (raises :class:`TracekitError` when the trace changed or cannot be read)."""
        from tracekit.analyze.model.phases import reopen

        with reopen(self.model, "its memory events") as export:
            return memory_timeline(export, self.model, self.kinds)


def _one_rank(ev: pl.DataFrame) -> bool:
    """Whether every row of ``ev`` has one and the same (non-null) ``global_pid, device``."""
    if ev.height == 0:
        return True
    return all(ev[c].null_count() == 0 and ev[c].n_unique() == 1 for c in RANK)


def memory_peaks(export: Export, model: PhaseModel, by=PHASE_KEYS, kinds: tuple[str, ...] = DEVICE_KINDS) -> pl.DataFrame:
    """Peak GPU memory in use per rank and group of phase windows, and headroom.

    For each phase window of a rank, the peak is the largest ``bytes_in_use`` during the
    window: the level at its start (after all events at or before it) or after any event
    inside it; a group's peak is the max over its windows (``by``: any of ``iteration, phase,
    micro_step, boundary``; ``()`` = whole trace).

    Columns: ``global_pid, device``, the ``by`` columns, ``peak_bytes``, ``min_bytes`` (lowest
    level, same rule), ``total_memory`` (device bytes, null when TARGET_INFO_GPU lacks it),
    ``headroom_bytes`` = total_memory - peak_bytes (an upper bound, see module doc).

    Raises :class:`~tracekit.errors.MissingDataError` without memory usage events.
    """
    by = check_by(by)
    if "sub_phase" in by:
        by = [b for b in by if b != "sub_phase"]  # sub-phases are per thread; peaks are per window
    w = window_levels(export, model, kinds).lazy()
    out = w.group_by([*RANK, *by]).agg(peak_bytes=pl.col("peak").max(), min_bytes=pl.col("low").min(),
                                       start_ns=pl.col("start").min())
    out = out.join(device_memory(export).lazy(), on="device", how="left").with_columns(
        headroom_bytes=pl.col("total_memory") - pl.col("peak_bytes")
    )
    return out.sort([*RANK, "start_ns"]).select(*RANK, *by, "start_ns", "peak_bytes", "min_bytes",
                                                "total_memory", "headroom_bytes").collect()


def window_levels(export: Export, model: PhaseModel, kinds: tuple[str, ...] = DEVICE_KINDS) -> pl.DataFrame:
    """Per phase window of a rank with memory events: ``global_pid, device, window_id,
    iteration, phase, micro_step, boundary, start, end`` (ns), ``start_level`` (bytes in use
    at the window's start: after every event at or before it; 0 before the first),
    ``ev_max``, ``ev_min`` (highest and lowest level after an event inside the window; null
    without one), ``peak`` and ``low`` (bytes: the larger and smaller of the two). The rule of
    :func:`memory_peaks`, whose groupings are maxima and minima of these rows: computed once
    per model and ``kinds`` and kept on it (the opportunities and the what-if model group them
    by phase and by iteration and phase). Raises :class:`~tracekit.errors.MissingDataError`
    without memory usage events.
    """
    return model.derived(("memory_window_levels", tuple(kinds)), lambda: _window_levels(export, model, kinds))


def _window_levels(export: Export, model: PhaseModel, kinds: tuple[str, ...]) -> pl.DataFrame:
    """:func:`window_levels`, computed."""
    tl = memory_timeline(export, None, kinds).lazy()  # the rest as one polars query
    ranks = tl.select(RANK).unique()
    win = model.windows.lazy().join(ranks, on="global_pid").select(
        *RANK, "window_id", "iteration", "phase", "micro_step", "boundary", "start", "end"
    )
    # level at each window start: last event at or before it
    lvl = win.sort("start").join_asof(
        tl.select(*RANK, t="time", level="bytes_in_use").sort("t"),
        left_on="start", right_on="t", by=RANK, strategy="backward", check_sortedness=False,
    ).select("window_id", *RANK, start_level=pl.col("level").fill_null(0))
    # events inside each window (windows of a pid tile its span, so an asof join finds it)
    inside = tl.sort("time").join_asof(
        win.select(*RANK, "window_id", w_start="start", w_end="end").sort("w_start"),
        left_on="time", right_on="w_start", by=RANK, strategy="backward", check_sortedness=False,
    ).filter(pl.col("time") < pl.col("w_end"))
    ev_max = inside.group_by("window_id", *RANK).agg(ev_max=pl.col("bytes_in_use").max(), ev_min=pl.col("bytes_in_use").min())
    w = win.join(lvl, on=["window_id", *RANK], how="left").join(ev_max, on=["window_id", *RANK], how="left")
    w = w.with_columns(
        peak=pl.max_horizontal("start_level", "ev_max"),
        low=pl.min_horizontal("start_level", "ev_min"),
    )
    return w.collect()
