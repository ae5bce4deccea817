"""The lead of report.md and report.html: the one-line headline and the compact advice table.

Its own module so that both renderers import it (report.py writes report.html through html.py)."""

from __future__ import annotations

from tracekit.render.data import ReportData


def headline(data: ReportData, rk: dict, res: dict | None) -> str:
    """The report's first line, plain text: ``trace · GPU · ZeRO-3 · offload cpu · bf16 · grad.
    accumulation 2`` (the settings of ``res``, the advice result, else what the trace's name
    and NVTX ranges say: :func:`tracekit.render.config.trace_config`); unknown parts left out.
    A trace of several ranks names the one shown second: ``rank 1 of 2 (pid 20)``."""
    from tracekit.render.config import config_text, trace_config

    cfg = trace_config(data)
    sett = {r["key"]: r["value"] for r in ((res or {}).get("config") or {}).get("settings") or []}
    parts = [data.path.name]
    if data.ranks.height > 1:  # the advice, numbers and figures below are this rank's
        parts.append(f"rank {rk['index']} of {data.ranks.height} (pid {rk['pid']})")
    try:
        g = data.export.gpus()
        g = g.filter(g["device"] == rk["device"]) if g.height else g
        if g.height and g["name"][0]:
            parts.append(f"GPU {rk['device']}: {g['name'][0]}")
        else:
            parts.append(f"GPU {rk['device']}")
    except Exception:  # noqa: BLE001 - an export without TARGET_INFO_GPU
        parts.append(f"GPU {rk['device']}")
    stage = sett.get("zero_optimization.stage", cfg.stage)
    if stage is not None:
        parts.append(f"ZeRO-{config_text(stage)}")
    dev = sett.get("zero_optimization.offload_optimizer.device")
    if dev is not None:
        pin = sett.get("zero_optimization.offload_optimizer.pin_memory")
        parts.append(f"optimizer offload {config_text(dev)}"
                     + (f" (pin_memory {config_text(pin)})" if pin is not None and dev not in ("none",) else ""))
    elif cfg.offload:
        parts.append(f"offload {cfg.offload}")
    prec = sett.get("precision", cfg.precision)
    if prec:
        parts.append(str(prec))
    gas = sett.get("gradient_accumulation_steps", cfg.gas)
    if gas is not None:
        parts.append(f"gradient accumulation {config_text(gas)}")
    return " · ".join(parts)


def only_rank_note(n_ranks: int) -> str:
    """What a report of one rank of ``n_ranks`` (two or more) shows of the others, after the
    shown rank: the advice, key numbers, findings and figures but the per-rank one are its."""
    return (f": the advice, key numbers, findings and every figure but the per-rank summary (all {n_ranks} "
            "ranks) are this rank's; `--rank N` for another")


def advice_rows(res: dict | None, rk: dict) -> list[dict]:
    """The advice of one rank as the compact table at the top of ``report.md`` and
    ``report.html`` shows it, largest saving first: ``{"knob", "change", "predicted",
    "saves", "confidence"}`` (text; ``predicted``: the iteration ms predicted with its 95 %
    interval, ``saves``: ms and % of the steady iteration; per iteration = mean over steady
    iterations, warm-up apart)."""
    from tracekit.vocab import fmt_plain, knob_label

    out = []
    for a in (res or {}).get("advice") or []:
        if a.get("pid") not in (None, rk["pid"]) or a.get("device") not in (None, rk["device"]):
            continue
        pred = a.get("predicted_iteration_ms")
        iv = a.get("predicted_interval_ms")
        ptxt = fmt_plain(pred)
        if iv and len(iv) == 2 and None not in iv:
            ptxt += f" ({fmt_plain(float(iv[0]))} to {fmt_plain(float(iv[1]))})"
        sv, sp = a.get("saving_ms_per_iteration"), a.get("saving_pct")
        saves = f"{fmt_plain(sv)} ms" + (f" ({sp:.1f}%)" if sp is not None else "")
        out.append({"knob": knob_label(a.get("knob")), "change": a.get("change") or "", "predicted": ptxt,
                    "saves": saves, "confidence": a.get("confidence") or "–"})
    return out


#: Headers of the compact advice table (the keys of :func:`advice_rows`).
ADVICE_HEADERS = {"knob": "knob", "change": "change", "predicted": "predicted iteration ms (95 % interval)",
                  "saves": "saves per iteration", "confidence": "confidence"}
