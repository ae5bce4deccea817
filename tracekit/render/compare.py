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
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tracekit.errors import TracekitError
from tracekit.textsafe import mpl as _mpl
from tracekit.textsafe import text as _t
from tracekit.userfiles import shown

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

    from tracekit.render.data import ReportData
# polars, numpy, matplotlib and the analysis are imported where used: printing a stored
# comparison (:func:`render`, :func:`regressions`) needs none of them

#: The metrics compared, named by :data:`tracekit.vocab.COLUMNS` (the report tables' mapping).
_METRIC_KEYS = ("wall_ns", "gpu_idle_ns", "h2d_bytes", "d2h_bytes", "h2d_exposed_ns", "d2h_exposed_ns",
                "overlap_ratio", "pageable_count", "pageable_bytes", "peak_bytes")


def _metrics() -> dict:
    from tracekit.vocab import COLUMNS

    return {m: (COLUMNS[m][0], COLUMNS[m][2], COLUMNS[m][1] or "count") for m in _METRIC_KEYS}


#: metric -> (label, unit divisor, unit), from :data:`tracekit.vocab.COLUMNS`
METRICS = _metrics()


def _diff(a, b) -> dict:
    a = None if a is None or (isinstance(a, float) and math.isnan(a)) else a
    b = None if b is None or (isinstance(b, float) and math.isnan(b)) else b
    delta = None if a is None or b is None else b - a
    pct = None if delta is None or not a else 100.0 * delta / a
    r = lambda v: None if v is None else (round(v, 6) if isinstance(v, float) else v)  # noqa: E731
    return {"a": r(a), "b": r(b), "delta": r(delta), "pct": r(pct)}


def _side(data: ReportData, rank: int) -> tuple[dict, pl.DataFrame, list[int]]:
    from tracekit.render import summary

    rk = data.rank(rank)
    steady = data.steady_iterations(rk)
    if not steady:
        from tracekit.vocab import NO_NVTX, no_iteration_reason

        raise TracekitError(f"{shown(data.path)}: no iteration found "
                            + no_iteration_reason(data.model.source.get(rk["global_pid"]) == NO_NVTX))
    return rk, summary.iteration_metrics(data, rk), steady


#: scenario of the what-if model that replays a config key going back from B's value to A's:
#: key -> (scenario, applies(a_value, b_value), change targets from A's value)
EXPLAINERS = {
    "zero_optimization.offload_optimizer.pin_memory": ("pin_memory", lambda a, b: a is True and b is not True, None),
    "precision": ("bf16", lambda a, b: a == "bf16" and b == "fp16", None),
    "zero_optimization.offload_optimizer.device": ("no_offload", lambda a, b: a in (None, "none") and b not in (None, "none"),
                                                   None),
    "zero_optimization.sub_group_size": ("sub_group_size", lambda a, b: a != b and isinstance(a, (int, float)),
                                         lambda a: {"sub_group_size": float(a)}),
    "zero_optimization.offload_optimizer.ratio": ("ratio", lambda a, b: a != b and isinstance(a, (int, float)),
                                                  lambda a: {"ratio": float(a)}),
    "zero_optimization.overlap_comm": ("overlap_grad_copies", lambda a, b: a is True and b is False, None),
}
#: labels of the update's steps (:data:`tracekit.analyze.sections.whatif.ROLES`)
SUB_PHASE_LABELS = {"overflow_check": "fp16 overflow check (has_overflow)",
                    "unscale": "gradient unscale (unscale_and_clip_grads)",
                    "copy_back": "parameter copy-back (param_copy_back)", "grad_norm": "gradient norm (grad_norm)",
                    "cpu_adam": "CPU optimizer step (cpu_optimizer_step)",
                    "cpu_wait": "wait for the CPU optimizer step (cpu_update_wait)",
                    "swap": "NVMe swap in/out"}


def _pieces(d: ReportData, rk: dict) -> dict | None:
    for p in d.sections.update_pieces():
        if p["global_pid"] == rk["global_pid"] and p["device"] == rk["device"]:
            return p
    return None


def _settings(d: ReportData, pieces: dict | None, ds_config) -> tuple[list[dict], dict]:
    from tracekit.analyze.section_data import run_settings

    return run_settings(d.path, pieces, ds_config)


