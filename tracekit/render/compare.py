"""``tracekit compare A.sqlite B.sqlite``: two runs side by side, per phase and iteration.

Both traces are analysed the same way (:mod:`tracekit.render.summary`); for every phase and
every metric the result holds A, B, ``delta`` = B - A and ``pct`` = 100 * delta / A (null when
A is 0 or missing):

- ``per_phase``: means per iteration over each run's steady iterations
  (:meth:`~tracekit.render.data.ReportData.steady_iterations`);
- ``per_iteration``: the k-th steady iteration of A against the k-th of B (runs are rarely
  numbered alike: a cut, a restart), for k up to the shorter run; both indices are given.

Metrics (:data:`METRICS`, named by :data:`tracekit.vocab.COLUMNS`): wall time, GPU idle time,
H2D/D2H bytes, exposed H2D/D2H copy time, the share of copy time hidden behind kernels,
pageable copies (count, bytes) and the GPU memory peak. Units: ns, bytes, ratio 0..1. Trace paths are printed as data (:mod:`tracekit.textsafe`).

Beyond the phases (:func:`config_and_advice`):

- ``per_sub_phase``: the update's DeepSpeed steps (overflow check, unscale, copy-back, gradient
  norm, CPU optimizer step: :data:`tracekit.analyze.sections.whatif.ROLES`), wall and CPU-only time, mean
  per steady iteration of each run;
- ``config``: each setting of :data:`tracekit.analyze.trace.dsconfig.KEYS` in A and B (from the
  capture manifest beside each trace, ``--ds-config-a/-b``, or inferred from the trace) and
  whether it differs;
- ``explanations``: for each differing key that one of the what-if scenarios replays
  (:data:`EXPLAINERS`), the scenario predicted *on B* with A's value as the target: the predicted
  cost of B's setting per iteration, beside the measured B - A of the phases it touches. When B
  drops A's optimizer offload the no_offload scenario is run *on A* with B's GPU optimizer
  (``model_run_on: "A"``; the cost is then negative: B's gain), and a one-sided offload is
  explained by ``offload_optimizer.device`` alone, never by ``pin_memory`` (which exists only
  with offload).

The numbers (the result, its significance, the regressions) are :mod:`tracekit.render.compare_data`,
re-exported here; this module draws them: the terminal text (:func:`render`) and the figure
(:func:`compare_figure`).
"""

from __future__ import annotations

from pathlib import Path

# polars, numpy, matplotlib and the analysis are imported where used: printing a stored
# comparison (:func:`render`, :func:`regressions`) needs none of them
from tracekit.render.compare_data import (  # noqa: F401  (the numbers, importable from here too)
    _METRIC_KEYS,
    _UNIT,
    EXPLAINERS,
    METRICS,
    SUB_PHASE_LABELS,
    _diff,
    _metrics,
    _pieces,
    _settings,
    _side,
    _spread,
    compare_data,
    compare_paths,
    config_and_advice,
    frame,
    regressions,
    significant,
)
from tracekit.textsafe import mpl as _mpl
from tracekit.textsafe import text as _t


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
    return s, _change_text(d)


def _change_text(d: dict) -> str:
    """The ``change`` cell of a diff ``{"a", "b", "pct", ...}``: never a percentage of zero
    (:func:`tracekit.vocab.fmt_change`): ``new`` when A is 0 and B is not, ``–`` when both are 0
    or one is missing, else :func:`_pct_text` of ``pct``."""
    if d.get("pct") is None:
        a, b = d.get("a"), d.get("b")
        return "new" if a is not None and b is not None and not a and b else "–"
    return _pct_text(d["pct"])


