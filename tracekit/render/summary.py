"""Key numbers per iteration and phase of one rank: what ``report.md`` lists and ``compare`` diffs.

All values come from the analysis layer (:mod:`tracekit.analyze`), narrowed to one rank:

==================  ===========================================================================
``wall_ns``         phase wall time (sum over its micro-steps), :func:`breakdown.phase_table`
``gpu_idle_ns``     time in the phase with no kernel, copy or memset running on the GPU
``h2d_bytes``       bytes of H2D memcpys launched in the phase (``d2h_bytes`` likewise)
``h2d_busy_ns``     busy time (union) of those copies, :func:`overlap.overlap`
``h2d_gbps``        h2d_bytes / h2d_busy_ns (GB/s = bytes per ns)
``h2d_exposed_ns``  part of h2d_busy_ns with no kernel of the GPU running (``d2h_*`` likewise)
``overlap_ratio``   share of copy time hidden behind compute kernels: copy_hidden_ns /
                    copy_busy_ns, where copy_busy_ns is the union of the H2D and D2H copies'
                    intervals and copy_hidden_ns its part under kernels (the ``overlap_ratio``
                    of :func:`overlap.overlap` and of ``analyze --json``; null without copies).
                    The one definition: a phase mean sums both over the iterations first
``pageable_count``  H2D/D2H memcpys from or to pageable host memory, ``pageable_bytes``
``peak_bytes``      peak GPU memory in use during the phase, :func:`memory.memory_peaks`
                    (null without CUDA memory events)
==================  ===========================================================================
"""

from __future__ import annotations

import polars as pl

from tracekit.render import data as D
from tracekit.render.data import ReportData

from tracekit.vocab import PHASES as PHASE_ORDER  # noqa: E402
#: What ``overlap_ratio`` is made of (ns), kept beside :data:`METRICS` so that means over
#: iterations divide sums (:func:`phase_means`).
OVERLAP_PARTS = ["copy_busy_ns", "copy_hidden_ns"]
#: Metrics of :func:`iteration_metrics`, in display order.
METRICS = [
    "wall_ns", "gpu_idle_ns", "h2d_bytes", "h2d_busy_ns", "h2d_gbps", "h2d_exposed_ns", "d2h_bytes",
    "d2h_busy_ns", "d2h_gbps", "d2h_exposed_ns", "overlap_ratio", "pageable_count", "pageable_bytes", "peak_bytes",
]


def _phase_rank() -> pl.Expr:
    return pl.col("phase").replace_strict({p: i for i, p in enumerate(PHASE_ORDER)}, default=9, return_dtype=pl.Int64)


def iteration_metrics(data: ReportData, rank: dict) -> pl.DataFrame:
    """One row per iteration and phase of ``rank`` (see module doc for the columns; plus
    ``iteration, phase, complete``). Sorted by iteration, then phase order."""
    t = data.rank_table(rank)
    base = t.group_by("iteration", "phase").agg(
        wall_ns=pl.col("wall_ns").sum(), gpu_idle_ns=pl.col("gpu_idle_ns").sum(),
        h2d_bytes=pl.col("h2d_bytes").sum(), d2h_bytes=pl.col("d2h_bytes").sum(),
        complete=pl.col("complete").all(),
    )
    keys = ["iteration", "phase"]
    full = data.cached("overlap:iteration,phase", lambda: data.sections.overlap(("iteration", "phase")))
    ov = data.of_rank(full, rank).select(
        *keys, "h2d_busy_ns", "h2d_exposed_ns", "d2h_busy_ns", "d2h_exposed_ns", "copy_busy_ns", "copy_overlap_ns",
    )
    out = base.join(ov, on=keys, how="left")
    pg = D.pageable_by_phase(data, rank, by=("iteration", "phase"))
    out = out.join(pg.select(*keys, "pageable_count", "pageable_bytes"), on=keys, how="left")
    pk = data.cached("memory_peaks:iteration,phase", lambda: D.memory_peaks(data, by=("iteration", "phase")))
    pk = data.of_rank(pk, rank)
    out = out.join(pk.select(*keys, "peak_bytes"), on=keys, how="left")
    ints = ["h2d_busy_ns", "h2d_exposed_ns", "d2h_busy_ns", "d2h_exposed_ns", "copy_busy_ns", "copy_overlap_ns",
            "pageable_count", "pageable_bytes"]
    out = out.with_columns(**{c: pl.col(c).fill_null(0).cast(pl.Int64) for c in ints})
    out = out.with_columns(
        h2d_gbps=pl.when(pl.col("h2d_busy_ns") > 0).then(pl.col("h2d_bytes") / pl.col("h2d_busy_ns")),
        d2h_gbps=pl.when(pl.col("d2h_busy_ns") > 0).then(pl.col("d2h_bytes") / pl.col("d2h_busy_ns")),
        overlap_ratio=pl.when(pl.col("copy_busy_ns") > 0).then(pl.col("copy_overlap_ns") / pl.col("copy_busy_ns")),
    )
    out = out.rename({"copy_overlap_ns": "copy_hidden_ns"})
    return out.sort("iteration", _phase_rank()).select("iteration", "phase", "complete", *METRICS, *OVERLAP_PARTS)


def phase_means(metrics: pl.DataFrame, iterations: list[int]) -> pl.DataFrame:
    """Mean per iteration of :func:`iteration_metrics` over ``iterations``, per phase (an
    iteration without the phase counts as 0); rates are recomputed from the summed bytes and
    busy times, ``peak_bytes`` is the max. Columns: ``phase, iterations`` and :data:`METRICS`."""
    n = max(len(iterations), 1)
    m = metrics.filter(pl.col("iteration").is_in(iterations))
    summed = ["wall_ns", "gpu_idle_ns", "h2d_bytes", "h2d_busy_ns", "h2d_exposed_ns", "d2h_bytes", "d2h_busy_ns",
              "d2h_exposed_ns", "pageable_count", "pageable_bytes"]
    g = m.group_by("phase").agg(
        *[(pl.col(c).sum() / n).alias(c) for c in summed],
        peak_bytes=pl.col("peak_bytes").max(),
        _copy=pl.col("copy_busy_ns").sum(),
        _hidden=pl.col("copy_hidden_ns").sum(),
    )
    g = g.with_columns(
        iterations=pl.lit(len(iterations), pl.Int64),
        h2d_gbps=pl.when(pl.col("h2d_busy_ns") > 0).then(pl.col("h2d_bytes") / pl.col("h2d_busy_ns")),
        d2h_gbps=pl.when(pl.col("d2h_busy_ns") > 0).then(pl.col("d2h_bytes") / pl.col("d2h_busy_ns")),
        overlap_ratio=pl.when(pl.col("_copy") > 0).then(pl.col("_hidden") / pl.col("_copy")),
    )
    return g.sort(_phase_rank()).select("phase", "iterations", *METRICS)
