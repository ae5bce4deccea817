"""Copy-size distribution (issue 4): memcpy sizes per direction in power-of-two buckets.

Bucket k holds copies of [2^k, 2^(k+1)) bytes (k = floor(log2 bytes), computed exactly with
``frexp``); 0-byte copies are bucket -1. Per rank, group ``by`` (default ``("phase",)``),
direction and host memory kind (pinned, pageable; ``device`` for D2D).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.model.gpu_ops import with_strings
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.transfer_common import RANK, check_by, sort_groups


def size_bucket(nbytes) -> np.ndarray:
    """k with 2^k <= nbytes < 2^(k+1) (exact for integers below 2^53); -1 for 0 bytes."""
    b = np.asarray(nbytes, dtype=np.int64)
    _, e = np.frexp(b.astype(np.float64))
    return np.where(b > 0, e - 1, -1).astype(np.int64)


def copy_sizes(model: PhaseModel, by=("phase",), directions=("H2D", "D2H", "D2D")) -> pl.DataFrame:
    """Copy counts, bytes and time per power-of-two size bucket.

    Columns: ``global_pid, device``, the ``by`` columns, ``direction``, ``host_kind``
    (source kind of H2D, destination kind of D2H, source kind otherwise), ``bucket`` (k),
    ``bucket_lo`` = 2^k, ``bucket_hi`` = 2^(k+1) (bytes), ``count``, ``bytes``, ``copy_ns``
    (sum of copy durations, not a union), ``median_gbps`` (median of per-copy bytes/duration,
    0 ns copies left out). Sorted by rank, group, direction, kind, bucket.
    """
    by = check_by(by)
    # (the columns read below, picked before the copies' rows are gathered)
    need = list(dict.fromkeys([*RANK, *by, "direction", "src_kind", "dst_kind", "bytes", "start", "end"]))
    c = model.scan_ops().filter(
        (pl.col("kind") == "memcpy") & pl.col("direction").is_in(list(directions)) & pl.col("device").is_not_null()
    ).select(need)
    c = with_strings(c).with_columns(
        host_kind=pl.when(pl.col("direction") == "D2H").then(pl.col("dst_kind")).otherwise(pl.col("src_kind")),
        dur=pl.col("end") - pl.col("start"),
        **({"sub_phase": pl.col("sub_phase").fill_null("(none)")} if "sub_phase" in by else {}),
    ).drop("src_kind", "dst_kind", "start", "end").collect()
    c = c.with_columns(bucket=pl.Series(size_bucket(c["bytes"].to_numpy()), dtype=pl.Int64))
    keys = [*RANK, *by, "direction", "host_kind", "bucket"]
    out = c.group_by(keys).agg(
        count=pl.len().cast(pl.Int64),
        bytes=pl.col("bytes").sum(),
        copy_ns=pl.col("dur").sum(),
        median_gbps=(pl.col("bytes") / pl.col("dur")).filter(pl.col("dur") > 0).median(),
    )
    out = out.with_columns(
        bucket_lo=pl.when(pl.col("bucket") >= 0).then(pl.lit(2, pl.Int64).pow(pl.col("bucket"))).otherwise(0),
        bucket_hi=pl.lit(2, pl.Int64).pow(pl.col("bucket") + 1),
    )
    return sort_groups(out, by, ["direction", "host_kind", "bucket"]).select(*keys[:-1], "bucket", "bucket_lo", "bucket_hi", "count", "bytes",
                                                    "copy_ns", "median_gbps")
