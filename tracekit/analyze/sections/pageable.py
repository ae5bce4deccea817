"""Pageable host<->device copies and what pinning would save (issue 4).

A copy is *pageable* when its host side is pageable memory (``srcKind`` of an H2D or
``dstKind`` of a D2H is 0, CUDA_MEMOPR_MEMORY_KIND_PAGEABLE): the driver stages it through a
pinned bounce buffer, which is slower and, for cudaMemcpyAsync from pageable memory, keeps
the host thread in the call for about the copy's duration.

- ``pinned_gbps`` of a copy: bytes / summed duration of the trace's *pinned* copies (all
  ranks) of the same direction and power-of-two size bucket (:func:`~tracekit.analyze.sections.copy_sizes.size_bucket`),
  or of the nearest bucket that has pinned copies — the bandwidth the link reached with
  pinned memory for copies of that size (small copies are latency-bound, so a trace-wide
  figure would overstate what pinning saves them);
  when that bucket's pinned copies reach < :data:`MIN_PINNED_GBPS` (only tiny, latency-bound
  pinned copies) for a copy of >= 1 MiB, or the trace has no pinned copy of that direction,
  :data:`FALLBACK_PINNED_GBPS` (what pinned copies reached on an H200);
- ``pinned_ns`` = bytes / pinned_gbps: the time the same bytes would take pinned;
  ``exposed_ns``: the copy's GPU time no kernel of its device hides;
- ``saving_ns`` and ``scenario``: what pinning saves, not computed here but taken from the what-if
  model (:func:`tracekit.analyze.sections.whatif.pinning_by_copy`, the ``savings`` argument): each
  copy of a steady iteration holds its part of the scenario the advice prints for it
  (``pin_memory`` for the copies offload_optimizer.pin_memory pins, ``pageable_to_pinned`` for the
  others, the ZeRO-3 parameter copy-back among them), so the section, its findings, the advice and
  ``compare`` give one saving (issue 21, "one voice"). Copies outside the steady iterations
  (start-up, the warm-up iteration, between iterations) are no part of a prediction: null;
- ``blocking``: the copy blocks the host by contract: a synchronous API (a memcpy call whose
  name lacks ``Async``) or a pageable D2H; ``host_ns`` is the time the launching thread spent
  in the API call (null without a runtime record), reported for every copy.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.copy_sizes import size_bucket
from tracekit.analyze.sections.transfer_common import (
    PHASE_KEYS,
    RANK,
    all_kernel_union,
    check_by,
    gbps,
    host_copies_query,
    sort_groups,
)
from tracekit.analyze.trace.export import Export

#: Pinned host<->device bandwidth assumed when the trace has no pinned copy of a direction (or
#: only tiny ones): what pinned copies of >= 1 MiB reached on an H200 (PCIe Gen5 x16) in the
#: shared trace.
FALLBACK_PINNED_GBPS = {"H2D": 53.0, "D2H": 53.0}
#: Below this a bucket's pinned bandwidth is latency, not bandwidth, for a copy of >= 1 MiB.
MIN_PINNED_GBPS = 5.0

COPY_COLUMNS = [
    "global_pid", "device", "iteration", "phase", "micro_step", "boundary", "sub_phase", "direction",
    "start", "end", "duration_ns", "bytes", "gbps", "api_name", "host_ns", "blocking",
    "pinned_gbps", "pinned_ns", "exposed_ns", "saving_ns", "scenario", "copy_back", "stream", "correlation_id",
]

#: the columns of :data:`COPY_COLUMNS` that :func:`~tracekit.analyze.sections.transfer_common.host_copies` has
_HOST_COPY_COLUMNS = ("global_pid", "device", "iteration", "phase", "micro_step", "boundary", "sub_phase", "direction",
                      "start", "end", "duration_ns", "bytes", "gbps", "stream", "correlation_id")


def pinned_bandwidth(model: PhaseModel, by_size: bool = False) -> pl.DataFrame:
    """Bandwidth of the trace's pinned H2D/D2H copies.

    Columns: ``direction`` (and ``bucket`` when ``by_size``), ``pinned_count``,
    ``pinned_bytes``, ``pinned_ns`` (summed copy durations), ``pinned_gbps`` = bytes / ns.
    """
    # (the columns read below, picked before the pinned copies' rows are gathered)
    c = host_copies_query(model).filter(pl.col("host_kind") == "pinned").select("direction", "bytes",
                                                                                 "duration_ns").collect()
    keys = ["direction"]
    if by_size:
        c = c.with_columns(bucket=pl.Series(size_bucket(c["bytes"].to_numpy()), dtype=pl.Int64))
        keys.append("bucket")
    out = c.group_by(keys).agg(
        pinned_count=pl.len().cast(pl.Int64), pinned_bytes=pl.col("bytes").sum(), pinned_ns=pl.col("duration_ns").sum()
    )
    return out.with_columns(pinned_gbps=gbps("pinned_bytes", "pinned_ns")).sort(keys)


def pageable_copies(model: PhaseModel, export: Export | None = None,
                    savings: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every pageable H2D/D2H copy, one row each (see module doc for the definitions).

    Columns: :data:`COPY_COLUMNS` — attribution (``iteration, phase, micro_step, boundary,
    sub_phase``), ``direction, start, end, duration_ns`` (ns), ``bytes``, ``gbps``,
    ``api_name`` (resolved through ``export``'s StringIds when given, else null),
    ``host_ns``, ``blocking``, ``pinned_gbps`` (null when the trace has no pinned copy of that
    direction), ``pinned_ns``, ``exposed_ns``, ``saving_ns`` (ns), ``scenario`` and ``copy_back``
    (the ZeRO-3 parameter copy-back, which pin_memory does not pin) from ``savings``
    (:func:`tracekit.analyze.sections.whatif.pinning_by_copy`, matched by rank, ``start`` and
    ``correlation_id``; null for a copy it lacks, and every copy without it).
    Sorted by rank and start.
    """
    # (the columns read below, picked before the pageable copies' rows are gathered)
    need = [*(c for c in COPY_COLUMNS if c in _HOST_COPY_COLUMNS), "api_name_id", "api_end", "launch"]
    c = host_copies_query(model).filter(pl.col("host_kind") == "pageable").select(need).collect()
    names = {}
    if export is not None and c.height:
        names = export.strings(c["api_name_id"].drop_nulls().unique().to_list())
    c = c.with_columns(
        api_name=pl.col("api_name_id").replace_strict(names, default=None, return_dtype=pl.String)
        if names else pl.lit(None, pl.String),
        host_ns=pl.col("api_end") - pl.col("launch"),
    )
    sync_api = pl.col("api_name").is_not_null() & pl.col("api_name").str.contains("(?i)memcpy") & ~pl.col(
        "api_name").str.contains("Async")
    c = c.with_columns(blocking=(sync_api | (pl.col("direction") == "D2H")).fill_null(False))
    c = c.with_columns(bucket=pl.Series(size_bucket(c["bytes"].to_numpy()), dtype=pl.Int64)).sort("bucket")
    ref = pinned_bandwidth(model, by_size=True).filter(pl.col("pinned_gbps").is_not_null())
    c = c.join_asof(ref.select("direction", "bucket", "pinned_gbps").sort("bucket"), on="bucket",
                    by="direction", strategy="nearest", check_sortedness=False)
    fallback = pl.col("direction").replace_strict(FALLBACK_PINNED_GBPS, default=None, return_dtype=pl.Float64)
    c = c.with_columns(pinned_gbps=pl.when(pl.col("pinned_gbps").is_null() | (
        (pl.col("bytes") >= 1 << 20) & (pl.col("pinned_gbps") < MIN_PINNED_GBPS))).then(fallback)
        .otherwise(pl.col("pinned_gbps")))
    c = _with_exposed(model, c)
    c = c.with_columns(pinned_ns=pl.col("bytes") / pl.col("pinned_gbps"))
    keys = [*RANK, "start", "correlation_id"]
    if savings is not None and savings.height and c.height:
        sv = savings.select(*keys, "saving_ns", "scenario", "copy_back").cast({k: c.schema[k] for k in keys})
        c = c.join(sv.unique(keys, keep="first"), on=keys, how="left")
    else:
        c = c.with_columns(saving_ns=pl.lit(None, pl.Float64), scenario=pl.lit(None, pl.String),
                           copy_back=pl.lit(None, pl.Boolean))
    return c.sort(keys).select(COPY_COLUMNS)


