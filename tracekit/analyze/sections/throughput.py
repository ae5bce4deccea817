"""Copy throughput timeline: bytes per second per copy direction in fixed time bins.

Definition (issue 4): per rank and direction, the bytes of each copy are spread evenly over
its [start, end) GPU interval; a bin's bytes are what all copies delivered inside it, its
``gbps`` = bytes / bin length (GB/s = 1e9 B/s). Bins are aligned to multiples of ``bin_ns``
from the start of the rank's first phase window to the end of its last, empty bins included.
Computed without materializing copy x bin pairs: the cumulative delivered-bytes function is
piecewise linear and is evaluated at the bin edges (:func:`tracekit.analyze.model.intervals.spread_cumulative`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import polars as pl

from tracekit.analyze.model.gpu_ops import with_strings
from tracekit.analyze.model.intervals import SpreadCumulative
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
    ok = next((b for b in (m * 10 ** e for e in range(3, 13) for m in (1, 2, 5))
               if b >= bin_ns and _bin_count(spans, b, n_directions) <= MAX_BINS), None)
    where = f"{len(spans)} ranks, {length / 1e9:.3g} s in all" if len(spans) > 1 else f"{length / 1e9:.3g} s"
    what = (f"use --bin-ms {ok / 1e6:g} or more" if ok is not None else
            "no bin up to 5,000 s fits: a time in the trace is implausible; analyze without the timeline "
            "section (--section with the others)")
    raise TracekitError(
        f"--bin-ms {bin_ns / 1e6:g} gives {n:,} timeline bins ({where} x {n_directions} copy directions; "
        f"at most {MAX_BINS:,}, to keep memory bounded); {what}"
    )


def throughput_timeline(
    model: PhaseModel, bin_ns: int = 1_000_000, directions: tuple[str, ...] = ("H2D", "D2H")
) -> pl.DataFrame:
    """Bytes per bin and direction for each rank.

    Columns: ``global_pid, device, direction, bin_start, bin_end`` (ns), ``bytes`` (Float64,
    fractional where a copy straddles a bin edge), ``gbps``, ``window_id, iteration, phase,
    micro_step, boundary`` (phase window containing the bin start). Sorted by rank,
    direction, bin_start. The whole frame at once: :class:`Timeline` gives the same rows in
    bounded chunks, its peaks and its JSON rows without holding them all.

    Raises :class:`~tracekit.errors.TracekitError` for ``bin_ns < 1`` or when the timeline
    would have more than :data:`MAX_BINS` bins, all ranks and directions together (a memory
    guard, checked before any bin is built; :func:`check_bin_count`).
    """
    return Timeline(model, bin_ns, directions).frame()


#: Bins per chunk of :meth:`Timeline.chunks` (a chunk frame of 12 columns: about 6 MB).
CHUNK_BINS = 65_536


class Timeline:
    """The copy throughput timeline of :func:`throughput_timeline`, columnar and lazy (issue 13):
    holds per rank the bin grid and each direction's prepared cumulative delivered bytes
    (:class:`tracekit.analyze.model.intervals.SpreadCumulative`: a few arrays per copy), and
    builds the per-bin rows only on demand, :data:`CHUNK_BINS` bins at a time, so that what is
    held does not grow with the length of the capture. A 1 ms timeline of a long capture has
    hundreds of thousands of bins; the terminal view needs only its peaks (:meth:`peaks`).

    Raises :class:`~tracekit.errors.TracekitError` as :func:`throughput_timeline` does.
    """

    def __init__(self, model: PhaseModel, bin_ns: int = 1_000_000,
                 directions: tuple[str, ...] = ("H2D", "D2H")) -> None:
        if bin_ns < 1:
            raise TracekitError("--bin-ms must be positive")
        self.model, self.bin_ns, self.directions = model, int(bin_ns), tuple(directions)
        # (the columns read here, picked before the copies' rows are gathered)
        c = model.scan_ops().filter((pl.col("kind") == "memcpy") & pl.col("direction").is_in(list(directions))
                                    & pl.col("device").is_not_null())
        c = with_strings(c.select(*RANK, "direction", "start", "end", "bytes")).collect()
        spans = model.windows.group_by("global_pid").agg(lo=pl.col("start").min(), hi=pl.col("end").max())
        ranks = []
        for (gpid, dev), rc in c.group_by(RANK):
            span = spans.filter(pl.col("global_pid") == gpid)
            lo = min(int(rc["start"].min()), int(span["lo"][0]) if span.height else int(rc["start"].min()))
            hi = max(int(rc["end"].max()), int(span["hi"][0]) if span.height else int(rc["end"].max()))
            ranks.append((gpid, dev, rc, lo, hi))
        check_bin_count([(lo, hi) for *_, lo, hi in ranks], bin_ns, len(directions))  # before any bin is built
        #: per rank, in the frame's order: (global_pid, device, first bin start, bins, {direction: cumulative})
        self.ranks: list[tuple[int, int, int, int, dict]] = []
        for gpid, dev, rc, lo, hi in sorted(ranks, key=lambda r: (r[0], r[1])):
            first = (lo // bin_ns) * bin_ns
            n_bins = len(range(first, hi + bin_ns, bin_ns)) - 1
            cums = {}
            for d in sorted(directions):
                dc = rc.filter(pl.col("direction") == d)
                cums[d] = SpreadCumulative(dc["start"].to_numpy(), dc["end"].to_numpy(), dc["bytes"].to_numpy())
            self.ranks.append((gpid, dev, first, n_bins, cums))

    @property
    def height(self) -> int:
        """Rows of the whole timeline (bins x directions, all ranks)."""
        return sum(n * len(c) for _, _, _, n, c in self.ranks)

    def empty(self) -> pl.DataFrame:
        """The timeline's columns, no rows."""
        schema = {"global_pid": pl.Int64, "device": pl.Int64, "direction": pl.String, "bin_start": pl.Int64,
                  "bin_end": pl.Int64, "bytes": pl.Float64, "gbps": pl.Float64}
        return attach_window(self.model, pl.DataFrame(schema=schema), "bin_start")

    def chunks(self, global_pid: int | None = None, device: int | None = None,
               rows: int = CHUNK_BINS) -> Iterator[pl.DataFrame]:
        """The rows of :func:`throughput_timeline` (of one rank when ``global_pid``/``device`` are
        given), in its order, as frames of at most ``rows`` bins each."""
        bn = self.bin_ns
        for gpid, dev, first, n, cums in self.ranks:
            if (global_pid is not None and gpid != global_pid) or (device is not None and dev != device):
                continue
            for d, cum in cums.items():
                for i0 in range(0, n, rows):
                    i1 = min(n, i0 + rows)
                    edges = first + bn * np.arange(i0, i1 + 1, dtype=np.int64)
                    b = np.diff(cum(edges))
                    f = pl.DataFrame({
                        "global_pid": np.full(b.size, gpid, dtype=np.int64),
                        "device": np.full(b.size, dev, dtype=np.int64),
                        "direction": pl.Series([d], dtype=pl.String).new_from_index(0, b.size),
                        "bin_start": edges[:-1],
                        "bin_end": edges[1:],
                        "bytes": np.maximum(b, 0.0),
                    }).with_columns(gbps=pl.col("bytes") / (pl.col("bin_end") - pl.col("bin_start")))
                    yield attach_window(self.model, f, "bin_start")

    def frame(self) -> pl.DataFrame:
        """The whole timeline as one frame (:func:`throughput_timeline`)."""
        parts = list(self.chunks())
        return pl.concat(parts) if parts else self.empty()

    def rank_chunks(self, global_pid: int, device: int, phase: str | None = None,
                    iteration: int | None = None) -> Iterator[pl.DataFrame]:
        """The chunks of one rank narrowed to ``phase``/``iteration`` (None: all), without the
        ``global_pid, device`` columns: what ``--json`` prints as that rank's
        ``throughput_timeline`` rows (empty chunks left out)."""
        for f in self._narrowed(global_pid, device, phase, iteration):
            if f.height:
                yield f.drop("global_pid", "device")

    def _narrowed(self, global_pid: int | None, device: int | None, phase: str | None,
                  iteration: int | None) -> Iterator[pl.DataFrame]:
        """:meth:`chunks` of the rank(s) given, each filtered to ``phase``/``iteration`` (None: all)."""
        for f in self.chunks(global_pid, device):
            if phase:
                f = f.filter(pl.col("phase") == phase)
            if iteration is not None:
                f = f.filter(pl.col("iteration") == iteration)
            yield f

    def peaks(self, global_pid: int | None = None, device: int | None = None, phase: str | None = None,
              iteration: int | None = None) -> pl.DataFrame:
        """:func:`timeline_peaks` of the timeline (of one rank, narrowed to ``phase``/``iteration``),
        chunk by chunk: counts summed and maxima taken across the chunks' group-bys."""
        keys = [*RANK, "phase", "direction"]
        parts = [timeline_peaks(f) for f in self._narrowed(global_pid, device, phase, iteration)]
        if not parts:
            return timeline_peaks(self.empty())
        return pl.concat(parts).group_by(keys).agg(
            bins=pl.col("bins").sum(), bin_ns=pl.col("bin_ns").first(), peak_gbps=pl.col("peak_gbps").max()
        ).sort(keys)


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
