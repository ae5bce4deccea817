"""Offload opportunities computed from the trace (issue 4, the study's two insights).

1. **Gradient round trips during gradient accumulation.** With ZeRO offload, each backward
   micro-step moves gradients between GPU and host. In a *non-boundary* backward micro-step
   (one that does not end a gradient accumulation cycle) the H2D copies bring accumulated
   gradients back and the D2H copies send them out again: traffic that keeping the
   accumulated gradients on the GPU would avoid until the boundary. Reported per micro-step:
   bytes and copy time (union) per direction; per rank, whether the GPU memory headroom in
   backward (device memory minus the peak in use during any backward) could hold the
   largest gradient volume a non-boundary micro-step sends out (its D2H bytes).
2. **The update phase.** While the CPU runs the optimizer step the GPU is idle (no kernel,
   copy or memset of the rank running, :mod:`tracekit.analyze.sections.breakdown`). Reported per
   update: wall and idle time, GPU memory free at the update's peak, and how much optimizer
   state it could hold: ``free_bytes`` and ``free_bytes / 16`` parameters (fp32 master weight,
   momentum, variance and gradient: 16 B per parameter for Adam), next to the H2D bytes the
   update copies back (the updated parameters).

Memory figures need ``CUDA_GPU_MEMORY_USAGE_EVENTS``; without them they are null.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections import breakdown
from tracekit.analyze.sections.memory import memory_peaks
from tracekit.analyze.sections.transfer_common import RANK, host_copies_query
from tracekit.analyze.trace.export import Export
from tracekit.errors import MissingDataError

BYTES_PER_PARAM = 16


def _peaks(export: Export, model: PhaseModel, by) -> pl.DataFrame | None:
    """:func:`tracekit.analyze.sections.memory.memory_peaks` of ``model`` by ``by`` (None when the
    trace has no memory usage events), computed once per model and ``by`` (the opportunities
    and the what-if model ask for the same ones)."""
    def compute() -> pl.DataFrame | None:
        try:
            return memory_peaks(export, model, by=by)
        except MissingDataError:
            return None

    return model.derived(("memory_peaks", tuple(by)), compute)


def gradient_round_trips(model: PhaseModel) -> pl.DataFrame:
    """Host copies of every backward micro-step.

    Columns: ``global_pid, device, iteration, micro_step, boundary``, ``h2d_count,
    h2d_bytes, h2d_ns, d2h_count, d2h_bytes, d2h_ns`` (ns = union of the copies' intervals),
    ``round_trip_ns`` (union of both directions), ``d2h_after_h2d_bytes`` (D2H bytes of
    copies starting after the micro-step's first H2D). Rows with ``boundary == False`` are
    the avoidable round trips of definition 1.
    """
    from tracekit.analyze.sections.breakdown import _union_lengths

    keys = [*RANK, "iteration", "micro_step", "boundary"]
    c = host_copies_query(model).filter((pl.col("phase") == "backward") & pl.col("iteration").is_not_null())
    first_h2d = c.filter(pl.col("direction") == "H2D").group_by(keys).agg(first_h2d=pl.col("start").min())
    c = c.join(first_h2d, on=keys, how="left", nulls_equal=True)
    out = c.group_by(keys).agg(
        **{f"{d.lower()}_count": (pl.col("direction") == d).sum().cast(pl.Int64) for d in ("H2D", "D2H")},
        **{f"{d.lower()}_bytes": pl.col("bytes").filter(pl.col("direction") == d).sum() for d in ("H2D", "D2H")},
        d2h_after_h2d_bytes=pl.col("bytes").filter((pl.col("direction") == "D2H") &
                                                   (pl.col("start") > pl.col("first_h2d"))).sum(),
    )
    # union lengths (ns) per micro-step: each direction, and both (one lazy query with the rest)
    for d in ("H2D", "D2H"):
        u = _union_lengths(c.filter(pl.col("direction") == d), keys).rename({"busy_ns": f"{d.lower()}_ns"})
        out = out.join(u, on=keys, how="left", nulls_equal=True)
    u = _union_lengths(c, keys).rename({"busy_ns": "round_trip_ns"})
    out = out.join(u, on=keys, how="left", nulls_equal=True)
    out = out.with_columns(**{k: pl.col(k).fill_null(0).cast(pl.Int64) for k in ("h2d_ns", "d2h_ns", "round_trip_ns")})
    return out.sort(keys).select(*keys, "h2d_count", "h2d_bytes", "h2d_ns", "d2h_count", "d2h_bytes", "d2h_ns",
                                 "round_trip_ns", "d2h_after_h2d_bytes").collect()


def gradient_round_trip_summary(export: Export, model: PhaseModel, trips: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per rank: the avoidable round trips of non-boundary backward micro-steps and whether
    the backward headroom could hold the gradients.

    Columns: ``global_pid, device, micro_steps`` (non-boundary backward micro-steps),
    ``iterations`` (complete iterations among them), ``h2d_bytes, d2h_bytes, round_trip_ns``
    (summed), ``grad_bytes`` (largest D2H bytes of one such micro-step), ``backward_peak_bytes``,
    ``total_memory``, ``backward_headroom_bytes`` (null without memory events), ``fits``
    (headroom >= grad_bytes; null when unknown).
    """
    t = trips if trips is not None else gradient_round_trips(model)
    nb = t.filter(~pl.col("boundary"))
    out = nb.group_by(RANK).agg(
        micro_steps=pl.len().cast(pl.Int64),
        iterations=pl.col("iteration").n_unique().cast(pl.Int64),
        h2d_bytes=pl.col("h2d_bytes").sum(), d2h_bytes=pl.col("d2h_bytes").sum(),
        round_trip_ns=pl.col("round_trip_ns").sum(), grad_bytes=pl.col("d2h_bytes").max(),
    )
    peaks = _peaks(export, model, ("phase",))
    if peaks is not None:
        bp = peaks.filter(pl.col("phase") == "backward").select(
            *RANK, backward_peak_bytes="peak_bytes", total_memory="total_memory",
            backward_headroom_bytes="headroom_bytes")
        out = out.join(bp, on=RANK, how="left")
    else:
        out = out.with_columns(backward_peak_bytes=pl.lit(None, pl.Int64), total_memory=pl.lit(None, pl.Int64),
                               backward_headroom_bytes=pl.lit(None, pl.Int64))
    return out.with_columns(fits=pl.col("backward_headroom_bytes") >= pl.col("grad_bytes")).sort(RANK)


def update_opportunity(export: Export, model: PhaseModel) -> pl.DataFrame:
    """Per rank and update window: idle GPU and free memory during the CPU optimizer step.

    Columns: ``global_pid, device, iteration, wall_ns, gpu_idle_ns, gpu_idle_share``,
    ``h2d_bytes`` (copied to the GPU by the update, e.g. updated parameters), ``h2d_busy_ns``,
    ``peak_bytes`` (GPU memory in use at the update's peak), ``total_memory``,
    ``free_bytes`` (= total - peak), ``state_params`` (= free_bytes / 16: parameters whose
    Adam state would fit). Memory columns are null without memory usage events.
    """
    t = breakdown.phase_table(model).filter(pl.col("phase") == "update")
    out = t.select(*RANK, "iteration", "wall_ns", "gpu_idle_ns", "gpu_idle_share", "h2d_bytes", "h2d_busy_ns",
                   "start_ns")
    peaks = _peaks(export, model, ("iteration", "phase"))
    if peaks is not None:
        p = peaks.filter(pl.col("phase") == "update").select(*RANK, "iteration", "peak_bytes", "total_memory",
                                                             free_bytes="headroom_bytes")
        out = out.join(p, on=[*RANK, "iteration"], how="left", nulls_equal=True)
    else:
        out = out.with_columns(peak_bytes=pl.lit(None, pl.Int64), total_memory=pl.lit(None, pl.Int64),
                               free_bytes=pl.lit(None, pl.Int64))
    out = out.with_columns(state_params=pl.col("free_bytes") // BYTES_PER_PARAM)
    return out.sort([*RANK, "start_ns"]).drop("start_ns")
