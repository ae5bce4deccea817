"""The study's figures, one function each; every function returns ``(figure, frame)``.

The frame is exactly what was drawn (in ns, bytes and GB/s; the axes show ms/s, GB, GB/s),
so a test or a notebook can check or re-plot the numbers. Figures use the phase colours of
:data:`tracekit.render.style.PHASE_COLORS` everywhere.

1. :func:`iteration_breakdown` - per iteration, stacked phase wall time with the GPU-busy part;
2. :func:`iteration_timeline` - one iteration: GPU memory, H2D and D2H throughput, PCIe metrics,
   phase and update sub-phase bands;
3. :func:`copy_size_distribution` - copies per power-of-two size bucket, pinned vs pageable;
4. :func:`sub_phase_breakdown` - update sub-phases: time (GPU busy vs CPU only) and throughput;
5. :func:`overlap_contention` - hidden vs exposed copy time per phase, contention windows;
6. :func:`rank_summary` - per rank, mean phase time and copy volume per iteration;
7. :func:`idle_breakdown` - per phase, wall time split into GPU busy and the three kinds of
   GPU idle time of :mod:`tracekit.analyze.sections.idle` (docs/idle.md).

Errors: :class:`~tracekit.errors.TracekitError` for a rank or iteration the trace lacks.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.patches import Patch

from tracekit.analyze.model.intervals import busy_in_windows
from tracekit.render import data as D
from tracekit.render import style as S
from tracekit.render.data import ReportData
from tracekit.textsafe import mpl
from tracekit.vocab import short_name

PHASE_SHORT = {"forward": "F", "backward": "B", "update": "U", "other": "gap"}


def _segment_label(phase: str, micro_step, boundary: bool) -> str:
    label = PHASE_SHORT.get(phase, phase)
    if phase in ("forward", "backward") and micro_step is not None:
        label += str(micro_step)
    if boundary:
        label += "*"
    return label


def iterations_note(its: list[int]) -> str:
    """``iterations 1-3`` / ``iteration 2`` / ``iterations 1, 3, 4`` for titles."""
    if not its:
        return "no iteration"
    if len(its) == 1:
        return f"iteration {its[0]}"
    if its == list(range(its[0], its[-1] + 1)):
        return f"iterations {its[0]}–{its[-1]}"
    return "iterations " + ", ".join(str(i) for i in its)


def _iteration_rows(data: ReportData, rank: dict) -> pl.DataFrame:
    """Phase rows of a rank in drawing order (time order, merged gaps last)."""
    t = data.rank_table(rank)
    return t.sort("iteration", pl.col("phase") == "other", "start_ns")


# ====================================================================== figure 1
def iteration_breakdown(data: ReportData, rank: int = 0):
    """Figure 1: per iteration, stacked bars of the phase wall times in time order (forward and
    backward per micro-step, the accumulation boundary backward hatched, update, and the gaps
    between them as ``gap``), each with its GPU-busy part drawn solid and the GPU-idle part light.

    Frame (one row per drawn segment): ``iteration, phase, micro_step, boundary, label,
    wall_ns, gpu_busy_ns, gpu_idle_ns, bottom_ns`` (stack offset), ``complete``.
    Values come from :func:`tracekit.analyze.sections.breakdown.phase_table`.
    """
    rk = data.rank(rank)
    rows = _iteration_rows(data, rk)
    frame = rows.select(
        "iteration", "phase", "micro_step", "boundary", "complete", "wall_ns", "gpu_idle_ns",
        gpu_busy_ns=pl.col("wall_ns") - pl.col("gpu_idle_ns"),
    ).with_columns(
        bottom_ns=(pl.col("wall_ns").cum_sum() - pl.col("wall_ns")).over("iteration"),
        label=pl.struct("phase", "micro_step", "boundary").map_elements(
            lambda s: _segment_label(s["phase"], s["micro_step"], s["boundary"]), return_dtype=pl.String
        ),
    ).select("iteration", "phase", "micro_step", "boundary", "label", "wall_ns", "gpu_busy_ns",
             "gpu_idle_ns", "bottom_ns", "complete")
    its = sorted(frame["iteration"].unique().to_list())
    frame = frame.with_columns(warmup=pl.col("iteration").is_in(D.warmup_iterations(data, rk)))
    totals = frame.group_by("iteration").agg(pl.col("wall_ns").sum(), pl.col("warmup").first())
    warm = sorted(totals.filter(pl.col("warmup"))["iteration"].to_list())
    steady_max = totals.filter(~pl.col("warmup"))["wall_ns"].max() or 0
    # the warm-up step drawn apart, on its own scale, when it would squeeze the others
    apart = bool(warm) and (totals.filter(pl.col("warmup"))["wall_ns"].max() > 1.5 * steady_max)
    groups = [warm, [i for i in its if i not in warm]] if apart else [its]
    n = len(its)
    width_in = min(16, max(8, 2.5 + 0.7 * n))
    if apart:
        fig, axes = S.new_figure(1, 2, width=width_in, height=5.4,
                                 gridspec_kw={"width_ratios": [max(len(warm), 1) + 0.6, len(groups[1]) + 0.6]})
        axes = list(axes)
    else:
        fig, ax = S.new_figure(width=width_in, height=5.4)
        axes = [ax]
    fig.suptitle(f"Iteration breakdown — pid {rk['pid']} GPU {rk['device']}\n{_title(data)}", x=0.01, ha="left",
                 fontsize=10)
    if n == 0:
        S.style_axes(axes[0])
        axes[0].text(0.5, 0.5, "no iterations in this trace", ha="center", va="center", transform=axes[0].transAxes)
        return fig, frame.drop("warmup")
    incomplete = frame.filter(~pl.col("complete"))["iteration"].unique().to_list()
    for gi, (ax, group) in enumerate(zip(axes, groups)):
        S.style_axes(ax)
        fr = frame.filter(pl.col("iteration").is_in(group))
        tot = totals.filter(pl.col("iteration").is_in(group))
        div, unit = S.time_unit(tot["wall_ns"].max())
        _draw_stacks(ax, fr, group, div, label_ok=len(group) <= 16)
        ticks, labels = list(range(len(group))), [f"{it}" + (" (no update)" if it in incomplete else "")
                                                  for it in group]
        if len(group) > 25:
            step = int(np.ceil(len(group) / 20))
            ticks, labels = ticks[::step], labels[::step]
        ax.set_xticks(ticks, labels)
        ax.set_xlim(-0.6, len(group) - 0.4)
        ax.set_ylim(0, tot["wall_ns"].max() / div * 1.08)
        ax.set_ylabel(f"wall time ({unit})")
        S.tidy_axis(ax, "y")
        if apart:
            ax.set_title("warm-up (own scale)" if gi == 0 else f"steady iterations (mean over {iterations_note(group)})",
                         loc="left", fontsize=9)
            ax.set_xlabel("iteration")
        else:
            ax.set_xlabel("iteration")
    present = set(frame["phase"].unique().to_list())
    handles = [Patch(color=S.PHASE_COLORS[p], label=p if p != "other" else "gap (other)") for p in S.PHASES
               if p in present]
    handles += [
        Patch(facecolor="#777777", label="solid: GPU busy"),
        Patch(facecolor="#777777", alpha=0.35, label="light: GPU idle"),
    ]
    if frame["boundary"].any():
        handles.append(Patch(facecolor="white", edgecolor="#333333", hatch="///", label="accumulation boundary"))
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return fig, frame.drop("warmup")


def _draw_stacks(ax, frame: pl.DataFrame, its: list[int], div: float, label_ok: bool) -> None:
    """The stacked segments of ``its`` on ``ax`` (x = position in ``its``): light wall bars,
    solid GPU-busy bars inside, hatched accumulation boundaries; bars for up to 100
    iterations (with gids ``wall:IT:LABEL`` / ``busy:IT:LABEL``), collections past that."""
    n = len(its)
    pos = {it: i for i, it in enumerate(its)}
    width = 0.8
    xs = np.array([pos[i] for i in frame["iteration"].to_list()], dtype=float)
    colors = [S.phase_color(p) for p in frame["phase"].to_list()]
    bottoms = frame["bottom_ns"].to_numpy() / div
    heights = frame["wall_ns"].to_numpy() / div
    names = [f"{i}:{lab}" for i, lab in zip(frame["iteration"].to_list(), frame["label"].to_list())]
    busy_h = frame["gpu_busy_ns"].to_numpy() / div
    bnd = frame["boundary"].to_numpy()
    if n <= 100:
        walls = ax.bar(xs, heights, width, bottom=bottoms, color=colors, alpha=0.35, edgecolor="white",
                       linewidth=1.0 if n <= 60 else 0)
        busy = ax.bar(xs, busy_h, width * 0.6, bottom=bottoms, color=colors, edgecolor="none")
        for name, w_, b_ in zip(names, walls, busy):
            w_.set_gid(f"wall:{name}")
            b_.set_gid(f"busy:{name}")
        if bnd.any():
            ax.bar(xs[bnd], heights[bnd], width, bottom=bottoms[bnd], color="none", edgecolor="#333333",
                   hatch="///", linewidth=0)
    else:  # thousands of segments: one collection per layer (a Rectangle each costs ~1 ms in matplotlib)
        _rects(ax, xs, bottoms, heights, width, colors, alpha=0.35)
        _rects(ax, xs, bottoms, busy_h, width * 0.6, colors)
        if bnd.any():
            _rects(ax, xs[bnd], bottoms[bnd], heights[bnd], width, ["none"] * int(bnd.sum()), hatch="///",
                   edgecolor="#333333", linewidth=0)
    if label_ok:
        totals = frame.group_by("iteration").agg(pl.col("wall_ns").sum())
        ymax = totals["wall_ns"].max() / div
        for x, b, h, r in zip(xs, bottoms, heights, frame.iter_rows(named=True)):
            if r["phase"] != "other" and h > 0.045 * ymax:
                busy_pct = 100 * r["gpu_busy_ns"] / r["wall_ns"] if r["wall_ns"] else 0
                ax.text(x + width * 0.36, b + h / 2, f"{r['label']}\n{busy_pct:.0f}% busy", ha="left", va="center",
                        fontsize=7, color="#222222",
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
        for it in its:
            tot = totals.filter(pl.col("iteration") == it)["wall_ns"][0] / div
            ax.text(pos[it], tot, f"{tot:,.0f}" if tot >= 100 else f"{tot:,.1f}", ha="center", va="bottom", fontsize=8)


def _rects(ax, xs, bottoms, heights, width, colors, **kw):
    """Bars as one PolyCollection (centred at ``xs``)."""
    from matplotlib.collections import PolyCollection

    x0, x1 = xs - width / 2, xs + width / 2
    top = bottoms + heights
    verts = np.stack([np.stack([x0, bottoms], 1), np.stack([x0, top], 1), np.stack([x1, top], 1),
                      np.stack([x1, bottoms], 1)], 1)
    coll = PolyCollection(verts, facecolors=colors, **kw)
    ax.add_collection(coll)
    return coll


# ====================================================================== figure 2
def _title(data: ReportData) -> str:
    """The run line of every figure: trace, model size, ZeRO stage, offload, precision
    (:func:`tracekit.render.config.trace_config`)."""
    from tracekit.render.config import trace_config

    return _text(trace_config(data).label())


def _text(value, width: int | None = None) -> str:
    """Text from the trace (or built around it: a label holding a memory-kind or NVTX name)
    for a matplotlib title, label, tick, legend entry or text: control characters as visible
    escapes (an ESC in an NVTX name otherwise breaks the SVG and warns about a missing glyph),
    ``$`` escaped so that no mathtext is parsed (:func:`tracekit.textsafe.mpl`; ``a$\\frac{$b``
    would otherwise fail the whole figure). TeX is never used (:mod:`tracekit.render.style`
    sets ``text.usetex`` off). With ``width``, cut to that many characters with ``…`` (a
    300-character memory-kind name in a legend would squeeze the axes to nothing). Every trace
    string of this module's figures goes through here."""
    s = "" if value is None else str(value)
    if width is not None and len(s) > width:
        s = s[: max(width - 1, 1)] + "…"
    return mpl(s)


#: Characters of a memory-kind name (pinned, pageable, ...) drawn in a label.
KIND_WIDTH = 32


def _short(name, width: int = 38) -> str:
    """:func:`tracekit.vocab.short_name` made safe for matplotlib (:func:`_text`)."""
    return _text(short_name(name, width))


def _sub_phase_names(names) -> dict:
    """Display name of each update sub-phase: ``(none)`` (no sub-range open) is the unmarked
    CPU optimizer step unless a range of the trace already marks that step."""
    names = [n for n in names if n]
    marked = any("optimizer_step" in n for n in names if n != "(none)")
    return {n: (S.UNMARKED_NAME if not marked else S.UNMARKED_NAME_MARKED) if n == "(none)" else n for n in names}


def _sub_phase_segments(data: ReportData, rk: dict, iteration: int, phase: str = "update") -> pl.DataFrame:
    """Self-time segments of ``phase``'s sub-phases in one iteration: ``sub_phase, s, e``."""
    wm = data.sections.rank_windows().filter(
        (pl.col("phase") == phase) & (pl.col("global_pid") == rk["global_pid"])
        & (pl.col("device") == rk["device"]) & (pl.col("iteration") == iteration)
    )
    if wm.height == 0:
        return pl.DataFrame(schema={"sub_phase": pl.String, "s": pl.Int64, "e": pl.Int64})
    seg = data.sections.self_segments(wm)
    return seg.select("sub_phase", "s", "e").sort("s")


def iteration_timeline(data: ReportData, rank: int = 0, iteration: int | None = None,
                       bin_ns: int | None = None, max_sub_phases: int = 8):
    """Figure 2: one iteration (default: the median complete iteration) on a shared time axis.

    Panels: phase bands (forward/backward per micro-step, update, gaps) with the sub-phases of
    the update (innermost NVTX range self time; the ``max_sub_phases`` longest coloured and
    named, ``(none)`` = no range open = the unmarked CPU optimizer step, the rest grey); GPU
    memory in use (GB, the axis scaled to what changes); H2D copies and D2H copies, each copy
    drawn as its own interval [start, end) at its bandwidth (GB/s = bytes / duration; pageable
    hatched), with the trace's pinned and pageable reference bandwidths
    (:func:`tracekit.render.data.reference_bandwidths`) as dashed lines; the GPU-metrics PCIe
    RX / TX throughput (% of link peak, mean per bin of ``bin_ns``, default
    :func:`tracekit.render.data.nice_bin`) in a panel of its own when the trace has it.
    All sub-phase and copy segments are drawn as one collection per colour (linear in the
    number of NVTX ranges).

    Frame (long): ``series`` (``memory``, ``H2D``, ``D2H``, ``pcie_RX``, ``pcie_TX``, ``phase``,
    ``sub_phase``), ``t_ns`` (absolute trace time), ``t_end_ns`` (bands, copies, PCIe bins),
    ``value`` (bytes in use; a copy's GB/s; mean percent per bin; null for bands), ``bytes``
    (of a copy), ``label`` (band name; a copy's host kind), ``phase`` (of a band or a copy),
    ``sub_phase`` (of a copy).
    """
    rk = data.rank(rank)
    it = data.pick_iteration(rk, iteration)
    win = data.rank_windows(rk).filter(pl.col("iteration") == it).sort("start")
    t0 = int(win["start"].min())
    t1 = int(win["end"].max())
    span = max(t1 - t0, 1)
    div, unit = S.time_unit(span)
    bin_ns = bin_ns or D.nice_bin(span)
    none_str = pl.lit(None, pl.String)
    # bands
    bands = win.select(
        series=pl.lit("phase"), t_ns="start", t_end_ns="end", value=pl.lit(None, pl.Float64),
        bytes=pl.lit(None, pl.Int64),
        label=pl.struct("phase", "micro_step", "boundary").map_elements(
            lambda s: _segment_label(s["phase"], s["micro_step"], s["boundary"]), return_dtype=pl.String),
        phase="phase", sub_phase=none_str,
    )
    segs = _sub_phase_segments(data, rk, it)
    sub = segs.select(series=pl.lit("sub_phase"), t_ns="s", t_end_ns="e", value=pl.lit(None, pl.Float64),
                      bytes=pl.lit(None, pl.Int64), label="sub_phase", phase=pl.lit("update"), sub_phase="sub_phase")
    # memory
    tl = D.memory_timeline(data, rk)
    inside = tl.filter((pl.col("t_ns") > t0) & (pl.col("t_ns") < t1))
    mem = pl.concat([
        pl.DataFrame({"t_ns": [t0], "in_use_bytes": [int(D.level_at(tl, np.array([t0]))[0])]}),
        inside,
        pl.DataFrame({"t_ns": [t1], "in_use_bytes": [int(D.level_at(tl, np.array([t1 - 1]))[0])]}),
    ]) if tl.height else pl.DataFrame(schema={"t_ns": pl.Int64, "in_use_bytes": pl.Int64})
    mem_f = mem.select(series=pl.lit("memory"), t_ns="t_ns", t_end_ns=pl.lit(None, pl.Int64),
                       value=pl.col("in_use_bytes").cast(pl.Float64), bytes=pl.lit(None, pl.Int64), label=none_str,
                       phase=none_str, sub_phase=none_str)
    cp = D.copy_intervals(data, rk, t0, t1)
    cp_f = cp.select(series="direction", t_ns="start_ns", t_end_ns="end_ns", value="gbps", bytes="bytes",
                     label="host_kind", phase="phase", sub_phase="sub_phase")
    ref = D.reference_bandwidths(data, rk, data.steady_iterations(rk))
    # PCIe samples (nsys samples at 10 kHz by default) averaged over bins of bin_ns
    pm = D.pcie_metrics(data, rk, t0, t1).with_columns(
        t_ns=t0 + (pl.col("t_ns") - t0) // bin_ns * bin_ns
    ).group_by("metric", "t_ns").agg(pl.col("percent").mean()).sort("metric", "t_ns")
    pm_f = pm.select(series=pl.lit("pcie_") + pl.col("metric"), t_ns="t_ns", t_end_ns=pl.col("t_ns") + bin_ns,
                     value="percent", bytes=pl.lit(None, pl.Int64), label=none_str, phase=none_str,
                     sub_phase=none_str)
    parts = [p.cast({"t_ns": pl.Int64, "t_end_ns": pl.Int64, "value": pl.Float64, "bytes": pl.Int64})
             for p in (cp_f, pm_f, mem_f, bands, sub)]  # numeric series first: CSV readers infer types from the top
    frame = pl.concat(parts, how="vertical_relaxed")

    has_pcie = pm.height > 0
    ratios = [0.9, 0.55, 1.3, 1.3] + ([0.8] if has_pcie else [])
    fig, axes = S.new_figure(len(ratios), 1, width=13, height=2.0 + 1.6 * sum(ratios), sharex=True,
                             gridspec_kw={"height_ratios": ratios})
    ax_b, ax_m, ax_h, ax_d = axes[:4]
    x = lambda t: (np.asarray(t, dtype=np.float64) - t0) / div  # noqa: E731
    fig.suptitle(_title(data), x=0.01, ha="left", fontsize=9, color="#444444")

    # band strip: row 1 phases, row 0 update sub-phases; one collection per colour
    top_subs = (segs.with_columns(d=pl.col("e") - pl.col("s")).group_by("sub_phase").agg(pl.col("d").sum())
                .sort("d", descending=True, maintain_order=True))
    named = [s for s in top_subs["sub_phase"].to_list() if s != "(none)"][:max_sub_phases]
    sub_colors = {s: S.SUB_PHASE_CYCLE[i % len(S.SUB_PHASE_CYCLE)] for i, s in enumerate(named)}
    if "(none)" in top_subs["sub_phase"].to_list():
        sub_colors["(none)"] = S.UNMARKED_COLOR
    display = _sub_phase_names(top_subs["sub_phase"].to_list())
    _bars_by_colour(ax_b, x(bands["t_ns"]), (bands["t_end_ns"] - bands["t_ns"]).to_numpy() / div,
                    [S.phase_color(p) for p in bands["phase"].to_list()], (1.05, 0.9), edgecolor="white", lw=0.5)
    for r in bands.iter_rows(named=True):
        if r["phase"] != "other" and (r["t_end_ns"] - r["t_ns"]) / span > 0.03:
            ax_b.text(x((r["t_ns"] + r["t_end_ns"]) / 2), 1.5, _text(r["label"]), ha="center", va="center", fontsize=8,
                      color="white", fontweight="bold")
    for a in axes[1:]:
        _spans(a, x(bands["t_ns"]), x(bands["t_end_ns"]), [S.phase_color(p) for p in bands["phase"].to_list()],
               [p != "other" for p in bands["phase"].to_list()])
    if segs.height:
        _bars_by_colour(ax_b, x(segs["s"]), (segs["e"] - segs["s"]).to_numpy() / div,
                        [sub_colors.get(s, S.OTHER_SUB_COLOR) for s in segs["sub_phase"].to_list()], (0.05, 0.9))
        wide = segs.filter((pl.col("e") - pl.col("s")) > 0.07 * span)
        for r in wide.head(20).iter_rows(named=True):  # wide enough to name in place
            if r["sub_phase"] in sub_colors:
                w = (r["e"] - r["s"]) / span
                ax_b.text(x((r["s"] + r["e"]) / 2), 0.5, _short(display[r["sub_phase"]], max(8, int(w * 150))),
                          ha="center", va="center", fontsize=7, color="white", fontweight="bold", clip_on=True)
        ax_b.set_yticks([0.5, 1.5], ["update\nsub-phases", "phase"], fontsize=8)
    else:
        ax_b.set_yticks([1.5], ["phase"], fontsize=8)
    ax_b.set_ylim(0, 2)
    for side in ("top", "right", "left"):
        ax_b.spines[side].set_visible(False)
    ax_b.tick_params(axis="y", length=0)
    ax_b.set_title(f"Iteration {it} in time — pid {rk['pid']} GPU {rk['device']} "
                   f"({span / div:,.{0 if unit == 'ms' else 1}f} {unit}; each copy drawn as its own interval)",
                   loc="left")
    present = set(bands["phase"].to_list())
    handles = [Patch(color=S.PHASE_COLORS[p], label=p if p != "other" else "gap") for p in S.PHASES if p in present]
    sub_share = {r["sub_phase"]: r["d"] for r in top_subs.iter_rows(named=True)}
    upd = max(sum(sub_share.values()), 1)
    handles += [Patch(color=c, label=f"{_short(display[s], 64)} ({100 * sub_share[s] / upd:.0f}%)")
                for s, c in sub_colors.items()]
    rest = [s for s in sub_share if s not in sub_colors]
    if rest:
        handles.append(Patch(color=S.OTHER_SUB_COLOR,
                             label=f"{len(rest)} other sub-phases ({100 * sum(sub_share[s] for s in rest) / upd:.0f}%)"))
    ax_b.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.35), frameon=False, fontsize=7,
                title="phases; update sub-phases (share of the update)", title_fontsize=7)

    # memory, scaled to what changes
    S.style_axes(ax_m)
    if mem.height:
        gb = mem["in_use_bytes"].to_numpy() / 1e9
        ax_m.step(x(mem["t_ns"]), gb, where="post", color=S.MEMORY_COLOR, lw=1.4)
        lo, hi = float(gb.min()), float(gb.max())
        pad = max(0.1 * (hi - lo), 0.02 * hi, 0.01)
        ax_m.set_ylim(max(lo - pad, 0), hi + pad)
        if hi - lo < 0.01 * max(hi, 1e-9):
            ax_m.text(0.01, 0.85, f"flat at {hi:,.2f} GB in this iteration (allocator cache)", transform=ax_m.transAxes,
                      fontsize=8, va="top")
        else:
            ax_m.text(0.01, 0.95, f"{lo:,.2f}–{hi:,.2f} GB (axis starts at {max(lo - pad, 0):,.2f} GB)",
                      transform=ax_m.transAxes, fontsize=7, va="top", color="#555555")
    else:
        ax_m.text(0.5, 0.5, "no CUDA memory events (nsys --cuda-memory-usage=true)", ha="center", va="center",
                  transform=ax_m.transAxes, fontsize=9)
        ax_m.set_yticks([])
    ax_m.set_ylabel("GPU memory\nin use (GB)", fontsize=8)
    S.tidy_axis(ax_m, "y", 3)

    for a, d in ((ax_h, "H2D"), (ax_d, "D2H")):
        S.style_axes(a)
        c = cp.filter(pl.col("direction") == d)
        kinds = [k for k in ("pinned", "pageable") if k in c["host_kind"].to_list()]
        kinds += sorted(k for k in set(c["host_kind"].to_list()) - set(kinds) if k is not None)
        for k in kinds:
            ck = c.filter(pl.col("host_kind") == k)
            coll = _intervals(a, x(ck["start_ns"]), x(ck["end_ns"]), ck["gbps"].to_numpy(), S.DIRECTION_COLORS[d],
                              hatch=S.HOST_KIND_HATCH.get(k, ".."), alpha=1.0 if k == "pageable" else 0.8,
                              edge="#222222" if k == "pageable" else S.DIRECTION_COLORS[d])
            coll.set_gid(f"copies:{d}:{k}")
            coll.set_label(f"{d} copies, {_text(k, KIND_WIDTH)} host memory ({ck.height})")
        ymax = float(c["gbps"].max() or 0)
        for r in ref.filter(pl.col("direction") == d).iter_rows(named=True):
            a.axhline(r["gbps"], color="#222222", lw=0.9, ls="--" if r["host_kind"] == "pinned" else ":",
                      label=f"{_text(r['host_kind'], KIND_WIDTH)} reference: {r['gbps']:,.1f} GB/s (copies ≥ 1 MiB, "
                            "steady iterations)")
            ymax = max(ymax, r["gbps"])
        a.set_ylabel(f"{d} copy\nbandwidth (GB/s)", fontsize=8)
        a.set_ylim(0, max(ymax * 1.2, 1.0))
        S.tidy_axis(a, "y", 4)
        if c.height == 0:
            a.text(0.5, 0.5, f"no {d} copies in this iteration", ha="center", va="center", transform=a.transAxes,
                   fontsize=8)
        else:
            a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    if has_pcie:
        ax_p = axes[4]
        S.style_axes(ax_p)
        for metric, d in (("RX", "H2D"), ("TX", "D2H")):
            m = pm.filter(pl.col("metric") == metric)
            if m.height:
                ax_p.step(np.append(x(m["t_ns"]), x(int(m["t_ns"][-1]) + bin_ns)),
                          np.append(m["percent"].to_numpy(), m["percent"][-1]), where="post",
                          color=S.DIRECTION_COLORS[d], lw=0.9,
                          label=f"PCIe {metric} ({'into' if metric == 'RX' else 'out of'} the GPU, {d} side)")
        ax_p.set_ylim(0, 105)
        ax_p.set_ylabel(f"PCIe (% of link\npeak, {bin_ns / 1e6:g} ms mean)", fontsize=8)
        S.tidy_axis(ax_p, "y", 4)
        ax_p.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False,
                    title="GPU metrics", title_fontsize=7)
    axes[-1].set_xlim(0, span / div)
    axes[-1].set_xlabel(f"time since iteration start ({unit})")
    S.tidy_axis(axes[-1], "x", 10)
    return fig, frame


