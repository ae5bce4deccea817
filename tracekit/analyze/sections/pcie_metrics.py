"""PCIe hardware series from ``GPU_METRICS`` (nsys ``--gpu-metrics-devices=all``), issue 4.

nsys samples ``PCIe RX Throughput [Throughput %]`` and ``PCIe TX Throughput [Throughput %]``
per GPU: the share of the link's peak bandwidth used in each sampling interval. RX is what
the GPU receives (host-to-device traffic), TX what it sends (device-to-host). A sample at
``timestamp`` t_i covers (t_{i-1}, t_i] of its metric. Only these metric ids are loaded,
filtered in SQL (a trace holds millions of other samples).

GPU mapping: ``GPU_METRICS.typeId`` identifies the sampled GPU. The distinct typeIds of the
PCIe metrics, sorted, are matched to the sorted ``TARGET_INFO_GPU.id`` values (the CUPTI
device ids) when both have the same count; a single sampled GPU is the device when the
trace's work runs on one device. Otherwise the series keeps a null device, and per-rank
frames (``model`` given) leave it out; :func:`tracekit.analyze.sections.transfers.analyze_transfers`
then adds a note.

- per group of phase windows (``by``): mean and peak % per direction over the samples whose
  timestamp lies in the group's windows, and the cross-check ``copy_gbps``: bytes the
  copies of that direction delivered during those windows (each copy's bytes spread evenly
  over its duration, all copies of the device) divided by the windows' wall time;
  ``implied_peak_gbps`` = copy_gbps / ((mean_pct - baseline_pct) / 100) is the link peak the
  two imply (the baseline is what the metric reads with no copy in flight) — it should be
  about the same in every phase when the copies explain the link traffic;
- saturation windows: maximal runs of consecutive samples at or above ``threshold`` %.

Streaming (issue 13): a long capture holds millions of samples, and none of the frames above
needs them at once. :func:`reduce_pcie` reads them in chunks of rowids (in time order, as
nsys writes them), reduces each chunk to per-window counts, sums and maxima, value counts
for the baseline median and saturation runs (a run open at a chunk's end continues in the
next) before reading on, and every frame is rolled up from that one reduction: memory grows
with the number of phase windows, not with the samples (the reducer:
:mod:`tracekit.analyze.sections.pcie_reduce`). The samples themselves
(:func:`pcie_series`) are built only for ``--out`` and figures.

Out-of-range samples: a share of the link is within 0-100 %; a sample outside it (a damaged
or hand-edited export: ``1e308``, ``-5``, ``inf``) is set aside, counted per direction in
:attr:`PcieReduction.set_aside` (the ``pcie`` section notes how many), and the next sample
of its metric then covers its interval too.
"""

from __future__ import annotations

import os

import numpy as np
import polars as pl

from tracekit.analyze.model.intervals import SpreadCumulative
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.pcie_reduce import (  # noqa: F401  (_Counts, PCT_RANGE: importable from here too)
    PCT_RANGE,
    PcieReduction,
    _Counts,
    _Reducer,
    _Unsorted,
    host_copy_times,
    in_range,
)
from tracekit.analyze.sections.transfer_common import PHASE_KEYS, RANK, attach_window, check_by, ranks_of, ratio
from tracekit.analyze.trace.export import Export
from tracekit.errors import MissingDataError
from tracekit.userfiles import shown

PCIE_RE = r"^PCIe (RX|TX) Throughput"
DIRECTION = {"RX": "H2D", "TX": "D2H"}


def pcie_metric_ids(export: Export) -> pl.DataFrame:
    """``metric_id, metric_name, direction`` (H2D for RX, D2H for TX) of the PCIe throughput
    metrics in ``TARGET_INFO_GPU_METRICS``.

    Raises :class:`~tracekit.errors.MissingDataError` (naming ``--gpu-metrics-devices=all``)
    when the trace has no GPU metrics or none of them is a PCIe throughput.
    """
    export.require("GPU_METRICS", "the PCIe throughput series")
    export.require("TARGET_INFO_GPU_METRICS", "the PCIe throughput series")
    m = export.load("TARGET_INFO_GPU_METRICS", {"metric_id": "metricId", "metric_name": "metricName"})
    m = m.unique("metric_id").filter(pl.col("metric_name").str.contains(PCIE_RE))
    if m.height == 0:
        raise MissingDataError(
            f"{shown(export.path)}: GPU_METRICS has no PCIe RX/TX Throughput metric, and the PCIe "
            "series needs it; record it with `nsys profile --gpu-metrics-devices=all` "
            "(a metric set that includes PCIe throughput)"
        )
    return m.with_columns(
        direction=pl.col("metric_name").str.extract(PCIE_RE, 1).replace_strict(DIRECTION, return_dtype=pl.String)
    ).sort("metric_id")


