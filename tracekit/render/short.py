"""The default ``tracekit analyze`` screen (issue 23): the answer at a glance.

One header line (trace, GPU, DeepSpeed stage/offload/precision/gas and where the config came
from), the advice as a table, the per-iteration phase table and each finding on one line (its
``summary``, computed by :mod:`tracekit.analyze.sections.finding_summary`); <= 40 lines at 80
columns for a one-GPU trace. A trace of several ranks gets :func:`render_short_multi`
(<= 40 lines): the advice once per run, the phases across ranks and the ranks' differences per
steady iteration (``across_ranks``: :mod:`tracekit.analyze.run_summary`) and the findings once
per run. ``--explain [N]`` prints each advice item's problem and basis (the evidence) and every
finding whole; ``--wide`` and ``--all`` print everything (:func:`tracekit.render.tables.render`).
Everything is read from the ``--json`` dict.

Over 500 lines as one module: the one-GPU and several-rank screens share their cells, folding
and line budget, and one file keeps the 40-line screen readable as a whole.
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
    ranks = result["ranks"]
    if len(ranks) > 2:  # many ranks: pid/device pairs
        gpus = "s (pid/device) " + ", ".join(f"{r['pid']}/{r['device']}" for r in ranks)
    else:
        gpus = " " + (", ".join(f"pid {r['pid']} device {r['device']}" for r in ranks) or "no GPU work")
    return f"{PurePath(result['trace']).name}: GPU{gpus}; {ds or 'DeepSpeed config unknown'} ({where})"


def filled_note(source: str) -> str | None:
    """The note for a process whose phases came partly from ``--phase-map`` and partly from the
    built-in names (``phase_source`` ``phase-map+tracekit`` or ``phase-map+DeepSpeed``, with
    ``+inferred-update`` when the update was inferred); None for any other source."""
    parts = source.split("+")
    if len(parts) < 2 or parts[0] != "phase-map" or parts[1] not in ("tracekit", "DeepSpeed"):
        return None
    return f"phases not in --phase-map keep the built-in names ({parts[1]} NVTX)"


def iteration_span(its: list[int]) -> str:
    """``1-3`` for consecutive iterations, else ``1, 3, 5``."""
    its = sorted(its)
    if len(its) > 1 and its == list(range(its[0], its[-1] + 1)):
        return f"{its[0]}-{its[-1]}"
    return ", ".join(str(i) for i in its)


def advice_basis_note(result: dict, iteration: int | None) -> str | None:
    """With ``--iteration N`` the tables show iteration N, but the advice (and its 95 % interval,
    which needs two or more iterations) is over the run's steady iterations (``predictions``'
    ``iterations``): the one line that says which; None without ``--iteration``, without
    predictions, or when N is the only steady iteration."""
    if iteration is None:
        return None
    its = sorted({int(i) for p in result.get("predictions") or [] for i in p.get("iterations") or []})
    if not its or its == [iteration]:
        return None
    what = f"iterations {iteration_span(its)}" if len(its) > 1 else f"iteration {its[0]}"
    return f"note: the advice is over steady {what}, not --iteration {iteration} alone"


def _cell(s: str):
    """A cell of pre-folded lines (each printed as data)."""
    from rich.text import Text

    return Text("\n").join(_t(line) for line in str(s).split("\n"))


#: lines of an advice row's "knob: change" cell (the rest: ``--explain N``), findings shown,
#: iterations shown (the first ones; the rest: ``--wide``)
ADVICE_LINES = 2
FINDINGS_SHOWN = 8
ITERATIONS_SHOWN = 8


def advice_text(item: dict) -> str:
    """An advice item's "knob: change" cell text: the change up to its first parenthesis or
    "when" clause (the rest: ``--explain N``), after its knob -- the config keys without the
    implied ``zero_optimization.`` -- unless the change already names one of them
    (``micro-batch x 2, gradient_accumulation_steps 2 -> 1``); :data:`SHORT_KEYS` abbreviated."""
    change = item["change"].split(" (")[0].split(" when ")[0]
    keys = [k.strip() for k in re.sub(r" \([^)]*\)", "", item["knob"]).split(" / ")]
    text = change if any(k.rsplit(".", 1)[-1] in change for k in keys if k) else (
        " / ".join(k.removeprefix("zero_optimization.") for k in keys) + ": " + change)
    for key, short in SHORT_KEYS:
        text = text.replace(key, short)
    return text


#: config keys the default screen's advice cells abbreviate as the header line does ("gas 2");
#: ``--explain N`` and the reports keep the keys whole
SHORT_KEYS = (("gradient_accumulation_steps", "gas"), ("train_micro_batch_size_per_gpu", "micro-batch"))


def _lines_fit(folded: str, n: int, width: int) -> str:
    """The first ``n`` lines of ``folded``; `` …`` ends the last one, within ``width``, when
    lines were left out (its last words make room)."""
    lines = folded.split("\n")
    if len(lines) <= n:
        return folded
    last = lines[n - 1]
    while len(last) + 2 > width and " " in last:
        last = last.rsplit(" ", 1)[0]
    return "\n".join(lines[: n - 1] + [last + " …"])


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
    t.add_column("#", justify="right", no_wrap=True, min_width=1)
    if multi:
        t.add_column("rank")
    # fixed parts: # 2, rank 7, ms 8, interval 11, save 6, conf 6, padding 2 per column gap
    kw = max(16, width - 1 - (9 if multi else 0) - 7 - 12 - 6 - 6 - 3 * (6 if multi else 5))
    t.add_column("knob: change", width=kw)
    for c in ("ms", "95 % int.", "save", "conf."):
        t.add_column(c, justify="right", no_wrap=True)
    for i, a in enumerate(items, 1):
        row = [str(i)] + ([f"{a['pid']}/{a['device']}"] if multi else [])
        row += [_lines(fold_text(advice_text(a), kw), ADVICE_LINES), f"{a['predicted_iteration_ms']:,.1f}",
                _interval(a.get("predicted_interval_ms")),
                (f"{a['saving_pct']:.1f}%" + ("*" if a.get("within_noise") else ""))
                if a.get("saving_pct") is not None else "", a["confidence"]]
        t.add_row(*map(_cell, row))
    if any(a.get("within_noise") for a in items):
        t.caption = "* within noise: the saving's 95 % interval holds 0"
        t.caption_justify = "left"
    return t


def _one_line(text: str, width: int) -> str:
    """The first clause of a finding, cut at a word boundary to ``width`` (… when cut)."""
    s = text
    if len(s) <= width:
        return s
    cut = s[: width - 1].rsplit(" ", 1)[0]
    return cut.rstrip(",:(") + "…"


def render_short(result: dict, console: Console, iteration: int | None = None) -> None:
    """Print the default screen of :mod:`this module <tracekit.render.short>` on ``console``;
    ``iteration``: the ``--iteration N`` the result was narrowed to (:func:`advice_basis_note`)."""
    from tracekit.vocab import rank_title

    console.print(_t(header_line(result)), highlight=False)
    cfg_note = (result.get("config") or {}).get("note")
    if cfg_note:  # why the config is what it is (a manifest ignored, a key unreadable): in full
        console.print(_t(f"note: {cfg_note}"), highlight=False)
    from tracekit.vocab import NO_KERNELS_NOTE

    if NO_KERNELS_NOTE in (result.get("transfer_notes") or []):  # every number below rests on it
        console.print(_t(f"note: {NO_KERNELS_NOTE}"), highlight=False)
    from tracekit.vocab import NO_NVTX, NO_NVTX_NOTE

    for pid, src in result["phase_source"].items():  # why there are no phases: in full
        if src == "none":
            console.print(_t(f"pid {pid}: no phase ranges (tracekit capture or DeepSpeed NVTX) in this trace, so all "
                             "its GPU work is 'other'; map your own NVTX ranges with --phase-map PHASE=REGEX"))
        elif src == NO_NVTX:
            console.print(_t(f"pid {pid}: {NO_NVTX_NOTE}"))
        elif filled := filled_note(src):
            console.print(_t(f"pid {pid}: {filled}"), highlight=False)
    t = advice_table(result, console.width)
    if t is not None:
        console.print(t)
    elif result.get("config") is not None:
        console.print(_t("advice: none (no change of the what-if model saves 0.5% of a steady iteration)"))
    if basis := advice_basis_note(result, iteration):
        console.print(_t(basis), highlight=False)
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
        _findings_head(console)
        multi = len({(f["pid"], f["device"]) for f in findings}) > 1
        for f in findings[:FINDINGS_SHOWN]:
            prefix = f"pid {f['pid']}/{f['device']}: " if multi else ""
            _print_finding(console, prefix + _summary(f))
        if len(findings) > FINDINGS_SHOWN:
            left = len(findings) - FINDINGS_SHOWN
            console.print(_t(f"+{left} more finding{'s' if left != 1 else ''}: --explain"))


def _summary(f: dict) -> str:
    """A finding's one line (``summary``, computed by the analysis; older results: computed here)."""
    from tracekit.analysis import finding_line

    return finding_line(f)


