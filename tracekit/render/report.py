"""``tracekit report``: the figures of one trace and a ``report.md`` that puts them beside the
key numbers.

Layout of the output directory (created when missing; files of the same names are replaced,
nothing else is touched)::

    DIR/report.md                    key numbers, findings, the figures with captions
    DIR/N_name.png, DIR/N_name.svg   each figure (``.pdf`` instead of ``.svg`` with fmt="pdf")
    DIR/data/N_name.csv              the frame each figure plotted
    DIR/data/key_numbers.csv         per iteration and phase (:func:`summary.iteration_metrics`)

Units in the report: ms (1e6 ns), MB / GB (1e6 / 1e9 bytes), GB/s (1e9 B/s). Text from the
trace (its path, NVTX names, the nsys version string) is written inert: Markdown syntax
escaped, code spans fenced to fit, control characters as visible escapes
(:mod:`tracekit.textsafe`); in the CSVs, a text cell that a spreadsheet would run as a formula
(starting with ``= + - @``, tab or CR) gets a leading ``'`` (:func:`tracekit.textsafe.csv_frame`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

import polars as pl

from tracekit.errors import TracekitError
from tracekit.render import figures as F
from tracekit.render import style as S
from tracekit.render import summary
from tracekit.render.data import ReportData
from tracekit.render.lead import ADVICE_HEADERS, advice_rows, headline, only_rank_note  # noqa: F401 (also report's API)
from tracekit.render.report_cache import (  # noqa: F401 (FORMATS, ReportResult, prepare_dir: this module's API)
    FORMATS, PERFETTO_MEMBER, TIMED, ReportResult, add_perfetto, check_out, prepare_dir)
from tracekit.textsafe import csv_frame, md, md_code
from tracekit.vocab import UNITS_LINE, column_label, fmt_count, fmt_gb, fmt_gbps, fmt_mb, fmt_ms, fmt_pct, os_pid



@contextlib.contextmanager
def progress(enabled: bool = True, label: str = "tracekit report") -> Iterator[Callable[[str], None]]:
    """A spinner with ``label`` and the current step on stderr (rich), yielding
    ``step(message)``; silent when ``enabled`` is false or stderr is not a terminal."""
    from rich.console import Console

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda _m: None
        return
    with console.status("loading", spinner="dots") as status:
        yield lambda m: status.update(f"[bold]{label}[/bold]: {m}")


_NONE = "–"  # a number the report does not have


def _ms(ns) -> str:
    return fmt_ms(ns, 1, _NONE)


def _gb(b) -> str:
    return fmt_gb(b, 2, _NONE)


def _mb(b) -> str:
    return fmt_mb(b, 1, _NONE)


def _gbps(v) -> str:
    return fmt_gbps(v, 1, _NONE)


def _count(v) -> str:
    return fmt_count(v, _NONE)


def _pct(v) -> str:
    return fmt_pct(v, 0, _NONE)


def write_report(
    trace: str | Path,
    out_dir: str | Path,
    rank: int = 0,
    iteration: int | None = None,
    fmt: str = "svg",
    phase_map: list[str] | None = None,
    gas: int | None = None,
    step: Callable[[str], None] | None = None,
    dpi: int | None = None,
    ds_config: str | Path | None = None,
    html: bool = True,
    perfetto: str | Path | None = None,
    cache: bool = False,
) -> ReportResult:
    """Write the figures, their data and ``report.md`` for ``trace`` into ``out_dir``.

    ``rank``: index of the rank to draw (0-based, by pid then device); ``iteration``: the one
    shown in the timeline figures (default: the median complete iteration); ``fmt``: ``svg``
    or ``pdf``, written beside each PNG; ``phase_map``/``gas`` as for ``tracekit analyze``;
    ``html``: also write ``report.html`` (:mod:`tracekit.render.html`); ``perfetto``: also write
    a Chrome/Perfetto trace-event JSON there (:mod:`tracekit.render.perfetto`). The per-rank
    figure is written only when the trace has two or more ranks; ``dpi`` of the PNGs (default
    :data:`tracekit.render.style.DPI`). ``cache``: read and keep the
    finished files, the analysis result and the query frames in the trace's cache (what
    ``tracekit report`` does; :mod:`tracekit.render.report_cache`): the same report again
    writes the stored files without drawing.

    The files are one :class:`tracekit.output.OutputSet`: each is written to a temporary beside
    it, and all are renamed into place once every one is written (a file of the same name is
    replaced, never written through; an error, a full disk, ^C or SIGTERM leaves the earlier
    report whole and no temporary). Raises :class:`TracekitError` for an unreadable trace, a
    missing rank or iteration, an unknown format, an output folder or Perfetto path that cannot
    be written (checked first) and a full disk (``disk full ...``).
    """
    if fmt not in FORMATS:
        raise TracekitError(f"--format {fmt!r}: choose {' or '.join(FORMATS)}")
    check_out(out_dir, perfetto)  # before any work: a folder or Perfetto path that cannot be written
    step = step or (lambda _m: None)
    tc = key = None
    if cache:
        from tracekit.render import report_cache

        tc, key, hit = report_cache.lookup_report(trace, out_dir, perfetto, rank=rank, iteration=iteration, fmt=fmt,
                                                  phase_map=phase_map, gas=gas, ds_config=ds_config, dpi=dpi,
                                                  html=html)
        if hit is not None:
            return hit
    dpi = S.DPI if dpi is None else dpi
    data = ReportData.load(trace, phase_map=phase_map, gas=gas, step=step, ds_config=ds_config,
                           cache=tc if tc is not None else False)
    from tracekit.output import OutputSet

    output = OutputSet(f"-o {out_dir}")  # every file renamed in once all are written
    try:
        rk = data.rank(rank)
        it = data.pick_iteration(rk, iteration)
        out = prepare_dir(out_dir, output)
        res = ReportResult(out_dir=out, iteration=it, rank=rk)
        written: list[tuple[str, bytes]] = []  # (name in out, bytes): what the cache keeps

        def put(name: str, payload: bytes) -> Path:
            written.append((name, payload))
            p = output.add(out / name, payload)
            res.files.append(p)
            return p

        frames: dict[str, pl.DataFrame] = {}
        pngs: dict[str, bytes] = {}  # for report.html (the files are renamed in at the end)
        n = len(F.FIGURES)
        if tc is not None:
            from tracekit.options import load_ds_config
            from tracekit.render import report_cache

            ds_loaded = load_ds_config(trace, ds_config)
        for i, (name, (fn, title)) in enumerate(F.FIGURES.items(), 1):
            step(f"figure {i}/{n}: {title.lower()}")
            if name == "6_ranks" and data.ranks.height < 2:
                continue  # one rank: nothing to compare
            fkey = got = None
            if tc is not None:  # drawn before for this rank (and iteration, for the timed ones)?
                fkey = report_cache.figure_key(tc, trace, name, rank=rank, iteration=it, fmt=fmt, phase_map=phase_map,
                                               gas=gas, ds_config=ds_loaded, dpi=dpi)
                got = report_cache.cached_figure(tc, fkey, name, fmt)
            if got is not None:
                png, vector, csv, frame = got
            else:
                if name == "6_ranks":
                    fig, frame = fn(data)
                elif name in TIMED:
                    fig, frame = fn(data, rank=rank, iteration=it)
                else:
                    fig, frame = fn(data, rank=rank)
                png, vector = (_savefig(fig, ext, dpi if ext == "png" else None) for ext in ("png", fmt))
                S.close(fig)
                csv = csv_frame(frame).write_csv().encode("utf-8")
                if fkey is not None:
                    report_cache.store_figure(tc, fkey, name, fmt, png, vector, csv, frame)
            put(f"{name}.png", png)
            pngs[name] = png
            put(f"{name}.{fmt}", vector)
            res.figures[name] = out / f"{name}.png"
            frames[name] = frame
            put(f"data/{name}.csv", csv)
        step("key numbers and findings")
        metrics = summary.iteration_metrics(data, rk)
        put("data/key_numbers.csv", csv_frame(metrics).write_csv().encode("utf-8"))
        findings = _findings(data, rk, res.notes)
        md = render_markdown(data, rk, it, metrics, frames, findings, fmt)
        md = _with_advice(md, data, rk, trace, ds_config, res.notes)
        put("report.md", md.encode("utf-8"))
        if html:
            step("report.html")
            from tracekit.render.html import render_html, write_advice

            means = summary.phase_means(metrics, data.steady_iterations(rk))
            page = render_html(data, rk, it, metrics, frames, res.figures, _captions(data, rk, it, frames, means),
                               findings, write_advice(data, res.notes), res.notes, pngs=pngs)
            put("report.html", page.encode("utf-8"))
        if perfetto is not None:
            step("Perfetto trace")
            from tracekit.render.perfetto import perfetto_bytes

            text = perfetto_bytes(data, findings=_findings(data, None, []))
            res.files.append(add_perfetto(output, perfetto, text))
            if tc is not None:
                written.append((PERFETTO_MEMBER, text))
        output.commit()
        if tc is not None:
            from tracekit.render import report_cache

            report_cache.store_report(tc, key, res, written)
        return res
    except BaseException:
        output.abort()  # an error, a full disk, ^C or SIGTERM: the earlier report stays whole
        raise
    finally:
        data.close()


def _savefig(fig, ext: str, dpi: int | None) -> bytes:
    """``fig`` as ``ext`` (png, svg, pdf) bytes (:func:`tracekit.render.style.figure_bytes`:
    savefig's bytes, its layout-only pre-draw without the rest of that draw)."""
    return S.figure_bytes(fig, ext, dpi)


def _findings(data: ReportData, rk: dict | None, notes: list[str]) -> list[dict]:
    """The findings of the trace's analysis (:attr:`tracekit.analysis.Analysis.findings`, the
    ones ``analyze`` prints: steady iterations, warm-up included as ``analyze`` does) for the
    rank, or every rank's with ``rk=None``; the analysis' notes are added to ``notes`` once."""
    result = data.analysis.to_json()
    for n in result.get("transfer_notes") or []:
        if n not in notes:
            notes.append(n)
    found = list(result.get("findings") or [])
    if rk is None:  # every rank's (the Perfetto export)
        return found
    return [f for f in found if f.get("pid") == rk["pid"] and f.get("device") == rk["device"]]


def lead_markdown(data: ReportData, rk: dict, res: dict | None) -> list[str]:
    """The lines that lead ``report.md``: :func:`headline` and the compact advice table."""
    L = [f"**{md(headline(data, rk, res))}**\n"]
    rows = advice_rows(res, rk)
    if rows:
        L.append("What to change (per iteration = mean over steady iterations, warm-up apart; details under "
                 "Advice below):\n")
        L.append("| " + " | ".join(ADVICE_HEADERS.values()) + " |")
        L.append("|---|---|---:|---:|---|")
        for r in rows:
            L.append(f"| `{md_code_inner(r['knob'])}` | {md(r['change'])} | {r['predicted']} | {r['saves']} | "
                     f"{r['confidence']} |")
        L.append("")
    elif res is not None and res.get("config") is not None:
        L.append("No change of the what-if model saves 0.5 % of a steady iteration.\n")
    return L


def md_code_inner(text: str) -> str:
    """Text for inside a one-backtick code span of a table cell: backticks and pipes removed."""
    return str(text).replace("`", "'").replace("|", "/")


def _with_advice(text: str, data: ReportData, rk: dict, trace, ds_config, notes: list[str]) -> str:
    """``report.md`` with the run's config and the advice (of the trace's analysis,
    :meth:`tracekit.analysis.Analysis.advice_result`) put before the key numbers: it leads the
    report (docs/advice.md)."""
    res = data.analysis.advice_result()
    if res.get("config") is None:
        notes.append("advice skipped: the analysis holds none")
        return _with_lead(text, data, rk, None)
    L = advice_markdown(res, rk)
    key = "## Key numbers"
    i = text.find(key)
    text = text[:i] + "\n".join(L) + "\n" + text[i:] if i >= 0 else text + "\n".join(L) + "\n"
    return _with_lead(text, data, rk, res)


def _with_lead(text: str, data: ReportData, rk: dict, res: dict | None) -> str:
    """``report.md`` with :func:`lead_markdown` right under its title line."""
    head, sep, rest = text.partition("\n\n")
    return head + sep + "\n".join(lead_markdown(data, rk, res)) + "\n" + rest


def advice_markdown(res: dict, rk: dict) -> list[str]:
    """Markdown lines of the config and advice of one rank (trace text escaped)."""
    from tracekit.textsafe import md as _md
    from tracekit.render.config import config_text
    from tracekit.vocab import fmt_plain, knob_label

    L = ["## Config\n"]
    cfg = res["config"]
    if cfg.get("source"):
        vers = ", ".join(f"{k} {v}" for k, v in (cfg.get("versions") or {}).items())
        L.append(f"From {'--ds-config' if cfg['source'] == 'ds-config' else 'the capture manifest'} "
                 f"`{_md(Path(cfg['path']).name)}`" + (f" ({_md(vers)})" if vers else "") + ".\n")
    else:
        L.append("No manifest beside the trace and no `--ds-config`: the values below are inferred from the trace.\n")
    if cfg["settings"]:
        L.append("| key | value | from |")
        L.append("|---|---|---|")
        for r in cfg["settings"]:
            v = config_text(r["value"])
            how = r["how"] if r["source"] != "trace" else f"inferred: {r['how']}"
            L.append(f"| `{r['key']}` | {_md(v)} | {_md(how)} |")
        L.append("")
    items = [a for a in res["advice"] if a["pid"] == rk["pid"] and a["device"] == rk["device"]]
    L.append("## Advice\n")
    L.append("Largest saving per iteration first; per iteration = mean over steady iterations, warm-up apart "
             "(model and validation: docs/advice.md).\n")
    if not items:
        L.append("No change of the what-if model saves 0.5 % of a steady iteration.\n")
    else:
        for i, a in enumerate(items, 1):
            L.append(f"{i}. `{md_code_inner(knob_label(a['knob']))}`: {_md(a['change'])} (saves "
                     f"{fmt_plain(a['saving_ms_per_iteration'])} ms, {a['saving_pct']:.1f}%: "
                     f"{fmt_plain(a['baseline_iteration_ms'])} → {fmt_plain(a['predicted_iteration_ms'])} ms, "
                     f"{a['confidence']} confidence). **Problem**: {_md(a['problem'])}. "
                     f"**Predicted from**: {_md(a['basis'])}.")
        L.append("")
    once = [c for c in res["one_time_costs"] if c["pid"] == rk["pid"] and c["device"] == rk["device"]]
    if once:
        L.append("One-time costs (totals, not per iteration):\n")
        for c in once:
            L.append(f"- {_md(c['problem'])} ({c['total_ms']:,.1f} ms)")
        L.append("")
    return L


def _warmup_note(warm: list[int]) -> str:
    """The report's note on the warm-up iterations left out of the means (empty for none)."""
    if not warm:
        return ""
    if len(warm) == 1:
        return f" (iteration {warm[0]}, the warm-up step, is left out)"
    return (f" (iterations {', '.join(map(str, warm))}, the warm-up, are left out: they hold the run's first two "
            "micro-steps)")


def render_markdown(data: ReportData, rk: dict, it: int, metrics: pl.DataFrame, frames: dict[str, pl.DataFrame],
                    findings: list[dict], fmt: str = "svg") -> str:
    """The text of ``report.md`` (see module doc)."""
    exp = data.export
    steady = data.steady_iterations(rk)
    spans = data.iteration_spans(rk)
    means = summary.phase_means(metrics, steady)
    L: list[str] = []
    L.append(f"# tracekit report: {md(data.path.name)}\n")
    src = ", ".join(f"pid {os_pid(gp)}: {md(s)}" for gp, s in sorted(data.model.source.items()))
    L.append(f"- trace: {md_code(data.path)} (nsys {md(exp.nsys_version or '?')}, "
             f"export schema {md(exp.schema_version)})")
    L.append(f"- phases from: {src or 'none'}")
    ranks = ", ".join(f"{i}: pid {r['pid']} GPU {r['device']}" for i, r in enumerate(data.ranks.iter_rows(named=True)))
    L.append(f"- ranks: {ranks}; shown: rank {rk['index']} (pid {rk['pid']} GPU {rk['device']})"
             + (only_rank_note(data.ranks.height) if data.ranks.height > 1 else ""))
    if spans.height:
        its = spans["iteration"].to_list()
        L.append(f"- iterations in the trace: {its[0]}–{its[-1]} ({spans.filter(pl.col('complete')).height} complete); "
                 f"means below are per iteration over {F.iterations_note(steady)}"
                 + _warmup_note(data.warmup_iterations(rk)))
        L.append(f"- iteration shown in time (figures 2 and 5): {it}")
    for u in data.model.unclosed.filter(pl.col("global_pid") == rk["global_pid"]).iter_rows(named=True):
        L.append(f"- iteration {u['iteration']} is incomplete and left out of the means: its {u['phase']} range "
                 f"{md_code(u['name'])} {md(u['reason'])}; its window ends at the process's last recorded "
                 f"activity ({_ms(u['end'] - u['start'])} ms after it opened)")
    L.append(f"- units: {UNITS_LINE}\n")

    L.append("## Key numbers (mean per iteration)\n")
    total_wall = float(means["wall_ns"].sum()) if means.height else 0.0
    cols = ("phase", "wall_ns", "share", "gpu_idle_share", "h2d_bytes", "h2d_gbps", "h2d_exposed_ns", "d2h_bytes",
            "d2h_gbps", "d2h_exposed_ns", "overlap_ratio", "pageable_count", "pageable_bytes", "peak_bytes")
    L.append("| " + " | ".join(column_label(c) for c in cols) + " |")
    L.append("|---|" + "---:|" * 13)
    for r in means.iter_rows(named=True):
        L.append(
            f"| {md(r['phase'])} | {_ms(r['wall_ns'])} | {_pct(r['wall_ns'] / total_wall if total_wall else None)} | "
            f"{_pct(r['gpu_idle_ns'] / r['wall_ns'] if r['wall_ns'] else None)} | {_mb(r['h2d_bytes'])} | "
            f"{_gbps(r['h2d_gbps'])} | {_ms(r['h2d_exposed_ns'])} | {_mb(r['d2h_bytes'])} | {_gbps(r['d2h_gbps'])} | "
            f"{_ms(r['d2h_exposed_ns'])} | {_pct(r['overlap_ratio'])} | {_count(r['pageable_count'])} | "
            f"{_mb(r['pageable_bytes'])} | {_gb(r['peak_bytes'])} |"
        )
    if total_wall:
        L.append(f"| **iteration** | **{_ms(total_wall)}** | 100% | | | | | | | | | | | |")
    L.append("")
    L.append("GPU idle: share of the phase with no kernel, copy or memset running (in `update`, the CPU-bound "
             "time). Exposed: copy busy time with no kernel running. Per-iteration rows are in "
             "`data/key_numbers.csv`.\n")

    if findings:
        L.append("## Findings\n")
        L.append("Findings cover every iteration of the trace, the warm-up one included (the key "
                 "numbers above may leave it out, as they say).\n")
        for f in findings:
            L.append(f"- **{md(f['topic'])}**" + (f" ({md(f['phase'])})" if f.get("phase") else "")
                     + f": {md(f['text'])}")
        L.append("")

    L.append("## Figures\n")
    captions = _captions(data, rk, it, frames, means)
    for name, (_fn, title) in F.FIGURES.items():
        if name not in frames:  # not drawn (the per-rank figure of a one-rank trace)
            continue
        L.append(f"### {title}\n")
        L.append(f"![{title}]({name}.png)\n")
        L.append(captions.get(name, ""))
        L.append(f"\nVector version: [`{name}.{fmt}`]({name}.{fmt}); data: [`data/{name}.csv`](data/{name}.csv).\n")
    return "\n".join(L) + "\n"


def _captions(data: ReportData, rk: dict, it: int, frames: dict[str, pl.DataFrame], means: pl.DataFrame) -> dict:
    out = {}
    m = {r["phase"]: r for r in means.iter_rows(named=True)}
    tot = sum(r["wall_ns"] for r in m.values()) or 0
    if tot:
        parts = [f"{p} {_ms(m[p]['wall_ns'])} ms ({_pct(m[p]['wall_ns'] / tot)})" for p in summary.PHASE_ORDER if p in m]
        out["1_iteration_breakdown"] = (
            f"Wall time per iteration by phase, in time order (F = forward, B = backward with micro-step index, "
            f"* = accumulation boundary, U = update). Solid inner bars: GPU busy; light: GPU idle. Mean iteration "
            f"{_ms(tot)} ms: " + ", ".join(parts) + "."
        )
    tl = frames.get("2_iteration_timeline")
    if tl is not None and tl.height:
        peak = tl.filter(pl.col("series") == "memory")["value"].max()
        h = tl.filter(pl.col("series") == "H2D")["value"].max()
        d = tl.filter(pl.col("series") == "D2H")["value"].max()
        out["2_iteration_timeline"] = (
            f"Iteration {it} on one time axis: phases and update sub-phases (top), GPU memory in use, and H2D / D2H "
            f"copies, each drawn as its own interval at its bandwidth (PCIe RX / TX from GPU metrics below, when recorded). "
            f"Peak memory {_gb(peak)} GB; fastest copy H2D {_gbps(h)} GB/s, D2H {_gbps(d)} GB/s."
        )
    cs = frames.get("3_copy_sizes")
    if cs is not None and cs.height:
        pg = cs.filter(pl.col("host_kind") == "pageable")
        top = cs.sort("bytes", descending=True).row(0, named=True)
        out["3_copy_sizes"] = (
            f"Copies inside iterations per power-of-two size bucket; pageable host memory hatched. The most bytes "
            f"move in {top['direction']} copies of {S.size_label(top['bucket_bytes'])}–"
            f"{S.size_label(2 * top['bucket_bytes'])} ({top['host_kind']}, {_mb(top['bytes'])} MB). "
            f"Pageable: {int(pg['count'].sum())} copies, {_mb(pg['bytes'].sum())} MB."
        )
    sp = frames.get("4_update_sub_phases")
    if sp is not None and sp.height:
        r = sp.row(0, named=True)
        out["4_update_sub_phases"] = (
            f"Update sub-phases (innermost NVTX range, self time), mean per iteration: GPU busy vs CPU only, and "
            f"copy throughput per direction. Longest: {md_code(r['sub_phase'])} {_ms(r['wall_ns'])} ms "
            f"({_pct(r['cpu_only_ns'] / r['wall_ns'] if r['wall_ns'] else None)} CPU only"
            + (f", H2D {_gbps(r['h2d_gbps'])} GB/s" if r["h2d_gbps"] is not None else "") + ")."
        )
    oc = frames.get("5_overlap_contention")
    if oc is not None:
        ov = oc.filter(pl.col("section") == "overlap")
        cw = oc.filter(pl.col("section") == "contention")
        exp_ms = ov["exposed_ns"].sum() if ov.height else 0
        cp_ms = ov["copy_ns"].sum() if ov.height else 0
        out["5_overlap_contention"] = (
            f"Copy time hidden behind kernels (solid) and exposed (hatched) per phase, mean per iteration: "
            f"{_ms(exp_ms)} of {_ms(cp_ms)} ms exposed. Bottom: iteration {it}, share of each bin with kernels / "
            f"H2D / D2H running, and {cw.height} PCIe contention window(s)"
            + (f" ({_ms((cw['end_ns'] - cw['start_ns']).sum())} ms)." if cw.height else ".")
        )
    ib = frames.get("7_idle_breakdown")
    if ib is not None and ib.height:
        from tracekit.vocab import IDLE_CATEGORIES

        parts = []
        for r in ib.iter_rows(named=True):
            idle_cats = {c: r[c] for c in IDLE_CATEGORIES if c != "gpu_busy_ns"}
            top = max(idle_cats, key=lambda c: idle_cats[c])
            parts.append(f"{r['phase']} {_ms(r['wall_ns'])} ms, {_ms(r['wall_ns'] - r['gpu_busy_ns'])} ms idle"
                         + (f" (mostly {IDLE_CATEGORIES[top]}, {_ms(idle_cats[top])} ms)" if idle_cats[top] else ""))
        out["7_idle_breakdown"] = (
            "Wall time of each phase per iteration (mean over the steady iterations) split into GPU busy and the "
            "GPU's idle time: a launching thread inside a CUDA API call, the host between API calls (Python / "
            "framework), waiting on a collective (docs/idle.md): " + "; ".join(parts) + "."
        )
    out["6_ranks"] = "Per rank: mean phase wall time and bytes copied per iteration; a slow or copy-heavy rank stands out."
    return out
