"""Figure 2, one iteration in time (:func:`iteration_timeline`), and the collections it draws with.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.patches import Patch

from tracekit.render import data as D
from tracekit.render import style as S
from tracekit.render.data import ReportData
from tracekit.render.figures.common import (
    KIND_WIDTH,
    _segment_label,
    _short,
    _sub_phase_names,
    _sub_phase_segments,
    _text,
    _title,
)


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
