"""Terminal tables (rich) for the analysis dict of :mod:`tracekit.analyze.result`.

Everything shown is read from that dict, so the tables and ``--json`` always agree. Text from
the trace (path, NVTX names) is printed as data (:mod:`tracekit.textsafe`): every cell, title
and line is a :class:`rich.text.Text`, never parsed as markup.
Units on screen: ms (1e6 ns), MB (1e6 bytes), GB/s (1e9 B/s).
"""

from __future__ import annotations

from rich.console import Console

from tracekit.render.cpu_update_tables import render_cpu_update
from tracekit.render.multi_gpu_tables import render_multi_gpu, render_rank_order
from tracekit.render.transfer_tables import render_findings, render_rank_transfers
from tracekit.render.terminal import add_num_column, make_console, new_table, terminal_width, view  # noqa: F401
from tracekit.textsafe import text as _t
from tracekit.vocab import fmt_gbps as _gbps
from tracekit.vocab import NO_NVTX, NO_NVTX_NOTE, UNITS_LINE, fmt_mb, fmt_mb_at, phase_label, short_name
from tracekit.vocab import fmt_ms as _ms
from tracekit.vocab import fmt_pct as _pct
from tracekit.vocab import fmt_range as _range
from tracekit.vocab import rank_title  # noqa: F401 (also this module's name for it)


def _mb(b) -> str:
    return fmt_mb(b, zero="")


#: sub-phase names in the default (80-column) tables are cut to this many characters
SUB_PHASE_WIDTH = 18


def _phase_label(p: dict) -> str:
    return phase_label(p)


#: every column of the per-iteration and whole-trace tables (``--wide``)
WIDE_COLUMNS = [
    ("wall ms", lambda p: _ms(p["wall_ns"])),
    ("GPU idle", lambda p: _pct(p.get("gpu_idle_share"))),
    ("kernel ms", lambda p: _ms(p["kernel_busy_ns"])),
    ("comm ms", lambda p: _ms(p.get("comm_busy_ns")) if p.get("comm_count") else ""),
    ("H2D MB", lambda p: _mb(p["h2d_bytes"])),
    ("H2D ms", lambda p: _ms(p["h2d_busy_ns"]) if p["h2d_count"] else ""),
    ("H2D GB/s", lambda p: _gbps(p.get("h2d_gbps"))),
    ("D2H MB", lambda p: _mb(p["d2h_bytes"])),
    ("D2H ms", lambda p: _ms(p["d2h_busy_ns"]) if p["d2h_count"] else ""),
    ("D2H GB/s", lambda p: _gbps(p.get("d2h_gbps"))),
    ("memset MB", lambda p: _mb(p["memset_bytes"])),
]
#: the default columns: fit 80 terminal columns without cutting a number
NARROW_COLUMNS = [
    ("wall ms", lambda p: _ms(p["wall_ns"], 1)),
    ("GPU idle", lambda p: _pct(p.get("gpu_idle_share"))),
    ("H2D MB @ GB/s", lambda p: fmt_mb_at(p["h2d_bytes"], p.get("h2d_gbps"))),
    ("D2H MB @ GB/s", lambda p: fmt_mb_at(p["d2h_bytes"], p.get("d2h_gbps"))),
]
_COLUMNS = WIDE_COLUMNS  # the full set (kept for callers of the old name)


def columns(wide: bool) -> list:
    """The numeric columns of the phase tables: all with ``wide``, else :data:`NARROW_COLUMNS`."""
    return WIDE_COLUMNS if wide else NARROW_COLUMNS


def _table(title: str, first: list[str], wide: bool = True) -> Table:
    t = new_table(title, wide)
    for c in first:
        t.add_column(c, overflow="fold")
    for name, _ in columns(wide):
        add_num_column(t, name)
    return t