def _bars_by_colour(ax, x0, widths, colors, yrange, edgecolor="none", lw=0.0):
    """Horizontal segments [x0, x0 + width) at ``yrange`` = (y, height): one collection per
    colour, however many segments (linear in their number)."""
    colors = np.asarray(colors, dtype=object)
    x0 = np.asarray(x0, dtype=float)
    widths = np.asarray(widths, dtype=float)
    for c in dict.fromkeys(colors.tolist()):
        sel = colors == c
        ax.broken_barh(np.stack([x0[sel], widths[sel]], 1), yrange, facecolors=c, edgecolors=edgecolor,
                       linewidth=lw).set_gid(f"segments:{c}")


def _spans(ax, x0, x1, colors, keep, alpha=0.09):
    """Background vertical bands (one collection per colour), for the ``keep`` ones."""
    from matplotlib.collections import PolyCollection
    from matplotlib.transforms import blended_transform_factory

    x0, x1 = np.asarray(x0, float), np.asarray(x1, float)
    keep = np.asarray(keep, bool)
    colors = np.asarray(colors, dtype=object)
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    for c in dict.fromkeys(colors[keep].tolist()):
        sel = keep & (colors == c)
        verts = [[(a, 0), (a, 1), (b, 1), (b, 0)] for a, b in zip(x0[sel], x1[sel])]
        ax.add_collection(PolyCollection(verts, facecolors=c, alpha=alpha, linewidths=0, transform=tr),
                          autolim=False)


