"""The default ``tracekit analyze`` screen (issue 23): the answer at a glance.

One header line (trace, GPU, DeepSpeed stage/offload/precision/gas and where the config came
from), the advice as a table, the per-iteration phase table and each finding on one line;
<= 40 lines at 80 columns for a one-GPU trace. ``--explain [N]`` prints each advice item's
problem and basis (the evidence); ``--wide`` and ``--all`` print everything
(:func:`tracekit.render.tables.render`). Everything is read from the ``--json`` dict.
"""

from __future__ import annotations

import re
from pathlib import PurePath

from rich.console import Console

from tracekit.render.terminal import add_num_column, fold_text, new_table
from tracekit.textsafe import text as _t
from tracekit.vocab import fmt_ms as _ms
from tracekit.vocab import fmt_pct as _pct
from tracekit.vocab import fmt_mb_at

#: settings of the header line: (key in config.settings, label)
HEADER_KEYS = (("zero_optimization.stage", "ZeRO-{}"), ("zero_optimization.offload_optimizer.device", "offload {}"),
               ("precision", "{}"), ("gradient_accumulation_steps", "gas {}"))


def header_line(result: dict) -> str:
    """``NAME.sqlite: GPU pid P device D; ZeRO-3, offload cpu, bf16, gas 2 (inferred from the trace)``
    (the trace's file name; the full path is in ``--wide`` and ``--json``)."""
    cfg = result.get("config") or {}
    vals = {r["key"]: r["value"] for r in cfg.get("settings") or []}
    ds = ", ".join(lab.format(vals[k]) for k, lab in HEADER_KEYS if k in vals)
    where = ("--ds-config" if cfg.get("source") == "ds-config" else "capture manifest" if cfg.get("source")
             else "inferred from the trace")
    gpus = ", ".join(f"pid {r['pid']} device {r['device']}" for r in result["ranks"]) or "no GPU work"
    return f"{PurePath(result['trace']).name}: GPU {gpus}; {ds or 'DeepSpeed config unknown'} ({where})"


def _cell(s: str):
    """A cell of pre-folded lines (each printed as data)."""
    from rich.text import Text

    return Text("\n").join(_t(line) for line in str(s).split("\n"))


#: lines of an advice row's "knob: change" cell (the rest: ``--explain N``), findings shown,
#: iterations shown (the first ones; the rest: ``--wide``)
ADVICE_LINES = 2
FINDINGS_SHOWN = 8
ITERATIONS_SHOWN = 8


def _lines(folded: str, n: int) -> str:
    """The first ``n`` lines of ``folded``; … ends the last one when lines were left out."""
    lines = folded.split("\n")
    if len(lines) <= n:
        return folded
    return "\n".join(lines[: n - 1] + [lines[n - 1] + " …"])


def _interval(v) -> str:
    if not v:
        return ""
    return f"{v[0]:,.0f}{' to ' if v[0] < 0 else '-'}{v[1]:,.0f}"


def advice_table(result: dict, width: int):
    """The advice, one row per item: rank (several only), knob, change, predicted iteration ms
    and its 95 % interval, saving %, confidence. None without advice."""
    items = result.get("advice") or []
    if not items:
        return None
    multi = len({(a["pid"], a["device"]) for a in items}) > 1
    base = items[0]["baseline_iteration_ms"]
    t = new_table(f"advice: ms per steady iteration (now {base:,.1f}); --explain N: evidence")
    t.show_edge = False  # no blank lines above and below: one screen
    t.add_column("#", justify="right")
    if multi:
        t.add_column("rank")
    # fixed parts: # 2, rank 7, ms 8, interval 11, save 6, conf 6, padding 2 per column gap
    kw = max(20, width - 1 - (9 if multi else 0) - 7 - 12 - 6 - 6 - 3 * (6 if multi else 5))
    t.add_column("knob: change", width=kw)
    for c in ("ms", "95 % int.", "save", "conf."):
        t.add_column(c, justify="right", no_wrap=True)
    for i, a in enumerate(items, 1):
        change = a["change"].split(" (")[0].split(" when ")[0]
        knob = re.sub(r" \([^)]*\)", "", a["knob"])
        row = [str(i)] + ([f"{a['pid']}/{a['device']}"] if multi else [])
        row += [_lines(fold_text(knob + ": " + change, kw), ADVICE_LINES), f"{a['predicted_iteration_ms']:,.1f}",
                _interval(a.get("predicted_interval_ms")),
                f"{a['saving_pct']:.1f}%" if a.get("saving_pct") is not None else "", a["confidence"]]
        t.add_row(*map(_cell, row))
    return t


def _one_line(text: str, width: int) -> str:
    """The first clause of a finding, cut at a word boundary to ``width`` (… when cut)."""
    s = text
    if len(s) <= width:
        return s
    cut = s[: width - 1].rsplit(" ", 1)[0]
    return cut.rstrip(",:(") + "…"