def _series_query(ids: pl.DataFrame) -> tuple[str, tuple, dict]:
    marks = ",".join(str(int(i)) for i in ids["metric_id"])
    return (
        f"SELECT typeId, metricId, timestamp, value FROM GPU_METRICS WHERE metricId IN ({marks})",
        (),
        {"type_id": pl.Int64, "metric_id": pl.Int64, "time": pl.Int64, "value_pct": pl.Float64},
    )


#: Rowids of GPU_METRICS per chunk of the streamed read (the PCIe rows are about a tenth of them
#: in a trace with the default metric set: ~200k samples, ~6 MB per chunk).
CHUNK_ROWIDS = 2_000_000
_EMPTY_SERIES = {"device": pl.Int64, "type_id": pl.Int64, "direction": pl.String, "start": pl.Int64,
                 "time": pl.Int64, "value_pct": pl.Float64}


def read_threads() -> int:
    """Threads that read GPU_METRICS chunks while the main thread reduces them: the cores this
    process may use, at most 2; 1 in a worker process (``--jobs``, Dask: the workers already
    share the cores, so that workers x read threads stays within them).
    ``TRACEKIT_READ_THREADS=N`` overrides."""
    env = os.environ.get("TRACEKIT_READ_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cores))


def _chunk_args(ids: pl.DataFrame) -> tuple[tuple, dict]:
    return _series_query(ids), {"table": "GPU_METRICS", "chunk_rows": CHUNK_ROWIDS, "workers": read_threads()}


def prefetch_series(export: Export) -> bool:
    """Start reading the first chunks of the PCIe samples in the background
    (:meth:`Export.prefetch_chunks`), so that the GPU_METRICS scan overlaps the phase model
    until :func:`reduce_pcie` needs them. False (and nothing started) when the trace has no
    PCIe metrics or the read is pending already."""
    try:
        ids = pcie_metric_ids(export)
    except MissingDataError:
        return False
    args, kw = _chunk_args(ids)
    return export.prefetch_chunks(*args, **kw)


def _mapping(types: list, gpus: list, model: PhaseModel | None) -> dict:
    """typeId -> device (see module doc)."""
    mapping = dict(zip(types, gpus)) if len(types) == len(gpus) else {}
    if not mapping and model is not None and len(types) == 1:
        devs = ranks_of(model)["device"].unique().to_list()
        if len(devs) == 1:  # one sampled GPU, one device with work: the same one
            mapping = {types[0]: devs[0]}
    return mapping



def set_aside_note(set_aside: dict) -> str:
    """The note for samples set aside (``set_aside``: direction -> count), e.g. ``pcie: 2
    GPU_METRICS samples outside 0-100 % set aside (PCIe RX 1, PCIe TX 1): not used``."""
    metric = {v: k for k, v in DIRECTION.items()}
    named = sorted((metric.get(d, d), n) for d, n in set_aside.items())
    parts = ", ".join(f"PCIe {m} {n:,}" for m, n in named)
    total = sum(set_aside.values())
    return (f"pcie: {total:,} GPU_METRICS sample(s) outside {PCT_RANGE[0]:g}-{PCT_RANGE[1]:g} % set aside "
            f"({parts}): not used")


def _clean_samples(s: pl.DataFrame, ids: pl.DataFrame, set_aside: dict | None = None) -> pl.DataFrame:
    """Raw rows -> ``type_id, time, value_pct, direction``, damaged rows (a null) dropped and
    samples outside :data:`PCT_RANGE` set aside (counted per direction into ``set_aside``)."""
    s = s.drop_nulls(["type_id", "metric_id", "time", "value_pct"])  # a damaged sample cannot be placed
    dirs = dict(zip(ids["metric_id"].to_list(), ids["direction"].to_list()))
    s = s.with_columns(direction=pl.col("metric_id").replace_strict(dirs, default=None, return_dtype=pl.String)) \
        .drop_nulls("direction").drop("metric_id")
    ok = in_range(s["value_pct"].to_numpy())
    if not ok.all():
        if set_aside is not None:
            for d, n in s.filter(~pl.Series(ok)).group_by("direction").len().iter_rows():
                set_aside[d] = set_aside.get(d, 0) + int(n)
        s = s.filter(pl.Series(ok))
    return s


def _by_metric_with_start(s: pl.DataFrame) -> pl.DataFrame:
    """``s`` sorted by (type_id, direction, time) with ``start`` = the time of the previous
    sample of the same (type_id, direction), null for the first.

    nsys writes GPU_METRICS in time order; then one stable sort on a small integer key keeps
    time order within each metric, several times faster than a three-key sort of millions of
    rows. Any other order falls back to the full sort.
    """
    if s["time"].is_sorted():
        dirs = {d: i for i, d in enumerate(sorted(s["direction"].unique().to_list()))}
        key = s["type_id"].rank("dense").cast(pl.Int64).to_numpy() * (len(dirs) + 1) + s["direction"].replace_strict(
            dirs, return_dtype=pl.Int64
        ).to_numpy()
        s = s[np.argsort(key, kind="stable")]
    else:
        s = s.sort("type_id", "direction", "time")
    same = (pl.col("type_id") == pl.col("type_id").shift(1)) & (pl.col("direction") == pl.col("direction").shift(1))
    return s.with_columns(start=pl.when(same).then(pl.col("time").shift(1)).otherwise(None))


def pcie_series(export: Export, model: PhaseModel | None = None) -> pl.DataFrame:
    """PCIe RX/TX samples, one row per sample (materialised: for ``--out`` and figures; the
    per-window statistics stream instead, :func:`reduce_pcie`).

    Columns: ``device`` (see module doc), ``type_id``, ``direction`` (H2D = RX, D2H = TX),
    ``time`` (ns, end of the sample's interval), ``start`` (ns, the previous sample of the same
    metric; for the first, ``time`` minus the median interval), ``value_pct``. With ``model``,
    one copy of the device's series per rank, with ``global_pid`` and the ``window_id,
    iteration, phase, micro_step, boundary`` of the window containing ``time``, and
    ``copy_gbps``: bytes the rank's copies of that direction delivered in the sample's
    interval (spread evenly over each copy) / interval length; sorted by rank, direction, time.

    Raises :class:`~tracekit.errors.MissingDataError` without PCIe metrics.
    """
    if model is not None:
        return reduce_pcie(export, model, keep_samples=True).series
    ids = pcie_metric_ids(export)
    s = _clean_samples(export.query(*_series_query(ids)), ids)
    types = sorted(s["type_id"].unique().to_list())
    gpus = sorted(export.load("TARGET_INFO_GPU", {"id": "id"})["id"].drop_nulls().unique().to_list())
    mapping = _mapping(types, gpus, None)
    s = s.with_columns(device=pl.col("type_id").replace_strict(mapping, default=None, return_dtype=pl.Int64))
    s = _by_metric_with_start(s)
    step = s.select((pl.col("time") - pl.col("start")).median()).item() or 0
    s = s.with_columns(start=pl.col("start").fill_null(pl.col("time") - int(step)))
    return s.select("device", "type_id", "direction", "start", "time", "value_pct")



def reduce_pcie(export: Export, model: PhaseModel, threshold: float = 80.0, keep_samples: bool = False) -> PcieReduction:
    """Stream the PCIe samples of ``GPU_METRICS`` once and reduce them to per-window
    aggregates, the baseline and the saturation runs at ``threshold`` % (:class:`PcieReduction`).

    The samples are read in chunks of :data:`CHUNK_ROWIDS` rowids, in rowid order, by
    :func:`read_threads` threads (:meth:`Export.query_chunks`); each chunk is reduced before
    the next is asked for: sample counts, sums and maxima per phase window, value counts of
    the samples with no copy in flight (the baseline is their median), saturation runs (a run
    still open at a chunk's end continues into the next), counts of the sampling intervals
    (their median dates the first sample of each metric). Peak memory depends on windows and
    chunk size, not on the number of samples; only ``keep_samples`` (``--out``) keeps
    :attr:`PcieReduction.series`. When a metric's samples are not in time order by rowid, or
    the typeIds sampled differ from those ``TARGET_INFO_GPU_METRICS`` lists (the device
    mapping may change), the samples are read whole and reduced as one chunk: the same
    results either way. Samples outside :data:`PCT_RANGE` are left out of everything and
    counted in :attr:`PcieReduction.set_aside`.

    Raises :class:`~tracekit.errors.MissingDataError` without PCIe metrics.
    """
    ids = pcie_metric_ids(export)
    gpus = sorted(export.load("TARGET_INFO_GPU", {"id": "id"})["id"].drop_nulls().unique().to_list())
    info = export.load("TARGET_INFO_GPU_METRICS", {"type_id": "typeId", "metric_id": "metricId"})
    types = sorted(info.filter(pl.col("metric_id").is_in(ids["metric_id"].to_list()))["type_id"]
                   .drop_nulls().unique().to_list())
    args, kw = _chunk_args(ids)
    red = None
    try:
        by_dir: dict = {}
        for mid, d in ids.select("metric_id", "direction").iter_rows():
            by_dir.setdefault(d, []).append(mid)
        for chunk in export.query_chunks(*args, **kw):
            if red is None:
                if not types:  # no typeIds listed: those of the first samples (checked at the end)
                    types = sorted(chunk["type_id"].drop_nulls().unique().to_list())
                    if not types:
                        continue
                red = _Reducer(model, _mapping(types, gpus, model), threshold, keep_samples)
            red.add_raw(chunk, by_dir)
        if red is None:
            red = _Reducer(model, {}, threshold, keep_samples)
        elif sorted(red.seen) != types:
            red = None
    except _Unsorted:
        red = None
    if red is not None:
        return red.finish()
    # the exact fallback: every sample at once, in metric and time order (rowid order for equal times)
    set_aside: dict = {}
    s = _clean_samples(pl.concat(list(export.query_chunks(*args, **kw)), rechunk=True), ids, set_aside)
    s = s.sort("type_id", "direction", "time", maintain_order=True)
    red = _Reducer(model, _mapping(sorted(s["type_id"].unique().to_list()), gpus, model), threshold, keep_samples)
    red.set_aside = set_aside
    red.add(s)
    out = red.finish()
    out.streamed = False
    return out


def _reduction_from_series(series: pl.DataFrame, threshold: float) -> PcieReduction:
    """:class:`PcieReduction` of a series of :func:`pcie_series` (with a model), for callers that
    hold one."""
    keys = [*RANK, "direction"]
    s = series.sort([*keys, "time"], maintain_order=True)
    windows = s.group_by([*keys, "window_id", "iteration", "phase", "micro_step", "boundary"]).agg(
        samples=pl.len().cast(pl.Int64), sum_pct=pl.col("value_pct").sum(), peak_pct=pl.col("value_pct").max())
    base = s.filter(pl.col("copy_gbps") == 0).group_by(keys).agg(baseline_pct=pl.col("value_pct").median())
    s = s.with_columns(hi=pl.col("value_pct") >= threshold)
    runs = s.with_columns(run=pl.struct(*keys, "hi").rle_id()).filter(pl.col("hi")).group_by([*keys, "run"]).agg(
        start=pl.col("start").min(), end=pl.col("time").max(), samples=pl.len().cast(pl.Int64),
        sum_pct=pl.col("value_pct").sum(), peak_pct=pl.col("value_pct").max()).drop("run")
    return PcieReduction(threshold, windows, base, runs, series, series.height, streamed=False)


def _window_copies(model: PhaseModel) -> pl.DataFrame:
    """Per rank, phase window and direction: ``wall`` (ns), ``copy_bytes`` the rank's copies of
    that direction delivered in the window (spread evenly over each copy); computed once per model."""
    hit = model.cache.get("pcie_window_copies")
    if hit is not None:
        return hit
    win = model.windows.join(ranks_of(model), on="global_pid")
    copies = host_copy_times(model)  # (the columns read here)
    parts = []
    for (gpid, dev), w in win.group_by(RANK):
        c = copies.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev))
        ws, we = w["start"].to_numpy(), w["end"].to_numpy()
        for d in ("H2D", "D2H"):
            cd = c.filter(pl.col("direction") == d)
            f = SpreadCumulative(cd["start"].to_numpy(), cd["end"].to_numpy(), cd["bytes"].to_numpy())
            parts.append(w.with_columns(direction=pl.lit(d), copy_bytes=pl.Series(np.maximum(f(we) - f(ws), 0.0)),
                                        wall=pl.col("end") - pl.col("start")))
    out = pl.concat(parts) if parts else None
    model.cache["pcie_window_copies"] = out
    return out


