"""``tracekit compare A.sqlite B.sqlite``: two runs side by side, per phase and iteration.

Both traces are analysed the same way (:mod:`tracekit.report.summary`); for every phase and
every metric the result holds A, B, ``delta`` = B - A and ``pct`` = 100 * delta / A (null when
A is 0 or missing):

- ``per_phase``: means per iteration over each run's steady iterations
  (:meth:`~tracekit.report.data.ReportData.steady_iterations`);
- ``per_iteration``: the k-th steady iteration of A against the k-th of B (runs are rarely
  numbered alike: a cut, a restart), for k up to the shorter run; both indices are given.

Metrics (:data:`METRICS`): wall time, GPU idle time, H2D/D2H bytes, exposed H2D/D2H copy time,
the share of copy time hidden behind kernels, pageable copies (count, bytes) and the GPU memory
peak. Units: ns, bytes, ratio 0..1. Trace paths are printed as data (:mod:`tracekit.textsafe`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from tracekit.errors import TracekitError
from tracekit.report import style as S
from tracekit.report import summary
from tracekit.report.data import ReportData
from tracekit.textsafe import mpl as _mpl
from tracekit.textsafe import text as _t

#: metric -> (label, unit divisor, unit)
METRICS = {
    "wall_ns": ("wall time", 1e6, "ms"),
    "gpu_idle_ns": ("GPU idle time", 1e6, "ms"),
    "h2d_bytes": ("H2D bytes", 1e6, "MB"),
    "d2h_bytes": ("D2H bytes", 1e6, "MB"),
    "h2d_exposed_ns": ("H2D exposed copy time", 1e6, "ms"),
    "d2h_exposed_ns": ("D2H exposed copy time", 1e6, "ms"),
    "overlap_ratio": ("copy time hidden", 0.01, "%"),
    "pageable_count": ("pageable copies", 1, "count"),
    "pageable_bytes": ("pageable bytes", 1e6, "MB"),
    "peak_bytes": ("GPU memory peak", 1e9, "GB"),
}


def _diff(a, b) -> dict:
    a = None if a is None or (isinstance(a, float) and np.isnan(a)) else a
    b = None if b is None or (isinstance(b, float) and np.isnan(b)) else b
    delta = None if a is None or b is None else b - a
    pct = None if delta is None or not a else 100.0 * delta / a
    r = lambda v: None if v is None else (round(v, 6) if isinstance(v, float) else v)  # noqa: E731
    return {"a": r(a), "b": r(b), "delta": r(delta), "pct": r(pct)}


def _side(data: ReportData, rank: int) -> tuple[dict, pl.DataFrame, list[int]]:
    rk = data.rank(rank)
    steady = data.steady_iterations(rk)
    if not steady:
        raise TracekitError(f"{data.path.name}: no iteration found (no forward/backward/update NVTX ranges)")
    return rk, summary.iteration_metrics(data, rk), steady


def compare_data(a: ReportData, b: ReportData, rank: int = 0) -> dict:
    """Compare two analysed traces (see module doc); returns a JSON-ready dict::

        {"a": {"trace", "pid", "device", "iterations"}, "b": {...},
         "per_phase": [{"phase", "metrics": {METRIC: {"a", "b", "delta", "pct"}}}],
         "per_iteration": [{"position", "a_iteration", "b_iteration", "phase", "metrics": {...}}]}

    Raises :class:`TracekitError` when a trace lacks the rank or any iteration.
    """
    ra, ma, sa = _side(a, rank)
    rb, mb, sb = _side(b, rank)
    pa, pb = summary.phase_means(ma, sa), summary.phase_means(mb, sb)
    phases = [p for p in summary.PHASE_ORDER if p in set(pa["phase"]) | set(pb["phase"])]
    per_phase = []
    for p in phases:
        ra_ = pa.filter(pl.col("phase") == p)
        rb_ = pb.filter(pl.col("phase") == p)
        row_a = ra_.row(0, named=True) if ra_.height else {}
        row_b = rb_.row(0, named=True) if rb_.height else {}
        per_phase.append({"phase": p, "metrics": {m: _diff(row_a.get(m), row_b.get(m)) for m in METRICS}})
    total = {m: _diff(pa[m].sum() if pa.height else None, pb[m].sum() if pb.height else None)
             for m in ("wall_ns", "gpu_idle_ns", "h2d_bytes", "d2h_bytes", "h2d_exposed_ns", "d2h_exposed_ns",
                       "pageable_count", "pageable_bytes")}
    per_it = []
    for k, (ia, ib) in enumerate(zip(sa, sb)):
        for p in phases:
            xa = ma.filter((pl.col("iteration") == ia) & (pl.col("phase") == p))
            xb = mb.filter((pl.col("iteration") == ib) & (pl.col("phase") == p))
            row_a = xa.row(0, named=True) if xa.height else {}
            row_b = xb.row(0, named=True) if xb.height else {}
            per_it.append({"position": k, "a_iteration": ia, "b_iteration": ib, "phase": p,
                           "metrics": {m: _diff(row_a.get(m), row_b.get(m)) for m in METRICS}})

    def side(d: ReportData, rk: dict, steady: list[int]) -> dict:
        return {"trace": str(d.path), "pid": rk["pid"], "device": rk["device"], "iterations": steady}

    return {"a": side(a, ra, sa), "b": side(b, rb, sb), "per_phase": per_phase, "iteration_total": total,
            "per_iteration": per_it}


def compare_paths(a: str | Path, b: str | Path, rank: int = 0, phase_map: list[str] | None = None,
                  gas: int | None = None, step: Callable[[str], None] | None = None) -> dict:
    """Open, analyse and compare two traces (:func:`compare_data`)."""
    step = step or (lambda _m: None)
    da = ReportData.load(a, phase_map=phase_map, gas=gas, step=lambda m: step(f"A: {m}"))
    try:
        db = ReportData.load(b, phase_map=phase_map, gas=gas, step=lambda m: step(f"B: {m}"))
        try:
            step("comparing")
            return compare_data(da, db, rank)
        finally:
            db.close()
    finally:
        da.close()


def frame(result: dict, section: str = "per_phase") -> pl.DataFrame:
    """A :func:`compare_data` section as a long frame: ``phase, metric, a, b, delta, pct`` (and
    ``position, a_iteration, b_iteration`` for ``per_iteration``)."""
    rows = []
    for r in result[section]:
        for m, v in r["metrics"].items():
            extra = {k: r[k] for k in ("position", "a_iteration", "b_iteration") if k in r}
            rows.append({**extra, "phase": r["phase"], "metric": m, **{k: None if v[k] is None else float(v[k])
                                                                          for k in ("a", "b", "delta", "pct")}})
    return pl.DataFrame(rows, schema_overrides={"a": pl.Float64, "b": pl.Float64, "delta": pl.Float64, "pct": pl.Float64})


# ---------------------------------------------------------------------- terminal
def _pct_text(pct: float) -> str:
    if abs(pct) >= 1000:  # from a near-zero A: the ratio says nothing, the values do
        return ">+999%" if pct > 0 else "<-999%"
    return "±0%" if abs(pct) < 0.5 else f"{pct:+.0f}%"


def _fmt(metric: str, v) -> str:
    if v is None:
        return "–"
    _label, div, unit = METRICS[metric]
    x = v / div
    if unit == "count":
        return f"{x:,.1f}" if x != int(x) else f"{int(x):,}"
    digits = 2 if unit == "GB" else 1
    if abs(x) < 0.5 * 10 ** -digits:
        x = 0.0  # no "-0.0"
    return f"{x:,.{digits}f}"


def _fmt_delta(metric: str, d: dict) -> tuple[str, str]:
    if d["delta"] is None:
        return "–", "–"
    s = _fmt(metric, d["delta"])
    if d["delta"] > 0 and s.strip("0.,") != "":
        s = "+" + s
    pct = "–" if d["pct"] is None else _pct_text(d["pct"])
    return s, pct


def render(result: dict, console=None) -> None:
    """Print the comparison as rich tables (per phase, then per iteration)."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)
    a, b = result["a"], result["b"]
    for key, side in (("A", a), ("B", b)):
        line = _t(key, "bold")
        line.append(_t(f" {side['trace']}  (pid {side['pid']} GPU {side['device']}, iterations {side['iterations']})"))
        console.print(line)
    t = Table(title="per phase, mean per iteration (B - A)", title_justify="left", header_style="bold")
    for c, j in (("phase", "left"), ("metric", "left"), ("unit", "left"), ("A", "right"), ("B", "right"),
                 ("B - A", "right"), ("change", "right")):
        t.add_column(c, justify=j)
    for r in result["per_phase"]:
        first = True
        for m, d in r["metrics"].items():
            if not d["a"] and not d["b"]:
                continue  # zero (or absent) in both runs
            label, _div, unit = METRICS[m]
            delta, pct = _fmt_delta(m, d)
            style = ""
            if d["pct"] is not None and abs(d["pct"]) >= 10:
                style = "red" if (d["delta"] > 0) != (m == "overlap_ratio") else "green"
            t.add_row(*map(_t, (r["phase"] if first else "", label, unit, _fmt(m, d["a"]), _fmt(m, d["b"]), delta)),
                      _t(pct, style))
            first = False
        t.add_section()
    console.print(t)
    it = Table(title="per iteration (k-th steady iteration of A vs of B; B - A)", title_justify="left",
               header_style="bold")
    cols = ["wall_ns", "h2d_bytes", "d2h_bytes", "h2d_exposed_ns", "d2h_exposed_ns", "pageable_bytes", "peak_bytes"]
    for c in ("k", "A it", "B it", "phase"):
        it.add_column(c)
    for m in cols:
        label, _div, unit = METRICS[m]
        it.add_column(f"Δ {label} {unit}", justify="right")
    last = None
    for r in result["per_iteration"]:
        if last is not None and r["position"] != last:
            it.add_section()
        new = r["position"] != last
        last = r["position"]
        cells = []
        for m in cols:
            delta, pct = _fmt_delta(m, r["metrics"][m])
            shown_zero = delta.lstrip("+-").strip("0.,") == ""
            cells.append(delta if pct in ("–", "±0%") or shown_zero else f"{delta} ({pct})")
        it.add_row(*map(_t, (str(r["position"]) if new else "", str(r["a_iteration"]) if new else "",
                             str(r["b_iteration"]) if new else "", r["phase"], *cells)))
    console.print(it)
    console.print(_t("Δ = B - A; change = Δ / A; exposed = copy busy time with no kernel running; metrics that "
                     "are 0 in both runs are not listed; MB = 1e6 B, GB = 1e9 B"))