def render(result: dict, console=None, wide: bool = False) -> None:
    """Print the comparison as rich tables (per phase, then per iteration), laid out for
    :func:`tracekit.render.terminal.terminal_width` (the width rule of ``analyze``); the
    per-iteration table shows wall time and copy bytes unless ``wide`` (every metric)."""
    from tracekit.render.terminal import add_num_column, make_console, new_table

    if console is None:
        console = make_console(wide)
    a, b = result["a"], result["b"]
    for key, side in (("A", a), ("B", b)):
        line = _t(key, "bold")  # wraps at the console's width (a long path)
        line.append(_t(f" {side['trace']}  (pid {side['pid']} GPU {side['device']}, iterations {side['iterations']})"))
        console.print(line)
    if result.get("same_trace"):
        console.print(_t(f"A and B are the same trace ({result['same_trace']}): every difference is 0"))
    hidden = 0  # rows that show 0 on both sides
    t = new_table("per phase, mean per iteration (B - A)", wide)
    for c in ("phase", "metric", "unit"):
        t.add_column(c, overflow="fold")
    for c in ("A", "B", "B - A", "change"):
        add_num_column(t, c)
    for r in result["per_phase"]:
        first = True
        for m, d in r["metrics"].items():
            if _shows_zero(m, d["a"]) and _shows_zero(m, d["b"]):
                hidden += bool(d["a"] or d["b"])  # zero (or absent) in both runs, or shown as 0 in both
                continue
            label, _div, unit = METRICS[m]
            delta, pct = _fmt_delta(m, d)
            style = ""  # a colour says "worse"/"better": only for a significant change of 10 % or more
            if d["pct"] is not None and abs(d["pct"]) >= 10 and significant(result, r["phase"], m, d):
                style = "red" if (d["delta"] > 0) != (m == "overlap_ratio") else "green"
            t.add_row(*map(_t, (r["phase"] if first else "", label, unit, _fmt(m, d["a"]), _fmt(m, d["b"]), delta)),
                      _t(pct, style))
            first = False
        if not first:
            t.add_section()
    console.print(t)
    hidden += _render_sub_phases(result, console)
    it = new_table("per iteration (k-th steady iteration of A vs of B; B - A)", wide)
    cols = (["wall_ns", "h2d_bytes", "d2h_bytes", "h2d_exposed_ns", "d2h_exposed_ns", "pageable_bytes", "peak_bytes"]
            if wide else ["wall_ns", "h2d_bytes", "d2h_bytes"])
    for c in ("k", "A it", "B it", "phase"):
        it.add_column(c, overflow="fold")
    for m in cols:
        label, _div, unit = METRICS[m]
        add_num_column(it, f"Δ {label} {unit}")
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
    if hidden:
        console.print(_t(f"{hidden} row{'s' if hidden != 1 else ''} showing 0 on both sides not listed; --json "
                         "has every value"))
    _render_config(result, console)


def _ms_text(ns) -> str:
    return "–" if ns is None else f"{ns / 1e6:,.1f}"


def _shows_zero(metric: str, v) -> bool:
    """Whether the table shows ``v`` of ``metric`` as 0 (or it is missing): 0.0 MB, 0.0 ms, 0."""
    return v is None or _fmt(metric, v).strip("0.,") == ""


def _render_sub_phases(result: dict, console) -> int:
    """The update's sub-phases of both runs; returns how many rows were left out because both
    sides show 0.0 ms (the JSON keeps them)."""
    from rich.table import Table

    rows = result.get("per_sub_phase") or []
    shown = [r for r in rows if not (_shows_zero("wall_ns", r["metrics"]["wall_ns"]["a"])
                                     and _shows_zero("wall_ns", r["metrics"]["wall_ns"]["b"]))]
    hidden = len(rows) - len(shown)
    if not shown:
        return hidden
    t = Table(title="update sub-phases, mean per steady iteration (B - A)", title_justify="left", header_style="bold")
    for c, j in (("sub-phase", "left"), ("A ms", "right"), ("B ms", "right"), ("B - A ms", "right"),
                 ("change", "right"), ("B - A CPU-only ms", "right")):
        t.add_column(c, justify=j)
    for r in shown:
        w, c = r["metrics"]["wall_ns"], r["metrics"]["cpu_ns"]
        pct = _change_text(w)
        from tracekit.analyze.significance import differs

        style = "red" if (w["pct"] or 0) >= 10 else "green" if (w["pct"] or 0) <= -10 else ""
        if style and not differs(w["b"], w["a"], "ns"):  # a colour says "worse"/"better": significant only
            style = ""
        t.add_row(*map(_t, (r["sub_phase"], _ms_text(w["a"]), _ms_text(w["b"]), _ms_text(w["delta"]))),
                  _t(pct, style), _t(_ms_text(c["delta"])))
    console.print(t)
    return hidden