def pcie_phase_stats(export: Export, model: PhaseModel, by=PHASE_KEYS, series: pl.DataFrame | None = None,
                     reduction: PcieReduction | None = None) -> pl.DataFrame:
    """PCIe metric per rank, group of phase windows and direction, with the copy cross-check.

    Columns: ``global_pid, device``, the ``by`` columns (``sub_phase`` is not available: the
    series is attributed by time), ``direction``, ``samples``, ``mean_pct``, ``peak_pct``,
    ``baseline_pct`` (median % of the rank's samples with no copy of that direction in flight:
    the metric's reading of an idle link, e.g. 1 % for TX), ``wall_ns`` (of the group's
    windows), ``copy_bytes`` (delivered during them), ``copy_gbps`` = copy_bytes / wall_ns,
    ``implied_peak_gbps`` = copy_gbps / ((mean_pct - baseline_pct) / 100) (null when the mean
    is not above the baseline). Samples outside every window count in phase ``other``.

    The samples come from ``reduction`` (:func:`reduce_pcie`, possibly of another model: the
    groups then take that model's attribution of each sample, the walls and bytes this
    model's windows), else from ``series`` (:func:`pcie_series`), else one streamed pass.
    Raises :class:`~tracekit.errors.MissingDataError` without PCIe metrics.
    """
    by = [b for b in check_by(by) if b != "sub_phase"]
    keys = [*RANK, *by]
    if reduction is None:
        reduction = _reduction_from_series(series, 80.0) if series is not None else reduce_pcie(export, model)
    stats = reduction.windows.group_by([*keys, "direction"]).agg(
        samples=pl.col("samples").sum(), sum_pct=pl.col("sum_pct").sum(), peak_pct=pl.col("peak_pct").max()
    ).with_columns(mean_pct=pl.col("sum_pct") / pl.col("samples")).drop("sum_pct")
    wc = _window_copies(model)
    if wc is None:
        return stats.select(*keys, "direction", "samples", "mean_pct", "peak_pct")
    cb = wc.group_by([*keys, "direction"]).agg(
        wall_ns=pl.col("wall").sum(), copy_bytes=pl.col("copy_bytes").sum(), start_ns=pl.col("start").min()
    )
    out = cb.join(stats, on=[*keys, "direction"], how="left", nulls_equal=True)
    out = out.join(reduction.baseline, on=[*RANK, "direction"], how="left").with_columns(
        pl.col("baseline_pct").fill_null(0.0))
    out = out.with_columns(samples=pl.col("samples").fill_null(0), copy_gbps=ratio("copy_bytes", "wall_ns"))
    above = pl.col("mean_pct") - pl.col("baseline_pct")
    out = out.with_columns(
        implied_peak_gbps=pl.when(above > 0).then(pl.col("copy_gbps") / (above / 100)).otherwise(None)
    )
    return out.sort([*RANK, "start_ns", "direction"]).select(
        *keys, "direction", "samples", "mean_pct", "peak_pct", "baseline_pct", "wall_ns", "copy_bytes", "copy_gbps",
        "implied_peak_gbps",
    )


