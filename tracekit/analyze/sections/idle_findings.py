"""What the idle GPU time says (:mod:`tracekit.analyze.sections.idle` measures it): one finding
per host-bound, API-bound or waiting phase (:func:`idle_findings`, the rule in docs/idle.md) and
the ``larger_micro_batch`` what-if of a launch-bound run (:func:`microbatch_advice`). Part of the
idle section; every function here only computes.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.idle import CATEGORIES, ROW_KEYS, idle_windows, launch_stats
from tracekit.analyze.trace.export import Export

#: Findings rule (docs/idle.md): a phase gets a cause finding when its mean wall time per steady
#: iteration is at least this, and its GPU idle share at least :data:`FINDING_MIN_IDLE_SHARE`.
FINDING_MIN_WALL_NS = 1_000_000
FINDING_MIN_IDLE_SHARE = 0.5


def idle_findings(model: PhaseModel, export: Export, iteration: int | None = None) -> list[dict]:
    """One finding per rank and phase that names where its idle GPU time goes (topic ``idle``),
    over the steady iterations (complete ones, :func:`tracekit.analyze.model.phases.steady_model`,
    the warm-up apart: :func:`tracekit.analyze.model.steady.warmup_keys`; only ``iteration`` when
    given). The rule (docs/idle.md): the phase's mean wall time per iteration
    is at least :data:`FINDING_MIN_WALL_NS` and its GPU idle share (1 - busy / wall) at least
    :data:`FINDING_MIN_IDLE_SHARE`; the cause is the largest of ``between_api_ns`` (host-bound),
    ``in_api_ns`` (held in CUDA API calls, the largest call group named) and ``waiting_ns``
    (waiting on collectives). Returns finding dicts ``{"topic", "pid", "device", "phase",
    "text", "values"}`` (``values`` in ns, per iteration), in rank then phase order."""
    from tracekit.analyze.model.phases import steady_model
    from tracekit.vocab import PHASE_ORDER, os_pid

    steady = steady_model(model)
    w, api = idle_windows(steady, export)
    w = w.filter(pl.col("iteration").is_not_null() & (pl.col("phase") != "other"))
    api = api.filter(pl.col("iteration").is_not_null())
    rows = None
    if iteration is not None:
        w, api = w.filter(pl.col("iteration") == iteration), api.filter(pl.col("iteration") == iteration)
        rows = (pl.col("iteration") == iteration).fill_null(False)  # (the launch statistics' kernels too)
    else:  # the warm-up apart (tracekit.analyze.model.steady), as every "per steady iteration"
        from tracekit.analyze.model.steady import warmup_keys

        drop = warmup_keys(steady.windows)
        keys = ["global_pid", "iteration"]
        w, api = w.join(drop, on=keys, how="anti"), api.join(drop, on=keys, how="anti")
        # the kernels of the warm-up are left out of the launch statistics by a condition on the
        # model's ops (no copy of them, nor of the model; issue 24)
        warm = pl.lit(False)
        for (gpid,), its in drop.group_by(["global_pid"]):
            warm = warm | ((pl.col("global_pid") == gpid) & pl.col("iteration").is_in(its["iteration"].implode()))
        rows = ~warm.fill_null(False)
    if w.height == 0:
        return []
    per = w.group_by("global_pid", "device", "phase").agg(
        pl.col("wall_ns", *CATEGORIES).sum(), iterations=pl.col("iteration").n_unique())
    ls = launch_stats(steady, export, by=("phase",), idle=w, rows=rows)
    out = []
    order = {p: i for i, p in enumerate(PHASE_ORDER)}
    for r in sorted(per.iter_rows(named=True), key=lambda r: (r["global_pid"], r["device"], order.get(r["phase"], 99))):
        n = r["iterations"]
        wall, busy = r["wall_ns"] / n, r["gpu_busy_ns"] / n
        idle_ns = wall - busy
        if wall < FINDING_MIN_WALL_NS or wall <= 0 or idle_ns / wall < FINDING_MIN_IDLE_SHARE:
            continue
        parts = {"between_api_ns": r["between_api_ns"] / n, "in_api_ns": r["in_api_ns"] / n,
                 "waiting_ns": r["waiting_ns"] / n}
        cause = max(parts, key=lambda c: (parts[c], c))
        share = parts[cause] / idle_ns
        phase = r["phase"]
        if cause == "between_api_ns":
            head = (f"{phase} is host-bound: {share:.0%} of its idle time is the launching thread between "
                    f"CUDA API calls (Python/framework)")
        elif cause == "in_api_ns":
            mine = api.filter((pl.col("global_pid") == r["global_pid"]) & (pl.col("device") == r["device"])
                              & (pl.col("phase") == phase))
            g = mine.group_by("group").agg(pl.col("ns").sum()).sort("ns", "group", descending=[True, False])
            top = mine.group_by("name").agg(pl.col("ns").sum()).sort("ns", "name", descending=[True, False])
            grp = g["group"][0] if g.height else "other"
            call = top["name"][0] if top.height else "?"
            head = (f"{phase} is held in CUDA API calls: {share:.0%} of its idle time is the launching thread "
                    f"inside them, mostly {grp} ({call} {fmt(top['ns'][0] / n if top.height else 0)} ms per iteration)")
        else:
            head = (f"{phase} waits on collectives: {share:.0%} of its idle time a communication kernel runs "
                    "while no compute does")
        text = (f"{head}; GPU idle {fmt(idle_ns)} of {fmt(wall)} ms per iteration "
                f"({idle_ns / wall:.0%}, steady iterations)")
        st = ls.filter((pl.col("global_pid") == r["global_pid"]) & (pl.col("device") == r["device"])
                       & (pl.col("phase") == phase))
        s = st.row(0, named=True) if st.height else {}
        values = {"wall_ns": wall, "gpu_idle_ns": idle_ns, **parts, "iterations": n}
        if s.get("kernel_count"):
            kern = s["kernel_count"] / n
            values.update(kernels=kern, kernel_p50_ns=s["kernel_p50_ns"], launch_mean_ns=s["launch_mean_ns"])
            text += f"; {kern:,.0f} kernel{'' if kern == 1 else 's'} of median {s['kernel_p50_ns'] / 1e3:,.1f} us"
            if s.get("launch_mean_ns") is not None:
                text += f", launch {s['launch_mean_ns'] / 1e3:,.1f} us each"
        out.append({"topic": "idle", "pid": os_pid(r["global_pid"]), "device": r["device"], "phase": phase,
                    "text": text, "values": values})
    return out


def fmt(ns: float) -> str:
    """ns as ms with one decimal (the findings' unit)."""
    return f"{ns / 1e6:,.1f}"


def microbatch_advice(model: PhaseModel, export: Export, adv: dict) -> tuple[list[dict], list[dict]]:
    """The ``larger_micro_batch`` what-if (docs/idle.md): twice the micro-batch at half the
    gradient accumulation steps (same global batch), for a rank whose forward or backward meets the
    findings rule (:func:`idle_findings`). Per steady iteration (``adv["predictions"]``: the
    iterations and baseline of :func:`tracekit.analyze.sections.advice.advise`), with ``W`` the
    forward + backward wall time, ``K`` their compute kernel busy time: each of the ``gas / 2`` new
    micro-steps keeps the host time (wall - GPU busy) and the copy time of one old micro-step and
    runs twice its kernel time, fully exposed, so ``predicted = baseline - (W - K) / 2`` (an upper
    bound on the time; the lower bound, where the longer kernels hide under the host time, is
    ``baseline - W + max(W, W_gpu + K) / 2`` with ``W_gpu`` the GPU busy time).

    Returns ``(advice items, prediction rows)`` in the shapes of ``adv["advice"]`` and
    ``adv["predictions"]``; both empty for a rank without an even ``gas >= 2`` or host-bound
    micro-steps, or a saving under the advice's threshold.

    For gas 2 the numbers are the what-if model's ``larger_micro_batch`` row of
    ``adv["predictions"]`` (:func:`tracekit.analyze.sections.whatif.predict`: the boundary
    micro-step kept whole, the other one's launches and gradient round trip gone, issue 22) when it
    is there and applicable: the item takes its saving and interval, the row gets
    ``lower_bound_ns`` and this basis, and no second prediction row is returned; the formula
    above (equal micro-steps: the same number) is the fallback for gas 4, 6, ..."""
    from tracekit.analyze.sections.advice import MIN_SAVING_SHARE
    from tracekit.analyze.sections.breakdown import phase_table
    from tracekit.vocab import os_pid

    base = {(p["pid"], p["device"]): (p["baseline_ns"], p.get("iterations") or []) for p in adv.get("predictions", [])}
    whatif_rows = {(p["pid"], p["device"]): p for p in adv.get("predictions", [])
                   if p.get("scenario") == "larger_micro_batch" and p.get("applicable")}
    # ZenFlow: an iteration's backward passes are update_interval training steps, not accumulation
    # micro-steps (the what-if row says so); its forwards are no micro-batch to merge
    zenflow = {(p["pid"], p["device"]) for p in adv.get("predictions", [])
               if p.get("scenario") == "larger_micro_batch" and str(p.get("why_not") or "").startswith("ZenFlow")}
    w, _ = idle_windows(model, export)
    rows = phase_table(model).select(*ROW_KEYS, "wall_ns", "kernel_busy_ns").join(
        w.select(*ROW_KEYS, "gpu_busy_ns"), on=list(ROW_KEYS), nulls_equal=True)
    items, preds = [], []
    for gpid, dev in rows.select("global_pid", "device").unique().sort("global_pid", "device").iter_rows():
        pid = os_pid(gpid)
        if (pid, dev) not in base or (pid, dev) in zenflow:
            continue
        b, its = base[(pid, dev)]
        m = rows.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev)
                        & pl.col("iteration").is_in(list(its)) & pl.col("phase").is_in(["forward", "backward"]))
        n = len(its)
        if not n or m.height == 0:
            continue
        fwd = m.filter(pl.col("phase") == "forward").group_by("iteration").len()["len"].unique().to_list()
        if len(fwd) != 1 or fwd[0] < 2 or fwd[0] % 2:
            continue
        gas = int(fwd[0])
        W = m["wall_ns"].sum() / n
        K = m["kernel_busy_ns"].sum() / n
        B = m["gpu_busy_ns"].sum() / n
        host_bound = any(
            (g["wall_ns"].sum() / n >= FINDING_MIN_WALL_NS)
            and 1 - g["gpu_busy_ns"].sum() / max(g["wall_ns"].sum(), 1) >= FINDING_MIN_IDLE_SHARE
            for _, g in m.group_by("phase"))
        wrow = whatif_rows.get((pid, dev))
        saving = wrow["saving_ns"] if wrow is not None and gas == 2 else (W - K) / 2
        if not host_bound or saving < max(MIN_SAVING_SHARE * b, 1e6):
            continue
        lower = b - W + max(W, B + K) / 2
        from tracekit.analyze.sections.whatif import interval

        if wrow is not None and gas == 2:  # the what-if model's row: one model for the change
            iv = {k: wrow.get(k) for k in ("interval_ns", "saving_interval_ns", "within_noise", "interval_basis")}
            basis = (wrow["basis"] + f"; if the longer kernels hide under the host time, {lower / 1e6:,.1f} ms")
            wrow["lower_bound_ns"] = round(lower, 3)
            wrow["basis"] = basis
        else:
            allp = rows.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev)
                               & pl.col("iteration").is_in(list(its)))
            walls = allp.group_by("iteration").agg(pl.col("wall_ns").sum()).sort("iteration")["wall_ns"].to_list()
            per = m.group_by("iteration").agg((pl.col("wall_ns").sum() - pl.col("kernel_busy_ns").sum()) / 2).sort(
                "iteration")["wall_ns"].to_list()
            iv = interval({"iteration_walls_ns": walls, "iteration_ns": b}, saving, per)
            basis = (
                f"forward + backward of the steady iterations, {W / 1e6:,.1f} ms per iteration in {gas} micro-steps "
                f"with {K / 1e6:,.1f} ms of compute kernels: per new micro-step the host time (wall - GPU busy) and "
                f"the copies of one old micro-step kept, its kernel time doubled and fully exposed (saving = (wall - "
                f"kernels) / 2); if the longer kernels hide under the host time, {lower / 1e6:,.1f} ms")
        pred = {"pid": pid, "device": dev, "iterations": its, "scenario": "larger_micro_batch", "applicable": True,
                "why_not": "", "baseline_ns": round(b, 3), "predicted_ns": round(b - saving, 3),
                "saving_ns": round(saving, 3), "basis": basis, "confidence": "low",
                "lower_bound_ns": round(lower, 3), "gas": gas, **iv}
        if not (wrow is not None and gas == 2):  # else the what-if row is the prediction
            preds.append(pred)
        items.append({
            "problem": (f"forward and backward are host-bound: the GPU is idle {100 * (1 - B / W):.0f}% of their "
                        f"{W / 1e6:,.1f} ms per iteration (mean over steady iterations {_span(its)}); "
                        f"each of the {gas} "
                        "micro-steps pays the launch and framework time again"),
            "knob": "train_micro_batch_size_per_gpu / gradient_accumulation_steps",
            "change": f"micro-batch x 2, gradient_accumulation_steps {gas} -> {gas // 2} (same global batch; needs "
                      "memory for twice the activations)",
            "baseline_iteration_ms": round(b / 1e6, 3), "predicted_iteration_ms": round((b - saving) / 1e6, 3),
            "saving_ms_per_iteration": round(saving / 1e6, 3), "saving_pct": round(100 * saving / b, 2) if b else None,
            "basis": basis, "confidence": "low", "scenario": "larger_micro_batch", "pid": pid, "device": dev,
            "config_fixable": True,
            "predicted_interval_ms": None if iv["saving_interval_ns"] is None else [
                round((b - iv["saving_interval_ns"][1]) / 1e6, 3), round((b - iv["saving_interval_ns"][0]) / 1e6, 3)],
            "saving_interval_ms": None if iv["saving_interval_ns"] is None else [
                round(v / 1e6, 3) for v in iv["saving_interval_ns"]],
            "within_noise": iv["within_noise"]})
    return items, preds


def _span(its: list[int]) -> str:
    """``1-2`` for steady iterations [1, 2], ``3`` for one."""
    return f"{its[0]}-{its[-1]}" if len(its) > 1 else (str(its[0]) if its else "none")
