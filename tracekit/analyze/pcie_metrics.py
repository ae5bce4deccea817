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
frames (``model`` given) leave it out; :func:`tracekit.analyze.transfers.analyze_transfers`
then adds a note.

- per group of phase windows (``by``): mean and peak % per direction over the samples whose
  timestamp lies in the group's windows, and the cross-check ``copy_gbps``: bytes the
  copies of that direction delivered during those windows (each copy's bytes spread evenly
  over its duration, all copies of the device) divided by the windows' wall time;
  ``implied_peak_gbps`` = copy_gbps / ((mean_pct - baseline_pct) / 100) is the link peak the
  two imply (the baseline is what the metric reads with no copy in flight) — it should be
  about the same in every phase when the copies explain the link traffic;
- saturation windows: maximal runs of consecutive samples at or above ``threshold`` %.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.export import Export
from tracekit.analyze.intervals import spread_cumulative
from tracekit.analyze.phases import PhaseModel
from tracekit.analyze.transfer_common import PHASE_KEYS, RANK, attach_window, check_by, ranks_of, ratio
from tracekit.errors import MissingDataError

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
            f"{export.path.name}: GPU_METRICS has no PCIe RX/TX Throughput metric, and the PCIe "
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


def prefetch_series(export: Export) -> bool:
    """Start reading the PCIe samples in the background (:meth:`Export.prefetch`), so that the
    GPU_METRICS scan overlaps the analysis until :func:`pcie_series` needs them. False (and
    nothing started) when the trace has no PCIe metrics or they are cached already."""
    try:
        ids = pcie_metric_ids(export)
    except MissingDataError:
        return False
    import os

    # a full scan of GPU_METRICS (no index on metricId): read in rowid ranges, one per core (up to 4)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return export.prefetch(*_series_query(ids), table="GPU_METRICS", parts=max(1, min(4, cores)))


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
    """PCIe RX/TX samples, one row per sample.

    Columns: ``device`` (see module doc), ``type_id``, ``direction`` (H2D = RX, D2H = TX),
    ``time`` (ns, end of the sample's interval), ``start`` (ns, the previous sample of the same
    metric; for the first, ``time`` minus the median interval), ``value_pct``. With ``model``,
    one copy of the device's series per rank, with ``global_pid`` and the ``window_id,
    iteration, phase, micro_step, boundary`` of the window containing ``time``, and
    ``copy_gbps``: bytes the rank's copies of that direction delivered in the sample's
    interval (spread evenly over each copy) / interval length.

    Raises :class:`~tracekit.errors.MissingDataError` without PCIe metrics.
    """
    ids = pcie_metric_ids(export)
    s = export.query(*_series_query(ids))
    s = s.drop_nulls(["type_id", "metric_id", "time", "value_pct"])  # a damaged sample cannot be placed
    s = s.join(ids.select("metric_id", "direction"), on="metric_id").drop("metric_id")
    types = sorted(s["type_id"].unique().to_list())
    gpus = sorted(export.load("TARGET_INFO_GPU", {"id": "id"})["id"].drop_nulls().unique().to_list())
    mapping = dict(zip(types, gpus)) if len(types) == len(gpus) else {}
    if not mapping and model is not None and len(types) == 1:
        devs = ranks_of(model)["device"].unique().to_list()
        if len(devs) == 1:  # one sampled GPU, one device with work: the same one
            mapping = {types[0]: devs[0]}
    s = s.with_columns(device=pl.col("type_id").replace_strict(mapping, default=None, return_dtype=pl.Int64))
    s = _by_metric_with_start(s)
    step = s.select((pl.col("time") - pl.col("start")).median()).item() or 0
    s = s.with_columns(start=pl.col("start").fill_null(pl.col("time") - int(step)))
    s = s.select("device", "type_id", "direction", "start", "time", "value_pct")
    if model is None:
        return s
    r = ranks_of(model)
    s = r.join(s, on="device", how="inner").sort([*RANK, "direction", "time"])
    # copy throughput of the rank over each sample's interval, for the cross-check
    copies = model.ops.filter((pl.col("kind") == "memcpy") & pl.col("direction").is_in(["H2D", "D2H"]))
    parts = []
    for (gpid, dev, d), g in s.group_by([*RANK, "direction"], maintain_order=True):  # s is sorted by these
        c = copies.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev) & (pl.col("direction") == d))
        cs, ce, cb = c["start"].to_numpy(), c["end"].to_numpy(), c["bytes"].to_numpy()
        a, b = g["start"].to_numpy(), g["time"].to_numpy()
        moved = spread_cumulative(cs, ce, cb, b) - spread_cumulative(cs, ce, cb, a)
        parts.append(g.with_columns(copy_gbps=pl.Series(np.maximum(moved, 0.0) / np.maximum(b - a, 1))))
    s = pl.concat(parts) if parts else s.with_columns(copy_gbps=pl.lit(None, pl.Float64))
    return attach_window(model, s, "time")  # still sorted by rank, direction, time: groups came in order


