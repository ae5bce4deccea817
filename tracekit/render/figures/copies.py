"""The copy figures: sizes (figure 3, :func:`copy_size_distribution`) and overlap and contention
(figure 5, :func:`overlap_contention`).
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.patches import Patch

from tracekit.analyze.model.intervals import busy_in_windows
from tracekit.render import data as D
from tracekit.render import style as S
from tracekit.render.data import ReportData
from tracekit.render.figures.common import _segment_label, _text, _title, iterations_note


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