def render(result: dict, console: Console | None = None, phase: str | None = None, wide: bool = False,
           iteration: int | None = None) -> None:
    """Print the per-iteration phase tables, totals, sub-phase breakdown and notes. The default
    tables fit :func:`terminal_width` (80 columns when piped) and never cut a number; ``wide``
    shows every column (:data:`WIDE_COLUMNS`); ``iteration``: the ``--iteration N`` the result
    was narrowed to (the advice says it is over the steady iterations)."""
    if console is None:
        console = make_console(wide)
    head_line = _t(result["trace"], "bold")
    head_line.append(_t(f"  nsys {result.get('nsys_version') or '?'} (export schema {result['schema_version']})"))
    console.print(head_line)
    src = ", ".join(f"pid {pid}: {s}" for pid, s in result["phase_source"].items()) or "none"
    console.print(_t(f"phases from: {src}"))
    for pid, s in result["phase_source"].items():
        if s == "none":
            console.print(_t(
                f"pid {pid}: no phase ranges (tracekit capture or DeepSpeed NVTX) in this trace, so all "
                "its GPU work is 'other'; map your own NVTX ranges with --phase-map PHASE=REGEX"
            ))
        elif s == NO_NVTX:
            console.print(_t(f"pid {pid}: {NO_NVTX_NOTE}"))
    render_config_and_advice(console, result, iteration)
    if not result["ranks"]:
        console.print(_t("no process with GPU work in this trace"))
    render_rank_order(console, result)
    for rank in result["ranks"]:
        head = rank_title(rank, len(result["ranks"]))
        t = _table(f"{head}: per iteration and phase", ["iter", "phase"], wide)
        for it in rank["iterations"]:
            for i, p in enumerate(it["phases"]):
                mark = " (unclosed)" if it.get("unclosed") else "" if it["complete"] else " (no update)"
                t.add_row(_t(str(it["index"]) + mark if i == 0 else ""), _t(_phase_label(p)),
                          *[_t(f(p)) for _, f in columns(wide)])
            t.add_section()
        if rank["iterations"]:
            console.print(t)
        else:
            console.print(_t(f"{head}: no iteration found (no forward/backward/update NVTX ranges)"))
        tt = _table(f"{head}: whole trace", ["phase"], wide)
        for name, p in rank["totals"].items():
            if phase and name != phase:
                continue
            tt.add_row(_t(name), *[_t(f(p)) for _, f in columns(wide)])
        console.print(tt)
        for ph, rows in rank.get("sub_phases", {}).items():
            _render_sub_phases(console, head, ph, rows, wide)
        render_cpu_update(console, head, rank, result.get("cpu_update_notes"))
        render_rank_transfers(console, head, rank, phase, wide)
    if len(result["ranks"]) > 1:
        s = new_table("across ranks (whole-trace wall time per phase)", wide)
        s.add_column("phase")
        for c in ("mean ms", "max ms", "slowest rank pid", "spread ms"):
            add_num_column(s, c)
        for ph, v in result["summary"]["per_phase"].items():
            who = v["slowest_rank_pid"]  # null: no rank stands out (tracekit.analyze.significance)
            s.add_row(*map(_t, (ph, _ms(v["mean_wall_ns"]), _ms(v["max_wall_ns"]), "–" if who is None else str(who),
                                _ms(v["spread_ns"]))))
        console.print(s)
    render_multi_gpu(console, result, wide)
    console.print(_t("* gradient accumulation boundary backward; GPU idle = share of the window with no "
                     f"kernel, copy or memset running; {UNITS_LINE}"))
    if wide:
        console.print(_t("kernel ms = compute kernels; comm ms = communication kernels (NCCL and the like), "
                         "which neither kernel ms nor GPU idle count"))
    else:
        console.print(_t("MB @ GB/s = bytes copied in the phase @ bytes / copy busy time; --wide for every "
                         "column (kernel, communication, copy ms, memset)"))
    a = result["nvtx_anomalies"]
    if any(a.values()):
        console.print(_t(
            "NVTX records set aside: "
            + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in a.items() if v)
        ))
    for u in result.get("incomplete_iterations") or []:  # ranges never popped (phases.set_aside_unclosed)
        console.print(_t(
            f"iteration {u['iteration']} (pid {u['pid']}) is incomplete: its {u['phase']} range {u['range']} "
            f"{u['reason']}; its window ends at the process's last recorded activity "
            f"({_ms(u['end_ns'] - u['start_ns'])} ms after it opened), and the iteration is left out of "
            "steady-state figures (findings; report key numbers and compare)"
        ))
    g = result.get("gpu_op_anomalies") or {}
    if any(g.values()):
        console.print(_t(
            "GPU operations set aside (whole trace, not in any number above): "
            + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in g.items() if v)
        ))
    render_findings(console, result)