def config_and_advice(a: ReportData, b: ReportData, ra: dict, rb: dict, ds_config_a=None, ds_config_b=None,
                      per_phase: list[dict] | None = None) -> dict:
    """Sub-phases, config keys and the advice that explains a difference (see module doc)::

        {"per_sub_phase": [{"phase": "update", "sub_phase": label, "role": role,
                            "metrics": {"wall_ns": diff, "cpu_ns": diff}}],
         "config": [{"key", "a", "b", "a_source", "b_source", "differs": bool}],
         "explanations": [{"key", "a", "b", "scenario", "applicable", "predicted_cost_ms",
                           "predicted_b_iteration_ms", "b_iteration_ms", "basis", "confidence",
                           "phases": {phase: {"predicted_ms", "measured_delta_ms"}},
                           "measured_iteration_delta_ms",
                           "advice": {"problem", "knob", "change", "saving_ms_per_iteration"} | None}]}

    ``diff`` as in :func:`compare_data` (ns per steady iteration). ``predicted_cost_ms``: what
    B's setting costs per iteration by the what-if model run on B with A's value as the target
    (positive = B slower because of it); ``phases``: the model's per-phase part of that cost and
    the measured B - A of the phase. ``ds_config_a/_b``: a DeepSpeed config or manifest for A/B
    (default: the manifest beside each trace). Raises :class:`TracekitError` for a bad
    ``--ds-config`` file.
    """
    from tracekit.analyze.section_data import advice_items, gpu_optimizer, update_roles, what_if

    pa, pb = _pieces(a, ra), _pieces(b, rb)
    subs = []
    for role in update_roles():
        label = SUB_PHASE_LABELS.get(role, role)
        va = (pa["roles"].get(role) or {}) if pa else {}
        vb = (pb["roles"].get(role) or {}) if pb else {}
        if not va.get("wall_ns") and not vb.get("wall_ns"):
            continue
        if (va.get("unmarked") or vb.get("unmarked")) and role == "cpu_adam":
            label = "CPU optimizer step (cpu_optimizer_step, or the update's unmarked time)"
        subs.append({"phase": "update", "sub_phase": label, "role": role,
                     "metrics": {"wall_ns": _diff(va.get("wall_ns"), vb.get("wall_ns")),
                                 "cpu_ns": _diff(va.get("cpu_ns"), vb.get("cpu_ns"))}})
    rows_a, sett_a = _settings(a, pa, ds_config_a)
    rows_b, sett_b = _settings(b, pb, ds_config_b)
    by_a = {r["key"]: r for r in rows_a}
    by_b = {r["key"]: r for r in rows_b}
    keys = [k for k in by_a] + [k for k in by_b if k not in by_a]
    config = []
    for k in keys:
        xa, xb = by_a.get(k, {}), by_b.get(k, {})
        config.append({"key": k, "a": xa.get("value"), "b": xb.get("value"), "a_source": xa.get("source"),
                       "b_source": xb.get("source"), "differs": xa.get("value") != xb.get("value")})
    measured = {r["phase"]: r["metrics"]["wall_ns"] for r in per_phase or []}
    dev = next((c for c in config if c["key"] == "zero_optimization.offload_optimizer.device"), None)
    # one side without optimizer offload: the offload device explains the difference; pin_memory
    # (which only exists with offload) is part of what no_offload removes, not a cause of its own
    offload_differs = dev is not None and dev["differs"] and (dev["a"] in (None, "none")) != (dev["b"] in (None, "none"))
    expl = []
    for c in config:
        if not c["differs"] or c["key"] not in EXPLAINERS:
            continue
        if offload_differs and c["key"] == "zero_optimization.offload_optimizer.pin_memory":
            continue
        scenario, applies, targets = EXPLAINERS[c["key"]]
        on_a = False
        if not applies(c["a"], c["b"]):
            # B drops A's offload: the model run on A with B's setting (the saving is B's gain)
            on_a = scenario == "no_offload" and applies(c["b"], c["a"])
            if not on_a:
                continue
        side_p, side_s, other_s = (pa, sett_a, sett_b) if on_a else (pb, sett_b, sett_a)
        if side_p is None:
            continue
        changes = targets(c["b" if on_a else "a"]) if targets else {}
        if scenario == "no_offload":  # the no-offload side's own GPU optimizer (torch_adam or FusedAdam)
            changes["gpu_optimizer"] = gpu_optimizer(other_s)
        scen = what_if(side_p, side_s, changes)
        s = {x["scenario"]: x for x in scen}[scenario]
        item = next((i for i in advice_items(side_p, scen, side_s) if i["scenario"] == scenario), None)
        ph = {}
        for phase, dns in (s.get("phase_delta_ns") or {}).items():
            m = measured.get(phase) or {}
            ph[phase] = {"predicted_ms": round((dns if on_a else -dns) / 1e6, 3),
                         "measured_delta_ms": None if m.get("delta") is None else round(m["delta"] / 1e6, 3)}
        e = {"key": c["key"], "a": c["a"], "b": c["b"], "scenario": scenario, "applicable": s["applicable"],
             "why_not": s["why_not"], "predicted_cost_ms": round((-s["saving_ns"] if on_a else s["saving_ns"]) / 1e6, 3),
             "predicted_b_iteration_ms": round(s["predicted_ns"] / 1e6, 3),
             "b_iteration_ms": round((pb["iteration_ns"] if on_a and pb else s["baseline_ns"]) / 1e6, 3),
             "basis": s["basis"], "confidence": s["confidence"], "phases": ph,
             "advice": None if item is None else {k: item[k] for k in ("problem", "knob", "change",
                                                                         "saving_ms_per_iteration")}}
        if on_a:
            e["model_run_on"] = "A"
        expl.append(e)
    return {"per_sub_phase": subs, "config": config, "explanations": expl}