def _findings_head(console: Console) -> None:
    from tracekit.analysis import finding_basis_note

    console.print(_t("findings, one line each (--explain: the whole text)", "bold"), highlight=False)
    console.print(_t(finding_basis_note()), highlight=False)


def _print_finding(console: Console, line: str) -> int:
    """``- line`` folded at spaces to the console's width (never cut); returns the lines used."""
    folded = fold_text(line, console.width - 2).split("\n")
    for i, x in enumerate(folded):
        console.print(_t(("- " if i == 0 else "  ") + x), highlight=False)
    return len(folded)


def render_explain(result: dict, console: Console, item: int | None = None, iteration: int | None = None) -> None:
    """``--explain [N]``: each advice item's (or item N's) change, problem and basis in full, then
    (without N) every finding's whole sentence. With several ranks the items are those of the
    default screen, once per run (``advice_per_run``), each followed by its per-rank evidence.
    ``iteration``: ``--iteration N``, for :func:`advice_basis_note` (first)."""
    from tracekit.errors import TracekitError

    per_rank = result.get("advice") or []
    multi = len(result.get("ranks") or []) > 1 and result.get("advice_per_run") is not None
    items = result["advice_per_run"] if multi else per_rank
    if item is not None and not 1 <= item <= len(items):
        raise TracekitError(f"--explain {item}: the advice has {len(items)} item(s)")
    if basis := advice_basis_note(result, iteration):
        console.print(_t(basis), highlight=False)
    for i, a in enumerate(items, 1):
        if item is not None and i != item:
            continue
        if multi:
            sv = a["saving_ms_per_iteration"]
            console.print(_t(f"{i}. {a['knob']}: {a['change']}", "bold"), highlight=False)
            console.print(_t(f"   saves {sv['mean']:,.1f} ms per steady iteration, mean over {a['ranks']} rank(s) "
                             f"({sv['min']:,.1f}-{sv['max']:,.1f}); slowest rank: pid {a['slowest']['pid']} device "
                             f"{a['slowest']['device']}"), highlight=False)
            mine = [x for x in per_rank if (x.get("scenario"), x.get("knob"), x.get("change"))
                    == (a["scenario"], a["knob"], a["change"])]
            for x in mine:
                console.print(_t(f"   pid {x['pid']} device {x['device']}:", "bold"), highlight=False)
                _explain_item(console, x, "     ")
        else:
            console.print(_t(f"{i}. {a['knob']}: {a['change']}", "bold"), highlight=False)
            _explain_item(console, a, "   ")
    if not items:
        console.print(_t("advice: none"))
    if item is None and result.get("findings"):
        several = len({(f.get("pid"), f.get("device")) for f in result["findings"]}) > 1
        console.print(_t("findings in full (ms = 1e6 ns, MB = 1e6 B)", "bold"), highlight=False)
        for f in result["findings"]:
            who = f"pid {f['pid']}/{f['device']}: " if several else ""
            console.print(_t(f"- {who}{f['text']}"), highlight=False)


