"""Figure 4, a phase's sub-phases: time (GPU busy vs CPU only) and copy throughput
(:func:`sub_phase_breakdown`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.render import data as D
from tracekit.render import style as S
from tracekit.render.data import ReportData
from tracekit.render.figures.common import KIND_WIDTH, _short, _sub_phase_names, _text, _title, iterations_note


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