def compare_data(a: ReportData, b: ReportData, rank: int = 0, ds_config_a=None, ds_config_b=None) -> dict:
    """Compare two analysed traces (see module doc); returns a JSON-ready dict::

        {"a": {"trace", "pid", "device", "iterations"}, "b": {...},
         "per_phase": [{"phase", "metrics": {METRIC: {"a", "b", "delta", "pct"}}}],
         "per_iteration": [{"position", "a_iteration", "b_iteration", "phase", "metrics": {...}}],
         "iteration_total": {METRIC: diff}, "per_sub_phase": [...], "config": [...], "explanations": [...]}

    (the last three from :func:`config_and_advice`, with ``measured_iteration_delta_ms`` in each
    explanation). Raises :class:`TracekitError` when a trace lacks the rank or any iteration.
    """
    import polars as pl

    from tracekit.render import summary

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

    extra = config_and_advice(a, b, ra, rb, ds_config_a, ds_config_b, per_phase)
    for e in extra["explanations"]:
        d = total["wall_ns"]["delta"]
        e["measured_iteration_delta_ms"] = None if d is None else round(d / 1e6, 3)
    return {"a": side(a, ra, sa), "b": side(b, rb, sb), "per_phase": per_phase, "iteration_total": total,
            "per_iteration": per_it, **extra}


def compare_paths(a: str | Path, b: str | Path, rank: int = 0, phase_map: list[str] | None = None,
                  gas: int | None = None, step: Callable[[str], None] | None = None,
                  ds_config_a=None, ds_config_b=None, cache: bool = False) -> dict:
    """Open, analyse and compare two traces (:func:`compare_data`); when A and B are one file or
    byte-identical files (:func:`same_trace`) and one config serves both, the result also holds
    ``"same_trace": "the same file" | "byte-identical files"`` (every B - A is then 0).

    ``cache``: read and keep the comparison in A's cache and each trace's analysis in its own
    (what ``tracekit compare`` does; :mod:`tracekit.render.report_cache`): the same comparison
    again is read back as stored; another one (``--rank``, B) reads each trace's stored
    analysis and query frames."""
    from tracekit.render.data import ReportData

    step = step or (lambda _m: None)
    tc = key = None
    if cache:
        from tracekit.render import report_cache

        tc, key, hit = report_cache.lookup_compare(a, b, rank=rank, phase_map=phase_map, gas=gas,
                                                   ds_config_a=ds_config_a, ds_config_b=ds_config_b)
        if hit is not None:
            return hit
        if tc is not None:
            try:
                check = report_cache.compare_check(b)
            except OSError:
                tc = None
    da = ReportData.load(a, phase_map=phase_map, gas=gas, step=lambda m: step(f"A: {m}"), cache=cache)
    try:
        db = ReportData.load(b, phase_map=phase_map, gas=gas, step=lambda m: step(f"B: {m}"), cache=cache)
        try:
            step("comparing")
            result = compare_data(da, db, rank, ds_config_a, ds_config_b)
        finally:
            db.close()
    finally:
        da.close()
    same = same_trace(a, b)
    if same is not None and ds_config_a == ds_config_b:  # (one config for both: nothing differs)
        result["same_trace"] = same
    if tc is not None:
        report_cache.store_compare(tc, key, b, check, result)
    return result