def _explain_item(console: Console, a: dict, indent: str) -> None:
    """The saving, problem and basis of one per-rank advice item, whole."""
    from tracekit.vocab import fmt_range as _range

    pi, si = a.get("predicted_interval_ms"), a.get("saving_interval_ms")
    console.print(_t(f"{indent}saves {a['saving_ms_per_iteration']:,.1f} ms ({_range(si) if si else 'no interval'}) "
                     f"per steady iteration ({a['baseline_iteration_ms']:,.1f} -> "
                     f"{a['predicted_iteration_ms']:,.1f} ms, 95 % interval {_range(pi) if pi else 'none'}"
                     f"; confidence {a['confidence']}){' (within noise)' if a.get('within_noise') else ''}"),
                  highlight=False)
    console.print(_t(f"{indent}problem: {a['problem']}"), highlight=False)
    console.print(_t(f"{indent}predicted from: {a['basis']}"), highlight=False)


#: the default screen of a multi-rank trace: at most this many lines (issue 23)
MULTI_LINES = 40


def _rows(console: Console, renderable) -> int:
    """How many lines ``renderable`` takes on ``console``'s width (rendered apart, no colour)."""
    import io

    c = Console(file=io.StringIO(), width=console.width, color_system=None, force_terminal=False)
    c.print(renderable, highlight=False)
    return c.file.getvalue().count("\n")


