"""The stacked-bar figures: per iteration (figure 1, :func:`iteration_breakdown`), per rank
(:func:`rank_summary`) and per phase, the idle kinds (figure 7, :func:`idle_breakdown`).
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.patches import Patch

from tracekit.render import data as D
from tracekit.render import style as S
from tracekit.render.data import ReportData
from tracekit.render.figures.common import _segment_label, _title, iterations_note


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
