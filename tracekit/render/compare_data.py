"""The numbers of ``tracekit compare`` (:mod:`tracekit.render.compare` says what they are): both
runs side by side per phase and iteration (:func:`compare_data`, :func:`compare_paths`), the
config and the what-if explanations (:func:`config_and_advice`), which differences are
significant (:func:`significant`) and the regressions a CI run fails on (:func:`regressions`).
The text and the figure drawn from them are compare.py's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tracekit.errors import TracekitError
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
                           "predicted_cost_interval_ms",  # 95 %, [low, high], the scenario's
                           "predicted_b_iteration_ms", "b_iteration_ms", "basis", "confidence",
                           "phases": {phase: {"predicted_ms", "measured_delta_ms"}},
                           "measured_iteration_delta_ms",
                           "advice": {"problem", "knob", "change", "saving_ms_per_iteration"} | None}]}

    ``diff`` as in :func:`compare_data` (ns per steady iteration). ``predicted_cost_ms``: what
    B's setting costs per iteration by the what-if model run on B with A's value as the target
    (positive = B slower because of it), or, when B holds the value the scenario moves to (B pins,
    runs bf16, drops the offload: ``model_run_on: "A"``), minus what A's advice says B's value saves
    A; the same scenario, number, interval and confidence as that side's advice. The offload device
    comes first. ``phases``: the model's per-phase part of that cost and
    the measured B - A of the phase. ``ds_config_a/_b``: a DeepSpeed config or manifest for A/B
    (default: the manifest beside each trace). Raises :class:`TracekitError` for a bad
    ``--ds-config`` file.
    """
    from tracekit.analyze.section_data import (
        advice_items,
        gpu_optimizer,
        update_roles,
        what_if,
    )

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
            # B has the setting the scenario moves to (B drops A's offload, pins, runs bf16, ...):
            # the model run on A with B's setting, as A's advice gives it (the saving is B's gain)
            on_a = applies(c["b"], c["a"])
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
             "predicted_cost_interval_ms": None if s.get("saving_interval_ns") is None else (
                 [round(-x / 1e6, 3) for x in s["saving_interval_ns"][::-1]] if on_a
                 else [round(x / 1e6, 3) for x in s["saving_interval_ns"]]),
             "advice": None if item is None else {k: item[k] for k in ("problem", "knob", "change",
                                                                         "saving_ms_per_iteration")}}
        if on_a:
            e["model_run_on"] = "A"
        expl.append(e)
    # the offload device first (the knob that changes the most), then the others in config order
    expl.sort(key=lambda e: e["key"] != "zero_optimization.offload_optimizer.device")
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