# ---------------------------------------------------------------------- figure
def compare_figure(result: dict, labels: tuple[str, str] = ("A", "B")):
    """Grouped bars per phase, A vs B, one panel per metric (mean per iteration), with the
    change in % above B's bar. Returns ``(figure, frame)`` with the frame of
    :func:`frame` (``per_phase``) for the plotted metrics."""
    shown = ["wall_ns", "gpu_idle_ns", "h2d_bytes", "d2h_bytes", "h2d_exposed_ns", "d2h_exposed_ns",
             "pageable_bytes", "overlap_ratio", "peak_bytes"]
    f = frame(result, "per_phase").filter(pl.col("metric").is_in(shown))
    phases = [r["phase"] for r in result["per_phase"]]
    fig, axes = S.new_figure(3, 3, width=14, height=10)
    fig.suptitle(f"{_mpl(labels[0])}: {_mpl(Path(result['a']['trace']).name)} (iterations {result['a']['iterations']})"
                 f"   vs   {_mpl(labels[1])}: {_mpl(Path(result['b']['trace']).name)} "
                 f"(iterations {result['b']['iterations']})"
                 "   — mean per iteration", x=0.01, ha="left", fontsize=10)
    w = 0.38
    x = np.arange(len(phases))
    for ax, m in zip(axes.ravel(), shown):
        label, div, unit = METRICS[m]
        S.style_axes(ax)
        g = f.filter(pl.col("metric") == m)
        va = [g.filter(pl.col("phase") == p)["a"].fill_null(0).sum() / div for p in phases]
        vb = [g.filter(pl.col("phase") == p)["b"].fill_null(0).sum() / div for p in phases]
        ba = ax.bar(x - w / 2, va, w, color=[S.phase_color(p) for p in phases], alpha=0.45, edgecolor="#333333",
                    linewidth=0.6)
        bb = ax.bar(x + w / 2, vb, w, color=[S.phase_color(p) for p in phases], edgecolor="#333333", linewidth=0.6)
        for p, pa, pb in zip(phases, ba, bb):
            pa.set_gid(f"a:{m}:{p}")
            pb.set_gid(f"b:{m}:{p}")
        top = max(max(va, default=0), max(vb, default=0))
        for i, p in enumerate(phases):
            pct = g.filter(pl.col("phase") == p)["pct"]
            # annotate only bars one can see (>= 2% of the panel's tallest)
            if pct.len() and pct[0] is not None and top > 0 and max(va[i], vb[i]) >= 0.02 * top:
                ax.text(x[i] + w / 2, vb[i], _pct_text(pct[0]), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, phases, fontsize=8)
        ax.set_title(f"{label} ({unit})", loc="left", fontsize=9)
        ax.margins(y=0.18)
        if unit == "%":
            ax.set_ylim(0, 110)
        elif top == 0:
            ax.set_ylim(0, 1)
        if top == 0:
            ax.text(0.5, 0.5, "0 in both runs", ha="center", va="center", transform=ax.transAxes, fontsize=8,
                    color="#666666")
        S.tidy_axis(ax, "y", 4)
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(facecolor="#999999", alpha=0.45, edgecolor="#333333", label=f"{labels[0]} (light)"),
                        Patch(facecolor="#999999", edgecolor="#333333", label=f"{labels[1]} (solid, change vs A)")],
               loc="upper right", fontsize=8, frameon=False)
    return fig, f


# ---------------------------------------------------------------------- regressions (CI)
def regressions(result: dict, fail_above_pct: float) -> list[dict]:
    """Phases, and the whole iteration, whose mean wall time per steady iteration got slower
    from A to B by more than ``fail_above_pct`` percent: ``[{"what", "a_ms", "b_ms", "pct"}]``
    (``what`` = a phase name or ``"iteration"``), for ``tracekit compare --fail-above PCT``."""
    out = []
    rows = [(r["phase"], r["metrics"]["wall_ns"]) for r in result["per_phase"]]
    rows.append(("iteration", result["iteration_total"]["wall_ns"]))
    for what, d in rows:
        if d["pct"] is not None and d["pct"] > fail_above_pct:
            out.append({"what": what, "a_ms": d["a"] / 1e6, "b_ms": d["b"] / 1e6, "pct": d["pct"]})
    return out