def _render_sub_phases(console: Console, head: str, phase: str, rows: list[dict], wide: bool = False) -> None:
    """Sub-phases summed over the shown iterations, largest first; names shortened as the
    figures draw them (:func:`tracekit.vocab.short_name`) unless ``wide``."""
    agg: dict[str, dict] = {}
    for r in rows:
        a = agg.setdefault(r["sub_phase"], {k: 0 for k in ("wall_ns", "gpu_idle_ns", "kernel_busy_ns",
                                                           "h2d_bytes", "h2d_busy_ns", "h2d_count",
                                                           "d2h_bytes", "d2h_busy_ns", "d2h_count")})
        for k in a:
            a[k] += r[k] or 0
    total = sum(a["wall_ns"] for a in agg.values()) or 1
    t = new_table(f"{head}: {phase} by sub-phase (innermost NVTX range; (none) = no range open)", wide)
    if wide:
        t.add_column("sub-phase", overflow="fold")
    else:  # one line per sub-phase: the name shortened as the figures do (tracekit.vocab.short_name)
        t.add_column("sub-phase", no_wrap=True, min_width=SUB_PHASE_WIDTH)
    heads = (("wall ms", "share", "GPU idle ms", "kernel ms", "H2D MB", "H2D GB/s", "D2H MB", "D2H GB/s") if wide
             else ("wall ms", "share", "GPU idle ms", "H2D MB @ GB/s", "D2H MB @ GB/s"))
    for c in heads:
        add_num_column(t, c)
    for name, a in sorted(agg.items(), key=lambda kv: -kv[1]["wall_ns"]):
        if a["wall_ns"] == 0 and not (a["h2d_count"] or a["d2h_count"] or a["kernel_busy_ns"]):
            continue
        h2d = a["h2d_bytes"] / a["h2d_busy_ns"] if a["h2d_busy_ns"] else None
        d2h = a["d2h_bytes"] / a["d2h_busy_ns"] if a["d2h_busy_ns"] else None
        if wide:
            cells = (name, _ms(a["wall_ns"]), _pct(a["wall_ns"] / total), _ms(a["gpu_idle_ns"]),
                     _ms(a["kernel_busy_ns"]), _mb(a["h2d_bytes"]), _gbps(h2d), _mb(a["d2h_bytes"]), _gbps(d2h))
        else:
            cells = (short_name(name, SUB_PHASE_WIDTH), _ms(a["wall_ns"], 1), _pct(a["wall_ns"] / total), _ms(a["gpu_idle_ns"], 1),
                     fmt_mb_at(a["h2d_bytes"], h2d), fmt_mb_at(a["d2h_bytes"], d2h))
        t.add_row(*map(_t, cells))
    console.print(t)
    idle = sum(a["gpu_idle_ns"] for a in agg.values())
    console.print(_t(
        f"time in {phase} with no GPU activity at all (CPU-bound): {_ms(idle)} ms of {_ms(total)} ms "
        f"({100 * idle / total:.0f}%)"
    ))


def render_config_and_advice(console: Console, result: dict, iteration: int | None = None) -> None:
    """The run's config (or what the trace says of it) and the advice, first in ``analyze``:
    items sorted by saving per steady iteration, one-time costs apart; with ``iteration``
    (``--iteration N``) the line of :func:`tracekit.render.short.advice_basis_note`."""
    cfg = result.get("config")
    if cfg:
        if cfg.get("source"):
            where = "--ds-config" if cfg["source"] == "ds-config" else "capture manifest"
            vers = ", ".join(f"{k} {v}" for k, v in (cfg.get("versions") or {}).items())
            console.print(_t(f"config: {where} {cfg.get('path')}" + (f" ({vers})" if vers else "")))
        else:
            console.print(_t("config: no manifest beside the trace and no --ds-config; values inferred from the trace"))
        if cfg.get("note"):
            console.print(_t(f"note: {cfg['note']}"))
        rows = cfg.get("settings") or []
        if rows:  # keys fold at their dots only, the "from" column first
            from tracekit.render.config import settings_table

            console.print(settings_table(rows, console.width))
    items = result.get("advice") or []
    if items:
        multi = len({(a["pid"], a["device"]) for a in items}) > 1
        console.print(_t("advice, largest saving first (per iteration: mean over steady iterations, warm-up apart; "
                         "docs/advice.md)", "bold"))
        if any(a.get("saving_interval_ms") for a in items):
            console.print(_t("   (low-high): 95 % interval of the next run's mean steady iteration, from the baseline's "
                             "iteration-to-iteration spread and the modelled term's (docs/advice.md, \"Interval\")"),
                          highlight=False)
        elif items:
            console.print(_t("   no interval: fewer than 2 steady iterations, no spread to measure"), highlight=False)
        for i, a in enumerate(items, 1):
            who = f"pid {a['pid']} device {a['device']}: " if multi else ""
            pct = f", {a['saving_pct']:.1f}%" if a.get("saving_pct") is not None else ""
            pi, si = a.get("predicted_interval_ms"), a.get("saving_interval_ms")
            siv = f" ({_range(si)})" if si else ""
            piv = f" ({_range(pi)})" if pi else ""
            noise = " (within noise)" if a.get("within_noise") else ""
            console.print(_t(f"{i}. {who}{a['knob']}: {a['change']}  saves {a['saving_ms_per_iteration']:,.1f} ms{siv} per "
                             f"iteration{pct} ({a['baseline_iteration_ms']:,.1f} -> {a['predicted_iteration_ms']:,.1f} ms"
                             f"{piv}; confidence {a['confidence']}){noise}"), highlight=False)
            console.print(_t(f"   problem: {a['problem']}"), highlight=False)
            console.print(_t(f"   predicted from: {a['basis']}"), highlight=False)
    elif result.get("config") is not None:
        console.print(_t("advice: none (no change of the what-if model saves 0.5% of a steady iteration)"))
    from tracekit.render.short import advice_basis_note

    if basis := advice_basis_note(result, iteration):
        console.print(_t(basis), highlight=False)
    for c in result.get("one_time_costs") or []:
        console.print(_t(f"one-time cost (total, not per iteration): {c['problem']} [{c['knob']}: {c['change']}]"))


