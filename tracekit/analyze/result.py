"""The analysis of one trace as a JSON-ready dict: what ``--json`` prints and the tables show.

Shape (times in ns, sizes in bytes, rates in GB/s = 1e9 B/s)::

    {"trace": str, "schema_version": str, "nsys_version": str|null,
     "phase_source": {pid: "tracekit"|"DeepSpeed"|"phase-map"[+"+tracekit"|"+DeepSpeed"]|"none"|"no NVTX"
                      [+"+inferred-update"]},
     "nvtx_anomalies": {"unclosed_ranges": int, "start_end_ranges": int, "marks": int,
                        "cross_thread_ranges": int},
     "gpu_op_anomalies": {KIND_REASON: int},  # rows set aside (tracekit.analyze.model.gpu_ops.SET_ASIDE_REASONS)
     "ranks": [{"pid": int, "device": int,
                "iterations": [{"index": int, "complete": bool, "unclosed": bool,
                                "phases": [{"phase": str, "micro_step": int|null,
                                            "boundary": bool, "inferred": bool, "unclosed": bool,
                                            "start_ns": int, "end_ns": int, **METRICS,
                                            "gpu_idle_share": float|null,
                                            "h2d_gbps": float|null, "d2h_gbps": float|null,
                                            "idle_breakdown": {...}, "launch_stats": {...}}]}],
                "totals": {PHASE: {same numeric keys}},
                "sub_phases": {PHASE: [{"iteration": int, "sub_phase": str, ...}]}}],
     "summary": {"ranks": int, "iterations": int, "per_phase": {PHASE: {"mean_wall_ns": float,
                 "max_wall_ns": int, "slowest_rank_pid": int|null, "spread_ns": int}}},
     "incomplete_iterations": [{"pid": int, "iteration": int, "phase": str, "micro_step": int|null,
                                "range": str, "form": "duration"|"null"|"stop", "reason": str,
                                "start_ns": int, "end_ns": int}]}

An iteration is ``complete`` when it has an update and none of its phase windows comes from
an NVTX range that never closed. Such a window (``unclosed``: true) ends at the process's last
recorded activity instead of the range's end (``tracekit.analyze.model.phases.set_aside_unclosed``);
``incomplete_iterations`` lists each with the reason. ``totals`` still sum every window (they
are totals); steady-state figures (findings, ``tracekit report`` key numbers, ``compare``)
leave these iterations out.

``totals`` covers the whole trace, so its ``other`` holds start-up and anything outside
iterations. ``sub_phases`` is present for the phase asked with ``--phase``.

Transfer analyses (docs/transfers.md): each rank gets ``"transfers": {SECTION: {FRAME: [rows]}}``
for the sections selected in :class:`Options` (frames of
:func:`tracekit.analyze.sections.transfers.analyze_transfers`, without ``global_pid``/``device``), and
the top level ``"findings": [{"topic", "pid", "device", "phase", "text", "values"}]`` and
``"transfer_notes": [str]`` (sections skipped for missing data, with the nsys option).

Many GPUs (issue 12, :mod:`tracekit.analyze.sections.multi_gpu`): ranks are listed by distributed rank
and carry ``"rank", "local_rank", "world", "host"``; phase rows and totals carry ``comm_busy_ns``
and ``comm_count`` (communication kernels, apart from ``kernel_busy_ns``); top level
``"rank_order"``, ``"hosts": [{"host", "host_contention": {"devices", "concurrent_ns", "h2d_ns",
"d2h_ns", "mixed_ns", "windows", ...}}]`` and ``"waiting_ranks"``.
With ``--iteration N`` the findings cover that iteration only. Each finding has a one-line
``"summary"`` with its numbers (:mod:`tracekit.analyze.sections.finding_summary`);
``"findings_per_run"`` holds each finding once per run (``[{"topic", "phase", "summary",
"ranks", "worst", "key_min", "key_max", "key_unit"}]``: the same finding on several ranks
merged) and ``"across_ranks"`` the ranks side by side per steady iteration (iteration and
phase ns, GPU idle, collective waits, the slowest rank: :mod:`tracekit.analyze.run_summary`).

Advice (docs/advice.md, :mod:`tracekit.analyze.sections.advice`): top level ``"config": {"source",
"path", "versions", "gpus", "note", "settings": [{"key", "value", "source": "config"|"default"|
"trace", "how"}]}``, ``"advice": [{"problem", "knob", "change", "baseline_iteration_ms",
"predicted_iteration_ms", "saving_ms_per_iteration", "saving_pct", "basis", "confidence",
"scenario", "pid", "device", "config_fixable"}]`` (per rank, per steady iteration, largest saving
first), ``"one_time_costs": [{"problem", "total_ms", "knob", "change", "pid", "device"}]`` and
``"predictions": [{"pid", "device", "scenario", "applicable", "baseline_ns", "predicted_ns",
"saving_ns", "basis", "confidence", ...}]`` (every what-if scenario, applicable or not).

Idle GPU time (docs/idle.md, :mod:`tracekit.analyze.sections.idle`, issue 22): each phase row carries
``"idle_breakdown": {"gpu_busy_ns", "in_api_ns", "between_api_ns", "waiting_ns", "by_api": {call: ns},
"by_api_group": {group: ns}}`` (the first four summing to its ``wall_ns``) and ``"launch_stats":
{"kernel_count", "launch_count", "kernels_per_ms", "launches_per_ms", "launch_mean_ns", "launch_p50_ns",
"launch_p99_ns", "queue_mean_ns", "queue_p50_ns", "kernel_p50_ns", "short_kernels"}``.

The CPU optimizer step wherever it ran (:mod:`tracekit.analyze.sections.cpu_update`, issue 15): each
iteration has ``"cpu_update": {"busy_ns", "hidden_ns", "exposed_ns", "overlapped_ns",
"wait_ns", "hidden_by_phase": {phase: ns}, "overlapped_by_phase": {phase: ns},
"exposed_basis", "ranges", "worker_ranges", "workers": [OS pid]}`` (null for a rank without
``cpu_optimizer_step`` ranges), each rank ``"cpu_update_steady"`` (the same as means per steady
iteration, with ``"iterations"`` and ``"warmup"``; null without), and the top level
``"cpu_update_notes": [str]`` (ranges left out, and why).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracekit.analyze import sections
from tracekit.analyze.model import phases
from tracekit.analyze.sections import Context, breakdown
from tracekit.analyze.sections.transfers import transfer_result
from tracekit.analyze.significance import slowest
from tracekit.analyze.trace.export import Export
from tracekit.options import Options  # the one Options of every command, importable from here too
from tracekit.vocab import PHASE_ORDER, json_number, os_pid, phase_rank


def _clean(row: dict) -> dict:
    return {k: json_number(k, v) for k, v in row.items()}


PHASE_ROW_KEYS = ["phase", "micro_step", "boundary", "inferred", "unclosed", "start_ns", "end_ns", *breakdown.METRICS,
                  "gpu_idle_share", "h2d_gbps", "d2h_gbps"]
TOTAL_KEYS = [*breakdown.METRICS, "gpu_idle_share", "h2d_gbps", "d2h_gbps", "start_ns", "end_ns"]
SUB_KEYS = ["iteration", "sub_phase", "wall_ns", "gpu_busy_ns", "gpu_idle_ns", "gpu_idle_share",
            "kernel_busy_ns", "h2d_bytes", "h2d_busy_ns", "h2d_count", "h2d_gbps",
            "d2h_bytes", "d2h_busy_ns", "d2h_count", "d2h_gbps"]


def analyze_export(export: Export, options: Options | dict | None = None) -> dict:
    """Run the phase breakdown on an open export; returns the dict described in the module doc.

    Raises :class:`~tracekit.errors.MissingDataError` when the trace has no CUDA activity.
    """
    return compute(export, Options.of(options))[0]


def compute(export: Export, options: Options, step=None, defer_timeline: bool = False,
            keep_ranges: bool = False) -> tuple[dict, dict]:
    """The analysis of an open export: ``(result, parts)``, ``result`` the dict of the module doc
    and ``parts`` what it was built from, ``{"model": PhaseModel, "table": phase_table,
    "totals": totals, "sub_phases": {phase: sub_phase_table}, "transfers": TransferResult}``
    (kept by :class:`tracekit.analysis.Analysis`, so that nothing is computed twice).

    Raises :class:`~tracekit.errors.MissingDataError` when the trace has no CUDA activity,
    :class:`TracekitError` for an ``options.iteration`` the trace lacks. ``step(message)`` is
    called before each stage (a progress display).

    ``defer_timeline``: each rank's ``transfers.timeline`` holds ``throughput_peaks`` (what the
    terminal view prints) instead of the per-bin ``throughput_timeline`` rows, and
    ``parts["timeline_deferred"]`` lists ``(that dict, global_pid, device)`` so that
    :meth:`tracekit.analysis.Analysis.to_json` builds the rows only when asked (issue 13).

    ``keep_ranges``: the model holds only the NVTX ranges the sections read
    (:func:`range_keep`; the others are reloaded from the trace if a later reader asks for them,
    :func:`tracekit.analyze.model.phases.ranges_for`), and its GPU operations are spilled to a
    file that each reader reads only its columns and rows of
    (``spill`` of :func:`tracekit.analyze.model.phases.build`, not under a memory limit:
    :func:`_may_spill`), so that neither stays in memory
    for the whole run (issue 24).
    """
    step = step or (lambda _m: None)
    step("finding phases and attributing GPU work")
    spill = keep_ranges and _may_spill()
    model = phases.build(export, phase_map=list(options.phase_map) if options.phase_map else None, gas=options.gas,
                         keep=range_keep(options) if keep_ranges else None, spill=spill)
    ctx = Context(export, model, tuple(options.sections or ()), options.pcie_threshold, options.bin_ns,
                  phase=options.phase, iteration=options.iteration, ds_config=options.ds_config)

    def before(section) -> None:
        if section.name == "breakdown":
            step("per-phase breakdown")
        elif len(ctx.ran) == 1:
            step("transfers, findings and advice")

    sections.run(ctx, before=before)  # every section of the registry, in dependency order
    table, tot, sub, full_sub = (ctx.out[k] for k in ("phase_table", "totals", "sub_phases", "sub_phases_all"))
    tr = transfer_result(ctx)
    ranks = []
    from tracekit.analyze.sections import cpu_update, idle

    idle_rows = ctx.out["idle_rows"]  # where each phase's GPU idle time goes (issue 22)
    from tracekit.analyze.sections.multi_gpu import rank_index, to_json

    cu = ctx.out["cpu_update"]

    ids = rank_index(tr.multi_gpu)  # ranks listed by distributed rank (issue 12)
    deferred = []
    # the phase rows of every rank and iteration in one pass: by iteration, merged gaps ("other") last
    per_rank: dict = {}
    for row in table.filter(pl.col("iteration").is_not_null()).sort(
            "global_pid", "device", "iteration", pl.col("phase") == "other", "start_ns").iter_rows(named=True):
        per_rank.setdefault((row["global_pid"], row["device"]), {}).setdefault(row["iteration"], []).append(row)
    tot_rows: dict = {}
    for row in tot.iter_rows(named=True):
        tot_rows.setdefault((row["global_pid"], row["device"]), []).append(row)
    for r in sorted(breakdown.ranks(model).iter_rows(named=True),
                    key=lambda r: (ids.get((r["global_pid"], r["device"]), {}).get("rank", 1 << 30), r["pid"])):
        iterations = []
        for idx, it in per_rank.get((r["global_pid"], r["device"]), {}).items():
            iterations.append(
                {
                    "index": int(idx),
                    "complete": not any(row["complete"] is False for row in it),  # polars' all(): nulls skipped
                    "unclosed": any(row["unclosed"] is True for row in it),
                    "phases": [{**_clean({k: row[k] for k in PHASE_ROW_KEYS}),
                                **idle_rows.get(tuple(row[k] for k in idle.ROW_KEYS), {})} for row in it],
                    "cpu_update": cpu_update.iteration_json(cu, r["global_pid"], r["device"], int(idx)),
                }
            )
        iterations.sort(key=lambda d: d["index"])
        rtot = tot_rows.get((r["global_pid"], r["device"]), [])
        totals = {
            row["phase"]: _clean({k: row[k] for k in TOTAL_KEYS})
            for row in sorted(rtot, key=lambda d: phase_rank(d["phase"]))
        }
        entry = {"pid": int(r["pid"]), "device": int(r["device"]), **ids.get((r["global_pid"], r["device"]), {}),
                 "iterations": iterations, "totals": totals}
        entry["cpu_update_steady"] = cpu_update.steady(cu, r["global_pid"], r["device"])
        if options.phase:
            same = (pl.col("global_pid") == r["global_pid"]) & (pl.col("device") == r["device"])
            rs = sub.filter(same) if sub.height else sub
            entry["sub_phases"] = {
                options.phase: [_clean({k: row[k] for k in SUB_KEYS}) for row in rs.iter_rows(named=True)]
            }
        if tr.sections:
            entry["transfers"] = tr.rank_sections(r["global_pid"], r["device"], options.phase, options.iteration,
                                                  timeline_rows=not defer_timeline)
            if "throughput_peaks" in entry["transfers"].get("timeline", {}):
                deferred.append((entry["transfers"]["timeline"], r["global_pid"], r["device"]))
        ranks.append(entry)
    result = {
        "trace": str(export.path),
        "schema_version": export.schema_version,
        "nsys_version": export.nsys_version,
        "phase_source": {str(os_pid(gp)): src for gp, src in sorted(model.source.items())},
        "nvtx_anomalies": model.anomalies,
        "gpu_op_anomalies": {k: v for k, v in export.set_aside.items() if not k.startswith("nvtx_")},
        "ranks": ranks,
        "summary": summarize(ranks),
        "transfer_notes": tr.notes,
        **to_json(tr.multi_gpu),
        "findings": ctx.out["findings"],
        **{k: v for k, v in ctx.out["advice"].items() if not k.startswith("_")},
        "incomplete_iterations": _incomplete(model),
        "cpu_update_notes": cu.notes,
    }
    from tracekit.analyze.run_summary import across_ranks
    from tracekit.analyze.sections.finding_summary import per_run

    result["across_ranks"] = across_ranks(result)  # the ranks side by side, per steady iteration
    result["findings_per_run"] = per_run(result["findings"], {(r["pid"], r["device"]): r.get("rank", i)
                                                               for i, r in enumerate(ranks)})
    parts = {"model": model, "table": table, "totals": tot, "transfers": tr,
             "sub_phases": {options.phase: full_sub} if options.phase else {}}
    if deferred:
        parts["timeline_deferred"] = deferred
    return result, parts


def _may_spill() -> bool:
    """Whether the GPU operations may go to an op store (:mod:`tracekit.analyze.model.op_store`):
    not under an address-space or data-segment limit (:func:`tracekit.memlimit.current_limit`).
    The store's reads run in polars' streaming engine, and under such a limit a thread or buffer
    that cannot be had left that engine waiting for ever (seen at ``prlimit --as=1000000000`` on
    the 9,538-op fixture) instead of failing, as the in-memory frames do, into the one line of
    :mod:`tracekit.memlimit`; there the ops stay in memory."""
    from tracekit.memlimit import current_limit

    return current_limit() is None


def range_keep(options: Options) -> phases.RangeKeep:
    """The NVTX ranges the sections of an analysis with ``options`` read
    (:class:`tracekit.analyze.model.phases.RangeKeep`): those in the ``update`` windows (the idle
    section's sub-phases) and in the windows of ``options.phase`` (the sub-phase table), and by name
    the what-if model's steps and the CPU update's ranges."""
    from tracekit.analyze.sections.cpu_update import CPU_STEP, CPU_WAIT
    from tracekit.analyze.sections.whatif_pieces import RANGE_NAMES

    kept = {"update", *([options.phase] if options.phase else [])}
    names = "|".join(f"(?:{p})" for p in (RANGE_NAMES, CPU_STEP, CPU_WAIT))
    return phases.RangeKeep(phases=frozenset(kept), names=names)


def _incomplete(model: phases.PhaseModel) -> list[dict]:
    """``incomplete_iterations`` of the result: one dict per window cut because its NVTX range
    never closed (:attr:`tracekit.analyze.model.phases.PhaseModel.unclosed`)."""
    return [
        {"pid": os_pid(r["global_pid"]), "iteration": r["iteration"], "phase": r["phase"],
         "micro_step": r["micro_step"], "range": r["name"], "form": r["form"], "reason": r["reason"],
         "start_ns": r["start"], "end_ns": r["end"]}
        for r in model.unclosed.iter_rows(named=True)
    ]


def summarize(ranks: list[dict]) -> dict:
    """Across ranks: count, iterations, and per phase the mean and max total wall time, the
    pid of the slowest rank and the spread (max - min), from each rank's ``totals``. The
    slowest rank is named only when its total differs from the next one's by
    :func:`tracekit.analyze.significance.slowest` (else ``slowest_rank_pid`` is null)."""
    per_phase: dict[str, dict] = {}
    for phase in PHASE_ORDER:
        vals = [(r["totals"][phase]["wall_ns"], r["pid"]) for r in ranks if phase in r["totals"]]
        if not vals:
            continue
        walls = [v for v, _ in vals]
        slow = max(vals)
        pid = slowest(sorted(vals))  # None: no rank's total differs from the next (the one rule)
        per_phase[phase] = {
            "mean_wall_ns": json_number("mean_wall_ns", sum(walls) / len(walls)),
            "max_wall_ns": int(slow[0]),
            "slowest_rank_pid": None if pid is None else int(pid),
            "spread_ns": int(max(walls) - min(walls)),
        }
    n_it = max((len(r["iterations"]) for r in ranks), default=0)
    return {"ranks": len(ranks), "iterations": n_it, "per_phase": per_phase}


def analyze_path(path: str | Path, options: Options | None = None) -> dict:
    """Open ``path`` read-only and analyze it (see :func:`analyze_export`)."""
    with Export.open(path) as export:
        return analyze_export(export, options)
