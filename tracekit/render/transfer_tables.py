"""Terminal tables for the transfer sections and the findings summary (issue 4).

Reads only the analysis dict (:mod:`tracekit.analyze.result`), like :mod:`tracekit.render.tables`.
Units on screen: ms (1e6 ns), MB (1e6 B), GB (1e9 B), GB/s (1e9 B/s). Text from the trace
(NVTX names in sub-phases and findings) is printed as data (:mod:`tracekit.textsafe`).
"""

from __future__ import annotations

from rich.console import Console

from tracekit.textsafe import text as _t
from tracekit.vocab import fmt_gb as _gb
from tracekit.vocab import fmt_gbps as _rate
from tracekit.vocab import fmt_mb as _mb
from tracekit.vocab import fmt_ms as _ms
from tracekit.vocab import fmt_number as _num
from tracekit.vocab import fmt_pct as _pct
from tracekit.vocab import fmt_size as _size


from tracekit.render.section_table import cell_text as _txt
from tracekit.render.section_table import iteration_cell as _it
from tracekit.render.section_table import phase_cell as _phase
from tracekit.render.section_table import section_table as _table


OVERLAP = [
    ("iter", _it, _txt), ("phase", _phase, _txt),
    ("H2D ms", "h2d_busy_ns", _ms), ("H2D hidden", "h2d_overlap_ratio", _pct), ("H2D exposed ms", "h2d_exposed_ns", _ms),
    ("D2H ms", "d2h_busy_ns", _ms), ("D2H hidden", "d2h_overlap_ratio", _pct), ("D2H exposed ms", "d2h_exposed_ns", _ms),
    ("both dirs ms", "bidir_ns", _ms), ("copy exposed ms", "copy_exposed_ns", _ms),
]
CONTENTION = [
    ("iter", _it, _txt), ("phase", _phase, _txt), ("copy ms", "copy_busy_ns", _ms), ("windows", "windows", _num),
    ("same-dir ms", "same_direction_ns", _ms), ("bidir ms", "bidirectional_ns", _ms),
    ("contended ms", "contention_ns", _ms), ("share", "contention_share", _pct), ("slowdown", "median_slowdown", _num),
]
WINDOWS = [
    ("kind", "kind", _txt), ("dir", "direction", _txt), ("start ms", "start", _ms), ("ms", "duration_ns", _ms),
    ("H2D MB", "h2d_bytes", _mb), ("D2H MB", "d2h_bytes", _mb), ("GB/s", "gbps", _rate), ("slowdown", "slowdown", _num),
    ("iter", _it, _txt), ("phase", _phase, _txt), ("sub-phase", "sub_phase", _txt),
]
SIZES = [
    ("phase", "phase", _txt), ("dir", "direction", _txt), ("host", "host_kind", _txt),
    ("size from", "bucket_lo", lambda v: _size(v)), ("size to", "bucket_hi", lambda v: _size(v)),
    ("count", "count", _num), ("MB", "bytes", _mb), ("copy ms", "copy_ns", _ms), ("median GB/s", "median_gbps", _rate),
]
PAGEABLE = [
    ("phase", "phase", _txt), ("sub-phase", "sub_phase", _txt), ("dir", "direction", _txt), ("count", "count", _num),
    ("MB", "bytes", _mb), ("copy ms", "copy_ns", _ms), ("GB/s", "gbps", _rate), ("pinned GB/s", "pinned_gbps", _rate),
    ("saving ms", "saving_ns", _ms), ("scenario", "scenario", _txt), ("host ms", "host_ns", _ms),
    ("blocking", "blocking_count", _num),
]
MEMORY = [
    ("iter", _it, _txt), ("phase", _phase, _txt), ("peak GB", "peak_bytes", _gb), ("min GB", "min_bytes", _gb),
    ("device GB", "total_memory", _gb), ("headroom GB", "headroom_bytes", _gb),
]
PCIE = [
    ("iter", _it, _txt), ("phase", _phase, _txt), ("dir", "direction", _txt), ("samples", "samples", _num),
    ("mean %", "mean_pct", _num), ("peak %", "peak_pct", _num), ("idle %", "baseline_pct", _num),
    ("copy GB/s", "copy_gbps", _rate),
    ("implied peak GB/s", "implied_peak_gbps", _rate),
]
TRIPS = [
    ("iter", _it, _txt), ("phase", lambda r: f"backward {r['micro_step']}" + (" *" if r["boundary"] else ""), _txt),
    ("H2D MB", "h2d_bytes", _mb), ("H2D ms", "h2d_ns", _ms), ("D2H MB", "d2h_bytes", _mb), ("D2H ms", "d2h_ns", _ms),
    ("round trip ms", "round_trip_ns", _ms),
]
UPDATE = [
    ("iter", _it, _txt), ("wall ms", "wall_ns", _ms), ("GPU idle ms", "gpu_idle_ns", _ms),
    ("idle", "gpu_idle_share", _pct), ("H2D MB", "h2d_bytes", _mb), ("peak GB", "peak_bytes", _gb),
    ("free GB", "free_bytes", _gb), ("params (16 B/param)", "state_params", lambda v: "" if v is None else f"{v / 1e9:,.2f} B"),
]