def _intervals(ax, x0, x1, heights, color, hatch="", alpha=1.0, edge=None):
    """Rectangles [x0, x1) x [0, height) as one collection, each edged so that a copy shorter
    than a pixel still shows."""
    from matplotlib.collections import PolyCollection

    x0, x1, h = np.asarray(x0, float), np.asarray(x1, float), np.asarray(heights, float)
    verts = np.stack([np.stack([x0, 0 * h], 1), np.stack([x0, h], 1), np.stack([x1, h], 1),
                      np.stack([x1, 0 * h], 1)], 1) if len(h) else np.zeros((0, 4, 2))
    coll = PolyCollection(verts, facecolors=color, edgecolors=edge or color, linewidths=0.6, alpha=alpha,
                          hatch=hatch or None)
    ax.add_collection(coll)
    return coll


# ====================================================================== figure 3
def copy_size_distribution(data: ReportData, rank: int = 0, iterations_only: bool = True):
    """Figure 3: H2D and D2H memcpy bytes and count per power-of-two size bucket, totals over the
    iterations of the trace (the title says which), stacked by phase (phase colours), pageable
    host memory hatched with a dark edge (it is what costs), pinned plain. Counts on a log
    scale, so that a few large copies stay visible beside thousands of 4-byte flag copies.
    With ``iterations_only`` (default), copies outside the iterations (start-up, model
    loading) are left out.

    Frame: :func:`tracekit.render.data.copy_sizes` by phase (``direction, phase, host_kind,
    bucket, bucket_bytes, count, bytes, busy_ns``; totals, not per iteration).
    """
    rk = data.rank(rank)
    frame = D.copy_sizes(data, rk, iterations_only, by_phase=True)
    fig, axes = S.new_figure(2, 2, width=13, height=7.4, sharex=True)
    its = data.iteration_spans(rk)["iteration"].to_list()
    warm = D.warmup_iterations(data, rk)
    scope = (f"totals over {iterations_note(its)}" + (" (warm-up included)" if warm else "") if iterations_only
             else "totals over the whole trace")
    fig.suptitle(f"Copy sizes — pid {rk['pid']} GPU {rk['device']}, {scope}\n{_title(data)}", x=0.01, ha="left",
                 fontsize=10)
    if frame.height == 0:
        for a in axes.ravel():
            a.text(0.5, 0.5, "no H2D/D2H copies", ha="center", va="center", transform=a.transAxes)
        return fig, frame
    b_lo, b_hi = int(frame["bucket"].min()), int(frame["bucket"].max())
    buckets = list(range(b_lo, b_hi + 1))
    kinds = [k for k in ("pinned", "pageable") if k in frame["host_kind"].unique().to_list()]
    kinds += [k for k in frame["host_kind"].unique().to_list() if k not in kinds]
    phases = [p for p in (*S.PHASES, None) if p in frame["phase"].to_list()]
    phases += [p for p in frame["phase"].unique().to_list() if p not in phases]
    for j, d in enumerate(D.COPY_DIRECTIONS):
        for i, (col, ylabel, scale) in enumerate((("bytes", "bytes (GB, total)", 1e9), ("count", "copies (total, log)", 1.0))):
            a = axes[i, j]
            S.style_axes(a)
            bottom = np.zeros(len(buckets))
            for k in kinds:
                for ph in phases:
                    f = frame.filter((pl.col("direction") == d) & (pl.col("host_kind") == k)
                                     & (pl.col("phase").eq_missing(ph)))
                    if f.height == 0:
                        continue
                    vals = np.zeros(len(buckets))
                    for r in f.iter_rows(named=True):
                        vals[r["bucket"] - b_lo] = r[col] / scale
                    pageable = k == "pageable"
                    nz = vals > 0
                    bars = a.bar(np.array(buckets)[nz], vals[nz], 0.8, bottom=bottom[nz],
                                 color=S.phase_color(ph or "other"), alpha=1.0 if pageable else 0.6,
                                 hatch=S.HOST_KIND_HATCH.get(k, ".."), edgecolor="#111111" if pageable else "white",
                                 linewidth=0.8 if pageable else 0.5)
                    for b, p in zip(np.array(buckets)[nz].tolist(), bars):
                        p.set_gid(f"{d}:{ph}:{k}:{col}:{b}")
                    bottom += vals
            if col == "bytes":
                for b, v in zip(buckets, bottom):
                    if 0 < v < 0.01 * bottom.max():  # tiny next to the largest: say so
                        a.text(b, bottom.max() * 0.01, "▲", ha="center", va="bottom", fontsize=6, color="#666666")
                a.text(0.01, 0.97, "▲ bytes present, under 1% of the tallest bar", transform=a.transAxes,
                       fontsize=7, color="#666666", va="top")
                S.tidy_axis(a, "y", 5)
                pg = frame.filter((pl.col("direction") == d) & (pl.col("host_kind") == "pageable"))
                if pg.height:
                    top = pg.sort("bytes", descending=True).row(0, named=True)
                    if top["bytes"] > 0.01 * bottom.max() * 1e9:
                        a.annotate(f"pageable {S.size_label(top['bucket_bytes'])}+: {top['bytes'] / 1e9:,.2f} GB "
                                   f"in {top['count']} copies", (top["bucket"], bottom[top["bucket"] - b_lo]),
                                   xytext=(0, 12), textcoords="offset points", ha="center", fontsize=8,
                                   fontweight="bold", arrowprops={"arrowstyle": "-", "color": "#111111"})
                a.margins(y=0.18)
                a.set_title(f"{d}", loc="left")
            else:
                a.set_yscale("log")
                a.set_ylim(0.7, max(bottom.max(), 1) * 2.5)
            a.set_ylabel(ylabel)
    handles = [Patch(color=S.phase_color(p or "other"), label=f"launched in {p or 'no phase'}" if p != "other"
                     else "launched in a gap") for p in phases]
    handles += [Patch(facecolor="#BBBBBB", alpha=0.6, edgecolor="white", label="pinned host memory")]
    if "pageable" in kinds:
        handles.append(Patch(facecolor="#BBBBBB", hatch=S.HOST_KIND_HATCH["pageable"], edgecolor="#111111",
                             label="pageable host memory"))
    axes[0, 1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    step = max(1, int(np.ceil(len(buckets) / 32)))
    for a in axes[1]:
        a.set_xticks(buckets[::step], [S.size_label(2**b) for b in buckets[::step]], rotation=60, ha="right", fontsize=7)
        a.set_xlabel("copy size bucket [2^k, 2^(k+1)) bytes")
    return fig, frame


# ====================================================================== figure 4
def sub_phase_breakdown(data: ReportData, rank: int = 0, phase: str = "update", top: int = 10):
    """Figure 4: ``phase``'s sub-phases (innermost NVTX range, self time), mean per steady
    iteration (:meth:`ReportData.steady_iterations`): time split into GPU busy and CPU only (no GPU activity), and H2D / D2H
    throughput of the copies launched in the sub-phase (bytes / copy busy time). The ``top``
    longest sub-phases are shown; the rest are summed into ``(other sub-phases)``.

    Frame: ``sub_phase, iterations, wall_ns, gpu_busy_ns, cpu_only_ns`` (means per iteration),
    ``h2d_bytes, d2h_bytes`` (means per iteration), ``h2d_gbps, d2h_gbps`` (null without
    copies), from :func:`tracekit.analyze.sections.breakdown.sub_phase_table`.
    """
    rk = data.rank(rank)
    st = data.sections.sub_phase_table(phase)
    complete = data.steady_iterations(rk)
    if st.height:
        st = st.filter((pl.col("global_pid") == rk["global_pid"]) & (pl.col("device") == rk["device"])
                       & pl.col("iteration").is_in(complete))
    n = max(len(complete), 1)
    sums = ["wall_ns", "gpu_busy_ns", "gpu_idle_ns", "h2d_bytes", "h2d_busy_ns", "d2h_bytes", "d2h_busy_ns"]
    schema = {"sub_phase": pl.String, "iterations": pl.Int64, "wall_ns": pl.Float64, "gpu_busy_ns": pl.Float64,
              "cpu_only_ns": pl.Float64, "h2d_bytes": pl.Float64, "d2h_bytes": pl.Float64,
              "h2d_gbps": pl.Float64, "d2h_gbps": pl.Float64}
    if st.height == 0:
        frame = pl.DataFrame(schema=schema)
    else:
        agg = st.group_by("sub_phase").agg(*[pl.col(c).sum() for c in sums]).sort("wall_ns", descending=True)
        if agg.height > top:
            head, rest = agg.head(top), agg.tail(agg.height - top)
            rest = rest.select(*[pl.col(c).sum() for c in sums]).with_columns(sub_phase=pl.lit("(other sub-phases)"))
            agg = pl.concat([head, rest.select(head.columns)])
        frame = agg.select(
            "sub_phase", iterations=pl.lit(n, pl.Int64),
            wall_ns=pl.col("wall_ns") / n, gpu_busy_ns=pl.col("gpu_busy_ns") / n, cpu_only_ns=pl.col("gpu_idle_ns") / n,
            h2d_bytes=pl.col("h2d_bytes") / n, d2h_bytes=pl.col("d2h_bytes") / n,
            h2d_gbps=pl.when(pl.col("h2d_busy_ns") > 0).then(pl.col("h2d_bytes") / pl.col("h2d_busy_ns")),
            d2h_gbps=pl.when(pl.col("d2h_busy_ns") > 0).then(pl.col("d2h_bytes") / pl.col("d2h_busy_ns")),
        ).cast(schema)
    k = frame.height
    fig, (ax_t, ax_r) = S.new_figure(1, 2, width=14, height=max(3.5, 1.2 + 0.42 * k), sharey=True,
                                     gridspec_kw={"width_ratios": [1.5, 1]})
    fig.suptitle(f"{phase.capitalize()} sub-phases — pid {rk['pid']} GPU {rk['device']}, mean per iteration "
                 f"over {iterations_note(complete)}\n{_title(data)}", x=0.01, ha="left", fontsize=10)
    if k == 0:
        ax_t.text(0.5, 0.5, f"no {phase} windows with NVTX sub-ranges", ha="center", va="center", transform=ax_t.transAxes)
        return fig, frame
    y = np.arange(k)
    div, unit = S.time_unit(frame["wall_ns"].max())
    c = S.phase_color(phase)
    busy = frame["gpu_busy_ns"].to_numpy() / div
    cpu = frame["cpu_only_ns"].to_numpy() / div
    b1 = ax_t.barh(y, busy, 0.7, color=c, label="GPU busy")
    b2 = ax_t.barh(y, cpu, 0.7, left=busy, color=c, alpha=0.35, hatch="..", edgecolor="white", linewidth=0,
                   label="CPU only (GPU idle)")
    for i, (p1, p2) in enumerate(zip(b1, b2)):
        p1.set_gid(f"busy:{i}")
        p2.set_gid(f"cpu:{i}")
    total = frame["wall_ns"].sum()
    for i, r in enumerate(frame.iter_rows(named=True)):
        share = r["cpu_only_ns"] / r["wall_ns"] if r["wall_ns"] else 0
        ax_t.text(r["wall_ns"] / div, i, f"  {r['wall_ns'] / div:,.1f} ({100 * r['wall_ns'] / total:.0f}%, "
                  f"{100 * share:.0f}% CPU only)", va="center", fontsize=7)
    display = _sub_phase_names(frame["sub_phase"].to_list())
    ax_t.set_yticks(y, [_short(display.get(s, s), 44) for s in frame["sub_phase"].to_list()], fontsize=8)
    ax_t.invert_yaxis()
    ax_t.set_xlabel(f"self time per iteration ({unit}); GPU busy = anything running on the GPU meanwhile")
    ax_t.set_xlim(0, frame["wall_ns"].max() / div * 1.45)
    S.tidy_axis(ax_t, "x")
    ax_t.grid(True, axis="x", color="#E5E5E5")
    ax_t.set_axisbelow(True)
    ax_t.legend(loc="lower right", fontsize=8, frameon=False)
    for side in ("top", "right"):
        ax_t.spines[side].set_visible(False)
    h = 0.38
    for off, d in ((-h / 2, "H2D"), (h / 2, "D2H")):
        col = f"{d.lower()}_gbps"
        vals = frame[col].fill_null(0).to_numpy()
        bars = ax_r.barh(y + off, vals, h, color=S.DIRECTION_COLORS[d], label=f"{d}")
        for i, (p, r) in enumerate(zip(bars, frame.iter_rows(named=True))):
            p.set_gid(f"{d}:{i}")
            mb = r[f"{d.lower()}_bytes"] / 1e6
            if r[col] is not None and mb > 0:
                txt = f" {mb:,.1f} MB" if mb >= 0.1 else f" {r[f'{d.lower()}_bytes']:,.0f} B"
                ax_r.text(vals[i], i + off, txt, va="center", fontsize=7)
    gmax = float(np.nanmax([frame["h2d_gbps"].fill_null(0).max() or 0, frame["d2h_gbps"].fill_null(0).max() or 0]))
    # what this trace's pinned and pageable copies reach: 7 GB/s reads as slow beside 53 GB/s
    ref = D.reference_bandwidths(data, rk, complete)
    for j, r in enumerate(ref.iter_rows(named=True)):
        ax_r.axvline(r["gbps"], color=S.DIRECTION_COLORS[r["direction"]], lw=1.0,
                     ls="--" if r["host_kind"] == "pinned" else ":", gid=f"ref:{r['direction']}:{r['host_kind']}")
        kind = _text(r["host_kind"], KIND_WIDTH)
        ax_r.text(r["gbps"], 1.0 + 0.05 * j, f" {kind} {r['direction']} {r['gbps']:,.1f} GB/s",
                  transform=ax_r.get_xaxis_transform(), fontsize=7, color=S.DIRECTION_COLORS[r["direction"]],
                  va="bottom", clip_on=False)
        gmax = max(gmax, r["gbps"])
    ax_r.set_xlim(0, max(gmax * 1.4, 1))
    ax_r.set_xlabel("copies launched in the sub-phase (GB/s = bytes / busy time)\n"
                    "lines: this trace's pinned (--) / pageable (··) copies ≥ 1 MiB")
    S.tidy_axis(ax_r, "x")
    ax_r.grid(True, axis="x", color="#E5E5E5")
    ax_r.set_axisbelow(True)
    ax_r.legend(loc="lower right", fontsize=8, frameon=False, title="MB per iteration beside bars", title_fontsize=7)
    for side in ("top", "right"):
        ax_r.spines[side].set_visible(False)
    return fig, frame


# ====================================================================== figure 5
def overlap_contention(data: ReportData, rank: int = 0, iteration: int | None = None):
    """Figure 5: per phase, hidden (overlapped by kernels) and exposed copy time per direction,
    mean per steady iteration (:meth:`ReportData.steady_iterations`); and, on the timeline of one
    iteration (default: the median one), the share of each time bin in which kernels, H2D and D2H
    copies run, with the PCIe contention windows.

    Frame (long): rows with ``section = overlap``: ``phase, direction, copy_ns, hidden_ns,
    exposed_ns`` (means per steady iteration), ``iterations``; rows with ``section =
    contention``: ``start_ns, end_ns, kind`` (``same-direction`` / ``bidirectional``) of the
    windows in the shown iteration; rows with ``section = busy``: ``direction`` (``kernels``,
    ``H2D``, ``D2H``), ``start_ns, end_ns`` (bin), ``copy_ns`` (busy share of the bin, 0..1). See :func:`tracekit.render.data.overlap_by_phase` and
    :func:`tracekit.render.data.contention_windows`.
    """
    rk = data.rank(rank)
    it = data.pick_iteration(rk, iteration)
    ops = data.rank_ops(rk)
    complete = data.steady_iterations(rk)
    n = max(len(complete), 1)
    ov = D.overlap_by_phase(data, rk, by=("phase",), iterations=complete)
    ov = ov.with_columns(
        pl.col("copy_ns") / n, pl.col("hidden_ns") / n, pl.col("exposed_ns") / n,
    )
    win = data.rank_windows(rk).filter(pl.col("iteration") == it)
    t0, t1 = int(win["start"].min()), int(win["end"].max())
    it_ops = ops.filter((pl.col("end") > t0) & (pl.col("start") < t1))
    cw = D.contention_windows(data, rk)
    cw = cw.filter((pl.col("end_ns") > t0) & (pl.col("start_ns") < t1))
    span = t1 - t0
    bin_ns = D.nice_bin(span)
    edges = np.arange(t0, t1 + bin_ns, bin_ns, dtype=np.int64)
    busy_rows: list[pl.DataFrame] = []
    frame = pl.concat([
        ov.select(section=pl.lit("overlap"), phase="phase", direction="direction",
                  copy_ns=pl.col("copy_ns").cast(pl.Float64), hidden_ns=pl.col("hidden_ns").cast(pl.Float64),
                  exposed_ns=pl.col("exposed_ns").cast(pl.Float64), iterations=pl.lit(n, pl.Int64),
                  start_ns=pl.lit(None, pl.Int64), end_ns=pl.lit(None, pl.Int64), kind=pl.lit(None, pl.String)),
        cw.select(section=pl.lit("contention"), phase=pl.lit(None, pl.String), direction=pl.lit(None, pl.String),
                  copy_ns=pl.lit(None, pl.Float64), hidden_ns=pl.lit(None, pl.Float64),
                  exposed_ns=pl.lit(None, pl.Float64), iterations=pl.lit(None, pl.Int64),
                  start_ns="start_ns", end_ns="end_ns", kind="kind"),
    ])
    fig, (ax_o, ax_t) = S.new_figure(2, 1, width=13, height=8, gridspec_kw={"height_ratios": [1.2, 1]})
    # --- overlap bars
    S.style_axes(ax_o)
    # a phase whose copies take under 0.1% of all copy time would be an empty category
    per_phase = ov.group_by("phase").agg(pl.col("copy_ns").sum())
    total_copy = float(per_phase["copy_ns"].sum() or 0)
    shown = set(per_phase.filter(pl.col("copy_ns") >= 0.001 * total_copy)["phase"].to_list()) if total_copy else set()
    phases_present = [p for p in S.PHASES if p in shown] + sorted(p for p in shown if p not in S.PHASES)
    left_out = sorted(set(per_phase["phase"].to_list()) - shown)
    fig.suptitle(_title(data), x=0.01, ha="left", fontsize=9, color="#444444")
    ax_o.set_title(f"Copy time hidden behind kernels vs exposed — pid {rk['pid']} GPU {rk['device']}, "
                   f"mean per iteration over {iterations_note(complete)}", loc="left")
    if left_out:
        ax_o.text(0.99, 0.97, _text("not drawn (under 0.1% of the copy time): " + ", ".join(left_out)),
                  transform=ax_o.transAxes, ha="right", va="top", fontsize=7, color="#666666")
    if ov.height:
        div, unit = S.time_unit(ov["copy_ns"].max())
        w = 0.38
        for j, p in enumerate(phases_present):
            for off, d in ((-w / 2, "H2D"), (w / 2, "D2H")):
                r = ov.filter((pl.col("phase") == p) & (pl.col("direction") == d))
                hid = float(r["hidden_ns"][0]) / div if r.height else 0.0
                exp = float(r["exposed_ns"][0]) / div if r.height else 0.0
                b1 = ax_o.bar(j + off, hid, w, color=S.DIRECTION_COLORS[d], edgecolor=S.phase_color(p), linewidth=1.5)
                b2 = ax_o.bar(j + off, exp, w, bottom=hid, color=S.DIRECTION_COLORS[d], alpha=0.35, hatch="//",
                              edgecolor=S.phase_color(p), linewidth=1.5)
                b1[0].set_gid(f"hidden:{p}:{d}")
                b2[0].set_gid(f"exposed:{p}:{d}")
                if hid + exp > 0.01 * float(ov["copy_ns"].max()) / div:  # label bars one can see
                    share = hid / (hid + exp)
                    ax_o.text(j + off, hid + exp, f"{d}\n{100 * share:.0f}% hidden", ha="center", va="bottom", fontsize=7)
        ax_o.set_xticks(range(len(phases_present)), phases_present)
        for lab, p in zip(ax_o.get_xticklabels(), phases_present):
            lab.set_color(S.phase_color(p))
            lab.set_fontweight("bold")
        ax_o.set_ylabel(f"copy busy time per iteration ({unit})")
        ax_o.margins(y=0.25)
        S.tidy_axis(ax_o, "y")
        ax_o.legend(handles=[
            Patch(color=S.DIRECTION_COLORS["H2D"], label="H2D"), Patch(color=S.DIRECTION_COLORS["D2H"], label="D2H"),
            Patch(facecolor="#999999", label="solid: hidden (a kernel runs)"),
            Patch(facecolor="#999999", alpha=0.35, hatch="//", label="hatched: exposed"),
        ], loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
    else:
        ax_o.text(0.5, 0.5, "no H2D/D2H copies in the iterations", ha="center", va="center", transform=ax_o.transAxes)
    # --- timeline
    div, unit = S.time_unit(span)
    x = lambda t: (np.asarray(t, dtype=np.float64) - t0) / div  # noqa: E731
    for r in win.iter_rows(named=True):
        if r["phase"] != "other":
            ax_t.axvspan(x(r["start"]), x(r["end"]), color=S.phase_color(r["phase"]), alpha=0.12, linewidth=0)
            if (r["end"] - r["start"]) / span > 0.03:
                ax_t.text(x((r["start"] + r["end"]) / 2), 3.55,
                          _segment_label(r["phase"], r["micro_step"], r["boundary"]), ha="center", fontsize=8,
                          color=S.phase_color(r["phase"]), fontweight="bold")
    rows = {"kernels": 2.5, "H2D": 1.5, "D2H": 0.5}
    colors = {"kernels": "#555555", **S.DIRECTION_COLORS}
    for name, sel in (("kernels", pl.col("kind") == "kernel"),
                      ("H2D", (pl.col("kind") == "memcpy") & (pl.col("direction") == "H2D")),
                      ("D2H", (pl.col("kind") == "memcpy") & (pl.col("direction") == "D2H"))):
        c = it_ops.filter(sel)
        share = busy_share(c, edges)
        busy_rows.append(pl.DataFrame({"direction": name, "start_ns": edges[:-1], "end_ns": edges[1:], "share": share}))
        base = rows[name] - 0.4
        ax_t.fill_between(np.append(x(edges[:-1]), x(t1)), base, base + 0.8 * np.append(share, 0), step="post",
                          color=colors[name], linewidth=0)
        ax_t.axhline(base, color="#DDDDDD", lw=0.6)
    from matplotlib.collections import PolyCollection

    kinds_seen = [k for k in S.CONTENTION_COLORS if k in cw["kind"].to_list()]
    for k in kinds_seen:  # one collection per kind, however many windows
        c = cw.filter(pl.col("kind") == k)
        a0 = x(np.maximum(c["start_ns"].to_numpy(), t0))
        a1 = x(np.minimum(c["end_ns"].to_numpy(), t1))
        verts = [[(u, 0), (u, 3), (v, 3), (v, 0)] for u, v in zip(a0, a1)]
        ax_t.add_collection(PolyCollection(verts, facecolors=S.CONTENTION_COLORS[k], alpha=0.6, linewidths=0.5,
                                           edgecolors=S.CONTENTION_COLORS[k], gid=f"contention:{k}"))
    # each row has its own 0-100% scale: ticks at its base and top
    ticks, labels = [], []
    for k, mid in rows.items():
        ticks += [mid - 0.4, mid + 0.4]
        labels += ["0", "100%"]
        ax_t.text(-0.055, mid, f"{k}\nbusy share\n({bin_ns / 1e6:g} ms bins)", transform=ax_t.get_yaxis_transform(),
                  ha="right", va="center", fontsize=8, color=colors[k])
    ax_t.set_yticks(ticks, labels, fontsize=7)
    busy = pl.concat(busy_rows).select(
        section=pl.lit("busy"), phase=pl.lit(None, pl.String), direction="direction", copy_ns="share",
        hidden_ns=pl.lit(None, pl.Float64), exposed_ns=pl.lit(None, pl.Float64), iterations=pl.lit(None, pl.Int64),
        start_ns="start_ns", end_ns="end_ns", kind=pl.lit(None, pl.String))
    frame = pl.concat([frame, busy])
    ax_t.set_ylim(0, 4)
    ax_t.set_xlim(0, span / div)
    ax_t.set_xlabel(f"time since iteration {it} start ({unit})")
    S.tidy_axis(ax_t, "x", 10)
    for side in ("top", "right"):
        ax_t.spines[side].set_visible(False)
    n_cw = cw.height
    tot_cw = int(cw["duration_ns"].sum()) if n_cw else 0
    title = (f"Iteration {it}: copies, kernels and PCIe contention windows — {n_cw} window(s), "
             f"{tot_cw / 1e6:,.2f} ms")
    if n_cw == 0:
        title += " (copies never overlapped each other)"
    ax_t.set_title(title, loc="left", fontsize=10)
    if kinds_seen:  # the legend lists only kinds that occur
        ax_t.legend(handles=[Patch(color=S.CONTENTION_COLORS[k], alpha=0.6, label=f"contention: {k}")
                             for k in kinds_seen],
                    loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
    return fig, frame


def busy_share(ops: pl.DataFrame, edges: np.ndarray) -> np.ndarray:
    """Share (0..1) of each bin [edges[i], edges[i+1]) covered by the union of ``ops``."""
    busy = busy_in_windows(ops["start"].to_numpy(), ops["end"].to_numpy(), edges[:-1], edges[1:])
    return busy / np.diff(edges)


# ====================================================================== rank summary
def rank_summary(data: ReportData):
    """Per-rank summary: mean phase wall time per steady iteration (stacked) and H2D / D2H
    bytes per iteration, one bar per rank, so a slow or copy-heavy rank stands out.

    Frame: ``rank, pid, device, phase, iterations, wall_ns, h2d_bytes, d2h_bytes, comm_ns`` (means
    per steady iteration of that rank, :meth:`ReportData.steady_iterations`; ``comm_ns``: time in
    communication kernels, :mod:`tracekit.analyze.model.communication`, drawn as a thin dark bar under
    the rank's wall-time bar).
    """
    rows = []
    for i in range(data.ranks.height):
        rk = data.rank(i)
        steady = data.steady_iterations(rk)
        t = data.rank_table(rk).filter(pl.col("iteration").is_in(steady))
        n = len(steady)
        if n == 0:
            continue
        g = t.group_by("phase").agg(pl.col("wall_ns").sum() / n, pl.col("h2d_bytes").sum() / n,
                                    pl.col("d2h_bytes").sum() / n,
                                    comm_ns=(pl.col("comm_busy_ns").sum() / n) if "comm_busy_ns" in t.columns
                                    else pl.lit(0.0))
        rows.append(g.with_columns(rank=pl.lit(i, pl.Int64), pid=pl.lit(rk["pid"], pl.Int64),
                                   device=pl.lit(rk["device"], pl.Int64), iterations=pl.lit(n, pl.Int64)))
    schema = {"rank": pl.Int64, "pid": pl.Int64, "device": pl.Int64, "phase": pl.String, "iterations": pl.Int64,
              "wall_ns": pl.Float64, "h2d_bytes": pl.Float64, "d2h_bytes": pl.Float64, "comm_ns": pl.Float64}
    frame = (pl.concat(rows).select(list(schema)).cast(schema) if rows else pl.DataFrame(schema=schema))
    frame = frame.sort("rank", pl.col("phase").replace_strict({p: i for i, p in enumerate(S.PHASES)}, default=9))
    nr = frame["rank"].n_unique()
    fig, (ax_w, ax_b) = S.new_figure(1, 2, width=13, height=max(3.4, 1.8 + 0.45 * nr))
    fig.suptitle(f"Per rank — mean per steady iteration ({nr} rank(s); warm-up left out: the iterations of the "
                 "run's first two micro-steps, when others are complete)", x=0.01, ha="left")
    if frame.height == 0:
        ax_w.text(0.5, 0.5, "no complete iteration", ha="center", va="center", transform=ax_w.transAxes)
        return fig, frame
    ranks = frame.select("rank", "pid", "device").unique().sort("rank")
    labels = [f"rank {r['rank']}\npid {r['pid']} GPU {r['device']}" for r in ranks.iter_rows(named=True)]
    tot = frame.group_by("rank").agg(pl.col("wall_ns").sum())
    div, unit = S.time_unit(tot["wall_ns"].max())
    for y, rk in enumerate(ranks["rank"].to_list()):
        left = 0.0
        for r in frame.filter(pl.col("rank") == rk).iter_rows(named=True):
            b = ax_w.barh(y, r["wall_ns"] / div, 0.6, left=left, color=S.phase_color(r["phase"]), edgecolor="white")
            b[0].set_gid(f"wall:{rk}:{r['phase']}")
            left += r["wall_ns"] / div
        ax_w.text(left, y, f" {left:,.1f}", va="center", fontsize=8)
        comm = frame.filter(pl.col("rank") == rk)["comm_ns"].sum() / div
        if comm > 0:  # communication kernels (NCCL): how much of the iteration the rank spent in them
            b = ax_w.barh(y + 0.38, comm, 0.12, color="#333333")
            b[0].set_gid(f"comm:{rk}")
            ax_w.text(comm, y + 0.38, f" comm {comm:,.1f}", va="center", fontsize=7)
    ax_w.set_xlim(0, tot["wall_ns"].max() / div * 1.12)
    ax_w.set_yticks(range(nr), labels, fontsize=8)
    ax_w.invert_yaxis()
    ax_w.set_xlabel(f"wall time per iteration ({unit})")
    ax_w.legend(handles=[Patch(color=S.PHASE_COLORS[p], label=p if p != "other" else "gap") for p in S.PHASES],
                loc="lower left", bbox_to_anchor=(0, 1.0), ncol=4, fontsize=8, frameon=False)
    S.tidy_axis(ax_w, "x")
    h = 0.35
    byr = frame.group_by("rank").agg(pl.col("h2d_bytes").sum(), pl.col("d2h_bytes").sum()).sort("rank")
    for off, d in ((-h / 2, "H2D"), (h / 2, "D2H")):
        vals = byr[f"{d.lower()}_bytes"].to_numpy() / 1e9
        bars = ax_b.barh(np.arange(nr) + off, vals, h, color=S.DIRECTION_COLORS[d], label=d)
        for rk, p in zip(byr["rank"].to_list(), bars):
            p.set_gid(f"{d}:{rk}")
    ax_b.set_yticks(range(nr), labels, fontsize=8)
    ax_b.invert_yaxis()
    ax_b.set_xlabel("copied per iteration (GB)")
    ax_b.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, fontsize=8, frameon=False)
    S.tidy_axis(ax_b, "x")
    for a in (ax_w, ax_b):
        for side in ("top", "right"):
            a.spines[side].set_visible(False)
    return fig, frame


# ====================================================================== figure 7
def idle_breakdown(data: ReportData, rank: int = 0):
    """Figure 7: per phase, stacked bars of the wall time split into the four categories of
    :mod:`tracekit.analyze.sections.idle` (docs/idle.md): GPU busy, and the GPU idle time with
    a launching thread in a CUDA API call, between API calls (host code), waiting on a
    collective; ms, mean per steady iteration (:meth:`ReportData.steady_iterations`; the
    micro-steps of forward and backward summed into their phase, ``other`` the gaps).

    Frame (one row per phase, in :data:`tracekit.vocab.PHASES` order): ``phase, iterations,
    wall_ns`` and ``gpu_busy_ns, in_api_ns, between_api_ns, waiting_ns`` (ns per steady
    iteration; the four sum to ``wall_ns``); the categories are stacked in
    :data:`tracekit.vocab.IDLE_CATEGORIES` order, GPU busy at the bottom. Bars carry the gid
    ``CATEGORY:PHASE``. From :func:`tracekit.analyze.sections.idle.idle_windows`, the numbers of
    ``--json``'s ``idle_breakdown``.
    """
    from tracekit.vocab import IDLE_CATEGORIES, phase_rank

    rk = data.rank(rank)
    steady = data.steady_iterations(rk)
    n = max(len(steady), 1)
    cats = list(IDLE_CATEGORIES)
    schema = {"phase": pl.String, "iterations": pl.Int64, "wall_ns": pl.Float64, **{c: pl.Float64 for c in cats}}
    w, _api = data.sections.idle_windows()
    w = w.filter((pl.col("global_pid") == rk["global_pid"]) & (pl.col("device") == rk["device"])
                 & pl.col("iteration").is_in(steady))
    if w.height:
        frame = w.group_by("phase").agg(*[pl.col(c).sum() / n for c in ("wall_ns", *cats)]).with_columns(
            iterations=pl.lit(len(steady), pl.Int64)).select(*schema).cast(schema)
        frame = frame.with_columns(_o=pl.col("phase").map_elements(phase_rank, return_dtype=pl.Int64)) \
            .sort("_o", "phase").drop("_o")
    else:
        frame = pl.DataFrame(schema=schema)
    fig, ax = S.new_figure(width=10, height=5.2)
    fig.suptitle(f"Where the GPU idle time goes — pid {rk['pid']} GPU {rk['device']}, ms per iteration "
                 f"(mean over {iterations_note(steady)})\n{_title(data)}", x=0.01, ha="left", fontsize=10)
    S.style_axes(ax)
    if frame.height == 0:
        ax.text(0.5, 0.5, "no phase windows in the steady iterations", ha="center", va="center",
                transform=ax.transAxes)
        return fig, frame
    phases = frame["phase"].to_list()
    x = np.arange(len(phases))
    bottom = np.zeros(len(phases))
    for c in cats:
        h = frame[c].to_numpy() / 1e6
        bars = ax.bar(x, h, 0.6, bottom=bottom, color=S.IDLE_COLORS[c], label=IDLE_CATEGORIES[c],
                      edgecolor="white", linewidth=0.5)
        for p, b in zip(phases, bars):
            b.set_gid(f"{c}:{p}")
        bottom = bottom + h
    for i, r in enumerate(frame.iter_rows(named=True)):
        idle_ns = r["wall_ns"] - r["gpu_busy_ns"]
        share = idle_ns / r["wall_ns"] if r["wall_ns"] else 0.0
        ax.text(i, bottom[i], f"{r['wall_ns'] / 1e6:,.1f} ms\n{100 * share:.0f}% idle", ha="center", va="bottom",
                fontsize=8)
    ax.set_xticks(x, phases, fontsize=9)
    ax.set_ylabel("ms per iteration")
    ax.margins(y=0.2)
    S.tidy_axis(ax, "y")
    ax.legend(loc="upper right", fontsize=8, frameon=False)
    return fig, frame


#: Figure name (file stem) -> (function, title), in report order.
FIGURES = {
    "1_iteration_breakdown": (iteration_breakdown, "Iteration breakdown"),
    "2_iteration_timeline": (iteration_timeline, "One iteration in time"),
    "3_copy_sizes": (copy_size_distribution, "Copy-size distributions"),
    "4_update_sub_phases": (sub_phase_breakdown, "Update sub-phases"),
    "5_overlap_contention": (overlap_contention, "Overlap and contention"),
    "6_ranks": (rank_summary, "Per-rank summary"),
    "7_idle_breakdown": (idle_breakdown, "Where the GPU idle time goes"),
}