def pinned_reference(model: PhaseModel, copies: pl.DataFrame, by=PHASE_KEYS) -> pl.DataFrame:
    """The pinned copies that ``copies``' (:func:`pageable_copies`) ``pinned_gbps`` rests on,
    per group: columns ``global_pid, device``, the ``by`` columns, ``direction``,
    ``ref_bytes`` and ``ref_ns`` (bytes and summed durations of the pinned copies of the size
    classes used as the reference), for :func:`tracekit.analyze.significance.differs`."""
    keys = [*RANK, *(b for b in by if b not in RANK), "direction"]
    ref = pinned_bandwidth(model, by_size=True).filter(pl.col("pinned_gbps").is_not_null())
    schema = {k: copies.schema[k] for k in keys} | {"ref_bytes": pl.Int64, "ref_ns": pl.Int64}
    if copies.height == 0 or ref.height == 0:
        return pl.DataFrame(schema=schema)
    c = copies.select(*keys, bucket=pl.Series(size_bucket(copies["bytes"].to_numpy()), dtype=pl.Int64)).sort("bucket")
    c = c.join_asof(ref.select("direction", "bucket", "pinned_bytes", "pinned_ns", ref_bucket="bucket").sort("bucket"),
                    on="bucket", by="direction", strategy="nearest", check_sortedness=False)
    c = c.filter(pl.col("ref_bucket").is_not_null()).select(*keys, "ref_bucket", "pinned_bytes", "pinned_ns").unique()
    return c.group_by(keys).agg(ref_bytes=pl.col("pinned_bytes").sum().cast(pl.Int64),
                                ref_ns=pl.col("pinned_ns").sum().cast(pl.Int64)).cast(schema)


