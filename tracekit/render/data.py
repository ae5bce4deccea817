"""What the figures plot: one analysed trace (:class:`ReportData`) and the frames derived from it.

Every frame here is a polars DataFrame with the units in its column names (``_ns``,
``_bytes``, ``_gbps`` = 1e9 B/s). The numbers come from the analyses of
:mod:`tracekit.analyze` (same definitions as ``tracekit analyze``), narrowed to one rank
(process, device) and reshaped for plotting:

- *memory in use*: :func:`tracekit.analyze.sections.memory.memory_timeline` (allocation +bytes,
  deallocation -bytes, device memory kinds; the CUDA allocator's view);
- *copy throughput*: per direction, bytes per bin with each copy's bytes spread evenly over its
  duration (:func:`tracekit.analyze.model.intervals.spread_cumulative`), over one time span;
- *overlap*: :func:`tracekit.analyze.sections.overlap.overlap` (copy time under kernels = hidden);
- *contention windows*: :func:`tracekit.analyze.sections.contention.contention_windows`;
- *copy sizes*: :func:`tracekit.analyze.sections.copy_sizes.copy_sizes` (power-of-two buckets);
- *pageable copies*: :func:`tracekit.analyze.sections.pageable.pageable_summary`;
- *memory peaks*: :func:`tracekit.analyze.sections.memory.memory_peaks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from tracekit.analyze.model import phases
from tracekit.analyze.trace.export import Export
from tracekit.analyze.model.intervals import spread_cumulative
from tracekit.analyze.model.steady import forward_counts, split_warmup
from tracekit.errors import MissingDataError, TracekitError
from tracekit.userfiles import shown

COPY_DIRECTIONS = ("H2D", "D2H")


@dataclass
class ReportData:
    """One trace, analysed once, for all figures.

    Attributes:
        path: the trace.
        export: the open read-only :class:`~tracekit.analyze.trace.export.Export`.
        model: the :class:`~tracekit.analyze.model.phases.PhaseModel`.
        table: :func:`tracekit.analyze.sections.breakdown.phase_table` (ns, bytes).
        totals: :func:`tracekit.analyze.sections.breakdown.totals`.
        ranks: :func:`tracekit.analyze.sections.breakdown.ranks` (``global_pid, pid, device``).
    """

    path: Path
    export: Export
    model: phases.PhaseModel
    table: pl.DataFrame
    totals: pl.DataFrame
    ranks: pl.DataFrame
    #: the :class:`tracekit.analysis.Analysis` of the trace (findings, advice, JSON): the one
    #: pipeline every command's numbers come from
    analysis: object = None
    #: its :meth:`~tracekit.analysis.Analysis.section_data` over :attr:`export`: the section
    #: frames the figures draw (render reads the sections only through it)
    sections: object = None
    _cache: dict = field(default_factory=dict, repr=False)

    def cached(self, key: str, compute: Callable[[], pl.DataFrame]) -> pl.DataFrame:
        """``compute()`` once per trace (whole-trace analyses shared by several figures)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @classmethod
    def load(
        cls,
        path: str | Path,
        phase_map: list[str] | None = None,
        gas: int | None = None,
        step: Callable[[str], None] | None = None,
        ds_config: str | Path | None = None,
        cache: "bool | object" = False,
    ) -> "ReportData":
        """Open ``path`` and analyze it (:meth:`tracekit.analysis.Analysis.of_export`: phases,
        breakdown, findings, advice with ``ds_config`` or the manifest beside the trace).
        ``step(message)`` is called before each stage (for a progress display).

        ``cache``: True (or the trace's :class:`~tracekit.analyze.trace.cache.TraceCache`) reads
        through the cache ``tracekit analyze`` keeps: the analysis is
        :func:`tracekit.analysis.analyze` with the same options as ``analyze``'s default view
        (its stored result when there is one), and every query of the figures goes through the
        Parquet cache. Raises :class:`~tracekit.errors.TracekitError` for a file that is not a
        readable nsys export or has no CUDA activity."""
        from tracekit.analysis import Analysis, analyze
        from tracekit.options import Options, load_ds_config

        step = step or (lambda _m: None)
        step("opening the export")
        export = Export.open(path, cache=cache)
        try:
            opts = Options(phase_map=tuple(phase_map) if phase_map else None, gas=gas, cache=bool(cache),
                           ds_config=load_ds_config(path, ds_config))
            if cache:
                step("analysis (through the cache)")
                a = analyze(path, opts)
                model = a.part("model")
            else:
                a = Analysis.of_export(export, opts, step)
                model = a.part("model")
        except BaseException:
            export.close()
            raise
        sections = a.section_data(export)
        return cls(Path(path), export, model, a.part("table"), a.part("totals"), sections.ranks(), analysis=a,
                   sections=sections)

    def close(self) -> None:
        """Close the export."""
        self.export.close()

    # ------------------------------------------------------------------ selection
    def rank(self, index: int = 0) -> dict:
        """Rank ``index`` (0-based, in :attr:`ranks` order: by pid, then device) as a dict with
        ``global_pid, pid, device, index``. Raises :class:`TracekitError` when out of range."""
        n = self.ranks.height
        if n == 0:
            raise TracekitError(f"{shown(self.path)}: no process with GPU work in this trace")
        if not 0 <= index < n:
            listing = ", ".join(f"{i} (pid {r['pid']} device {r['device']})" for i, r in enumerate(self.ranks.iter_rows(named=True)))
            raise TracekitError(f"--rank {index}: this trace has {n} rank(s): {listing}")
        return {**self.ranks.row(index, named=True), "index": index}

    def rank_table(self, rank: dict) -> pl.DataFrame:
        """Rows of :attr:`table` of ``rank`` that belong to an iteration."""
        return self.table.filter(
            (pl.col("global_pid") == rank["global_pid"])
            & (pl.col("device") == rank["device"])
            & pl.col("iteration").is_not_null()
        )

    def iteration_spans(self, rank: dict) -> pl.DataFrame:
        """``iteration, start_ns, end_ns, wall_ns, complete`` of each iteration of ``rank``."""
        t = self.rank_table(rank)
        return (
            t.group_by("iteration")
            .agg(start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max(),
                 wall_ns=pl.col("wall_ns").sum(), complete=pl.col("complete").all())
            .sort("iteration")
        )

    def pick_iteration(self, rank: dict, iteration: int | None = None) -> int:
        """``iteration`` when the rank has it, else (``None``) the median iteration: of the
        complete iterations, the one whose wall time is the (lower) median. Raises
        :class:`TracekitError` when the rank has no such iteration."""
        spans = self.iteration_spans(rank)
        if spans.height == 0:
            from tracekit.vocab import NO_NVTX, no_iteration_reason

            raise TracekitError(
                f"{shown(self.path)}: no iteration found for pid {rank['pid']} device {rank['device']} "
                + no_iteration_reason(self.model.source.get(rank["global_pid"]) == NO_NVTX)
            )
        if iteration is not None:
            if iteration not in spans["iteration"].to_list():
                have = spans["iteration"].to_list()
                raise TracekitError(f"--iteration {iteration}: this trace has iterations {have[0]}..{have[-1]}")
            return int(iteration)
        full = spans.filter(pl.col("complete"))
        if full.height == 0:
            full = spans
        full = full.sort("wall_ns")
        return int(full["iteration"][(full.height - 1) // 2])

    def steady_iterations(self, rank: dict) -> list[int]:
        """Iterations averaged over by the figures: the complete iterations of ``rank`` (those
        with an update), the warm-up left out by the one warm-up rule
        (:func:`tracekit.analyze.model.steady.split_warmup`: iteration 0, and iteration 1 too
        when iteration 0 holds a single micro-step, as long as one complete iteration remains).
        Falls back to all iterations when none is complete."""
        return self._split_warmup(rank)[0]

    def warmup_iterations(self, rank: dict) -> list[int]:
        """The iterations :meth:`steady_iterations` leaves out by the warm-up rule (sorted; from
        the same candidates: the complete iterations, or all when none is complete)."""
        return self._split_warmup(rank)[1]

    def _split_warmup(self, rank: dict) -> tuple[list[int], list[int]]:
        spans = self.iteration_spans(rank)
        full = spans.filter(pl.col("complete"))["iteration"].to_list() or spans["iteration"].to_list()
        return split_warmup(full, forward_counts(self.model.windows, rank["global_pid"]))

    def rank_ops(self, rank: dict) -> pl.DataFrame:
        """GPU operations of ``rank`` (its process, on its device)."""
        from tracekit.analyze.model.gpu_ops import with_strings

        return with_strings(self.model.scan_ops().filter(
            (pl.col("global_pid") == rank["global_pid"]) & (pl.col("device") == rank["device"])
        )).collect()

    def of_rank(self, frame: pl.DataFrame, rank: dict) -> pl.DataFrame:
        """Rows of a whole-trace analysis ``frame`` (with ``global_pid, device``) of ``rank``."""
        return frame.filter((pl.col("global_pid") == rank["global_pid"]) & (pl.col("device") == rank["device"]))

    def rank_windows(self, rank: dict) -> pl.DataFrame:
        """Phase windows of ``rank``'s process (see :data:`tracekit.analyze.model.phases.WINDOW_COLUMNS`)."""
        return self.model.windows.filter(pl.col("global_pid") == rank["global_pid"]).sort("start")


# ---------------------------------------------------------------------- memory
def memory_timeline(data: ReportData, rank: dict) -> pl.DataFrame:
    """GPU memory in use of one rank over time: ``t_ns`` (event time), ``in_use_bytes``
    (level right after the event), from :func:`tracekit.analyze.sections.memory.memory_timeline`.
    Empty frame when the trace has no memory events (recorded with
    ``nsys profile --cuda-memory-usage=true``)."""
    def whole():
        try:
            return data.sections.memory_timeline()
        except MissingDataError:
            return pl.DataFrame(schema={"global_pid": pl.Int64, "device": pl.Int64, "time": pl.Int64,
                                        "bytes_in_use": pl.Int64})
    tl = data.of_rank(data.cached("memory_timeline", whole), rank)
    return tl.sort("time", maintain_order=True).select(t_ns="time", in_use_bytes="bytes_in_use")


def memory_peaks(data: ReportData, by=("iteration", "phase")) -> pl.DataFrame:
    """:func:`tracekit.analyze.sections.memory.memory_peaks` (all ranks; ``peak_bytes`` per group ``by``),
    or an empty frame when the trace has no memory events."""
    try:
        return data.sections.memory_peaks(by)
    except MissingDataError:
        return pl.DataFrame(schema={"global_pid": pl.Int64, "device": pl.Int64,
                                    **{b: data.model.windows.schema[b] for b in by}, "peak_bytes": pl.Int64})


def level_at(timeline: pl.DataFrame, t_ns: np.ndarray) -> np.ndarray:
    """Memory in use (bytes) at times ``t_ns`` from a :func:`memory_timeline` step function
    (the level after the last event at or before each time; 0 before the first event)."""
    t = timeline["t_ns"].to_numpy()
    v = timeline["in_use_bytes"].to_numpy()
    i = np.searchsorted(t, np.asarray(t_ns, dtype=np.int64), side="right") - 1
    return np.where(i >= 0, v[np.maximum(i, 0)], 0)


# ---------------------------------------------------------------------- throughput
def throughput_timeline(ops: pl.DataFrame, t0: int, t1: int, bin_ns: int) -> pl.DataFrame:
    """Copy throughput per direction in bins of ``bin_ns`` over [t0, t1) (the definition of
    :mod:`tracekit.analyze.sections.throughput`, over one span with bins starting at ``t0``).

    Each memcpy's bytes are spread evenly over its [start, end). Columns: ``bin_start_ns``,
    ``direction`` (H2D, D2H), ``bytes`` (moved in the bin), ``gbps`` (bytes / bin length,
    GB/s). Every bin of both directions is present (zero when idle). Raises
    :class:`TracekitError` for ``bin_ns < 1``.
    """
    if bin_ns < 1:
        raise TracekitError("the throughput bin must be at least 1 ns")
    edges = np.arange(int(t0), int(t1) + bin_ns, bin_ns, dtype=np.int64)
    frames = []
    for d in COPY_DIRECTIONS:
        c = ops.filter((pl.col("kind") == "memcpy") & (pl.col("direction") == d))
        cum = spread_cumulative(c["start"].to_numpy(), c["end"].to_numpy(), c["bytes"].to_numpy(), edges)
        per_bin = np.maximum(np.diff(cum), 0.0)
        frames.append(pl.DataFrame(
            {"bin_start_ns": edges[:-1], "direction": d, "bytes": per_bin, "gbps": per_bin / bin_ns}
        ))
    return pl.concat(frames)


def nice_bin(span_ns: int, target_bins: int = 800, min_ns: int = 100_000) -> int:
    """A round bin length (1, 2, 5 x 10^k ns, at least ``min_ns``) giving about
    ``target_bins`` bins over ``span_ns``: 1 ms for a 0.6 s iteration, 100 ms for a 60 s one."""
    raw = max(span_ns / max(target_bins, 1), min_ns)
    k = 10 ** np.floor(np.log10(raw))
    for m in (1, 2, 5, 10):
        if m * k >= raw:
            return int(m * k)
    return int(10 * k)


def pcie_metrics(data: ReportData, rank: dict, t0: int, t1: int) -> pl.DataFrame:
    """GPU-metrics PCIe samples of ``rank``'s GPU whose time lies in [t0, t1), from
    :func:`tracekit.analyze.sections.pcie_metrics.pcie_series`: ``t_ns`` (end of the sample interval),
    ``metric`` (``RX`` = into the GPU, the H2D side; ``TX`` = out of the GPU, the D2H side),
    ``percent`` (of the link's peak, as nsys reports it). Empty frame when the trace has no
    PCIe metrics (recorded with ``nsys profile --gpu-metrics-devices=all``); a series whose
    GPU cannot be mapped to a device is used only when it is the trace's only one."""
    def whole():
        try:
            return data.sections.pcie_series()
        except MissingDataError:
            return pl.DataFrame(schema={"device": pl.Int64, "type_id": pl.Int64, "direction": pl.String,
                                        "start": pl.Int64, "time": pl.Int64, "value_pct": pl.Float64})
    s = data.cached("pcie_series", whole)
    single = s["type_id"].n_unique() == 1
    mine = pl.col("device") == rank["device"]
    if single:
        mine = mine | pl.col("device").is_null()
    s = s.filter(mine.fill_null(False) & (pl.col("time") >= t0) & (pl.col("time") < t1))
    return s.sort("time").select(
        t_ns="time", metric=pl.when(pl.col("direction") == "H2D").then(pl.lit("RX")).otherwise(pl.lit("TX")),
        percent="value_pct",
    )


# ---------------------------------------------------------------------- overlap, contention, sizes
def overlap_by_phase(data: ReportData, rank: dict, by: tuple[str, ...] = ("iteration", "phase"),
                     iterations: list[int] | None = None) -> pl.DataFrame:
    """Hidden and exposed copy time per group ``by`` and direction of one rank, from
    :func:`tracekit.analyze.sections.overlap.overlap` (hidden = copy busy time during which any kernel of
    the device runs). ``iterations`` narrows to those iterations first.

    Columns: ``by``, ``direction``, ``copy_ns`` (busy time, union), ``hidden_ns``,
    ``exposed_ns``, ``overlap_ratio`` (hidden / copy; null without copies).
    """
    key = f"overlap:{','.join(('iteration', *[b for b in by if b != 'iteration']))}"
    full = data.cached(key, lambda: data.sections.overlap(("iteration", *[b for b in by if b != "iteration"])))
    o = data.of_rank(full, rank)
    if iterations is not None:
        o = o.filter(pl.col("iteration").is_in(iterations))
    parts = []
    for d in COPY_DIRECTIONS:
        lo = d.lower()
        parts.append(o.filter(pl.col(f"{lo}_count") > 0).group_by(list(by)).agg(
            copy_ns=pl.col(f"{lo}_busy_ns").sum(), hidden_ns=pl.col(f"{lo}_overlap_ns").sum(),
        ).with_columns(direction=pl.lit(d)))
    out = pl.concat(parts).select(*by, "direction", "copy_ns", "hidden_ns")
    return out.with_columns(
        exposed_ns=pl.col("copy_ns") - pl.col("hidden_ns"),
        overlap_ratio=pl.when(pl.col("copy_ns") > 0).then(pl.col("hidden_ns") / pl.col("copy_ns")),
    ).sort(*by, "direction", nulls_last=False)


def contention_windows(data: ReportData, rank: dict) -> pl.DataFrame:
    """PCIe contention windows of one rank, from
    :func:`tracekit.analyze.sections.contention.contention_windows`: ``start_ns, end_ns,
    duration_ns, kind`` (same-direction | bidirectional), ``direction`` (H2D | D2H | both),
    ``h2d_bytes, d2h_bytes, gbps, slowdown, iteration, phase``."""
    w = data.of_rank(data.cached("contention", lambda: data.sections.contention_windows()), rank)
    return w.select(start_ns="start", end_ns="end", duration_ns="duration_ns", kind="kind", direction="direction",
                    h2d_bytes="h2d_bytes", d2h_bytes="d2h_bytes", gbps="gbps", slowdown="slowdown",
                    iteration="iteration", phase="phase")


def host_kind() -> pl.Expr:
    """``pinned`` / ``pageable`` / other host memory kind of a memcpy (its host side)."""
    return pl.when(pl.col("direction") == "H2D").then(pl.col("src_kind")).otherwise(pl.col("dst_kind"))


def copy_sizes(data: ReportData, rank: dict, iterations_only: bool = True,
               by_phase: bool = False) -> pl.DataFrame:
    """H2D and D2H memcpys of one rank per power-of-two size bucket and host memory kind, from
    :func:`tracekit.analyze.sections.copy_sizes.copy_sizes`; with ``iterations_only``, copies outside
    iterations (start-up) are left out.

    Columns: ``direction``, ``host_kind`` (pinned, pageable, ...), ``bucket`` (k of
    [2^k, 2^(k+1)) bytes), ``bucket_bytes`` (2^k), ``count``, ``bytes``, ``busy_ns`` (sum of
    copy durations); with ``by_phase`` also ``phase`` (of the launching call; null outside
    phase windows). Totals over the copies, not per iteration. Zero-byte copies are left out.
    """
    full = data.cached("copy_sizes:phase", lambda: data.sections.copy_sizes(("iteration", "phase"), COPY_DIRECTIONS))
    c = data.of_rank(full, rank).filter(pl.col("bucket") >= 0)
    if iterations_only:
        c = c.filter(pl.col("iteration").is_not_null())
    keys = ["direction", "phase", "host_kind", "bucket"] if by_phase else ["direction", "host_kind", "bucket"]
    return (
        c.group_by(keys)
        .agg(bucket_bytes=pl.col("bucket_lo").first(), count=pl.col("count").sum(), bytes=pl.col("bytes").sum(),
             busy_ns=pl.col("copy_ns").sum())
        .sort("direction", "bucket", *keys[1:-1], nulls_last=True)
    )


def pageable_by_phase(data: ReportData, rank: dict, by: tuple[str, ...] = ("iteration", "phase")) -> pl.DataFrame:
    """Pageable H2D/D2H memcpys of one rank per group ``by`` (both directions together), from
    :func:`tracekit.analyze.sections.pageable.pageable_summary`: ``by``, ``pageable_count``,
    ``pageable_bytes``, ``pageable_ns`` (summed durations). What pinning would save is the what-if
    model's (the advice, ``analyze --section pageable``), not summed here (issue 21, one voice)."""
    key = "pageable:" + ",".join(by)
    full = data.cached(key, lambda: data.sections.pageable_summary(by))
    p = data.of_rank(full, rank)
    return p.group_by(list(by)).agg(
        pageable_count=pl.col("count").sum(), pageable_bytes=pl.col("bytes").sum(),
        pageable_ns=pl.col("copy_ns").sum(),
    )


# ---------------------------------------------------------------------- copies as intervals
def copy_intervals(data: ReportData, rank: dict, t0: int, t1: int) -> pl.DataFrame:
    """Each H2D / D2H memcpy of ``rank`` that runs during [t0, t1), as an interval (never
    binned, so a 55 GB/s copy reads 55 GB/s however short it is).

    Columns: ``start_ns, end_ns`` (the copy's own extent, not clipped), ``duration_ns``,
    ``direction`` (H2D | D2H), ``host_kind`` (pinned | pageable | ...), ``bytes``, ``gbps``
    (bytes / duration, GB/s; a zero-length copy counts 1 ns), ``iteration``, ``phase`` and
    ``sub_phase`` (of the CUDA call that launched it; ``(none)`` where no sub-range was open,
    null outside phase windows). Sorted by start.
    """
    ops = data.rank_ops(rank).filter(
        (pl.col("kind") == "memcpy") & pl.col("direction").is_in(list(COPY_DIRECTIONS))
        & (pl.col("end") > t0) & (pl.col("start") < t1)
    )
    return ops.sort("start").select(
        start_ns="start", end_ns="end", duration_ns=pl.col("end") - pl.col("start"), direction="direction",
        host_kind=host_kind(), bytes="bytes",
        gbps=pl.col("bytes") / pl.max_horizontal(pl.col("end") - pl.col("start"), pl.lit(1)),
        iteration="iteration", phase="phase", sub_phase="sub_phase",
    )


#: Copies smaller than this are left out of the reference bandwidths (their time is latency).
REFERENCE_MIN_BYTES = 1 << 20


def reference_bandwidths(data: ReportData, rank: dict, iterations: list[int] | None = None,
                         min_bytes: int = REFERENCE_MIN_BYTES) -> pl.DataFrame:
    """What this trace's copies reach, per direction and host memory kind: the bandwidth the
    figures draw as reference lines (pinned vs pageable).

    Over the memcpys of ``rank`` of at least ``min_bytes`` bytes (smaller ones are mostly
    latency) in ``iterations`` (default: all). Columns: ``direction, host_kind, copies,
    bytes, busy_ns`` (sum of durations), ``gbps`` (bytes / busy_ns, GB/s). Directions and kinds
    without such copies have no row.
    """
    ops = data.rank_ops(rank).filter(
        (pl.col("kind") == "memcpy") & pl.col("direction").is_in(list(COPY_DIRECTIONS))
        & (pl.col("bytes") >= min_bytes)
    )
    if iterations is not None:
        ops = ops.filter(pl.col("iteration").is_in(iterations))
    return (
        ops.with_columns(host_kind=host_kind(), d=pl.col("end") - pl.col("start"))
        .group_by("direction", "host_kind")
        .agg(copies=pl.len().cast(pl.Int64), bytes=pl.col("bytes").sum(), busy_ns=pl.col("d").sum())
        .filter(pl.col("busy_ns") > 0)
        .with_columns(gbps=pl.col("bytes") / pl.col("busy_ns"))
        .sort("direction", "host_kind")
    )


def warmup_iterations(data: ReportData, rank: dict) -> list[int]:
    """Iterations of ``rank`` that :meth:`ReportData.steady_iterations` leaves out although
    they are complete: the warm-up (:meth:`ReportData.warmup_iterations`), drawn apart by the
    figures."""
    done = set(data.iteration_spans(rank).filter(pl.col("complete"))["iteration"].to_list())
    return [i for i in data.warmup_iterations(rank) if i in done]