def _emit(console: Console, renderable) -> int:
    console.print(renderable, highlight=False)
    return _rows(console, renderable)


def run_advice_table(result: dict, width: int):
    """The advice once per run (``advice_per_run``): one row per change with the mean saving
    per steady iteration over the ranks, its min-max and the mean saving %. None without advice."""
    items = result.get("advice_per_run") or []
    if not items:
        return None
    n = len(result["ranks"])
    t = new_table(f"advice once for {n} ranks: ms saved per steady iteration; --explain N")
    t.show_edge = False
    heads = ("mean ms", "ranks", "save", "conf.")
    cells = []
    for a in items:
        sv = a["saving_ms_per_iteration"]
        pct = a.get("saving_pct") or {}
        cells.append([f"{sv['mean']:,.1f}", f"{sv['min']:,.1f}-{sv['max']:,.1f}" if a["ranks"] > 1 else "1 rank",
                      f"{pct['mean']:.1f}%" if pct else "", a.get("confidence") or ""])
    fixed = len(str(len(items))) + sum(max(len(h), *(len(c[j]) for c in cells)) for j, h in enumerate(heads))
    kw = max(20, width - 4 - fixed - 3 * len(heads))
    t.add_column("#", justify="right", no_wrap=True, min_width=1)
    t.add_column("knob: change", width=kw)
    for c in heads:
        t.add_column(c, justify="right", no_wrap=True)
    for i, (a, c) in enumerate(zip(items, cells), 1):
        change = (a.get("change") or "").split(" (")[0].split(" when ")[0]
        knob = re.sub(r" \([^)]*\)", "", a.get("knob") or "")
        t.add_row(*map(_cell, [str(i), _lines_fit(fold_text(knob + ": " + change, kw), ADVICE_LINES, kw), *c]))
    return t


def phases_table(result: dict):
    """The phases across ranks (``across_ranks``): per phase the mean over the ranks, the min
    and max and the slowest rank (named only when it differs from the next one: the one rule
    of a comparative claim), in ms per steady iteration (whole-trace totals without iterations)."""
    ar = result.get("across_ranks") or {}
    rows = ar.get("phases") or []
    if not rows:
        return None
    per = ar.get("per_rank") or []
    its = sorted({i for r in per for i in r.get("iterations") or []})
    if ar.get("basis") == "steady":
        span = f"{its[0]}-{its[-1]}" if len(its) > 1 else f"{its[0]}" if its else ""
        title = f"phases of {len(per)} ranks: ms per steady iteration ({span})"
    else:
        title = f"phases of {len(per)} ranks: ms in all (whole trace{'' if ar.get('basis') == 'total' else ', where a rank has no iteration'})"
    t = new_table(title)
    t.show_edge = False
    t.add_column("phase")
    for c in ("mean", "min", "max", "max at", "stands out"):
        add_num_column(t, c)
    for r in rows:
        slow = r.get("slowest_rank")
        name = r["phase"] if r["phase"] != "iteration" or ar.get("basis") == "steady" else "all phases"
        t.add_row(*map(_t, (name, _ms(r["mean_ns"], 1), _ms(r["min_ns"], 1), _ms(r["max_ns"], 1),
                            f"rank {r['max_rank']}", "no" if slow is None else f"rank {slow}")))
    return t


def rank_lines(result: dict) -> list[str]:
    """The ranks' differences in one or two lines with numbers (``across_ranks``): iteration
    time per rank, the slowest (when it stands out), and who waits most in collectives."""
    ar = result.get("across_ranks") or {}
    per = ar.get("per_rank") or []
    if len(per) < 2:
        return []
    basis = "per steady iteration" if ar.get("basis") == "steady" else "in all"
    lo = min(per, key=lambda r: r["iteration_ns"])
    hi = max(per, key=lambda r: r["iteration_ns"])
    what = "iteration" if ar.get("basis") == "steady" else "trace"
    line = (f"ranks: {what} {_ms(lo['iteration_ns'], 1)} (rank {lo['rank']}) to {_ms(hi['iteration_ns'], 1)} ms "
            f"(rank {hi['rank']}) {basis}; ")
    if ar.get("slowest_rank") is not None:
        line += f"rank {ar['slowest_rank']} is the slowest"
    else:
        sp = [r["iteration_spread_ns"] for r in per if r.get("iteration_spread_ns") is not None]
        line += (f"none stands out (iteration spread up to {_ms(max(sp), 1)} ms)" if sp
                 else "none stands out (under 5 % or 1 ms apart)")
    out = [line]
    waits = [r for r in per if r.get("wait_ns") is not None]
    if not ar.get("collectives") or not waits:
        out.append("waiting: no collective kernels, so no rank waits for another on the GPU")
        return out
    most = ar.get("waits_most")
    each = ", ".join(f"rank {r['rank']} {_ms(r['wait_ns'], 1)}" for r in waits[:4]) + (" ..." if len(waits) > 4 else "")
    if most:
        out.append(f"waiting for the last rank in collectives {basis}: rank {most['rank']} most, "
                   f"{_ms(most['wait_ns'], 1)} ms vs {_ms(most['others_mean_ns'], 1)} ms on the others ({each} ms)")
    else:
        out.append(f"waiting for the last rank in collectives {basis}: {each} ms; no rank stands out")
    return out


