"""The one pipeline: ``tracekit.analyze(path, **options) -> Analysis`` (issue 10).

Every command gets its numbers here: ``tracekit analyze`` (tables, ``--json``, ``--format``,
``--out``), ``tracekit report``, ``tracekit compare``, many traces and Dask. An
:class:`Analysis` holds the result of one trace once; JSON, tables, figures and files are views
of it. Several traces are :mod:`tracekit.analysis_many` (which imports this module and
:mod:`tracekit.analyze.multi`; this one imports neither). Example (a notebook)::

    import tracekit
    a = tracekit.analyze("run.sqlite")                 # or analyze("run.sqlite", phase="update")
    a.phases.filter(pl.col("phase") == "update")       # one row per rank, iteration, phase, micro-step
    a.copies.group_by("phase", "direction").agg(pl.col("bytes").sum())
    a.frames["overlap_phase"], a.findings, a.advice
    a.to_json()                                        # exactly what `tracekit analyze --json` prints
    a.phases.to_pandas()                               # with pandas installed

Every frame is a polars DataFrame; units: ns, bytes, GB/s = 1e9 B/s. Ranks are named by OS
``pid`` and CUDA ``device`` (and distributed ``rank`` where the trace tells it), text (kernel,
range, thread and API names) as text, never as string ids.

Caching lives in the reading layer (:mod:`tracekit.analyze.trace.cache`, beside the trace): a result
computed before for the same trace, options and tracekit code is read back; frames that the
result does not hold (copies, kernels, sub-phases, ``frames``) are computed from the phase model
when first asked for, and the model is built once per :class:`Analysis`.

Over 500 lines because :class:`Analysis` is one class: each frame (phases, sub-phases, copies,
kernels, frames, findings, advice) is a short property over the one result and model it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.errors import TracekitError
from tracekit.options import SECTIONS, Options
from tracekit.vocab import PHASES, TID_MASK

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

    from tracekit.analyze.section_data import SectionData

__all__ = ["Analysis", "analyze", "Options"]


def finding_line(finding: dict) -> str:
    """The one-line summary of a finding dict (``--json``'s ``findings`` rows): its ``summary``
    when the analysis set one, else computed now
    (:func:`tracekit.analyze.sections.finding_summary.summary`, for results kept from before)."""
    if finding.get("summary"):
        return finding["summary"]
    from tracekit.analyze.sections.finding_summary import summary

    return summary(finding)


def finding_basis_note() -> str:
    """What ``ms/it`` and ``in all`` mean in :func:`finding_line`'s lines (one line of text)."""
    from tracekit.analyze.sections.finding_summary import BASIS_NOTE

    return BASIS_NOTE


def _trace_cache(path: Path, options: Options):
    """The trace's :class:`tracekit.analyze.trace.cache.TraceCache` when caching is on and usable, else None."""
    from tracekit.analyze.trace.cache import open_trace_cache

    return open_trace_cache(path, options.cache)


def result_key(path: Path, options: Options, tc) -> str:
    """The result cache's key of ``path`` with ``options`` (for the stored JSON and terminal text)."""
    return tc.result_key(options.key(), str(path))


def cached_result_text(path: str | Path, options: Options) -> str | None:
    """The JSON text ``--json`` printed before for ``path`` with ``options`` (stored by
    :func:`analyze`), without parsing it or loading polars; None when there is none, caching is
    off or the trace changed."""
    path = Path(path)
    tc = _trace_cache(path, options)
    return None if tc is None else tc.get_result_text(result_key(path, options, tc))


def analyze(path: str | Path, options: Options | dict | None = None, **kwargs) -> "Analysis":
    """Analyze one nsys SQLite export (opened read-only).

    Args:
        path: the trace (``nsys export --type sqlite``).
        options: an :class:`tracekit.options.Options` or a dict of its fields; ``kwargs``
            (``phase="update"``, ``sections=("overlap",)``, ``cache=False``, ...) override them.

    Returns an :class:`Analysis`. Raises :class:`TracekitError` (one line) for a file that is not
    a readable nsys export, a trace without CUDA activity, an option out of range or an
    ``iteration`` the trace lacks.
    """
    path = Path(path)
    opts = Options.of(options, **kwargs)
    tc = _trace_cache(path, opts)
    key = None
    if tc is not None:
        key = result_key(path, opts, tc)
        hit = tc.get_result(key)
        if hit is not None:
            return Analysis(path, opts, hit)
    from tracekit.analyze.result import compute
    from tracekit.analyze.trace.export import Export

    with Export.open(path, cache=tc if tc is not None else False) as export:
        if "pcie" in opts.sections:
            from tracekit.analyze.sections.pcie_metrics import prefetch_series

            prefetch_series(export)  # the GPU_METRICS scan overlaps the phase model and other sections
        # the per-bin timeline rows are built when the JSON is asked for, not for the tables
        result, parts = compute(export, opts, defer_timeline=True, keep_ranges=True)
    a = Analysis(path, opts, result, parts)
    if key is not None:
        a._put_result(tc, key)  # the stored result is the whole JSON
    return a


class Analysis:
    """The analysis of one trace (see the module doc). Build it with :func:`analyze`.

    Attributes:
        path: the trace.
        options: the :class:`~tracekit.options.Options` it was computed with.
    """

    def __init__(self, path: Path, options: Options, result: dict, parts: dict | None = None) -> None:
        self.path = Path(path)
        self.options = options
        self._result = result
        self._parts = dict(parts or {})
        self._memo: dict = {}

    @classmethod
    def of_export(cls, export, options: Options | dict | None = None, step=None) -> "Analysis":
        """The analysis of an already open :class:`tracekit.analyze.trace.export.Export` (``tracekit
        report`` and ``compare`` keep the export open for their figures); no result cache.
        ``step(message)`` is called before each stage."""
        from tracekit.analyze.result import compute

        opts = Options.of(options)
        result, parts = compute(export, opts, step)
        return cls(Path(export.path), opts, result, parts)

    def part(self, name: str):
        """What the result was built from (``model``, ``table`` = :func:`breakdown.phase_table`,
        ``totals`` = :func:`breakdown.totals`, ``transfers``), computed when missing."""
        if name == "model":
            return self.model
        if name not in self._parts:
            from tracekit.analyze.sections import breakdown

            if name == "table":
                self._parts["table"] = breakdown.phase_table(self.model)
            elif name == "totals":
                self._parts["totals"] = breakdown.totals(self.model)
            elif name == "transfers":
                return self._transfers(tuple(self.options.sections))
            else:
                raise KeyError(name)
        return self._parts[name]

    def section_data(self, export) -> "SectionData":
        """The section frames the figures draw (memory timeline, PCIe samples, overlap, idle time,
        what-if pieces: :class:`tracekit.analyze.section_data.SectionData`) over ``export``, the
        open export of this trace, on this analysis's phase model."""
        from tracekit.analyze.section_data import SectionData

        return SectionData(self.path, export, self.model)

    def out_frame_names(self) -> set[str]:
        """The names of the frames of the ``sections`` option's sections (every section's without
        it): what ``--out`` writes beside the phase tables (the registry's
        :data:`tracekit.analyze.sections.SECTION_FRAMES`)."""
        from tracekit.analyze.sections import SECTION_FRAMES

        return {n for s in (self.options.sections or SECTIONS) for n in SECTION_FRAMES[s]}

    def advice_result(self) -> dict:
        """``config``, ``advice``, ``one_time_costs`` and ``predictions`` of the result
        (:func:`tracekit.analyze.sections.advice.advise`, docs/advice.md), as ``--json`` has them."""
        r = self._result
        return {k: r.get(k) for k in ("config", "advice", "one_time_costs", "predictions")}

    def __repr__(self) -> str:
        r = self._result
        return (f"Analysis({str(self.path)!r}: {len(r.get('ranks', []))} rank(s), "
                f"{r.get('summary', {}).get('iterations', 0)} iteration(s))")

    # ------------------------------------------------------------------ JSON view
    def to_json(self) -> dict:
        """The JSON-ready dict ``tracekit analyze --json`` prints (shape:
        :mod:`tracekit.analyze.result`). The same object on every call: do not modify it."""
        self._fill_timeline(self._parts.pop("timeline_deferred", ()))
        return self._result

    def json_text(self) -> str:
        """Exactly the text ``tracekit analyze --json`` prints (rows one per line)."""
        from tracekit.analyze.trace.json_format import format_json

        replaced = self._fill_timeline(self._parts.get("timeline_deferred"), columnar=True)
        try:
            return format_json(self._result)
        finally:
            self._restore_peaks(replaced)

    def write_json(self, fh) -> None:
        """Write :meth:`json_text` to the text file ``fh`` piece by piece (the timeline's rows
        encoded column by column, chunk by chunk: the whole text is never held, issue 13)."""
        from tracekit.analyze.trace.json_format import write_json_to

        replaced = self._fill_timeline(self._parts.get("timeline_deferred"), columnar=True)
        try:
            write_json_to(self._result, fh)
        finally:
            self._restore_peaks(replaced)

    def _view(self) -> dict:
        """The result as the terminal tables read it: each rank's ``transfers.timeline`` may
        hold ``throughput_peaks`` (:func:`tracekit.analyze.sections.throughput.timeline_peaks`) instead
        of the per-bin ``throughput_timeline`` rows, which only the JSON needs (issue 13)."""
        return self._result

    def _fill_timeline(self, deferred, columnar: bool = False) -> list:
        """Put the ``throughput_timeline`` rows in place of ``throughput_peaks`` in each
        ``(timeline dict, global_pid, device)`` of ``deferred``; returns what was replaced.
        ``columnar``: the rows as :class:`tracekit.analyze.sections.transfers.JsonRows` (text built
        column by column when written; put the peaks back with :meth:`_restore_peaks`)."""
        if not deferred:
            return []
        tr = self._parts["transfers"]
        rows = tr.rank_json_rows if columnar else tr.rank_frame_rows
        replaced = []
        for d, gpid, dev in deferred:
            peaks = d.pop("throughput_peaks")
            d["throughput_timeline"] = rows("throughput_timeline", gpid, dev, self.options.phase,
                                            self.options.iteration)
            replaced.append((d, peaks))
        return replaced

    @staticmethod
    def _restore_peaks(replaced: list) -> None:
        for d, peaks in replaced:
            del d["throughput_timeline"]
            d["throughput_peaks"] = peaks

    def _put_result(self, tc, key: str) -> None:
        """Store the whole JSON result in the result cache ``tc`` under ``key``, the timeline rows
        built for it and let go afterwards (the terminal view keeps only the peaks)."""
        replaced = self._fill_timeline(self._parts.get("timeline_deferred"), columnar=True)
        try:
            tc.put_result(key, self._result)
        finally:
            self._restore_peaks(replaced)

    @property
    def notes(self) -> list[str]:
        """Sections skipped for data the trace lacks, each naming the nsys option that records it."""
        return list(self._result.get("transfer_notes") or [])

    # ------------------------------------------------------------------ the model, once
    def _export(self):
        """Open the trace again (read-only, through the Parquet cache when caching is on)."""
        from tracekit.analyze.trace.export import Export

        tc = _trace_cache(self.path, self.options)
        return Export.open(self.path, cache=tc if tc is not None else False)

    @property
    def model(self):
        """The :class:`tracekit.analyze.model.phases.PhaseModel` (windows, GPU operations, NVTX ranges),
        built when first needed (a result read from the cache holds none). The model of
        :func:`analyze` holds only the NVTX ranges its sections read (``ranges_scope``, issue 24);
        :func:`tracekit.analyze.model.phases.ranges_for` gives every one of them."""
        if "model" not in self._parts:
            from tracekit.analyze.model import phases

            with self._export() as export:
                pm = list(self.options.phase_map) if self.options.phase_map else None
                self._parts["model"] = phases.build(export, phase_map=pm, gas=self.options.gas)
        return self._parts["model"]

    def _strings(self, ids) -> dict[int, str]:
        with self._export() as export:
            return export.strings([int(i) for i in ids if i is not None])

    def _rank_numbers(self) -> dict[tuple[int, int], int | None]:
        return {(r["pid"], r["device"]): r.get("rank") for r in self._result.get("ranks", [])}

    # ------------------------------------------------------------------ tables
    @property
    def phases(self) -> "pl.DataFrame":
        """One row per rank, iteration, phase and micro-step, exactly the numbers of
        ``--json``'s ``ranks[].iterations[].phases[]`` (narrowed like them by ``phase`` and
        ``iteration``). Columns: ``pid, device, rank`` (distributed rank or null),
        ``iteration, complete`` (of the iteration), then ``phase, micro_step, boundary,
        inferred, unclosed, start_ns, end_ns``, the metrics of
        :data:`tracekit.analyze.sections.breakdown.METRICS` (ns, bytes, counts), ``gpu_idle_share``
        (0..1), ``h2d_gbps, d2h_gbps`` (GB/s)."""
        if "phases" not in self._memo:
            import polars as pl

            from tracekit.analyze.result import PHASE_ROW_KEYS
            from tracekit.analyze.sections import breakdown

            rows = []
            for r in self._result.get("ranks", []):
                for it in r["iterations"]:
                    for p in it["phases"]:
                        rows.append({"pid": r["pid"], "device": r["device"], "rank": r.get("rank"),
                                     "iteration": it["index"], "complete": it["complete"], **p})
            ints = {k: pl.Int64 for k in ("pid", "device", "rank", "iteration", "micro_step", "start_ns", "end_ns",
                                          *breakdown.METRICS)}
            bools = {k: pl.Boolean for k in ("complete", "boundary", "inferred", "unclosed")}
            schema = {**{k: ints.get(k, pl.Int64) for k in ("pid", "device", "rank", "iteration")},
                      "complete": pl.Boolean, "phase": pl.String,
                      **{k: ints.get(k) or bools.get(k) or pl.Float64 for k in PHASE_ROW_KEYS if k != "phase"}}
            self._memo["phases"] = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(
                schema=schema)
        return self._memo["phases"]

    @property
    def totals(self) -> "pl.DataFrame":
        """Whole-trace totals per rank and phase (``--json``'s ``ranks[].totals``; ``other``
        includes start-up): ``pid, device, rank, phase`` and the numeric keys of the phase rows."""
        if "totals" not in self._memo:
            import polars as pl

            rows = [{"pid": r["pid"], "device": r["device"], "rank": r.get("rank"), "phase": ph, **v}
                    for r in self._result.get("ranks", []) for ph, v in r["totals"].items()]
            self._memo["totals"] = pl.DataFrame(rows, infer_schema_length=None)
        return self._memo["totals"]

    def sub_phase_table(self, phase: str) -> "pl.DataFrame":
        """``phase`` broken down by sub-phase (innermost NVTX range; ``(none)`` = no range open), per
        rank and iteration: :func:`tracekit.analyze.sections.breakdown.sub_phase_table` with ``pid`` in place
        of ``global_pid``. Raises :class:`TracekitError` for an unknown phase."""
        if phase not in PHASES:
            raise TracekitError(f"phase {phase!r}: choose one of {', '.join(PHASES)}")
        subs = self._parts.setdefault("sub_phases", {})
        if phase not in subs:
            from tracekit.analyze.sections import breakdown

            subs[phase] = breakdown.sub_phase_table(self.model, phase)
        return subs[phase]

    @property
    def sub_phases(self) -> "pl.DataFrame":
        """Every phase (or the ``phase`` option's only) by sub-phase, per rank and iteration.
        Columns: ``pid, device, phase, iteration, sub_phase, wall_ns`` (self time of the range),
        ``gpu_busy_ns, gpu_idle_ns, gpu_idle_share`` (CPU-only time and its share),
        ``kernel_busy_ns, comm_busy_ns``, ``h2d_/d2h_`` ``bytes, busy_ns, count, gbps``
        (ns, bytes, GB/s). With the ``iteration`` option, that iteration only."""
        if "sub_phases" not in self._memo:
            import polars as pl

            parts = []
            for ph in ([self.options.phase] if self.options.phase else PHASES):
                t = self.sub_phase_table(ph)
                if t.height:
                    parts.append(t.with_columns(phase=pl.lit(ph)))
            if parts:
                out = pl.concat(parts, how="diagonal_relaxed")
                out = out.select("pid", "device", "phase", "iteration", "sub_phase",
                                 *[c for c in out.columns if c not in ("global_pid", "pid", "device", "phase",
                                                                       "iteration", "sub_phase")])
                if self.options.iteration is not None:
                    out = out.filter(pl.col("iteration") == self.options.iteration)
            else:
                out = pl.DataFrame(schema={"pid": pl.Int64, "device": pl.Int64, "phase": pl.String,
                                           "iteration": pl.Int64, "sub_phase": pl.String, "wall_ns": pl.Int64})
            self._memo["sub_phases"] = out
        return self._memo["sub_phases"]

    def _ops(self, kind: str) -> "pl.DataFrame":
        import polars as pl

        from tracekit.analyze.model.gpu_ops import with_strings
        from tracekit.vocab import os_pid_expr

        # (the API's frames carry strings)
        ops = with_strings(self.model.scan_ops().filter(pl.col("kind") == kind)).collect()
        ids = [*ops["api_name_id"].drop_nulls().unique().to_list()]
        if kind == "kernel":
            ids += ops["name_id"].drop_nulls().unique().to_list()
        with self._export() as export:
            names = export.strings(ids)
            threads = export.thread_names()
            if threads.height:
                tn = export.strings(threads["name_id"].drop_nulls().unique().to_list())
                threads = threads.select(
                    launch_tid="global_tid",
                    thread=pl.col("name_id").replace_strict(tn, default=None, return_dtype=pl.String))
        ranks = self._rank_numbers()
        out = ops.with_columns(
            pid=os_pid_expr(pl.col("global_pid")),
            api_call=pl.col("api_name_id").replace_strict(names, default=None, return_dtype=pl.String),
            tid=pl.col("launch_tid") % (TID_MASK + 1),
        )
        if threads.height:
            out = out.join(threads.unique("launch_tid"), on="launch_tid", how="left")
        else:
            out = out.with_columns(thread=pl.lit(None, pl.String))
        rk = pl.DataFrame([{"pid": p, "device": d, "rank": r} for (p, d), r in ranks.items()],
                          schema={"pid": pl.Int64, "device": pl.Int64, "rank": pl.Int64})
        out = out.with_columns(pl.col("device").cast(pl.Int64)).join(rk, on=["pid", "device"], how="left")
        return out

    @property
    def copies(self) -> "pl.DataFrame":
        """One row per memcpy of the trace, sorted by GPU start. Columns: ``pid, device, rank``,
        ``stream``, ``direction`` (H2D, D2H, D2D, P2P, ...), ``host_memory`` (``pinned`` /
        ``pageable`` / ... for H2D and D2H, else null), ``src_kind, dst_kind``, ``bytes``,
        ``start_ns, end_ns, duration_ns``, ``gbps`` (bytes / duration, GB/s; null for 0 ns),
        ``iteration, phase, micro_step, sub_phase`` (of the CUDA call that launched it; phase
        ``other`` outside phase windows, sub-phase null where no range was open), ``tid``
        (OS thread id of the launching thread), ``thread`` (its name), ``api_call``
        (``cudaMemcpyAsync``, ...), ``launch_ns`` (start of that call)."""
        if "copies" not in self._memo:
            import polars as pl

            o = self._ops("memcpy")
            self._memo["copies"] = o.select(
                "pid", "device", "rank", "stream", "direction",
                host_memory=pl.when(pl.col("direction") == "H2D").then(pl.col("src_kind"))
                .when(pl.col("direction") == "D2H").then(pl.col("dst_kind")),
                src_kind="src_kind", dst_kind="dst_kind", bytes="bytes", start_ns="start", end_ns="end",
                duration_ns=pl.col("end") - pl.col("start"),
                gbps=pl.when(pl.col("end") > pl.col("start")).then(pl.col("bytes") / (pl.col("end") - pl.col("start"))),
                iteration="iteration", phase="phase", micro_step="micro_step", sub_phase="sub_phase",
                tid="tid", thread="thread", api_call="api_call", launch_ns="launch",
            ).sort("start_ns")
        return self._memo["copies"]

    @property
    def kernels(self) -> "pl.DataFrame":
        """One row per kernel, sorted by GPU start. Columns: ``pid, device, rank, stream, name``
        (demangled), ``communication`` (NCCL and the like), ``collective`` (AllReduce, ... or
        null), ``start_ns, end_ns, duration_ns``, ``iteration, phase, micro_step, sub_phase``,
        ``tid, thread, api_call, launch_ns`` (as in :attr:`copies`)."""
        if "kernels" not in self._memo:
            import polars as pl

            o = self._ops("kernel")
            ids = o["name_id"].drop_nulls().unique().to_list()
            names = self._strings(ids)
            self._memo["kernels"] = o.select(
                "pid", "device", "rank", "stream",
                name=pl.col("name_id").replace_strict(names, default=None, return_dtype=pl.String),
                communication="comm", collective="collective", start_ns="start", end_ns="end",
                duration_ns=pl.col("end") - pl.col("start"),
                iteration="iteration", phase="phase", micro_step="micro_step", sub_phase="sub_phase",
                tid="tid", thread="thread", api_call="api_call", launch_ns="launch",
            ).sort("start_ns")
        return self._memo["kernels"]

    def _transfers(self, sections: tuple[str, ...], keep_samples: bool = False):
        """The :class:`tracekit.analyze.sections.transfers.TransferResult` holding at least ``sections``:
        the one computed with the result when it does, else computed now (once).
        ``keep_samples``: the ``pcie`` section must also hold ``pcie_series`` (one row per PCIe
        sample, for ``--out`` and :attr:`frames`); the JSON and terminal views never ask for it,
        so their peak memory stays independent of the number of samples."""
        need_series = keep_samples and "pcie" in sections
        for key in ("transfers", "more_transfers"):
            tr = self._parts.get(key)
            if tr is not None and set(sections) <= set(tr.sections) and (
                    not need_series or getattr(tr, "kept_samples", False)):
                return tr
        from tracekit.analyze.sections.transfers import analyze_transfers

        with self._export() as export:
            tr = analyze_transfers(export, self.model, tuple(sections), self.options.pcie_threshold,
                                   self.options.bin_ns, keep_samples=need_series)
        self._parts["more_transfers"] = tr
        return tr

    def section_frames(self, sections: tuple[str, ...] | None = None) -> "dict[str, pl.DataFrame]":
        """The frames of ``sections`` (default: the ``sections`` option, else all) by name, as in
        :attr:`frames`."""
        import polars as pl

        from tracekit.vocab import os_pid_expr

        tr = self._transfers(tuple(sections or self.options.sections or SECTIONS), keep_samples=True)
        out = {}
        for name, f in {**tr.frames, **tr.multi_gpu}.items():
            if isinstance(f, pl.DataFrame) and "global_pid" in f.columns:
                f = f.with_columns(pid=os_pid_expr(pl.col("global_pid"))).select(
                    "pid", *[c for c in f.columns if c not in ("global_pid", "pid")])
            out[name] = f
        return out

    @property
    def frames(self) -> "dict[str, pl.DataFrame]":
        """Every transfer section's frames by name (:data:`tracekit.analyze.sections.SECTION_FRAMES`, the registry:
        ``overlap``, ``overlap_phase``, ..., ``memory_timeline``, ``pcie_series``) and the multi-GPU
        frames (``rank_ids``, host contention, communication, waiting ranks), ``global_pid``
        replaced by the OS ``pid``. Sections whose data the trace lacks are absent (see
        :attr:`notes`). Computed when first asked for unless the analysis already holds them."""
        if "frames" not in self._memo:
            self._memo["frames"] = self.section_frames(SECTIONS)
        return self._memo["frames"]

    @property
    def findings(self) -> "pl.DataFrame":
        """The findings (``--json``'s ``findings``): ``topic, pid, device, phase, text``,
        ``values`` (the finding's numbers as a JSON object in text, strict: NaN/inf as null; units
        in their keys) and ``summary`` (its one line with numbers, what the default screen prints)."""
        import polars as pl

        from tracekit.analyze.trace.json_format import dumps_strict

        rows = [{"topic": f.get("topic"), "pid": f.get("pid"), "device": f.get("device"), "phase": f.get("phase"),
                 "text": f.get("text"), "values": dumps_strict(f.get("values") or {}, sort_keys=True),
                 "summary": f.get("summary")}
                for f in self._result.get("findings") or []]
        schema = {"topic": pl.String, "pid": pl.Int64, "device": pl.Int64, "phase": pl.String, "text": pl.String,
                  "values": pl.String, "summary": pl.String}
        return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)

    @property
    def advice(self) -> "pl.DataFrame":
        """The advice (``--json``'s ``advice``, docs/advice.md), largest saving per steady
        iteration first: ``problem, knob, change, baseline_iteration_ms, predicted_iteration_ms,
        saving_ms_per_iteration, saving_pct, basis, confidence, scenario, pid, device,
        config_fixable``."""
        import polars as pl

        cols = ["problem", "knob", "change", "baseline_iteration_ms", "predicted_iteration_ms",
                "saving_ms_per_iteration", "saving_pct", "basis", "confidence", "scenario", "pid", "device",
                "config_fixable"]
        rows = [{k: a.get(k) for k in cols} for a in self._result.get("advice") or []]
        schema = {c: pl.String for c in cols} | {c: pl.Float64 for c in cols[3:7]} | {
            "pid": pl.Int64, "device": pl.Int64, "config_fixable": pl.Boolean}
        return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
