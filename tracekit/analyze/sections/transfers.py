"""The transfer analyses of ``tracekit analyze`` as the views read them: the frames of the
selected sections, notes and findings (:class:`TransferResult`, from a run of the registry
:func:`tracekit.analyze.sections.run`), and their JSON rows (the ``--out`` files:
:mod:`tracekit.render.files`).

Sections (``--section``; ``--all`` selects every one):

==============  ======================================================================
overlap         :func:`tracekit.analyze.sections.overlap.overlap`
contention      :mod:`tracekit.analyze.sections.contention` (windows, summaries, uncontended GB/s)
sizes           :func:`tracekit.analyze.sections.copy_sizes.copy_sizes`
pageable        :mod:`tracekit.analyze.sections.pageable`
memory          :mod:`tracekit.analyze.sections.memory` (peaks; the event timeline goes to --out)
timeline        :func:`tracekit.analyze.sections.throughput.throughput_timeline`
pcie            :mod:`tracekit.analyze.sections.pcie_metrics` (reads GPU_METRICS: slower)
opportunities   :mod:`tracekit.analyze.sections.opportunities`
idle            :mod:`tracekit.analyze.sections.idle` (GPU idle by cause, launch statistics)
==============  ======================================================================

The findings summary always needs overlap, contention, pageable and the opportunities at phase
level; those are computed for every run (they are cheap). A section whose data the trace lacks
is skipped with a note naming the nsys option.

Findings leave out the iterations that hold a window whose NVTX range never closed
(:func:`tracekit.analyze.model.phases.steady_model`): their frames are computed again without them
when there are any. The section frames cover every window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit.analyze.model.phases import PhaseModel

# the registry (tracekit.analyze.sections) imports no polars, so that the CLI can parse --section
# and answer from the result cache without importing the analysis stack
from tracekit.analyze.sections import FILE_ONLY, PER_WINDOW, REGISTRY, SECTION_FRAMES, Context, order, run, throughput  # noqa: E402,F401
from tracekit.analyze.sections.transfer_common import _INF
from tracekit.analyze.sections.transfer_common import json_rows as _rows
from tracekit.analyze.trace.export import Export
from tracekit.vocab import INTEGRAL_SUFFIXES, json_number


@dataclass
class TransferResult:
    """Frames of the run (name -> polars frame), notes on skipped sections, findings.

    The ``timeline`` section's ``throughput_timeline`` is held as a
    :class:`tracekit.analyze.sections.throughput.Timeline` (:attr:`timeline`) and becomes a frame of
    :attr:`frames` only when that is read (``--out``, :attr:`tracekit.analysis.Analysis.frames`);
    the terminal and JSON views take its peaks and rows chunk by chunk (issue 13)."""

    stored: dict[str, pl.DataFrame]
    sections: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    #: frames of :func:`tracekit.analyze.sections.multi_gpu.analyze_multi_gpu` (host contention,
    #: communication, waiting ranks), computed for every run
    multi_gpu: dict[str, pl.DataFrame] = field(default_factory=dict)
    #: whether the ``pcie`` section kept its samples (``pcie_series``; ``keep_samples``)
    kept_samples: bool = False
    #: the copy throughput timeline (``timeline`` section), None when not selected
    timeline: throughput.Timeline | None = None
    #: file-only frames built when :attr:`frames` is read, by name (``memory_timeline``:
    #: a :class:`tracekit.analyze.sections.memory.DeferredTimeline`)
    deferred: dict = field(default_factory=dict)

    @property
    def frames(self) -> dict[str, pl.DataFrame]:
        """Every frame by name, ``throughput_timeline`` and the :attr:`deferred` frames built
        (whole) on first access."""
        if self.timeline is not None and "throughput_timeline" not in self.stored:
            self.stored["throughput_timeline"] = self.timeline.frame()
        for name in list(self.deferred):
            self.stored[name] = self.deferred.pop(name).frame()
        return self.stored

    def rank_sections(self, global_pid: int, device: int, phase: str | None = None,
                      iteration: int | None = None, timeline_rows: bool = True) -> dict:
        """``{section: {frame name: [row dicts]}}`` of one rank for the selected sections, rows
        narrowed to ``phase``/``iteration`` where the frame has those columns.

        ``timeline_rows`` False: the ``timeline`` section holds ``throughput_peaks`` (the rows of
        :func:`tracekit.analyze.sections.throughput.timeline_peaks`: all the terminal view prints) in
        place of the per-bin ``throughput_timeline`` rows (605 k on a 2.5 GB trace, issue 13),
        computed chunk by chunk (:meth:`~tracekit.analyze.sections.throughput.Timeline.peaks`);
        :meth:`rank_frame_rows` gives those rows when the JSON needs them."""
        out: dict[str, dict] = {}
        for sec in self.sections:
            d = {}
            for name in SECTION_FRAMES[sec]:
                if name in FILE_ONLY:
                    continue
                if name == "throughput_timeline" and self.timeline is not None and name not in self.stored:
                    if timeline_rows:
                        d[name] = self.rank_frame_rows(name, global_pid, device, phase, iteration)
                    else:
                        d["throughput_peaks"] = _rows(self.timeline.peaks(global_pid, device, phase, iteration)
                                                      .drop("global_pid", "device"))
                    continue
                f = self.stored.get(name)
                if f is None:
                    continue
                if name == "throughput_timeline" and not timeline_rows:  # (timeline_peaks groups by rank)
                    f = self._rank_frame(f, global_pid, device, phase, iteration, keep_rank=True)
                    d["throughput_peaks"] = _rows(throughput.timeline_peaks(f).drop("global_pid", "device"))
                else:
                    d[name] = _rows(self._rank_frame(f, global_pid, device, phase, iteration))
            if d:
                out[sec] = d
        return out

    def rank_frame_rows(self, name: str, global_pid: int, device: int, phase: str | None = None,
                        iteration: int | None = None) -> list[dict]:
        """The rows of frame ``name`` for one rank, as :meth:`rank_sections` gives them."""
        if name == "throughput_timeline" and self.timeline is not None and name not in self.stored:
            rows: list[dict] = []
            for f in self.timeline.rank_chunks(global_pid, device, phase, iteration):
                rows.extend(_rows(f))
            return rows
        return _rows(self._rank_frame(self.frames[name], global_pid, device, phase, iteration))

    def rank_json_rows(self, name: str, global_pid: int, device: int, phase: str | None = None,
                       iteration: int | None = None) -> "JsonRows":
        """The rows :meth:`rank_frame_rows` gives, as :class:`JsonRows`: their JSON text built
        column by column, chunk by chunk for the timeline (nothing per row or value in Python)."""
        if name == "throughput_timeline" and self.timeline is not None and name not in self.stored:
            tl = self.timeline
            return JsonRows(lambda: tl.rank_chunks(global_pid, device, phase, iteration))
        f = self._rank_frame(self.frames[name], global_pid, device, phase, iteration)
        return JsonRows(lambda: iter([f]))

    @staticmethod
    def _rank_frame(f: pl.DataFrame, global_pid: int, device: int, phase: str | None,
                    iteration: int | None, keep_rank: bool = False) -> pl.DataFrame:
        if "global_pid" in f.columns:
            f = f.filter((pl.col("global_pid") == global_pid) & (pl.col("device") == device))
            if not keep_rank:
                f = f.drop("global_pid", "device")
        if phase and "phase" in f.columns:
            f = f.filter(pl.col("phase") == phase)
        if iteration is not None and "iteration" in f.columns:
            f = f.filter(pl.col("iteration") == iteration)
        return f


class JsonRows(list):
    """Rows of frames, written to JSON column by column (issue 13): what :func:`_rows` gives as
    dicts, as text. ``frames()`` gives the frames (a fresh iterator each call: the timeline's
    chunks, :meth:`tracekit.analyze.sections.throughput.Timeline.rank_chunks`).

    A ``list`` only so that :func:`tracekit.analyze.trace.json_format.format_json` lays its parent out
    as a container; the list itself stays empty: the writer asks :meth:`json_blocks` for the
    text, and :meth:`rows` builds the dicts where a caller needs them."""

    def __init__(self, frames) -> None:
        super().__init__()
        self.frames = frames

    def rows(self) -> list[dict]:
        """The rows as :func:`_rows` builds them (dicts, one per row)."""
        out: list[dict] = []
        for f in self.frames():
            out.extend(_rows(f))
        return out

    def json_blocks(self, sep: str):
        """Yield the rows' JSON text, each block the rows of one frame joined by ``sep``; every
        row is exactly ``json.dumps(row)`` of its :func:`_rows` dict (keys in column order,
        ``", "`` and ``": "`` separators, ASCII). Empty frames yield nothing."""
        for f in self.frames():
            if f.height:
                yield json_row_text(f, sep)


def _float_texts(name: str, s: pl.Series) -> pl.Series:
    """JSON text of each value of a float column as :func:`_rows` writes it (rounded to 6
    decimals, an integral ns/bytes/count value as an int, NaN/inf/null as null): Python's
    rounding and repr applied once per distinct value (bit pattern), gathered back in polars."""
    import json

    import numpy as np

    nulls = s.is_null()
    a = s.cast(pl.Float64).fill_null(0.0).to_numpy()
    bits, inv = np.unique(a.view(np.int64), return_inverse=True)
    integral = name.endswith(INTEGRAL_SUFFIXES)
    texts = []
    for v in bits.view(np.float64).tolist():
        if integral:
            v = json_number(name, v)
        else:
            v = None if v != v or v in _INF else round(v, 6)
        texts.append(json.dumps(v))
    out = pl.Series(name, texts, dtype=pl.String).gather(inv.ravel())
    return pl.select(pl.when(nulls).then(pl.lit("null")).otherwise(out).alias(name)).to_series()


def json_row_text(f: pl.DataFrame, sep: str = ", ") -> str:
    """The rows of ``f`` as JSON objects joined by ``sep``, each exactly ``json.dumps`` of its
    :func:`_rows` dict, built by one columnar pass: integers and booleans cast in polars,
    strings and floats encoded once per distinct value (``json.dumps``) and gathered, the
    pieces concatenated by ``concat_str``. Columns of other types (lists, structs, dates) go
    through :func:`_rows` and the C encoder instead."""
    import json

    pieces: list = []
    cols: dict[str, pl.Series] = {}
    for i, (name, dtype) in enumerate(f.schema.items()):
        pieces.append(pl.lit(("{" if i == 0 else ", ") + json.dumps(name) + ": "))
        s = f[name]
        if dtype == pl.Boolean:
            t = pl.select(pl.when(s.is_null()).then(pl.lit("null")).when(s).then(pl.lit("true"))
                          .otherwise(pl.lit("false")).alias(name)).to_series()
        elif dtype.is_integer():
            t = s.cast(pl.String).fill_null("null")
        elif dtype.is_float():
            t = _float_texts(name, s)
        elif dtype == pl.String:
            u = s.drop_nulls().unique()
            t = s.replace_strict(u, [json.dumps(v) for v in u.to_list()], return_dtype=pl.String).fill_null("null")
        else:
            return sep.join(json.dumps(r) for r in _rows(f))
        cols[f"_c{i}"] = t
        pieces.append(pl.col(f"_c{i}"))
    pieces.append(pl.lit("}"))
    return pl.DataFrame(cols).select(pl.concat_str(pieces).str.join(sep)).item()


def analyze_transfers(
    export: Export,
    model: PhaseModel,
    sections: tuple[str, ...] = (),
    pcie_threshold: float = 80.0,
    bin_ns: int = 1_000_000,
    keep_samples: bool = False,
) -> TransferResult:
    """Compute the selected ``sections``, the multi-GPU frames and the findings of their rules
    (the registry's loop, :func:`tracekit.analyze.sections.run`; no advice or CPU update, so
    their findings are those of a whole analysis, :func:`tracekit.analyze.result.compute`); see
    module doc.

    ``keep_samples``: also keep ``pcie_series`` (one row per PCIe sample, for ``--out``); without
    it the samples are streamed and only their per-window reduction is held
    (:func:`tracekit.analyze.sections.pcie_metrics.reduce_pcie`).

    Frame names: overlap (per phase window), overlap_phase (whole trace per phase),
    overlap_sub_phase (per iteration, phase and sub-phase), overlap_total (one row per rank), contention, contention_phase,
    contention_sub_phase, contention_windows, uncontended_bandwidth, copy_sizes,
    pageable, pageable_phase (per phase and sub-phase), pageable_copies, pinned_bandwidth,
    memory_peaks, memory_phase, memory_timeline, throughput_timeline, pcie, pcie_phase,
    pcie_saturation, pcie_series, round_trips, round_trip_summary, update_opportunity, idle,
    idle_by_api, idle_sub_phase, launch_stats.
    """
    ctx = Context(export, model, tuple(sections), pcie_threshold, bin_ns, keep_samples)
    return transfer_result(run(ctx, (*REGISTRY, "findings")))


def transfer_result(ctx: Context) -> TransferResult:
    """The :class:`TransferResult` of a run of the registry (:func:`tracekit.analyze.sections.run`):
    the frames of the selected sections, the notes, the findings (``transfer_findings``, when
    the findings ran) and the multi-GPU frames."""
    frames = {k: ctx.out[k] for s in ctx.ran if REGISTRY.get(s) is not None for k in ctx.produced[s]}
    timeline = frames.pop("timeline", None)  # rows built on demand
    kept = {k: v for k, v in frames.items() if any(k in SECTION_FRAMES[s] for s in ctx.sections)}
    deferred = {k: kept.pop(k) for k in [k for k, v in kept.items() if not isinstance(v, pl.DataFrame)
                                         and hasattr(v, "frame")]}
    return TransferResult(stored=kept, sections=tuple(ctx.sections), notes=ctx.notes, deferred=deferred,
                          findings=ctx.out.get("transfer_findings", []),
                          multi_gpu={k: ctx.out[k] for k in ctx.produced["multi_gpu"]},
                          kept_samples=ctx.keep_samples, timeline=timeline)