def _with_exposed(model: PhaseModel, c: pl.DataFrame) -> pl.DataFrame:
    """``c`` with ``exposed_ns`` (Float64): each copy's duration minus its overlap with the union
    of its device's kernels (all kernels of the rank, as the what-if model counts them)."""
    import numpy as np

    from tracekit.analyze.model.intervals import covered_length

    if not c.height:
        return c.with_columns(exposed_ns=pl.lit(None, pl.Float64))
    parts = []
    for (gp, dev), g in c.group_by(RANK):
        # (the union of the rank's kernels, from the kept unions: no copy of the kernels' rows)
        ks, ke = all_kernel_union(model, gp, dev)
        s, e = g["start"].to_numpy(), g["end"].to_numpy()
        cov = covered_length(ks, ke, s, e) if len(ks) else np.zeros(len(s))
        parts.append(g.with_columns(exposed_ns=pl.Series((e - s) - cov, dtype=pl.Float64)))
    return pl.concat(parts)


def pageable_summary(model: PhaseModel, by=PHASE_KEYS, copies: pl.DataFrame | None = None,
                     export: Export | None = None) -> pl.DataFrame:
    """Pageable copies per rank, group ``by`` and direction.

    Columns: ``global_pid, device``, the ``by`` columns, ``direction``, ``count``, ``bytes``,
    ``copy_ns`` (summed durations), ``gbps`` (bytes / copy_ns), ``pinned_ns`` and
    ``saving_ns`` (summed over copies; null when none of them has one: see :func:`pageable_copies`),
    ``scenario`` (the what-if scenarios its copies' savings come from, "+"-joined; null for none),
    ``copy_back`` (any copy is the ZeRO-3 parameter copy-back), ``pinned_gbps`` (bytes / pinned_ns),
    ``blocking_count``, ``blocking_host_ns`` (host time in the API calls of blocking copies), ``host_ns`` (host
    time in the API calls of all of them).
    """
    by = check_by(by)
    c = copies if copies is not None else pageable_copies(model, export)
    keys = [*RANK, *by, "direction"]
    out = c.group_by(keys).agg(
        count=pl.len().cast(pl.Int64),
        bytes=pl.col("bytes").sum(),
        copy_ns=pl.col("duration_ns").sum(),
        pinned_ns=pl.col("pinned_ns").sum(),
        saving_ns=pl.when(pl.col("saving_ns").is_not_null().any()).then(pl.col("saving_ns").sum()),
        scenario=pl.col("scenario").drop_nulls().unique().sort().str.join("+"),
        copy_back=pl.col("copy_back").any(),
        blocking_count=pl.col("blocking").sum().cast(pl.Int64),
        blocking_host_ns=pl.col("host_ns").filter(pl.col("blocking")).sum(),
        host_ns=pl.col("host_ns").sum(),
    ).with_columns(gbps=gbps("bytes", "copy_ns"), pinned_gbps=gbps("bytes", "pinned_ns"),
                   scenario=pl.when(pl.col("scenario") != "").then(pl.col("scenario")))
    return sort_groups(out, by, ["direction"]).select(*keys, "count", "bytes", "copy_ns", "gbps", "pinned_gbps",
                                                   "pinned_ns", "saving_ns", "scenario", "copy_back",
                                                   "blocking_count", "blocking_host_ns", "host_ns")