def _render_config(result: dict, console) -> None:
    from rich.table import Table

    diff = [c for c in result.get("config") or [] if c["differs"]]
    if diff:
        t = Table(title="config keys that differ (source: config, default, trace)", title_justify="left",
                  header_style="bold")
        from rich.text import Text

        from tracekit.render.config import config_text, fold_key, key_width

        def cell(v, src) -> str:  # JSON-like values (false, not set), the source when known
            return config_text(v) + (f" ({src})" if src else "")

        cells = [(cell(c["a"], c["a_source"]), cell(c["b"], c["b_source"])) for c in diff]
        short = max((len(x) for ab in cells for x in ab if len(x) <= 20), default=6)
        kw = key_width([c["key"] for c in diff], console.width - 10 - 2 * short)  # keys fold at dots only
        kw = max(len(x) for c in diff for x in fold_key(c["key"], kw).split("\n"))
        t.add_column("key", no_wrap=True, min_width=kw, max_width=kw)
        for c in ("A", "B"):
            t.add_column(c, overflow="fold")
        for c, (a, b) in zip(diff, cells):
            t.add_row(Text("\n").join(_t(x) for x in fold_key(c["key"], kw).split("\n")), _t(a), _t(b))
        console.print(t)
    elif result.get("config"):
        console.print(_t("config: no key of the shown settings differs between A and B"))
    from tracekit.render.config import config_text
    from tracekit.vocab import knob_label

    total = (result.get("iteration_total") or {}).get("wall_ns") or {}
    real = bool(total) and significant(result, "iteration", "wall_ns", total)
    for e in result.get("explanations") or []:
        meas = e.get("measured_iteration_delta_ms")
        # "explained" only when there is a significant measured difference to explain
        lead = "explained by advice" if real else "advice on a differing key (B - A is no significant difference)"
        on = e.get("model_run_on", "B")
        head = (f"{lead}: {e['key']} {config_text(e['a'])} (A) -> {config_text(e['b'])} (B) costs B "
                f"{e['predicted_cost_ms']:,.1f} ms per iteration by the what-if model run on {on} "
                f"({e['scenario']}, {e['confidence']} confidence); measured B - A: "
                + ("–" if meas is None else f"{meas:+,.1f} ms per iteration"))
        if not e["applicable"]:
            head += f" (the model gives no effect: {e['why_not']})"
        parts = [f"{ph} predicted {v['predicted_ms']:+,.1f} / measured "
                 + ("–" if v["measured_delta_ms"] is None else f"{v['measured_delta_ms']:+,.1f}") + " ms"
                 for ph, v in e["phases"].items() if abs(v["predicted_ms"]) >= 0.05]
        console.print(_t(head + (("; " + ", ".join(parts)) if parts else "")))
        if e.get("advice"):
            console.print(_t(f"  advice for {on}: {knob_label(e['advice']['knob'])}: {e['advice']['change']} — "
                             f"{e['advice']['problem']}"))


# ---------------------------------------------------------------------- figure
def compare_figure(result: dict, labels: tuple[str, str] = ("A", "B")):
    """Grouped bars per phase, A vs B, one panel per metric (mean per iteration), with the
    change in % above B's bar. Returns ``(figure, frame)`` with the frame of
    :func:`frame` (``per_phase``) for the plotted metrics."""
    import numpy as np
    import polars as pl

    from tracekit.render import style as S

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