def render_rank_transfers(console: Console, head: str, rank: dict, phase: str | None = None,
                          wide: bool = True) -> None:
    """Tables of the transfer sections present in ``rank["transfers"]`` (with ``phase``, the
    overlap of that phase's sub-phases too); without ``wide``, the columns of
    :data:`tracekit.render.section_table.NARROW_DROP` are left out."""
    tr = rank.get("transfers") or {}
    if "overlap" in tr:
        _table(console, f"{head}: copy/compute overlap per phase window (hidden = share of copy time under kernels)",
               tr["overlap"].get("overlap", []), OVERLAP, wide=wide)
        total = [dict(r, phase="all phases") for r in tr["overlap"].get("overlap_total", [])]
        _table(console, f"{head}: copy/compute overlap, whole trace per phase",
               tr["overlap"].get("overlap_phase", []) + total, OVERLAP[1:], wide=wide)
        subs = [r for r in tr["overlap"].get("overlap_sub_phase", []) if r.get("phase") == phase]
        if phase and subs:
            _table(console, f"{head}: copy/compute overlap in {phase} by sub-phase",
                   sorted(subs, key=lambda r: (r.get("iteration") is None, r.get("iteration"), -r["copy_busy_ns"])),
                   [OVERLAP[0], ("sub-phase", "sub_phase", _txt), *OVERLAP[2:]], wide=wide)
    if "contention" in tr:
        c = tr["contention"]
        _table(console, f"{head}: PCIe contention per phase window", c.get("contention", []), CONTENTION, wide=wide)
        ub = ", ".join(f"{r['direction']} {r['host_kind']} {r['median_gbps']:.1f} GB/s ({r['copies']} copies)"
                       for r in c.get("uncontended_bandwidth", []) if r["median_gbps"] is not None)
        console.print(_t(f"uncontended copies, median bandwidth: {ub or 'none'}"))
        wins = sorted(c.get("contention_windows", []), key=lambda r: -r["duration_ns"])
        _table(console, f"{head}: longest contention windows", wins, WINDOWS, limit=10, wide=wide)
    if "sizes" in tr:
        _table(console, f"{head}: copy sizes (power-of-two buckets) per phase", tr["sizes"].get("copy_sizes", []), SIZES, wide=wide)
    if "pageable" in tr:
        _table(console, f"{head}: pageable copies per phase and sub-phase (saving: the steady iterations' "
               "part of the what-if scenario named, as the advice gives it)",
               tr["pageable"].get("pageable_phase", []), PAGEABLE, wide=wide)
    if "memory" in tr:
        _table(console, f"{head}: GPU memory in use (CUDA allocator view) per phase window",
               tr["memory"].get("memory_peaks", []), MEMORY, wide=wide)
    if "timeline" in tr:
        line = timeline_line(tr["timeline"])
        if line:
            console.print(_t(f"{head}: {line}"))
    if "pcie" in tr:
        p = tr["pcie"]
        _table(console, f"{head}: PCIe RX (H2D) / TX (D2H) metric per phase window vs copies",
               p.get("pcie", []), PCIE, wide=wide)
        sat = p.get("pcie_saturation", [])
        console.print(_t(f"{head}: PCIe saturation windows: {len(sat)}, "
                         f"{_ms(sum(r['duration_ns'] for r in sat))} ms in total"))
    if "opportunities" in tr:
        o = tr["opportunities"]
        _table(console, f"{head}: gradient round trips per backward micro-step (* = accumulation boundary)",
               o.get("round_trips", []), TRIPS, wide=wide)
        _table(console, f"{head}: update: idle GPU and free memory during the CPU optimizer step",
               o.get("update_opportunity", []), UPDATE, wide=wide)
    if "idle" in tr:
        from tracekit.render.idle_tables import render_idle

        render_idle(console, head, tr["idle"], wide=wide)


def timeline_line(timeline: dict) -> str | None:
    """The terminal view's line of a rank's ``timeline`` section: bins, bin width and the peak
    bin GB/s per phase and direction; None without bins. Read from ``throughput_peaks`` (one row
    per phase and direction, :func:`tracekit.analyze.sections.throughput.timeline_peaks`) where the
    result has them, else from the per-bin ``throughput_timeline`` rows (a result from the JSON)."""
    if "throughput_peaks" in timeline:
        rows = timeline["throughput_peaks"]
        n = sum(r["bins"] for r in rows)
        width = rows[0]["bin_ns"] if rows else 0
        peaks = {(r["phase"], r["direction"]): r["peak_gbps"] or 0.0 for r in rows}
    else:
        bins = timeline.get("throughput_timeline", [])
        n = len(bins)
        width = bins[0]["bin_end"] - bins[0]["bin_start"] if bins else 0
        peaks: dict[tuple, float] = {}
        for b in bins:
            k = (b["phase"], b["direction"])
            peaks[k] = max(peaks.get(k, 0.0), b["gbps"] or 0.0)
    if not n:
        return None
    txt = "; ".join(f"{p} {d} {v:.1f}" for (p, d), v in sorted(peaks.items()) if v > 0)
    return (f"copy throughput timeline: {n} bins of {_ms(width)} ms; "
            f"peak bin GB/s per phase: {txt or 'no copies'} (rows in --json / --out)")


def render_findings(console: Console, result: dict) -> None:
    """The findings summary and the notes on skipped sections."""
    for note in result.get("transfer_notes", []):
        console.print(_t(f"note: {note}"))
    findings = result.get("findings") or []
    if not findings:
        return
    console.print(_t("findings", "bold"))
    multi = len({(f["pid"], f["device"]) for f in findings}) > 1
    for f in findings:
        prefix = f"pid {f['pid']} device {f['device']}: " if multi else ""
        console.print(_t(f"- {prefix}{f['text']}"))