def pcie_phase_stats(export: Export, model: PhaseModel, by=PHASE_KEYS, series: pl.DataFrame | None = None) -> pl.DataFrame:
    """PCIe metric per rank, group of phase windows and direction, with the copy cross-check.

    Columns: ``global_pid, device``, the ``by`` columns (``sub_phase`` is not available: the
    series is attributed by time), ``direction``, ``samples``, ``mean_pct``, ``peak_pct``,
    ``baseline_pct`` (median % of the rank's samples with no copy of that direction in flight:
    the metric's reading of an idle link, e.g. 1 % for TX), ``wall_ns`` (of the group's
    windows), ``copy_bytes`` (delivered during them), ``copy_gbps`` = copy_bytes / wall_ns,
    ``implied_peak_gbps`` = copy_gbps / ((mean_pct - baseline_pct) / 100) (null when the mean
    is not above the baseline).
    """
    by = [b for b in check_by(by) if b != "sub_phase"]
    keys = [*RANK, *by]
    s = series if series is not None else pcie_series(export, model)
    stats = s.group_by([*keys, "direction"]).agg(
        samples=pl.len().cast(pl.Int64), mean_pct=pl.col("value_pct").mean(), peak_pct=pl.col("value_pct").max()
    )
    base = s.filter(pl.col("copy_gbps") == 0).group_by([*RANK, "direction"]).agg(baseline_pct=pl.col("value_pct").median())
    win = model.windows.join(ranks_of(model), on="global_pid")
    copies = model.ops.filter((pl.col("kind") == "memcpy") & pl.col("direction").is_in(["H2D", "D2H"]))
    parts = []
    for (gpid, dev), w in win.group_by(RANK):
        c = copies.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev))
        for d in ("H2D", "D2H"):
            cd = c.filter(pl.col("direction") == d)
            ws, we = w["start"].to_numpy(), w["end"].to_numpy()
            b = spread_cumulative(cd["start"].to_numpy(), cd["end"].to_numpy(), cd["bytes"].to_numpy(), we) - \
                spread_cumulative(cd["start"].to_numpy(), cd["end"].to_numpy(), cd["bytes"].to_numpy(), ws)
            parts.append(w.with_columns(direction=pl.lit(d), copy_bytes=pl.Series(np.maximum(b, 0.0)),
                                        wall=pl.col("end") - pl.col("start")))
    if not parts:
        return stats
    cb = pl.concat(parts).group_by([*keys, "direction"]).agg(
        wall_ns=pl.col("wall").sum(), copy_bytes=pl.col("copy_bytes").sum(), start_ns=pl.col("start").min()
    )
    out = cb.join(stats, on=[*keys, "direction"], how="left", nulls_equal=True)
    out = out.join(base, on=[*RANK, "direction"], how="left").with_columns(pl.col("baseline_pct").fill_null(0.0))
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
                    series: pl.DataFrame | None = None) -> pl.DataFrame:
    """Windows where a PCIe direction stays at or above ``threshold`` % of the link.

    A window is a maximal run of consecutive samples of one metric with ``value_pct >=
    threshold``; it spans from the start of its first sample's interval to its last sample.
    Columns: ``global_pid, device, direction, start, end, duration_ns, samples, mean_pct,
    peak_pct`` and ``window_id, iteration, phase, micro_step, boundary`` of the phase window
    containing its start.
    """
    s = series if series is not None else pcie_series(export, model)
    s = s.sort([*RANK, "direction", "time"]).with_columns(hi=pl.col("value_pct") >= threshold)
    s = s.with_columns(run=(pl.col("hi") != pl.col("hi").shift(1)).fill_null(True).cast(pl.Int64).cum_sum()
                       .over([*RANK, "direction"]))
    w = s.filter(pl.col("hi")).group_by([*RANK, "direction", "run"]).agg(
        start=pl.col("start").min(), end=pl.col("time").max(), samples=pl.len().cast(pl.Int64),
        mean_pct=pl.col("value_pct").mean(), peak_pct=pl.col("value_pct").max(),
    ).with_columns(duration_ns=pl.col("end") - pl.col("start")).drop("run")
    w = attach_window(model, w, "start")
    return w.sort([*RANK, "start"]).select(*RANK, "direction", "start", "end", "duration_ns", "samples", "mean_pct",
                                           "peak_pct", "window_id", "iteration", "phase", "micro_step", "boundary")
