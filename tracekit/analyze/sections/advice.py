"""Advice: what to change in the DeepSpeed config (or environment, or code), and how much
faster one steady iteration gets, from the what-if scenarios of :mod:`tracekit.analyze.sections.whatif`.

:func:`build_advice` is a pure function: measured pieces, predicted scenarios and the run's
settings in, a list of dicts out. Each item::

    {"problem": str,             # the problem with its evidence (mean over steady iterations)
     "knob": str,                # a DeepSpeed config key, an environment variable, or "DeepSpeed code"
     "change": str,              # e.g. "false -> true"
     "baseline_iteration_ms": float, "predicted_iteration_ms": float,
     "saving_ms_per_iteration": float, "saving_pct": float,
     "basis": str,               # how it was predicted
     "confidence": "high"|"medium"|"low",
     "scenario": str, "pid": int, "device": int, "config_fixable": bool,
     "predicted_interval_ms": [low, high] | None,   # 95 % interval of the predicted iteration
     "saving_interval_ms": [low, high] | None,      # and of the saving (docs/advice.md, "Interval")
     "within_noise": bool | None}                   # the saving interval holds 0 (None: no interval)

sorted by saving per iteration, largest first. Items saving less than :data:`MIN_SAVING_SHARE`
of the iteration (and less than 1 ms) are left out. :func:`one_time_costs` lists start-up
costs (pageable copies before the first iteration, the warm-up iteration's excess) apart,
in ms in total, not per iteration.

Confidence: *high* when the prediction only removes or re-times measured work at a bandwidth
measured in the same trace; *medium* when it rests on an assumed constant (a device bandwidth,
a bytes-per-parameter count) or on how DeepSpeed schedules the changed work; *low* when it needs
a code change whose schedule is a guess.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyze.trace import dsconfig

MIN_SAVING_SHARE = 0.005


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def _basis(pieces: dict) -> str:
    its = pieces["iterations"]
    rng = f"{its[0]}-{its[-1]}" if len(its) > 1 else str(its[0])
    warm = pieces.get("warmup") or []
    w = ""
    if warm:
        ns = pieces["one_time"]["warmup_ns"]
        w = (f"; warm-up iteration{'s' if len(warm) > 1 else ''} "
             + ", ".join(f"{i} ({ns[i] / 1e6:,.0f} ms)" for i in warm) + " apart")
    return f"mean over steady iterations {rng} ({len(its)}){w}"


def _copy_stats(copies: pl.DataFrame, n: int) -> tuple[float, float, float]:
    b = float(copies["bytes"].sum()) / n
    d = float(copies["duration_ns"].sum()) / n
    e = float(copies["exposed_ns"].sum()) / n
    return b, d, e


def build_advice(pieces: dict, scenarios: list[dict], settings: dict) -> list[dict]:
    """Advice items of one rank (see module doc) from its ``pieces``
    (:func:`tracekit.analyze.sections.whatif.measure`), ``scenarios`` (:func:`~tracekit.analyze.sections.whatif.predict`)
    and ``settings`` (``{key: value}``). Sorted by saving per iteration, largest first."""
    n = len(pieces["iterations"])
    base = pieces["iteration_ns"]
    ev = _basis(pieces)
    roles = pieces["roles"]
    copies = pieces["copies"]
    upd = pieces["update_ns"]
    pin = settings.get("zero_optimization.offload_optimizer.pin_memory")
    sc = {s["scenario"]: s for s in scenarios}
    items: list[dict] = []

    def add(s: dict, problem: str, knob: str, change: str, saving_ns: float | None = None, confidence=None,
            fixable=True, basis=None):
        saving = s["saving_ns"] if saving_ns is None else saving_ns
        if saving < max(MIN_SAVING_SHARE * base, 1e6):
            return
        siv = s.get("saving_interval_ns") if saving_ns is None else s.get("copy_back_saving_interval_ns")
        items.append({
            "problem": problem, "knob": knob, "change": change,
            "baseline_iteration_ms": _ms(base), "predicted_iteration_ms": _ms(base - saving),
            "saving_ms_per_iteration": _ms(saving), "saving_pct": round(100 * saving / base, 2) if base else None,
            "basis": basis or s["basis"], "confidence": confidence or s["confidence"], "scenario": s["scenario"],
            "pid": pieces["pid"], "device": pieces["device"], "config_fixable": fixable,
            "predicted_interval_ms": None if siv is None else [_ms(base - siv[1]), _ms(base - siv[0])],
            "saving_interval_ms": None if siv is None else [_ms(siv[0]), _ms(siv[1])],
            "within_noise": None if siv is None else bool(siv[0] <= 0 <= siv[1]),
        })

    s = sc.get("bf16")
    if s and s["applicable"]:
        oc = roles["overflow_check"]
        add(s, f"fp16 overflow check: DeepSpeed's has_overflow scans the gradient buffer on the CPU for inf/NaN "
               f"every step, {oc['wall_ns'] / 1e6:,.1f} ms per iteration ({100 * oc['wall_ns'] / upd:.0f}% of the "
               f"update, {100 * oc['cpu_ns'] / max(oc['wall_ns'], 1):.0f}% of it with the GPU idle; {ev})",
            "fp16.enabled / bf16.enabled", "fp16 -> bf16 (bf16: {enabled: true}; no loss scaling, no overflow check)")
    s = sc.get("pin_memory")
    if s and s["applicable"]:
        pg = copies.filter((pl.col("host_kind") == "pageable") & (pl.col("role").is_null() | (pl.col("role") != "copy_back")))
        b, d, e = _copy_stats(pg, n)
        add(s, f"{b / 1e6:,.0f} MB of pageable gradient copies per iteration at {b / d if d else 0:,.1f} GB/s "
               f"({e / 1e6:,.1f} ms exposed; {ev}): offload_optimizer.pin_memory is off, so the CPU gradient "
               "buffers are pageable and every copy is staged and blocks the host",
            "zero_optimization.offload_optimizer.pin_memory", "false -> true")
    s = sc.get("pageable_to_pinned")
    if s and s["applicable"] and s.get("copy_back_saving_ns", 0) > 0:
        cb = copies.filter((pl.col("role") == "copy_back") & (pl.col("host_kind") == "pageable"))
        b, d, e = _copy_stats(cb, n)
        why = ("with offload_optimizer.pin_memory: true this copy is still pageable: it is DeepSpeed's own "
               "fp32 -> fp16/bf16 temporary in _reassign_or_swap_out_partitioned_parameters "
               "(fp16_partitioned_groups_flat.copy_(fp32_partitioned_groups_flat) converts on the CPU into a fresh "
               "tensor), which no config key pins; DS_PIN_MEMORY_BACKEND=native pins with mlock, which CUDA still "
               "counts as pageable" if pin is True else
               "part of it is DeepSpeed's fp32 -> 16-bit temporary, which stays pageable even with pin_memory: true")
        add(s, f"parameter copy-back: {b / 1e6:,.0f} MB of pageable H2D per iteration at {b / d if d else 0:,.1f} GB/s "
               f"({e / 1e6:,.1f} ms exposed; {ev}); {why}",
            "DeepSpeed code (not a config key)",
            "convert fp32 -> 16-bit into a pinned staging buffer (or on the GPU) before the H2D copy",
            saving_ns=s["copy_back_saving_ns"], confidence=s.get("copy_back_confidence", "medium"), fixable=False,
            basis="the copy-back's pageable H2D at the pinned bandwidth of its size measured in this trace, times "
                  "its exposed share; the CPU conversion stays")
    s = sc.get("no_offload")
    if s and s["applicable"]:
        cpu = sum(roles[k]["cpu_ns"] for k in roles)
        mem = (f"the optimizer state ({s['state_bytes'] / 1e9:,.1f} GB at 16 B per parameter) fits the "
               f"{s['free_bytes'] / 1e9:,.1f} GB of GPU memory free at the peak" if s.get("free_bytes") is not None else
               f"check that the optimizer state ({s['state_bytes'] / 1e9:,.1f} GB at 16 B per parameter) fits: free GPU "
               "memory unknown (record with --cuda-memory-usage=true)")
        add(s, f"the optimizer step runs on the CPU: update {upd / 1e6:,.1f} ms per iteration, {cpu / 1e6:,.1f} ms "
               f"of it in the CPU steps of the update with the GPU idle ({ev}); {mem}",
            "zero_optimization.offload_optimizer.device",
            f"{settings.get('zero_optimization.offload_optimizer.device') or 'cpu'} -> none (keep the optimizer on the GPU)",
            confidence=None if s.get("free_bytes") is not None else "low")
    s = sc.get("ratio")
    if s and s["applicable"] and not (sc.get("no_offload") or {}).get("applicable"):  # else: no offload at all
        add(s, f"the CPU optimizer step and copy-back take {(roles['cpu_adam']['wall_ns'] + roles['copy_back']['wall_ns']) / 1e6:,.1f} "
               f"ms per iteration ({ev}) while GPU memory is free for {s['gpu_sub_groups']} of {s['sub_groups']} "
               "sub-groups' optimizer state",
            "zero_optimization.offload_optimizer.ratio", f"1.0 -> {s['ratio']:g}")
    s = sc.get("grads_on_gpu")
    if s and s["applicable"]:
        nb = copies.filter((pl.col("phase") == "backward") & ~pl.col("boundary"))
        b, d, e = _copy_stats(nb, n)
        gas = pieces.get("micro_steps") or 2
        if type(settings.get("gradient_accumulation_steps")) is int and settings.get("zero_optimization.zenflow"):
            gas = settings["gradient_accumulation_steps"]  # ZenFlow: micro-steps = gas x update_interval
        add(s, f"gradient accumulation round trip: the non-boundary backward micro-steps move {b / 1e6:,.0f} MB per "
               f"iteration between GPU and host ({e / 1e6:,.1f} ms exposed; {ev}) only to accumulate gradients",
            "gradient_accumulation_steps / train_micro_batch_size_per_gpu (or DeepSpeed code)",
            "accumulate in a GPU buffer until the boundary (code change); gradient_accumulation_steps "
            f"{gas} -> 1 with train_micro_batch_size_per_gpu x{gas} also drops the round trip: its prediction is "
            "the larger_micro_batch scenario",
            confidence="low")
    s = sc.get("overlap_grad_copies")
    if s and s["applicable"]:
        oc_ = settings.get("zero_optimization.overlap_comm")
        bw = copies.filter(pl.col("phase") == "backward")
        b, d, e = _copy_stats(bw, n)
        add(s, f"backward's host copies are not hidden behind compute: {e / 1e6:,.1f} of {d / 1e6:,.1f} ms per "
               f"iteration exposed ({ev})",
            "zero_optimization.overlap_comm" if oc_ is False else "DeepSpeed code (no config key)",
            "false -> true" if oc_ is False else
            "issue the gradient D2H on a side stream into pinned buffers as each gradient is ready",
            fixable=oc_ is False)
    s = sc.get("sub_group_size")
    if s and s["applicable"]:
        add(s, f"parameter copy-back in {pieces['sub_groups'] or 1} sub-group(s) per step ({ev})",
            "zero_optimization.sub_group_size", f"-> {s['sub_group_size']:.0e}")
    s = sc.get("superoffload_no_clipping")
    if s and s["applicable"]:
        clip = settings.get("gradient_clipping")
        clip_why = ("gradient_clipping on, from the trace: one wait per CPU sub-group inside the update"
                    if clip == dsconfig.CLIPPING_ON else f"gradient_clipping {clip}, DeepSpeed's default since 0.19.3")
        add(s, f"SuperOffload steps every sub-group inside the update while the training waits: "
               f"{s['wait_ns'] / 1e6:,.1f} ms per iteration in cpu_update_wait ({ev}); with gradient clipping on "
               f"({clip_why}) SuperOffloadOptimizer_Stage3 skips its asynchronous path, which steps each finished "
               "sub-group in the worker during the boundary backward",
            "gradient_clipping", f"{settings.get('gradient_clipping')} -> 0.0 (only if the training can do without "
            "clipping: it changes the optimisation, not just the schedule)"
            + (f"; with zero_optimization.reduce_bucket_size {s['reduce_bucket_size']:.0e} -> "
               f"{s['suggested_reduce_bucket_size']:.0e} so that sub-groups complete during backward"
               if s.get("one_reduce_bucket") else ""), fixable=True)
    items.sort(key=lambda x: -x["saving_ms_per_iteration"])
    return items


def one_time_costs(pieces: dict) -> list[dict]:
    """Start-up costs of one rank, apart from the per-iteration advice (totals, not per
    iteration): ``{"problem", "total_ms", "knob", "change", "pid", "device"}``."""
    ot = pieces["one_time"]
    out = []
    if ot["startup_pageable_ns"] >= 1e6:
        out.append({"problem": f"start-up: {ot['startup_pageable_bytes'] / 1e6:,.0f} MB of pageable copies before the first "
                               f"iteration ({ot['startup_pageable_count']} copies, "
                               f"{ot['startup_pageable_ns'] / 1e6:,.1f} ms in total, once per run): the optimizer "
                               "state's first offload to the host", "total_ms": _ms(ot["startup_pageable_ns"]),
                    "knob": "zero_optimization.offload_optimizer.pin_memory",
                    "change": "true (pinned host buffers) if not set; otherwise a one-time cost",
                    "pid": pieces["pid"], "device": pieces["device"]})
    for it, ns in (ot.get("warmup_ns") or {}).items():
        extra = ns - pieces["iteration_ns"]
        if extra >= 1e6:
            out.append({"problem": f"warm-up iteration {it}: {ns / 1e6:,.0f} ms, {extra / 1e6:,.0f} ms more than a steady "
                                   "iteration (allocator growth, first use of the buffers), once per run",
                        "total_ms": _ms(extra), "knob": "(none)", "change": "one-time cost",
                        "pid": pieces["pid"], "device": pieces["device"]})
    return out


def settings_map(rows: list[dict]) -> dict:
    """``{key: value}`` of :func:`tracekit.analyze.trace.dsconfig.settings` rows; the values the
    what-if model reads are normalised (``pin_memory`` bool, ``device`` str)."""
    return {r["key"]: r["value"] for r in rows}


def advise(export, model, loaded: dict, changes: dict | None = None) -> dict:
    """Measure, predict and advise for every rank of an analysed trace.

    ``loaded``: :func:`tracekit.analyze.trace.dsconfig.load`. Returns::

        {"config": {"source", "path", "versions", "gpus", "note", "settings": [rows]},
         "advice": [items of every rank],  "one_time_costs": [...],
         "predictions": [{"pid", "device", **scenario}],
         "_cpu_steps": {(pid, device): {step label: CPU-only ns per iteration}}}  (not JSON: for
         :func:`tracekit.analyze.sections.findings.name_cpu_steps`),
         "_pinning": frame}  (not JSON: :func:`tracekit.analyze.sections.whatif.pinning_by_copy` of
         every rank, what the pageable section and its findings print as pinning's saving)

    (``settings`` from the config when there is one, else inferred from rank 0's trace.)
    """
    from tracekit.analyze.sections import whatif

    ranks = model.derived(("whatif", "measure"), lambda: whatif.measure(export, model))  # the whatif section's
    inferred = dsconfig.infer_settings(whatif.trace_facts(ranks[0])) if ranks else {}
    rows = dsconfig.settings(loaded, inferred)
    # keys the config leaves unknown but the trace shows (e.g. pin_memory without a version)
    have = {r["key"] for r in rows if r["value"] is not None}
    for k, (v, how) in inferred.items():
        if k not in have and loaded.get("deepspeed_config") is not None:
            rows.append({"key": k, "value": v, "source": "trace", "how": how})
    sett = settings_map(rows)
    items, once, preds, steps, pinning = [], [], [], {}, []
    labels = {"overflow_check": "fp16 overflow check (has_overflow)", "unscale": "gradient unscale (unscale_and_clip_grads)",
              "copy_back": "parameter copy-back", "grad_norm": "gradient norm", "cpu_adam": "CPU optimizer step",
              "cpu_wait": "waiting for the CPU optimizer worker (cpu_update_wait)",
              "swap": "NVMe swap of the optimizer state (swap_in/swap_out)"}
    for p in ranks:
        steps[(p["pid"], p["device"])] = {
            (labels[k] if not (k == "cpu_adam" and v.get("unmarked")) else "unmarked CPU optimizer step"): v["cpu_ns"]
            for k, v in p["roles"].items()}
        scen = whatif.predict(p, sett, changes)
        pinning.append(whatif.pinning_by_copy(p, sett))
        items.extend(build_advice(p, scen, sett))
        once.extend(one_time_costs(p))
        preds.extend({"pid": p["pid"], "device": p["device"], "iterations": p["iterations"],
                      **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()}} for s in scen)
    items.sort(key=lambda x: -x["saving_ms_per_iteration"])
    cfg = {k: loaded.get(k) for k in ("source", "path", "versions", "gpus", "note")}
    cfg["settings"] = rows
    return {"config": cfg, "advice": items, "one_time_costs": once, "predictions": preds, "_cpu_steps": steps,
            "_pinning": pl.concat(pinning) if pinning else None}