def render_short_multi(result: dict, console: Console, iteration: int | None = None) -> None:
    """The default screen of a trace with several ranks (<= :data:`MULTI_LINES` lines): the
    header, the advice once per run, the phases across ranks, the ranks' differences and the
    findings once per run (``findings_per_run``), as many as fit; ``--wide`` prints every
    rank's tables, ``--explain`` the evidence and every finding whole."""
    from tracekit.vocab import NO_NVTX, NO_NVTX_NOTE

    used = _emit(console, _t(header_line(result)))
    cfg_note = (result.get("config") or {}).get("note")
    if cfg_note:
        used += _emit(console, _t(f"note: {cfg_note}"))
    by_src: dict[str, list[str]] = {}
    for pid, src in result["phase_source"].items():
        by_src.setdefault(src, []).append(pid)
    for src, pids in by_src.items():  # why there are no phases: once for all the pids it concerns
        who = f"pid{'s' if len(pids) > 1 else ''} {', '.join(pids)}"
        if src == "none":
            used += _emit(console, _t(f"{who}: no phase ranges (tracekit capture or DeepSpeed NVTX), so all GPU work "
                                      "is 'other'; --phase-map PHASE=REGEX maps your own NVTX ranges"))
        elif src == NO_NVTX:
            used += _emit(console, _t(f"{who}: {NO_NVTX_NOTE}"))
        elif filled := filled_note(src):
            used += _emit(console, _t(f"{who}: {filled}"))
    ro = result.get("rank_order")
    if ro:
        used += _emit(console, _t(f"rank numbers: {ro['source']} (--wide: how)"))
    t = run_advice_table(result, console.width)
    if t is not None:
        used += _emit(console, t)
    elif result.get("config") is not None:
        used += _emit(console, _t("advice: none (no change of the what-if model saves 0.5% of a steady iteration)"))
    if basis := advice_basis_note(result, iteration):
        used += _emit(console, _t(basis))
    t = phases_table(result)
    if t is not None:
        used += _emit(console, t)
    for line in rank_lines(result):
        used += _emit(console, _t(line))
    inc = sorted({(u["pid"], u["iteration"]) for u in result.get("incomplete_iterations") or []})
    if inc:  # one line for every rank's (the reasons: --wide)
        used += _emit(console, _t("incomplete, left out of steady figures (--wide: why): "
                                  + ", ".join(f"pid {p} iteration {i}" for p, i in inc)))
    a = result.get("nvtx_anomalies") or {}
    if any(a.values()):
        used += _emit(console, _t("NVTX records set aside: " + ", ".join(f"{v} {k.replace('_', ' ')}"
                                                                        for k, v in a.items() if v)))
    g = result.get("gpu_op_anomalies") or {}
    if any(g.values()):
        used += _emit(console, _t("GPU operations set aside (whole trace, not in any number above): "
                                  + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in g.items() if v)))
    runs = result.get("findings_per_run")
    if runs is None:  # a result without it: one line per finding
        runs = [{"summary": _summary(f)} for f in result.get("findings") or []]
    if not runs:
        return
    room = MULTI_LINES - used - 3  # the two head lines and the "+N more" line
    lines = [fold_text(r["summary"], console.width - 2).split("\n") for r in runs]
    shown = 0
    for folded in lines:
        if room - len(folded) < 0:
            break
        room -= len(folded)
        shown += 1
    if shown == 0:
        console.print(_t(f"findings: {len(runs)} (--explain: each in full)"), highlight=False)
        return
    _findings_head(console)
    for r in runs[:shown]:
        _print_finding(console, r["summary"])
    if len(runs) > shown:
        left = len(runs) - shown
        console.print(_t(f"+{left} more finding{'s' if left != 1 else ''}: --explain"), highlight=False)
