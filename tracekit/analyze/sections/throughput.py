"""Copy throughput timeline: bytes per second per copy direction in fixed time bins.

Definition (issue 4): per rank and direction, the bytes of each copy are spread evenly over
its [start, end) GPU interval; a bin's bytes are what all copies delivered inside it, its
``gbps`` = bytes / bin length (GB/s = 1e9 B/s). Bins are aligned to multiples of ``bin_ns``
from the start of the rank's first phase window to the end of its last, empty bins included.
Computed without materializing copy x bin pairs: the cumulative delivered-bytes function is
piecewise linear and is evaluated at the bin edges (:func:`tracekit.analyze.model.intervals.spread_cumulative`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.model.intervals import spread_cumulative
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.transfer_common import RANK, attach_window
from tracekit.errors import TracekitError

DIRECTIONS = ("H2D", "D2H", "D2D")
#: Most bins of a trace, all ranks and directions together (each bin is a row; 2 M rows take about
#: 1 GB while the timeline is built, and more again in --json). A 1 ms bin fits 1000 s of one rank.
MAX_BINS = 2_000_000


def _bin_count(spans: list[tuple[int, int]], bin_ns: int, n_directions: int) -> int:
    """Rows of the timeline: per rank span [lo, hi], the bins from ``lo`` rounded down to a
    multiple of ``bin_ns`` through ``hi``, once per direction."""
    return sum(-(-(hi - (lo // bin_ns) * bin_ns) // bin_ns) * n_directions for lo, hi in spans)


def check_bin_count(spans: list[tuple[int, int]], bin_ns: int, n_directions: int) -> None:
    """Raise :class:`TracekitError` (naming a ``--bin-ms`` that fits: the smallest 1, 2 or 5
    times a power of ten) when the rank ``spans`` (ns) would take more than :data:`MAX_BINS` bins."""
    n = _bin_count(spans, bin_ns, n_directions)
    if n <= MAX_BINS:
        return
    length = sum(hi - lo for lo, hi in spans)
    ok = next(b for b in (m * 10 ** e for e in range(3, 13) for m in (1, 2, 5))
              if b >= bin_ns and _bin_count(spans, b, n_directions) <= MAX_BINS)
    where = f"{len(spans)} ranks, {length / 1e9:.3g} s in all" if len(spans) > 1 else f"{length / 1e9:.3g} s"
    raise TracekitError(
        f"--bin-ms {bin_ns / 1e6:g} gives {n:,} timeline bins ({where} x {n_directions} copy directions; "
        f"at most {MAX_BINS:,}, to keep memory bounded); use --bin-ms {ok / 1e6:g} or more"
    )


def throughput_timeline(
    model: PhaseModel, bin_ns: int = 1_000_000, directions: tuple[str, ...] = ("H2D", "D2H")
) -> pl.DataFrame:
    """Bytes per bin and direction for each rank.

    Columns: ``global_pid, device, direction, bin_start, bin_end`` (ns), ``bytes`` (Float64,
    fractional where a copy straddles a bin edge), ``gbps``, ``window_id, iteration, phase,
    micro_step, boundary`` (phase window containing the bin start). Sorted by rank,
    direction, bin_start.

    Raises :class:`~tracekit.errors.TracekitError` for ``bin_ns < 1`` or when the timeline
    would have more than :data:`MAX_BINS` bins, all ranks and directions together (a memory
    guard, checked before any bin is built; :func:`check_bin_count`).
    """
    if bin_ns < 1:
        raise TracekitError("--bin-ms must be positive")
    c = model.ops.filter((pl.col("kind") == "memcpy") & pl.col("direction").is_in(list(directions)))
    c = c.filter(pl.col("device").is_not_null())
    spans = model.windows.group_by("global_pid").agg(lo=pl.col("start").min(), hi=pl.col("end").max())
    ranks = []
    for (gpid, dev), rc in c.group_by(RANK):
        span = spans.filter(pl.col("global_pid") == gpid)
        lo = min(int(rc["start"].min()), int(span["lo"][0]) if span.height else int(rc["start"].min()))
        hi = max(int(rc["end"].max()), int(span["hi"][0]) if span.height else int(rc["end"].max()))
        ranks.append((gpid, dev, rc, lo, hi))
    check_bin_count([(lo, hi) for *_, lo, hi in ranks], bin_ns, len(directions))  # before any bin is built
    parts = []
    for gpid, dev, rc, lo, hi in ranks:
        first = (lo // bin_ns) * bin_ns
        edges = np.arange(first, hi + bin_ns, bin_ns, dtype=np.int64)
        for d in directions:
            dc = rc.filter(pl.col("direction") == d)
            cum = spread_cumulative(dc["start"].to_numpy(), dc["end"].to_numpy(), dc["bytes"].to_numpy(), edges)
            b = np.diff(cum)
            parts.append(pl.DataFrame({
                "global_pid": np.full(b.size, gpid, dtype=np.int64),
                "device": np.full(b.size, dev, dtype=np.int64),
                "direction": [d] * b.size,
                "bin_start": edges[:-1],
                "bin_end": edges[1:],
                "bytes": np.maximum(b, 0.0),
            }))
    if not parts:
        schema = {"global_pid": pl.Int64, "device": pl.Int64, "direction": pl.String, "bin_start": pl.Int64,
                  "bin_end": pl.Int64, "bytes": pl.Float64, "gbps": pl.Float64}
        return attach_window(model, pl.DataFrame(schema=schema), "bin_start")
    out = pl.concat(parts).with_columns(gbps=pl.col("bytes") / (pl.col("bin_end") - pl.col("bin_start")))
    out = attach_window(model, out, "bin_start")
    return out.sort([*RANK, "direction", "bin_start"])


def timeline_peaks(timeline: pl.DataFrame) -> pl.DataFrame:
    """The terminal view's one line of a :func:`throughput_timeline` frame, by one group-by
    (no per-bin Python work, issue 13): per rank, phase and direction, ``bins`` (count),
    ``bin_ns`` (bin length, ns) and ``peak_gbps`` (the largest bin's GB/s; 0.0 when no copy
    moved bytes). Columns ``global_pid, device, phase, direction, bins, bin_ns, peak_gbps``,
    sorted by rank, phase, direction; empty for an empty timeline."""
    return timeline.group_by([*RANK, "phase", "direction"]).agg(
        bins=pl.len().cast(pl.Int64),
        bin_ns=(pl.col("bin_end") - pl.col("bin_start")).first(),
        peak_gbps=pl.col("gbps").fill_null(0.0).max(),
    ).sort([*RANK, "phase", "direction"])