# ---------------------------------------------------------------------- other formats (--format)
def markdown_table(head: list[str], rows: list[list[str]], right=()) -> str:
    """A GitHub-Markdown pipe table; columns whose index is in ``right`` are right-aligned.
    Cells are text from the analysis; ``|`` and line breaks in them are escaped."""
    right = set(right)

    def cell(v: str) -> str:
        return str(v).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("\r", " ")

    lines = ["| " + " | ".join(cell(h) for h in head) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(head))) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_markdown(result: dict, wide: bool = False) -> str:
    """``--format md``: per rank, the per-iteration phase table and the whole-trace table with
    the terminal's columns (all with ``wide``), as Markdown; units in the headers (ms = 1e6 ns,
    MB = 1e6 B, GB/s = 1e9 B/s)."""
    cols = columns(wide)
    out = []
    for rank in result["ranks"]:
        head = rank_title(rank, len(result["ranks"]))
        rows = []
        for it in rank["iterations"]:
            mark = " (unclosed)" if it.get("unclosed") else "" if it["complete"] else " (no update)"
            for p in it["phases"]:
                rows.append([f"{it['index']}{mark}", _phase_label(p), *[f(p) for _, f in cols]])
        out.append(f"### {head}: per iteration and phase\n")
        out.append(markdown_table(["iter", "phase", *[n for n, _ in cols]], rows, right=range(2, 2 + len(cols))))
        tot = [[name, *[f(p) for _, f in cols]] for name, p in rank["totals"].items()]
        out.append(f"\n### {head}: whole trace\n")
        out.append(markdown_table(["phase", *[n for n, _ in cols]], tot, right=range(1, 1 + len(cols))))
        out.append("\n")
    out.append(f"{UNITS_LINE}; * = gradient accumulation boundary backward\n")
    return "".join(out)


def render_text(analysis, fmt: str = "table", wide: bool = False, explain=False) -> str:
    """What ``tracekit analyze`` prints for an :class:`tracekit.analysis.Analysis` in ``fmt``:
    ``table`` (the rich tables laid out for :func:`terminal_width`, ANSI styles when stdout is a
    colour terminal), ``csv`` (:attr:`Analysis.phases`, raw units: ns, bytes, GB/s) or ``md``
    (:func:`render_markdown`). ``table`` is the one-screen summary of
    :mod:`tracekit.render.short` unless ``wide``, sections (``--all``, ``--section``) or a
    phase were asked for (a trace of several GPUs: :func:`tracekit.render.short.render_short_multi`);
    ``explain`` (True, or an advice item's number) prints the advice's evidence instead
    (``--explain [N]``)."""
    if fmt == "csv":
        from tracekit.textsafe import csv_frame

        return csv_frame(analysis.phases).write_csv()
    if fmt == "md":
        return render_markdown(analysis.to_json(), wide)
    import io

    buf = io.StringIO()
    ref = make_console(wide)  # the real stdout's width, colours, NO_COLOR
    console = Console(file=buf, width=ref.width, color_system=ref.color_system, no_color=ref.no_color,
                      force_terminal=ref.is_terminal)
    view = analysis._view()  # the tables need no per-bin timeline rows (issue 13)
    from tracekit.render import short

    it = analysis.options.iteration
    if explain is not False and explain is not None:
        short.render_explain(view, console, None if explain is True else int(explain), iteration=it)
    elif wide or analysis.options.sections or analysis.options.phase:
        render(view, console=console, phase=analysis.options.phase, wide=wide, iteration=it)
    elif len(view["ranks"]) > 1:  # several GPUs: the ranks side by side, advice and findings once
        short.render_short_multi(view, console, iteration=it)
    else:
        short.render_short(view, console, iteration=it)
    return buf.getvalue()
