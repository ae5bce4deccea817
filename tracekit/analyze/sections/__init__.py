"""The sections of an analysis: pure functions of the model (:mod:`tracekit.analyze.model`) that
return polars frames, one module each, and the registry that says what each section is and runs it.

:data:`REGISTERED` holds one :class:`Section` per section module, in the order they run (each
after the sections it :attr:`~Section.needs`): the per-phase breakdown, the eight ``--section``
analyses, the multi-GPU frames, the CPU update, the what-if model, the advice and the findings.
Each says what it reads (``needs``: sections; ``tables``: nsys tables beyond the CUDA kernels and
copies every section reads, and :attr:`~Section.nsys_option` records them), what it adds
(``frames``: the frames, main table first, with the columns that identify each frame's rows as
:attr:`tracekit.analysis.Analysis.frames` shows them: ``pid`` is the OS pid), the topics of the
findings it feeds (:func:`tracekit.analyze.sections.findings.build_findings`), how it is computed
(``compute(ctx) -> {name: frame}``, reading a :class:`Context`) and which of its frames the
findings read again on the steady model (``findings_frames``).

Running an analysis is :func:`run`: a loop over the registry in dependency order
(:func:`order`). :data:`REGISTRY` is its ``--section`` part (``option``: the sections a user
selects); the command line's ``--section`` choices and help, ``--out``'s frame list, the JSON's
section frames and the "the trace lacks ..." notes all read it. docs/contributing.md says how to
add a section.

This module imports no polars (the command line parses ``--section`` and answers from the result
cache without loading the analysis stack): each ``compute`` imports its section module when it
runs.

Over 500 lines because the registry is read as one list: each section's entry sits beside its
few short adapters (compute, findings frames, advice), and the adapters take the Context this
module defines; a module of adapters apart would import it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tracekit.errors import TracekitError

#: the tables every section reads (recorded by ``nsys profile -t cuda``)
BASE_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY")
#: the keys of a per-window frame (one row per rank, iteration, phase and micro-step)
WINDOW_KEYS = ("pid", "device", "iteration", "phase", "micro_step")
PHASE_KEYS = ("pid", "device", "phase")
#: the ``by`` of a per-window frame (with the rank's ``global_pid, device``)
PER_WINDOW = ("iteration", "phase", "micro_step")


@dataclass
class Context:
    """What a section's ``compute`` reads, and what the sections run so far gave.

    ``export``: the open :class:`tracekit.analyze.trace.export.Export`; ``model``: its
    :class:`tracekit.analyze.model.phases.PhaseModel`; ``sections``: the ``--section`` names
    selected (a section computes its detail frames only when selected; what the findings read it
    computes always); ``pcie_threshold`` (percent), ``bin_ns`` (ns), ``keep_samples``, ``phase``,
    ``iteration``, ``ds_config`` (the options of :class:`tracekit.options.Options`; ``ds_config``
    None: read the trace's own). :func:`run` puts what each section returns into ``out`` (by name;
    ``produced[section]`` lists the names) and appends the section to ``ran``; ``notes`` collects
    the sentences about sections skipped for missing data."""

    export: Any
    model: Any
    sections: tuple[str, ...] = ()
    pcie_threshold: float = 80.0
    bin_ns: int = 1_000_000
    keep_samples: bool = False
    phase: str | None = None
    iteration: int | None = None
    ds_config: dict | None = None
    out: dict[str, Any] = field(default_factory=dict)
    produced: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    #: the model the findings read (``model`` without its unclosed iterations); None: computed when asked
    steady: Any = None

    def selected(self, name: str) -> bool:
        """Whether ``--section name`` was asked for."""
        return name in self.sections

    def steady_model(self):
        """:func:`tracekit.analyze.model.phases.steady_model` of :attr:`model`, computed once."""
        if self.steady is None:
            from tracekit.analyze.model.phases import steady_model

            self.steady = steady_model(self.model)
        return self.steady


@dataclass(frozen=True)
class Section:
    """One section: see the module doc."""

    name: str
    module: str  #: the module under tracekit.analyze.sections that computes it
    doc: str  #: one line for ``--section``'s help and docs/transfers.md
    frames: tuple[str, ...] = ()  #: frames it adds, main table first (the ``--section`` frames; see :attr:`compute`)
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  #: per frame, the columns that identify a row
    tables: tuple[str, ...] = ()  #: nsys tables read beyond :data:`BASE_TABLES`
    findings: tuple[str, ...] = ()  #: topics of the findings its frames feed
    file_only: tuple[str, ...] = ()  #: frames too long for ``--json`` (one row per event/sample): ``--out`` only
    #: ``compute(ctx) -> {name: frame}``: what it adds to ``ctx.out`` (a section whose result is
    #: not a table gives its object under its own name: ``timeline``, ``cpu_update``, ...)
    compute: Callable[[Context], dict] | None = None
    needs: tuple[str, ...] = ()  #: the sections whose ``ctx.out`` it reads (they run first)
    #: sections that, when they run too, run first; ``findings`` applies their ``add_findings`` in this order
    after: tuple[str, ...] = ()
    option: bool = True  #: a ``--section`` (False: computed for every analysis)
    #: ``findings_frames(ctx) -> {name: frame}``: its frames the findings read, computed again on
    #: ``ctx.steady_model()`` (:func:`tracekit.analyze.sections.transfers.findings_frames`)
    findings_frames: Callable[[Context], dict] | None = None
    #: ``add_findings(ctx, findings) -> findings``: its own findings, added to (or worded into) the
    #: list of the ``findings`` section, which applies them after its rules, in the order of its ``after``
    add_findings: Callable[[Context, list], list] | None = None
    #: ``add_advice(ctx, advice) -> advice``: its own advice and predictions, added to the result of
    #: the ``advice`` section, which applies them in the order of its ``after``
    add_advice: Callable[[Context, dict], dict] | None = None

    @property
    def nsys_option(self) -> str:
        """The ``nsys profile`` option that records :attr:`tables` (``-t cuda`` for the base)."""
        from tracekit.analyze.trace.enums import RECORDED_BY  # plain constants, no polars

        opts = [RECORDED_BY.get(t, "-t cuda") for t in self.tables] or ["-t cuda"]
        return " ".join(dict.fromkeys(opts))

    def missing_note(self, table: str) -> str:
        """The note printed when the trace lacks ``table``: what is unknown, and how to record it."""
        return (f"{self.name}: skipped, {table} is missing; record it with "
                f"`nsys profile {self.nsys_option}`")


# ---------------------------------------------------------------- how each section is computed
# Each function imports its section module when it runs (this module stays free of polars) and
# calls the section's own functions; the order and the frames are those of the registry below.

def _breakdown(ctx: Context) -> dict:
    """``phase_table`` (narrowed to ``ctx.phase`` / ``ctx.iteration``), ``totals`` and
    ``sub_phases`` (of ``ctx.phase``, narrowed to ``ctx.iteration``; ``sub_phases_all`` not
    narrowed). Raises TracekitError for an iteration the trace lacks."""
    import polars as pl

    from tracekit.analyze.sections import breakdown

    if not ctx.export.has("CUPTI_ACTIVITY_KIND_KERNEL", 1):  # copies only (phases.build refuses neither)
        from tracekit.vocab import NO_KERNELS_NOTE

        ctx.notes.append(NO_KERNELS_NOTE)
    table = breakdown.phase_table(ctx.model)
    tot = breakdown.totals(ctx.model)
    sub = breakdown.sub_phase_table(ctx.model, ctx.phase) if ctx.phase else pl.DataFrame()
    full_sub = sub
    if ctx.phase:
        table = table.filter(pl.col("phase") == ctx.phase)
    if ctx.iteration is not None:
        found = sorted(table["iteration"].drop_nulls().unique().to_list())
        if ctx.iteration not in found:
            have = f"{found[0]}..{found[-1]}" if found else "none"
            raise TracekitError(f"--iteration {ctx.iteration}: this trace has iterations {have}")
        table = table.filter(pl.col("iteration") == ctx.iteration)
        if sub.height:
            sub = sub.filter(pl.col("iteration") == ctx.iteration)
    return {"phase_table": table, "totals": tot, "sub_phases": sub, "sub_phases_all": full_sub}


def _overlap(ctx: Context) -> dict:
    from tracekit.analyze.sections import overlap

    levels: dict[str, tuple] = {"overlap_phase": ("phase",)}
    if ctx.selected("overlap"):
        levels.update(overlap=PER_WINDOW, overlap_sub_phase=("iteration", "phase", "sub_phase"), overlap_total=())
    return overlap.overlap_levels(ctx.model, levels)  # the unions once, summed upward


def _overlap_findings(ctx: Context) -> dict:
    from tracekit.analyze.sections import overlap

    return {"overlap_phase": overlap.overlap(ctx.steady_model(), by=("phase",))}


def _contention(ctx: Context) -> dict:
    from tracekit.analyze.sections import contention

    windows = contention.contention_windows(ctx.model)
    out = {"contention_phase": contention.contention_summary(ctx.model, by=("phase",), windows=windows)}
    if ctx.selected("contention"):
        out["contention"] = contention.contention_summary(ctx.model, by=PER_WINDOW, windows=windows)
        out["contention_sub_phase"] = contention.contention_summary(
            ctx.model, by=("iteration", "phase", "sub_phase"), windows=windows)
        out["contention_windows"] = windows
        out["uncontended_bandwidth"] = contention.uncontended_bandwidth(ctx.model)
    return out


def _contention_findings(ctx: Context) -> dict:
    from tracekit.analyze.sections import contention

    steady = ctx.steady_model()
    return {"contention_phase": contention.contention_summary(steady, by=("phase",),
                                                              windows=contention.contention_windows(steady))}


def _sizes(ctx: Context) -> dict:
    from tracekit.analyze.sections import copy_sizes

    return {"copy_sizes": copy_sizes.copy_sizes(ctx.model, by=("phase",))} if ctx.selected("sizes") else {}


def _pinning(ctx: Context):
    """What pinning saves per pageable copy (:func:`tracekit.analyze.sections.whatif.pinning_by_copy`
    of every rank): the advice's (``ctx.out["advice"]["_pinning"]``; the pageable section runs after
    it), else the advice computed here (a run of the pageable section alone)."""
    adv = ctx.out.get("advice")
    if adv is None:
        from tracekit.analyze.sections import advice

        loaded = _loaded_config(ctx)
        adv = ctx.model.derived(("advice", "pinning"), lambda: advice.advise(ctx.export, ctx.model, loaded))
    return adv.get("_pinning")


def _pinning_scenarios(ctx: Context):
    """The predictions the pageable findings quote (``pin_memory`` and ``pageable_to_pinned`` of
    each rank, as the advice's JSON gives them), by ``(pid, device, scenario)``."""
    adv = ctx.out.get("advice") or {}
    return {(p["pid"], p["device"], p["scenario"]): p for p in adv.get("predictions") or []
            if p["scenario"] in ("pin_memory", "pageable_to_pinned")}


def _pageable(ctx: Context) -> dict:
    from tracekit.analyze.sections import pageable

    copies = pageable.pageable_copies(ctx.model, ctx.export, savings=_pinning(ctx))
    out = {"pageable_phase": pageable.pageable_summary(ctx.model, by=("phase", "sub_phase"), copies=copies)}
    if ctx.selected("pageable"):
        out["pageable"] = pageable.pageable_summary(ctx.model, by=PER_WINDOW, copies=copies)
        out["pageable_copies"] = copies
        out["pinned_bandwidth"] = pageable.pinned_bandwidth(ctx.model, by_size=True)
    return out


def _pageable_findings(ctx: Context) -> dict:
    from tracekit.analyze.sections import pageable

    steady = ctx.steady_model()
    pcopies = pageable.pageable_copies(steady, ctx.export, savings=_pinning(ctx))
    return {"pageable_phase": pageable.pageable_summary(steady, by=("phase", "sub_phase"), copies=pcopies),
            "pageable_reference": pageable.pinned_reference(steady, pcopies, by=("phase", "sub_phase")),
            "pinning_scenarios": _pinning_scenarios(ctx)}


def _memory(ctx: Context) -> dict:
    """The peaks and timeline when selected (the opportunities read the peaks they need
    themselves); a note when the trace lacks the memory events."""
    from tracekit.analyze.sections import memory
    from tracekit.errors import MissingDataError

    out = {}
    if ctx.selected("memory"):
        try:
            out["memory_peaks"] = memory.memory_peaks(ctx.export, ctx.model, by=PER_WINDOW)
            out["memory_phase"] = memory.memory_peaks(ctx.export, ctx.model, by=("phase",))
            out["memory_timeline"] = memory.DeferredTimeline(ctx.model)  # (a frame when read: --out)
        except MissingDataError as exc:
            ctx.notes.append(f"memory: skipped, {exc}")
    elif not ctx.export.has(memory.TABLE, 1):
        mem = REGISTERED["memory"]
        ctx.notes.append(f"GPU memory headroom unknown: {mem.tables[0]} is missing; record it with "
                         f"`nsys profile {mem.nsys_option}`")
    return out


def _timeline(ctx: Context) -> dict:
    """``timeline``: a :class:`tracekit.analyze.sections.throughput.Timeline` (its rows are built
    on demand), when selected."""
    from tracekit.analyze.sections import throughput

    return {"timeline": throughput.Timeline(ctx.model, bin_ns=ctx.bin_ns)} if ctx.selected("timeline") else {}


def _pcie(ctx: Context) -> dict:
    """The PCIe frames when selected; the reduction of the samples is kept in
    ``model.cache["pcie_reduction"]`` for the findings."""
    from tracekit.analyze.sections import pcie_metrics
    from tracekit.errors import MissingDataError

    if not ctx.selected("pcie"):
        return {}
    export, model, out = ctx.export, ctx.model, {}
    try:
        red = pcie_metrics.reduce_pcie(export, model, ctx.pcie_threshold, keep_samples=ctx.keep_samples)
        if red.samples == 0:
            ctx.notes.append("pcie: the PCIe samples of GPU_METRICS could not be matched to the devices with work "
                             "(TARGET_INFO_GPU lists a different number of GPUs than were sampled)")
        if red.set_aside:
            ctx.notes.append(pcie_metrics.set_aside_note(red.set_aside))
        if red.series is not None:
            out["pcie_series"] = red.series
        out["pcie"] = pcie_metrics.pcie_phase_stats(export, model, by=PER_WINDOW, reduction=red)
        out["pcie_phase"] = pcie_metrics.pcie_phase_stats(export, model, by=("phase",), reduction=red)
        out["pcie_saturation"] = pcie_metrics.pcie_saturation(export, model, ctx.pcie_threshold, reduction=red)
        model.cache["pcie_reduction"] = red
    except MissingDataError as exc:
        ctx.notes.append(f"pcie: skipped, {exc}")
    return out


def _pcie_findings(ctx: Context) -> dict:
    from tracekit.analyze.sections import pcie_metrics

    red = ctx.model.cache.get("pcie_reduction")  # the samples as attributed to the whole model
    if red is None or "pcie_phase" not in ctx.out:
        return {}
    steady = ctx.steady_model()
    return {"pcie_phase": pcie_metrics.pcie_phase_stats(ctx.export, steady, by=("phase",), reduction=red),
            "pcie_saturation": pcie_metrics.pcie_saturation(ctx.export, steady, ctx.pcie_threshold, reduction=red)}


def _opportunities_of(export, model) -> dict:
    from tracekit.analyze.sections import opportunities

    trips = opportunities.gradient_round_trips(model)
    return {"round_trips": trips,
            "round_trip_summary": opportunities.gradient_round_trip_summary(export, model, trips),
            "update_opportunity": opportunities.update_opportunity(export, model)}


def _opportunities(ctx: Context) -> dict:
    return _opportunities_of(ctx.export, ctx.model)


def _opportunities_findings(ctx: Context) -> dict:
    out = _opportunities_of(ctx.export, ctx.steady_model())
    del out["round_trips"]
    return out


def _idle(ctx: Context) -> dict:
    """The idle frames when selected (a note when the trace lacks the CUDA API calls); and, for
    the phase rows of a whole analysis (the breakdown ran), ``idle_rows``:
    :func:`tracekit.analyze.sections.idle.phase_json`."""
    from tracekit.analyze.sections import idle

    out = {}
    if ctx.selected("idle"):
        # (the windows and the update's sub-phases from one read of the API calls)
        out["idle"], out["idle_by_api"], out["idle_sub_phase"] = idle.idle_frames(ctx.model, ctx.export)
        out["launch_stats"] = idle.launch_stats(ctx.model, ctx.export, idle=out["idle"])
        if not ctx.export.has(idle.TABLE, 1):
            ctx.notes.append(f"idle: {REGISTRY['idle'].missing_note(idle.TABLE).split(', ', 1)[1]}: in_api_ns is 0 "
                             "and every idle ns without a collective counts as between_api_ns")
    if "breakdown" in ctx.ran:
        # where each phase's GPU idle time goes (the launch statistics computed once)
        out["idle_rows"] = idle.phase_json(ctx.model, ctx.export, out.get("launch_stats"))
    return out


def _idle_findings(ctx: Context, findings: list) -> list:
    """Where the idle GPU time of a phase goes (:func:`tracekit.analyze.sections.idle_findings.idle_findings`)."""
    from tracekit.analyze.sections.idle_findings import idle_findings

    return findings + idle_findings(ctx.model, ctx.export, ctx.iteration)


def _idle_advice(ctx: Context, adv: dict) -> dict:
    """The launch-bound what-if, a larger micro-batch
    (:func:`tracekit.analyze.sections.idle_findings.microbatch_advice`)."""
    from tracekit.analyze.sections.idle_findings import microbatch_advice

    extra, preds = microbatch_advice(ctx.model, ctx.export, adv)
    if extra:
        adv["advice"] = sorted(adv["advice"] + extra, key=lambda x: -x["saving_ms_per_iteration"])
        adv["predictions"] = adv["predictions"] + preds
    return adv


def _multi_gpu(ctx: Context) -> dict:
    """The frames of :func:`tracekit.analyze.sections.multi_gpu.analyze_multi_gpu`."""
    from tracekit.analyze.sections.multi_gpu import analyze_multi_gpu

    return analyze_multi_gpu(ctx.export, ctx.model)


def _cpu_update(ctx: Context) -> dict:
    """``cpu_update``: the :class:`tracekit.analyze.sections.cpu_update.CpuUpdate` of the model
    (the CPU optimizer step, also in worker processes)."""
    from tracekit.analyze.sections import cpu_update

    return {"cpu_update": cpu_update.for_model(ctx.model, ctx.export.path)}


def _cpu_update_findings(ctx: Context, findings: list) -> list:
    """One ``cpu-update`` finding per rank with CPU optimizer ranges
    (:func:`tracekit.analyze.sections.findings.cpu_update_findings`)."""
    from tracekit.analyze.sections.findings import cpu_update_findings

    return cpu_update_findings(findings, ctx.out["cpu_update"], ctx.iteration)


def _whatif(ctx: Context) -> dict:
    """``whatif``: the measured pieces of every rank (:func:`tracekit.analyze.sections.whatif.measure`)."""
    from tracekit.analyze.sections import whatif

    model = ctx.model  # (kept on the model: the advice reads the same pieces)
    return {"whatif": model.derived(("whatif", "measure"), lambda: whatif.measure(ctx.export, model))}


def _loaded_config(ctx: Context) -> dict:
    """The run's DeepSpeed config for the advice: ``ctx.ds_config``, else the trace's own
    (:func:`tracekit.analyze.trace.dsconfig.load`)."""
    from tracekit.analyze.trace import dsconfig

    return ctx.ds_config if ctx.ds_config is not None else dsconfig.load(ctx.export.path)


def _advice(ctx: Context) -> dict:
    """``advice``: :func:`tracekit.analyze.sections.advice.advise` with the config of
    ``ctx.ds_config`` (None: the trace's own, :func:`tracekit.analyze.trace.dsconfig.load`)."""
    from tracekit.analyze.sections import advice

    adv = advice.advise(ctx.export, ctx.model, _loaded_config(ctx))
    # the what-if pieces are used up: the advice is their one reader (a rank's copies each, 3.3 MiB
    # at 16x the shared trace, not held for the sections after; issue 24)
    ctx.model.cache.pop(("whatif", "measure"), None)
    ctx.out.pop("whatif", None)
    for name in REGISTERED["advice"].after:  # the advice other sections add
        if name in ctx.ran and REGISTERED[name].add_advice is not None:
            adv = REGISTERED[name].add_advice(ctx, adv)
    from tracekit.analyze.run_advice import per_run

    adv["advice_per_run"] = per_run(adv["advice"])  # each change once, with its spread over ranks
    return {"advice": adv}


def _advice_findings(ctx: Context, findings: list) -> list:
    """The ``update`` findings name the update's CPU steps that cost most
    (:func:`tracekit.analyze.sections.findings.name_cpu_steps`); not with ``ctx.iteration``: the
    steps are means over steady iterations, so only the same basis."""
    from tracekit.analyze.sections.findings import name_cpu_steps

    if ctx.iteration is not None:
        return findings
    return name_cpu_steps(findings, ctx.out["advice"]["_cpu_steps"])


def findings_frames(ctx: Context) -> dict:
    """The frames :func:`tracekit.analyze.sections.findings.build_findings` reads, computed again
    on ``ctx.steady_model()`` (the model without its unclosed iterations,
    :func:`tracekit.analyze.model.phases.steady_model`): each section's ``findings_frames``, in
    registry order."""
    ff: dict = {}
    for s in order():
        if s.findings_frames is not None:
            ff.update(s.findings_frames(ctx))
    return ff


def _findings_frames(export, model, steady, frames: dict, pcie_threshold: float) -> dict:
    """:func:`findings_frames` of ``steady``, ``frames`` the frames computed on ``model``."""
    return findings_frames(Context(export, model, pcie_threshold=pcie_threshold, out=dict(frames), steady=steady))


def _findings(ctx: Context) -> dict:
    """``transfer_findings``: :func:`tracekit.analyze.sections.findings.build_findings` over the
    frames of the steady model (the frames of the run when no iteration is unclosed) and the
    multi-GPU frames; ``findings``: those (or, with ``ctx.iteration``, the findings of that
    iteration), then the ``add_findings`` of the sections of its ``after`` that ran, in that order."""
    import polars as pl

    from tracekit.analyze.model.steady import forward_counts
    from tracekit.analyze.sections import breakdown
    from tracekit.analyze.sections import findings as fd

    model = ctx.model
    steady = ctx.steady_model()
    frames = {k: ctx.out[k] for s in REGISTERED["findings"].needs if REGISTERED[s].option for k in ctx.produced[s]}
    ff = frames if steady is model else findings_frames(ctx)
    iters: dict[tuple[int, int], dict[str, int]] = {}
    win = steady.windows.filter(pl.col("iteration").is_not_null())
    # (the ranks kept on the model: no pass over its ops)
    for (gpid, dev) in breakdown.ranks(model).select("global_pid", "device").iter_rows():
        w = win.filter(pl.col("global_pid") == gpid)
        iters[(gpid, dev)] = {p: int(g["iteration"].n_unique()) for (p,), g in w.group_by(["phase"])}
    mg = {k: ctx.out[k] for k in ctx.produced["multi_gpu"]}
    whole = fd.build_findings({**ff, **mg, "pinning_scenarios": _pinning_scenarios(ctx)}, iters, ctx.pcie_threshold,
                              forwards=forward_counts(model.windows))
    # one iteration's findings: its copies keep their part of the steady iterations' predictions
    adv = {"advice": ctx.out["advice"]} if "advice" in ctx.out else {}
    out = whole if ctx.iteration is None else fd.iteration_findings(
        ctx.export, model, ctx.iteration, ctx.pcie_threshold,
        frames_of=lambda one: _findings_frames(ctx.export, one, one, adv, ctx.pcie_threshold))
    for name in REGISTERED["findings"].after:
        if name in ctx.ran and REGISTERED[name].add_findings is not None:
            out = REGISTERED[name].add_findings(ctx, out)
    from tracekit.analyze.sections.finding_summary import add_summaries

    return {"transfer_findings": whole, "findings": add_summaries(out)}  # each with its one line


#: every section, in the order they run; see the module doc
REGISTERED: dict[str, Section] = {s.name: s for s in (
    Section("breakdown", "breakdown", "per-phase breakdown: phase windows, whole-trace totals, sub-phases of --phase",
            option=False, compute=_breakdown),
    Section("overlap", "overlap", "copy time hidden under kernels, per window, phase, sub-phase and rank",
            ("overlap", "overlap_phase", "overlap_sub_phase", "overlap_total"),
            {"overlap": WINDOW_KEYS, "overlap_phase": PHASE_KEYS,
             "overlap_sub_phase": ("pid", "device", "iteration", "phase", "sub_phase"),
             "overlap_total": ("pid", "device")},
            findings=("exposed-copies",), compute=_overlap, findings_frames=_overlap_findings),
    Section("contention", "contention", "H2D and D2H in flight at once: windows, summaries, uncontended GB/s",
            ("contention", "contention_phase", "contention_sub_phase", "contention_windows", "uncontended_bandwidth"),
            {"contention": WINDOW_KEYS, "contention_phase": PHASE_KEYS,
             "contention_sub_phase": ("pid", "device", "iteration", "phase", "sub_phase"),
             "contention_windows": ("pid", "device", "start"),
             "uncontended_bandwidth": ("direction", "host_kind")},
            findings=("contention",), compute=_contention, findings_frames=_contention_findings),
    Section("sizes", "copy_sizes", "copies by size bucket and phase",
            ("copy_sizes",), {"copy_sizes": ("pid", "device", "phase", "direction", "host_kind", "bucket")},
            compute=_sizes),
    Section("pageable", "pageable", "pageable (unpinned) host copies and what pinning would save",
            ("pageable", "pageable_phase", "pageable_copies", "pinned_bandwidth"),
            {"pageable": WINDOW_KEYS, "pageable_phase": ("pid", "device", "phase", "sub_phase"),
             "pageable_copies": ("pid", "device", "start"),
             "pinned_bandwidth": ("direction", "bucket")},
            findings=("pageable",), after=("advice",), compute=_pageable, findings_frames=_pageable_findings),
    Section("memory", "memory", "GPU memory peaks per window and phase (the event timeline goes to --out)",
            ("memory_peaks", "memory_phase", "memory_timeline"),
            {"memory_peaks": WINDOW_KEYS, "memory_phase": PHASE_KEYS,
             "memory_timeline": ("pid", "device", "time")},
            tables=("CUDA_GPU_MEMORY_USAGE_EVENTS",), findings=("update",), file_only=("memory_timeline",),
            compute=_memory),
    Section("timeline", "throughput", "copy throughput in time bins (--bin-ms)",
            ("throughput_timeline",), {"throughput_timeline": ("pid", "device", "direction", "bin_start")},
            compute=_timeline),
    Section("pcie", "pcie_metrics", "PCIe RX/TX of GPU_METRICS per window and phase, saturation (slower)",
            ("pcie", "pcie_phase", "pcie_saturation", "pcie_series"),
            {"pcie": WINDOW_KEYS, "pcie_phase": PHASE_KEYS, "pcie_saturation": ("pid", "device", "direction", "start"),
             "pcie_series": ("pid", "device", "direction", "time")},
            tables=("GPU_METRICS", "TARGET_INFO_GPU_METRICS"), findings=("pcie", "pcie-cross-check"),
            file_only=("pcie_series",), compute=_pcie, findings_frames=_pcie_findings),
    Section("opportunities", "opportunities", "gradient round trips and the overlap the CPU update leaves",
            ("round_trips", "round_trip_summary", "update_opportunity"),
            {"round_trips": ("pid", "device", "iteration", "micro_step"), "round_trip_summary": ("pid", "device"),
             "update_opportunity": ("pid", "device", "iteration")},
            tables=("NVTX_EVENTS",), findings=("gradient-round-trip", "update"), compute=_opportunities,
            findings_frames=_opportunities_findings),
    Section("idle", "idle", "where GPU idle time goes (busy, waiting, in CUDA API calls, between them) and launch cost",
            ("idle", "idle_by_api", "idle_sub_phase", "launch_stats"),
            {"idle": WINDOW_KEYS, "idle_by_api": (*WINDOW_KEYS, "name"),
             "idle_sub_phase": ("pid", "device", "iteration", "phase", "sub_phase"),
             "launch_stats": WINDOW_KEYS},
            tables=("CUPTI_ACTIVITY_KIND_RUNTIME",), findings=("idle",), after=("breakdown",), compute=_idle,
            add_findings=_idle_findings, add_advice=_idle_advice),
    Section("multi_gpu", "multi_gpu", "ranks, host contention, communication and waiting ranks (many GPUs)",
            ("rank_ids", "host_summary", "host_windows", "host_phase", "host_bandwidth", "host_copies",
             "communication", "collectives", "waiting", "waiting_slowest"),
            findings=("host-contention", "communication", "waiting-rank"), option=False, compute=_multi_gpu),
    Section("whatif", "whatif", "the measured pieces of each rank that the what-if model predicts from",
            ("whatif",), tables=("NVTX_EVENTS",), option=False, compute=_whatif),
    Section("advice", "advice", "the DeepSpeed settings, advice, one-time costs and what-if predictions",
            ("advice",), needs=("whatif",), after=("idle",), option=False, compute=_advice,
            add_findings=_advice_findings),
    Section("cpu_update", "cpu_update", "the CPU optimizer step wherever it ran: hidden, exposed, waited for",
            ("cpu_update",), findings=("cpu-update",), option=False, compute=_cpu_update,
            add_findings=_cpu_update_findings),
    Section("findings", "findings", "the findings: one sentence per problem, per rank, largest cost first",
            ("findings", "transfer_findings"),
            needs=("overlap", "contention", "pageable", "pcie", "opportunities", "multi_gpu"),
            after=("advice", "cpu_update", "idle"),  # the CPU steps named, then the CPU update's own finding
            option=False, compute=_findings),
)}
#: the ``--section`` part of :data:`REGISTERED` (``option``), in the same order
REGISTRY: dict[str, Section] = {n: s for n, s in REGISTERED.items() if s.option}

SECTIONS: tuple[str, ...] = tuple(REGISTRY)
#: frames shown/serialized per section (the first is the main table)
SECTION_FRAMES: dict[str, list[str]] = {s.name: list(s.frames) for s in REGISTRY.values()}
#: frames too long for --json (one row per event/sample); written with --out only
FILE_ONLY: frozenset[str] = frozenset(f for s in REGISTRY.values() for f in s.file_only)


def order(names=None) -> list[Section]:
    """The sections to run for ``names`` (default: every one) and the sections they need, each
    after what it needs (and after the sections of its ``after`` that run too), otherwise in
    registry order. Raises ValueError for a need that is not registered or a cycle."""
    want = list(REGISTERED) if names is None else [n for n in REGISTERED if n in set(names)]
    unknown = set(names or ()) - set(REGISTERED)
    if unknown:
        raise ValueError(f"no section {sorted(unknown)[0]!r} is registered")
    running: set[str] = set()
    todo = list(want)
    while todo:  # the closure over needs (an unknown need is reported by visit)
        n = todo.pop()
        if n not in running and n in REGISTERED:
            running.add(n)
            todo.extend(REGISTERED[n].needs)
    out: list[Section] = []
    done: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in chain:
            raise ValueError("sections need each other: " + " -> ".join((*chain, name)))
        if name not in REGISTERED:
            raise ValueError(f"section {chain[-1]!r} needs {name!r}, which is not registered")
        s = REGISTERED[name]
        for need in (*s.needs, *(a for a in s.after if a in running)):
            visit(need, (*chain, name))
        done.add(name)
        out.append(REGISTERED[name])

    for name in want:
        visit(name, ())
    return out


#: the frames of :attr:`tracekit.analyze.model.phases.PhaseModel.cache` with a row per GPU op
#: or copy that :func:`run` lets go after each section: kept, they held 17 MiB of a 10 GB trace's
#: analysis from the first section that built them to the end (issue 24); the next reader
#: builds them again (a filter of the ops, a few ms); ``ops_frame`` is the whole of spilled ops
#: read back (:attr:`tracekit.analyze.model.phases.PhaseModel.ops_store`); the kernel unions
#: (3.8 MiB at 16x the shared trace) are made again by the pageable and what-if sections
PER_OP_FRAMES = ("kernel_frames", "comm_kernels", "host_copies", "compute_ops", "ops_frame",
                 ("overlap_kernel_unions", False), ("overlap_kernel_unions", True))


def run(ctx: Context, names=None, before: Callable[[Section], None] | None = None) -> Context:
    """Run the sections of ``names`` (default: every one) and those they need on ``ctx``, in
    :func:`order`: each section's ``compute(ctx)`` result goes into ``ctx.out`` (its names in
    ``ctx.produced[section]``), the section into ``ctx.ran``. ``before(section)`` is called
    before each (a progress display). Returns ``ctx``; errors of a section propagate."""
    for s in order(names):
        if before is not None:
            before(s)
        got = s.compute(ctx)
        for key in PER_OP_FRAMES:  # (built again by the next section that reads them)
            ctx.model.cache.pop(key, None)
        from tracekit.analyze.trace.heap import release

        release()  # the C heap's pages the section's reads freed (tracekit.analyze.trace.heap)
        ctx.out.update(got)
        ctx.produced[s.name] = tuple(got)
        ctx.ran.append(s.name)
    return ctx


def choices_help() -> str:
    """``--section``'s choices, for its help text."""
    return ", ".join(SECTIONS)


def parse_sections(text: list[str] | str | None, all_: bool = False) -> tuple[str, ...]:
    """``"overlap,pageable"`` (or a list of such) -> sections; raises TracekitError for unknown."""
    if all_:
        return SECTIONS
    if not text:
        return ()
    items = [text] if isinstance(text, str) else list(text)
    out = []
    for item in items:
        for s in str(item).split(","):
            s = s.strip()
            if not s:
                continue
            if s == "all":
                return SECTIONS
            if s not in REGISTRY:
                raise TracekitError(f"--section {s!r}: choose from {', '.join(SECTIONS)} (or all)")
            if s not in out:
                out.append(s)
    return tuple(out)