def render_short(result: dict, console: Console) -> None:
    """Print the default screen of :mod:`this module <tracekit.render.short>` on ``console``."""
    from tracekit.vocab import rank_title

    console.print(_t(header_line(result)), highlight=False)
    cfg_note = (result.get("config") or {}).get("note")
    if cfg_note:  # why the config is what it is (a manifest ignored, a key unreadable): in full
        console.print(_t(f"note: {cfg_note}"), highlight=False)
    from tracekit.vocab import NO_NVTX, NO_NVTX_NOTE

    for pid, src in result["phase_source"].items():  # why there are no phases: in full
        if src == "none":
            console.print(_t(f"pid {pid}: no phase ranges (tracekit capture or DeepSpeed NVTX) in this trace, so all "
                             "its GPU work is 'other'; map your own NVTX ranges with --phase-map PHASE=REGEX"))
        elif src == NO_NVTX:
            console.print(_t(f"pid {pid}: {NO_NVTX_NOTE}"))
    t = advice_table(result, console.width)
    if t is not None:
        console.print(t)
    elif result.get("config") is not None:
        console.print(_t("advice: none (no change of the what-if model saves 0.5% of a steady iteration)"))
    if len(result["ranks"]) > 1:
        from tracekit.render.multi_gpu_tables import render_rank_order

        render_rank_order(console, result)  # how the ranks were numbered
    for rank in result["ranks"]:
        head = rank_title(rank, len(result["ranks"]))
        tt = new_table(f"{head}: per iteration (--wide: phases)")
        tt.show_edge = False
        tt.add_column("iter")
        for c in ("wall ms", "GPU idle", "update ms", "update idle", "H2D MB @ GB/s"):
            add_num_column(tt, c)
        for it in rank["iterations"][:ITERATIONS_SHOWN]:
            ph = it["phases"]
            wall = sum(p["wall_ns"] for p in ph)
            idle = sum(p["gpu_idle_ns"] for p in ph if p.get("gpu_idle_ns") is not None)
            up = [p for p in ph if p["phase"] == "update"]
            uw = sum(p["wall_ns"] for p in up)
            ui = sum(p["gpu_idle_ns"] for p in up if p.get("gpu_idle_ns") is not None)
            hb = sum(p["h2d_bytes"] for p in ph)
            hbusy = sum(p["h2d_busy_ns"] for p in ph)
            mark = " (unclosed)" if it.get("unclosed") else "" if it["complete"] else " (no update)"
            tt.add_row(*map(_t, (f"{it['index']}{mark}", _ms(wall, 1), _pct(idle / wall if wall else None),
                                 _ms(uw, 1) if up else "", _pct(ui / uw if uw else None),
                                 fmt_mb_at(hb, hb / hbusy if hbusy else None))))
        if rank["iterations"]:
            console.print(tt)
            if len(rank["iterations"]) > ITERATIONS_SHOWN:
                left = len(rank['iterations']) - ITERATIONS_SHOWN
                console.print(_t(f"+{left} more iteration{'s' if left != 1 else ''}: --wide"))
        else:
            console.print(_t(f"{head}: no iteration found (no forward/backward/update NVTX ranges)"))
    for u in result.get("incomplete_iterations") or []:  # (the reason in full: --wide)
        console.print(_t(_one_line(f"iteration {u['iteration']} (pid {u['pid']}) is incomplete ({u['phase']} range "
                                   f"{u['reason']}): left out of steady figures", console.width)), highlight=False)
    a = result.get("nvtx_anomalies") or {}
    if any(a.values()):
        console.print(_t("NVTX records set aside: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in a.items() if v)))
    g = result.get("gpu_op_anomalies") or {}
    if any(g.values()):
        console.print(_t("GPU operations set aside (whole trace, not in any number above): "
                         + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in g.items() if v)))
    findings = result.get("findings") or []
    if findings:
        console.print(_t("findings (--wide: whole text; ms = 1e6 ns, MB = 1e6 B)", "bold"))
        multi = len({(f["pid"], f["device"]) for f in findings}) > 1
        for f in findings[:FINDINGS_SHOWN]:
            prefix = f"pid {f['pid']}/{f['device']}: " if multi else ""
            console.print(_t(_one_line(f"- {prefix}{f['text']}", console.width)), highlight=False)
        if len(findings) > FINDINGS_SHOWN:
            left = len(findings) - FINDINGS_SHOWN
            console.print(_t(f"+{left} more finding{'s' if left != 1 else ''}: --wide"))


def render_explain(result: dict, console: Console, item: int | None = None) -> None:
    """``--explain [N]``: each advice item's (or item N's) change, problem and basis in full."""
    from tracekit.errors import TracekitError

    items = result.get("advice") or []
    if item is not None and not 1 <= item <= len(items):
        raise TracekitError(f"--explain {item}: the advice has {len(items)} item(s)")
    for i, a in enumerate(items, 1):
        if item is not None and i != item:
            continue
        console.print(_t(f"{i}. {a['knob']}: {a['change']}", "bold"), highlight=False)
        from tracekit.vocab import fmt_range as _range

        pi, si = a.get("predicted_interval_ms"), a.get("saving_interval_ms")
        console.print(_t(f"   saves {a['saving_ms_per_iteration']:,.1f} ms ({_range(si) if si else 'no interval'}) per "
                         f"steady iteration ({a['baseline_iteration_ms']:,.1f} -> {a['predicted_iteration_ms']:,.1f} ms, "
                         f"95 % interval {_range(pi) if pi else 'none'}"
                         f"; confidence {a['confidence']}){' (within noise)' if a.get('within_noise') else ''}"),
                      highlight=False)
        console.print(_t(f"   problem: {a['problem']}"), highlight=False)
        console.print(_t(f"   predicted from: {a['basis']}"), highlight=False)
    if not items:
        console.print(_t("advice: none"))