def pcie_saturation(export: Export, model: PhaseModel, threshold: float = 80.0,
                    series: pl.DataFrame | None = None, reduction: PcieReduction | None = None) -> pl.DataFrame:
    """Windows where a PCIe direction stays at or above ``threshold`` % of the link.

    A window is a maximal run of consecutive samples of one metric with ``value_pct >=
    threshold``; it spans from the start of its first sample's interval to its last sample.
    Columns: ``global_pid, device, direction, start, end, duration_ns, samples, mean_pct,
    peak_pct`` and ``window_id, iteration, phase, micro_step, boundary`` of the phase window
    of ``model`` containing its start; sorted by rank and start. The runs come from
    ``reduction`` when it was made at this threshold, else from ``series``, else from one
    streamed pass. Raises :class:`~tracekit.errors.MissingDataError` without PCIe metrics.
    """
    if reduction is None or reduction.threshold != threshold:
        if series is not None:
            reduction = _reduction_from_series(series, threshold)
        else:
            reduction = reduce_pcie(export, model, threshold)
    w = reduction.runs.with_columns(mean_pct=pl.col("sum_pct") / pl.col("samples"),
                                    duration_ns=pl.col("end") - pl.col("start")).drop("sum_pct")
    w = attach_window(model, w, "start")
    return w.sort([*RANK, "start", "direction"]).select(
        *RANK, "direction", "start", "end", "duration_ns", "samples", "mean_pct", "peak_pct", "window_id",
        "iteration", "phase", "micro_step", "boundary")