def same_trace(a: str | Path, b: str | Path) -> str | None:
    """``"the same file"`` when ``a`` and ``b`` name one file, ``"byte-identical files"`` when
    their bytes are equal, else None (also when either cannot be read): then every B - A of
    the comparison is 0 (``same_trace`` in its result)."""
    import filecmp
    import os

    try:
        if os.path.samefile(a, b):
            return "the same file"
        return "byte-identical files" if filecmp.cmp(a, b, shallow=False) else None
    except OSError:
        return None


def frame(result: dict, section: str = "per_phase") -> pl.DataFrame:
    """A :func:`compare_data` section as a long frame: ``phase, metric, a, b, delta, pct`` (and
    ``position, a_iteration, b_iteration`` for ``per_iteration``)."""
    import polars as pl

    rows = []
    for r in result[section]:
        for m, v in r["metrics"].items():
            extra = {k: r[k] for k in ("position", "a_iteration", "b_iteration") if k in r}
            rows.append({**extra, "phase": r["phase"], "metric": m, **{k: None if v[k] is None else float(v[k])
                                                                          for k in ("a", "b", "delta", "pct")}})
    return pl.DataFrame(rows, schema_overrides={"a": pl.Float64, "b": pl.Float64, "delta": pl.Float64, "pct": pl.Float64})


# ---------------------------------------------------------------------- significance
#: unit of :func:`tracekit.analyze.significance.differs` per metric (shares and counts: none)
_UNIT = {"wall_ns": "ns", "gpu_idle_ns": "ns", "h2d_exposed_ns": "ns", "d2h_exposed_ns": "ns",
         "h2d_bytes": "bytes", "d2h_bytes": "bytes", "pageable_bytes": "bytes", "peak_bytes": "bytes"}


def _spread(result: dict, phase: str, metric: str) -> float | None:
    """The iteration-to-iteration spread of ``metric`` in ``phase`` (``"iteration"``: the sum of
    the phases), from ``per_iteration``: the larger of A's and B's max - min over their steady
    iterations (None when not measurable)."""
    from tracekit.analyze.significance import spread

    per = {}
    for r in result.get("per_iteration") or []:
        if phase != "iteration" and r["phase"] != phase:
            continue
        d = r["metrics"].get(metric) or {}
        for side in ("a", "b"):
            if d.get(side) is not None:
                key = (side, r["position"])
                per[key] = per.get(key, 0) + d[side]
    spreads = [spread([v for (sd, _), v in per.items() if sd == side]) for side in ("a", "b")]
    known = [x for x in spreads if x is not None]
    return max(known) if known else None


def significant(result: dict, phase: str, metric: str, d: dict, min_rel: float | None = None) -> bool:
    """Whether B differs from A in ``metric`` of ``phase`` (``d``: its ``{"a", "b", ...}``) by the
    one rule of a comparative claim (:func:`tracekit.analyze.significance.differs`, with the
    iteration-to-iteration spread of :func:`_spread`); metrics without a unit there (shares,
    counts) only need 5 %. ``min_rel``: the relative minimum (default 5 %)."""
    from tracekit.analyze.significance import MIN_REL, differs

    rel = MIN_REL if min_rel is None else min_rel
    a, b = d.get("a"), d.get("b")
    unit = _UNIT.get(metric)
    if unit is None:
        return a is not None and b is not None and (abs(b - a) / abs(a) >= rel if a else b != a)
    return bool(differs(b, a, unit, spread=_spread(result, phase, metric), min_rel=rel))


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


# ---------------------------------------------------------------------- regressions (CI)
def regressions(result: dict, fail_above_pct: float) -> list[dict]:
    """Phases, and the whole iteration, whose mean wall time per steady iteration got slower
    from A to B by more than ``fail_above_pct`` percent: ``[{"what", "a_ms", "b_ms", "pct"}]``
    (``what`` = a phase name or ``"iteration"``), for ``tracekit compare --fail-above PCT``.
    A regression is also significant (:func:`significant` with ``fail_above_pct`` as the
    relative minimum: at least 1 ms slower and beyond the iteration-to-iteration spread)."""
    out = []
    rows = [(r["phase"], r["metrics"]["wall_ns"]) for r in result["per_phase"]]
    rows.append(("iteration", result["iteration_total"]["wall_ns"]))
    for what, d in rows:
        if d["pct"] is not None and d["pct"] > fail_above_pct \
                and significant(result, what, "wall_ns", d, min_rel=fail_above_pct / 100):
            out.append({"what": what, "a_ms": d["a"] / 1e6, "b_ms": d["b"] / 1e6, "pct": d["pct"]})
    return out
