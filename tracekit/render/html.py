"""``report.html``: one self-contained page of a trace's report (no network needed to view it).

What the page holds, in order: the trace and run configuration; the advice of
:mod:`tracekit.analyze.sections.advice` (what to change, saving per steady iteration), else the findings;
the key numbers (mean per steady iteration); an interactive timeline of one iteration (plotly:
phases, update sub-phases, kernels, where the GPU time goes per time bin (busy, in CUDA API calls,
between them, waiting on collectives: docs/idle.md), GPU memory, each H2D / D2H copy with its bytes, bandwidth,
phase and sub-phase on hover, PCIe RX / TX); every figure (the PNG ``tracekit report`` wrote,
inlined) with its caption and its data as a CSV download; the per-iteration key numbers and
update sub-phase tables.

Everything is inlined: plotly.js once (about 4.8 MB, the bulk of the page), styles, figures
(base64 PNG) and CSVs (``data:`` links). What is drawn interactively is bounded: kernels are
merged into busy intervals (gaps under :data:`KERNEL_MERGE_NS`), at most
:data:`MAX_INTERACTIVE_COPIES` copies per direction are drawn one by one (the rest binned),
so the page stays a few MB for a 600 MB trace.

Text from the trace (NVTX names, paths) is data: escaped for HTML everywhere, and in the
embedded JSON ``<``, ``>`` and ``&`` are written as ``\\u003c`` etc. so no string can end a
``<script>``.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import numpy as np
import polars as pl

from tracekit.render import data as D
from tracekit.render import style as S
from tracekit.render.data import ReportData
from tracekit.textsafe import clean, csv_frame
from tracekit.vocab import UNITS_LINE, column_label, fmt_column, fmt_plain, knob_label, os_pid, short_name

#: Kernels closer than this are drawn as one busy interval in the interactive timeline.
KERNEL_MERGE_NS = 20_000
#: Copies per direction drawn one by one in the interactive timeline (the rest binned).
MAX_INTERACTIVE_COPIES = 20_000

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0 auto;max-width:1320px;padding:0 18px 40px;color:#222}
h1{font-size:1.45em;margin:18px 0 4px}h2{font-size:1.2em;margin-top:30px;border-bottom:1px solid #ddd;padding-bottom:3px}
h3{font-size:1.05em;margin:22px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0 10px}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#f4f4f4}td.l,th.l{text-align:left}
.cfg td{text-align:left}.muted{color:#666;font-size:12px}
figure{margin:10px 0 24px}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:13px;margin-top:4px;max-width:1100px}
.advice li,.findings li{margin:4px 0}.conf{font-size:11px;padding:1px 5px;border-radius:3px;background:#eee}
.dl{font-size:12px;margin-left:8px}
nav a{margin-right:12px;font-size:13px}
.scroll{overflow-x:auto;max-height:520px;overflow-y:auto}
"""



def _esc(value, quote: bool = True) -> str:
    """HTML-escaped text with control characters shown as visible escapes
    (:func:`tracekit.textsafe.clean`): trace text never reaches the page as raw ESC/BEL."""
    return html.escape(clean(value), quote=quote)

def _e(v) -> str:
    """HTML-escaped text of a value (``–`` for None)."""
    return "–" if v is None else _esc(str(v), quote=True)


#: What plotly reads as markup in its strings, and the entity each is written as. plotly draws
#: a subset of HTML in trace names, hover text and templates, bar text, annotations and titles
#: (``<a href>``, ``<b>``, ``<br>``, ...) and decodes only ``&amp; &lt; &gt;`` (and a few
#: others) and numeric entities: ``html.escape``'s ``&quot;`` / ``&#x27;`` work, but ``&quot;``
#: is shown literally, so the quotes are numeric. ``%`` is numeric too, so that a ``%{x}`` in a
#: name placed in a hover template is shown, not substituted.
_PLOTLY_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;", "%": "&#37;"}
_PLOTLY_SPECIAL = re.compile("[&<>\"'%]")


def _plotly_text(value) -> str:
    """Text from the trace (or built around it) for a plotly string: control characters as
    visible escapes (:func:`tracekit.textsafe.clean`), then ``& < > " ' %`` as the entities of
    :data:`_PLOTLY_ENTITIES`, once: plotly shows the string as written, never as a link or
    markup, and never ``&quot;``. Every string of :func:`timeline_figure` that holds trace
    text goes through here (and only once)."""
    return _PLOTLY_SPECIAL.sub(lambda m: _PLOTLY_ENTITIES[m.group()], clean(value))


def _script_json(obj) -> str:
    """JSON safe to place inside ``<script>``: no ``</script>``, no ``<!--``."""
    from plotly.utils import PlotlyJSONEncoder

    s = json.dumps(obj, cls=PlotlyJSONEncoder, separators=(",", ":"))
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _csv_link(frame: pl.DataFrame, name: str) -> str:
    b64 = base64.b64encode(csv_frame(frame).write_csv().encode("utf-8")).decode("ascii")
    return (f'<a class="dl" download="{_e(name)}.csv" href="data:text/csv;base64,{b64}" '
            f'data-rows="{frame.height}">download the data (CSV, {frame.height:,} rows)</a>')


def _table(frame: pl.DataFrame, fmt: dict | None = None, cls: str = "", tid: str = "") -> str:
    """An HTML table of ``frame`` (every cell escaped). Columns are keys of
    :data:`tracekit.vocab.COLUMNS` in their own units (ns, bytes, shares 0..1, GB/s): headers
    are their labels with units (:func:`~tracekit.vocab.column_label`: ``H2D GB/s``), cells the
    values in those units (:func:`~tracekit.vocab.fmt_column`: fixed notation, ``true`` /
    ``false``); ``fmt``: column -> callable for a column of its own."""
    fmt = fmt or {}
    head = "".join(f'<th class="{"l" if frame.schema[c] == pl.String else ""}" data-key="{_e(c)}">'
                   f"{_e(column_label(c))}</th>" for c in frame.columns)
    rows = []
    for r in frame.iter_rows(named=True):
        cells = []
        for c in frame.columns:
            v = r[c]
            text = fmt[c](v) if c in fmt and v is not None else fmt_column(c, v)
            cells.append(f'<td class="{"l" if frame.schema[c] == pl.String else ""}">{_e(text)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="{cls}" id="{tid}"><thead><tr>{head}</tr></thead><tbody>' + "".join(rows)
            + "</tbody></table>")


def _merge(starts: np.ndarray, ends: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals merged where the next starts less than ``gap`` ns after the running end:
    ``(start, end, count)``."""
    if len(starts) == 0:
        return starts, ends, np.zeros(0, dtype=np.int64)
    o = np.argsort(starts, kind="stable")
    s, e = starts[o], ends[o]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1] + gap
    idx = np.flatnonzero(new)
    grp_end = np.maximum.reduceat(e, idx)
    counts = np.diff(np.append(idx, len(s)))
    return s[idx], grp_end, counts


def timeline_figure(data: ReportData, rk: dict, it: int) -> dict:
    """The interactive timeline of iteration ``it`` of rank ``rk`` as a plotly figure dict
    (``data``, ``layout``). Time axis: ms since the iteration start. Rows: phases and update
    sub-phases, kernels (busy intervals), where the GPU time goes per time bin (share of the bin
    busy, in CUDA API calls, between them, waiting on collectives: docs/idle.md; each trace's
    ``meta`` is its category key, ``customdata`` its ms per bin), GPU memory in use (GB), H2D and D2H copies (each a bar
    from its start to its end at its GB/s), PCIe RX / TX (% of link peak) when recorded."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from tracekit.render.figures.common import _segment_label, _sub_phase_names, _sub_phase_segments

    win = data.rank_windows(rk).filter(pl.col("iteration") == it).sort("start")
    t0, t1 = int(win["start"].min()), int(win["end"].max())
    ms = lambda t: (np.asarray(t, dtype=np.float64) - t0) / 1e6  # noqa: E731
    pm = D.pcie_metrics(data, rk, t0, t1)
    idle_bins = _idle_bins(data, rk, t0, t1)
    rows = ["phases", "kernels"] + (["idle"] if idle_bins.height else []) + ["memory", "H2D", "D2H"] \
        + (["PCIe"] if pm.height else [])
    heights = {"phases": 0.16, "kernels": 0.08, "idle": 0.12, "memory": 0.12, "H2D": 0.22, "D2H": 0.22, "PCIe": 0.14}
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.025,
                        row_heights=[heights[r] for r in rows])
    row = {r: i + 1 for i, r in enumerate(rows)}
    # phases and sub-phases: horizontal bars with base = start
    lab = [_segment_label(p, m, b) for p, m, b in win.select("phase", "micro_step", "boundary").iter_rows()]
    for p in [q for q in S.PHASES if q in win["phase"].to_list()]:
        sel = (win["phase"] == p).to_numpy()
        w = win.filter(pl.col("phase") == p)
        fig.add_trace(go.Bar(
            y=["phase"] * w.height, x=ms(w["end"]) - ms(w["start"]), base=ms(w["start"]), orientation="h",
            marker_color=S.phase_color(p), name=_plotly_text(p if p != "other" else "gap"), legendgroup="phases",
            text=[_plotly_text(x) for x, s in zip(lab, sel) if s], textposition="inside", insidetextanchor="middle",
            hovertemplate="%{text}: %{x:.2f} ms<extra>" + _plotly_text(p) + "</extra>"), row=row["phases"], col=1)
    segs = _sub_phase_segments(data, rk, it)
    if segs.height:
        totals = segs.with_columns(d=pl.col("e") - pl.col("s")).group_by("sub_phase").agg(pl.col("d").sum()) \
            .sort("d", descending=True, maintain_order=True)
        names = _sub_phase_names(totals["sub_phase"].to_list())
        named = [s for s in totals["sub_phase"].to_list() if s != "(none)"][:12]
        for i, s in enumerate(totals["sub_phase"].to_list()):
            g = segs.filter(pl.col("sub_phase") == s)
            color = S.UNMARKED_COLOR if s == "(none)" else (
                S.SUB_PHASE_CYCLE[named.index(s) % len(S.SUB_PHASE_CYCLE)] if s in named else S.OTHER_SUB_COLOR)
            fig.add_trace(go.Bar(
                y=["update sub-phase"] * g.height, x=ms(g["e"]) - ms(g["s"]), base=ms(g["s"]), orientation="h",
                marker_color=color, name=_plotly_text(short_name(names[s], 60)), legendgroup="sub",
                showlegend=s in named or s == "(none)",
                hovertemplate=_plotly_text(names[s]) + "<br>%{base:.2f} ms + %{x:.3f} ms<extra>sub-phase</extra>"),
                row=row["phases"], col=1)
    # kernels: merged busy intervals
    ops = data.rank_ops(rk).filter((pl.col("end") > t0) & (pl.col("start") < t1))
    k = ops.filter(pl.col("kind") == "kernel")
    ks, ke, kc = _merge(k["start"].to_numpy(), k["end"].to_numpy(), KERNEL_MERGE_NS)
    if len(ks):
        fig.add_trace(go.Bar(
            y=["kernels"] * len(ks), x=(ke - ks) / 1e6, base=ms(ks), orientation="h", marker_color="#555555",
            marker_line_width=0, name="kernels (busy)", customdata=kc,
            hovertemplate="%{customdata} kernel(s), %{x:.3f} ms<extra>kernels</extra>"), row=row["kernels"], col=1)
    # where the GPU time goes, per bin: the idle categories of docs/idle.md (share of the bin)
    if idle_bins.height:
        from tracekit.vocab import IDLE_CATEGORIES

        bx = ms(idle_bins["start"].to_numpy())
        bw = (idle_bins["end"] - idle_bins["start"]).to_numpy() / 1e6
        bottom = np.zeros(idle_bins.height)  # stacked by hand: the page's bars overlay
        for c, label in IDLE_CATEGORIES.items():
            ns = idle_bins[c].to_numpy().astype(np.float64)
            share = 100 * ns / np.maximum(idle_bins["wall_ns"].to_numpy(), 1)
            fig.add_trace(go.Bar(x=bx + bw / 2, y=share, base=bottom.copy(), width=bw, name=_plotly_text(label),
                                 legendgroup="idle",
                                 marker_color=S.IDLE_COLORS[c], marker_line_width=0, customdata=ns / 1e6,
                                 meta=c, hovertemplate=_plotly_text(label) + ": %{y:.0f}% of the bin "
                                 "(%{customdata:.3f} ms)<extra>GPU time</extra>"), row=row["idle"], col=1)
            bottom += share
        fig.update_yaxes(range=[0, 100], title_text="GPU time %", row=row["idle"], col=1)
    # memory
    tl = D.memory_timeline(data, rk)
    if tl.height:
        inside = tl.filter((pl.col("t_ns") > t0) & (pl.col("t_ns") < t1))
        tx = np.concatenate([[t0], inside["t_ns"].to_numpy(), [t1]])
        lv = np.concatenate([[D.level_at(tl, np.array([t0]))[0]], inside["in_use_bytes"].to_numpy(),
                             [D.level_at(tl, np.array([t1 - 1]))[0]]]) / 1e9
        fig.add_trace(go.Scatter(x=ms(tx), y=lv, mode="lines", line_shape="hv", line_color=S.MEMORY_COLOR,
                                 name="GPU memory in use (GB)",
                                 hovertemplate="%{y:.3f} GB<extra>memory</extra>"), row=row["memory"], col=1)
    # copies, one bar each (x = middle, width = duration)
    cp = D.copy_intervals(data, rk, t0, t1)
    for d in D.COPY_DIRECTIONS:
        c = cp.filter(pl.col("direction") == d)
        if c.height > MAX_INTERACTIVE_COPIES:
            c = c.sort("bytes", descending=True).head(MAX_INTERACTIVE_COPIES).sort("start_ns")
        for kind in [x for x in ("pinned", "pageable") if x in c["host_kind"].to_list()] + \
                sorted({x for x in c["host_kind"].to_list() if x not in ("pinned", "pageable") and x}):
            ck = c.filter(pl.col("host_kind") == kind)
            mid = (ms(ck["start_ns"]) + ms(ck["end_ns"])) / 2
            width = np.maximum((ck["end_ns"] - ck["start_ns"]).to_numpy() / 1e6, 1e-4)
            cd = np.stack([ck["bytes"].to_numpy().astype(float) / 1e6, ck["duration_ns"].to_numpy() / 1e3,
                           np.array([_plotly_text(p) for p in ck["phase"].to_list()], dtype=object),
                           np.array([_plotly_text(s) for s in ck["sub_phase"].to_list()], dtype=object)], 1)
            fig.add_trace(go.Bar(
                x=mid, y=ck["gbps"].to_numpy(), width=width, name=_plotly_text(f"{d} copies ({kind})"),
                marker_color=S.DIRECTION_COLORS[d], marker_line_color="#111111" if kind == "pageable" else
                S.DIRECTION_COLORS[d], marker_line_width=0.8, marker_pattern_shape="x" if kind == "pageable" else "",
                opacity=1.0 if kind == "pageable" else 0.8, customdata=cd,
                hovertemplate=(_plotly_text(f"{d} copy, {kind} host memory") + "<br>"
                               f"%{{customdata[0]:,.3f}} MB in %{{customdata[1]:,.1f}} µs"
                               "<br>%{y:.2f} GB/s<br>phase: %{customdata[2]}<br>sub-phase: %{customdata[3]}"
                               "<extra></extra>")), row=row[d], col=1)
    ref = D.reference_bandwidths(data, rk, data.steady_iterations(rk))
    for r in ref.iter_rows(named=True):
        fig.add_hline(y=r["gbps"], line_dash="dash" if r["host_kind"] == "pinned" else "dot", line_width=1,
                      line_color="#333333", row=row[r["direction"]], col=1,
                      annotation_text=_plotly_text(f"{r['host_kind']} {r['gbps']:.1f} GB/s"), annotation_font_size=10)
    if pm.height:
        bin_ns = D.nice_bin(t1 - t0)
        pmb = pm.with_columns(t_ns=t0 + (pl.col("t_ns") - t0) // bin_ns * bin_ns).group_by("metric", "t_ns") \
            .agg(pl.col("percent").mean()).sort("metric", "t_ns")
        for metric, d in (("RX", "H2D"), ("TX", "D2H")):
            m = pmb.filter(pl.col("metric") == metric)
            fig.add_trace(go.Scatter(x=ms(m["t_ns"]), y=m["percent"].to_numpy(), mode="lines", line_shape="hv",
                                     line_color=S.DIRECTION_COLORS[d], line_width=1,
                                     name=f"PCIe {metric} (% of link peak, {bin_ns / 1e6:g} ms mean)",
                                     hovertemplate="%{y:.0f}%<extra>PCIe " + metric + "</extra>"),
                          row=row["PCIe"], col=1)
        fig.update_yaxes(range=[0, 105], title_text="PCIe %", row=row["PCIe"], col=1)
    fig.update_yaxes(title_text="GB", row=row["memory"], col=1)
    fig.update_yaxes(title_text="H2D GB/s", rangemode="tozero", row=row["H2D"], col=1)
    fig.update_yaxes(title_text="D2H GB/s", rangemode="tozero", row=row["D2H"], col=1)
    fig.update_xaxes(title_text=f"ms since the start of iteration {it}", row=len(rows), col=1)
    fig.update_layout(barmode="overlay", height=820, margin={"l": 60, "r": 20, "t": 30, "b": 40},
                      legend={"font": {"size": 10}}, hovermode="closest", bargap=0, template="plotly_white",
                      title={"text": _plotly_text(f"Iteration {it} — drag to zoom, double-click to reset"),
                             "font": {"size": 13}})
    return fig.to_plotly_json()


def _idle_bins(data: ReportData, rk: dict, t0: int, t1: int) -> pl.DataFrame:
    """[t0, t1) cut into bins of :func:`tracekit.render.data.nice_bin` (the last one shorter),
    each with its wall time split into the idle categories of
    :func:`tracekit.analyze.sections.idle.breakdown_of`: ``bin, start, end, wall_ns`` and
    :data:`tracekit.vocab.IDLE_CATEGORIES` (ns); empty when the analysis cannot say."""
    if t1 <= t0:
        return pl.DataFrame()
    step = max(int(D.nice_bin(t1 - t0)), 1)
    starts = np.arange(t0, t1, step, dtype=np.int64)
    iv = pl.DataFrame({"global_pid": [rk["global_pid"]] * len(starts), "device": [rk["device"]] * len(starts),
                       "bin": np.arange(len(starts), dtype=np.int64), "start": starts,
                       "end": np.minimum(starts + step, t1)})
    iv = iv.cast({"global_pid": data.model.ops_schema.get("global_pid", pl.Int64),
                  "device": data.model.ops_schema.get("device", pl.Int64)})
    got = data.sections.idle_breakdown_of(iv, ("bin",))
    return iv.select("bin", "start", "end").join(got.drop("global_pid", "device"), on="bin", how="left").sort("bin")


def _img(path: Path, png: bytes | None = None) -> str:
    b64 = base64.b64encode(path.read_bytes() if png is None else png).decode("ascii")
    return f'<img alt="{_e(path.stem)}" src="data:image/png;base64,{b64}">'


def render_html(data: ReportData, rk: dict, it: int, metrics: pl.DataFrame, frames: dict[str, pl.DataFrame],
                figures: dict[str, Path], captions: dict[str, str], findings: list[dict],
                advice: dict | None = None, notes: list[str] | None = None,
                pngs: dict[str, bytes] | None = None) -> str:
    """The text of ``report.html`` (see the module doc). ``figures``: figure name -> PNG path;
    ``pngs``: figure name -> the PNG's bytes, read from ``figures`` where missing (a report's
    files are renamed into place only once all are written); ``captions``: figure name -> caption (plain text, escaped here); ``advice``: the dict of
    :func:`tracekit.analyze.sections.advice.advise` or None."""
    import plotly.offline

    from tracekit.render import figures as F
    from tracekit.render import summary
    from tracekit.render.config import config_text, trace_config

    cfg = trace_config(data)
    steady = data.steady_iterations(rk)
    means = summary.phase_means(metrics, steady)
    exp = data.export
    P: list[str] = []
    P.append(f"<h1>tracekit report: {_e(data.path.name)}</h1>")
    from tracekit.render.lead import ADVICE_HEADERS, advice_rows, headline, only_rank_note

    P.append(f'<p class="lead" id="headline"><b>{_e(headline(data, rk, advice))}</b></p>')
    lead = advice_rows(advice, rk)
    if lead:
        P.append('<p class="muted">What to change, largest saving first (per iteration = mean over steady '
                 'iterations, warm-up apart; details under <a href="#advice">advice</a>):</p>')
        P.append('<table id="advice-summary"><thead><tr>'
                 + "".join(f'<th class="{"l" if k in ("knob", "change", "confidence") else ""}">{_e(h)}</th>'
                           for k, h in ADVICE_HEADERS.items()) + "</tr></thead><tbody>"
                 + "".join("<tr>" + "".join(f'<td class="{"l" if k in ("knob", "change", "confidence") else ""}">'
                                            f"{_e(r[k])}</td>" for k in ADVICE_HEADERS) + "</tr>" for r in lead)
                 + "</tbody></table>")
    P.append(f'<p class="muted">{_e(cfg.label())}</p>')
    P.append('<nav><a href="#config">configuration</a><a href="#advice">advice and findings</a>'
             '<a href="#key">key numbers</a><a href="#timeline">interactive timeline</a>'
             '<a href="#figures">figures</a><a href="#tables">tables</a></nav>')
    # configuration
    P.append('<h2 id="config">Trace and configuration</h2>')
    rows = cfg.rows() + [
        ("nsys / export schema", f"{exp.nsys_version or '?'} / {exp.schema_version}"),
        ("phases from", ", ".join(f"pid {os_pid(gp)}: {s}" for gp, s in sorted(data.model.source.items()))
         or "none"),
        ("ranks", ", ".join(f"{i}: pid {r['pid']} GPU {r['device']}" for i, r in enumerate(data.ranks.iter_rows(named=True)))),
        ("shown", f"rank {rk['index']} (pid {rk['pid']} GPU {rk['device']})"
         + (only_rank_note(data.ranks.height).replace("`", "") if data.ranks.height > 1 else "")
         + f"; iteration {it} in time"),
        ("steady iterations (means)", F.iterations_note(steady)),
        ("warm-up drawn apart", F.iterations_note(D.warmup_iterations(data, rk)) if D.warmup_iterations(data, rk) else "none"),
        ("units", UNITS_LINE),
    ]
    if advice and advice.get("config", {}).get("settings"):
        for s in advice["config"]["settings"][:40]:
            rows.append((f"setting {s.get('key')}", f"{config_text(s.get('value'))} ({s.get('source')})"))
    P.append('<table class="cfg" id="config-table"><tbody>'
             + "".join(f"<tr><th class='l'>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</tbody></table>")
    # advice first, then findings
    P.append('<h2 id="advice">Advice and findings</h2>')
    items = [a for a in (advice or {}).get("advice", []) if a.get("pid") in (None, rk["pid"])
             and a.get("device") in (None, rk["device"])]
    if items:
        P.append("<h3>What to change (saving per steady iteration, largest first)</h3><ol class='advice' id='advice-list'>")
        for a in items:
            P.append(f"<li><b>{_e(knob_label(a.get('knob')))}</b>: {_e(a.get('change'))} — saves "
                     f"{_e(fmt_plain(a.get('saving_ms_per_iteration') or 0.0))} ms per iteration "
                     f"({_e(fmt_plain(a.get('saving_pct') or 0.0))}%, {_e(fmt_plain(a.get('baseline_iteration_ms')))} → "
                     f"{_e(fmt_plain(a.get('predicted_iteration_ms')))} ms) <span class='conf'>{_e(a.get('confidence'))}"
                     f"</span><br><span class='muted'>{_e(a.get('problem'))} — {_e(a.get('basis'))}</span></li>")
        P.append("</ol>")
        once = [o for o in (advice or {}).get("one_time_costs", []) if o.get("pid") in (None, rk["pid"])]
        if once:
            P.append("<p>One-time costs (totals, not per iteration):</p><ul>" + "".join(
                f"<li>{_e(o.get('problem'))}: {_e(o.get('total_ms'))} ms in total ({_e(o.get('knob'))}: "
                f"{_e(o.get('change'))})</li>" for o in once) + "</ul>")
    if findings:
        P.append("<h3>Findings</h3><p class='muted'>Findings cover every iteration of the trace, the warm-up one "
                 "included.</p><ul class='findings' id='findings-list'>")
        for f in findings:
            P.append(f"<li><b>{_e(f.get('topic'))}</b>" + (f" ({_e(f['phase'])})" if f.get("phase") else "")
                     + f": {_e(f.get('text'))}</li>")
        P.append("</ul>")
    if not items and not findings:
        P.append("<p id='findings-list'>No advice or findings for this rank.</p>")
    # key numbers
    P.append(f'<h2 id="key">Key numbers (mean per iteration over {_e(F.iterations_note(steady))})</h2>')
    total = float(means["wall_ns"].sum()) if means.height else 0.0
    km = means.select(
        "phase", "wall_ns",
        share=(pl.col("wall_ns") / total) if total else pl.lit(None, pl.Float64),
        gpu_idle_share=pl.when(pl.col("wall_ns") > 0).then(pl.col("gpu_idle_ns") / pl.col("wall_ns")),
        h2d_bytes=pl.col("h2d_bytes").cast(pl.Float64), h2d_gbps="h2d_gbps",
        d2h_bytes=pl.col("d2h_bytes").cast(pl.Float64), d2h_gbps="d2h_gbps", overlap_ratio="overlap_ratio",
        pageable_count="pageable_count", pageable_bytes=pl.col("pageable_bytes").cast(pl.Float64),
        peak_bytes=pl.col("peak_bytes").cast(pl.Float64),
    )
    P.append(_table(km, tid="key-numbers"))
    P.append('<p class="muted">GPU idle: share of the phase with no kernel, copy or memset running. Copy hidden: '
             'share of copy busy time under kernels.</p>')
    # interactive timeline
    P.append(f'<h2 id="timeline">Iteration {it} in time (interactive)</h2>')
    P.append('<p class="muted">Drag to zoom into any part, double-click to reset; hover a copy for its bytes, '
             'bandwidth, phase and sub-phase. Kernels closer than 20 µs are merged into one busy bar. Dashed / dotted '
             'lines: the bandwidth of this trace\'s pinned / pageable copies ≥ 1 MiB (steady iterations).</p>')
    tfig = timeline_figure(data, rk, it)
    P.append('<div id="timeline-plot" class="plotly-fig" style="width:100%;height:820px"></div>')
    P.append("<script>Plotly.newPlot('timeline-plot'," + _script_json(tfig["data"]) + ","
             + _script_json(tfig["layout"]) + ",{responsive:true,displaylogo:false});</script>")
    P.append(_csv_link(D.copy_intervals(data, rk, *_span(data, rk, it)), "timeline_copies"))
    # figures
    P.append('<h2 id="figures">Figures</h2>')
    for name, (_fn, title) in F.FIGURES.items():
        if name not in figures:
            continue
        P.append(f'<figure id="fig-{_e(name)}" class="static-fig"><h3>{_e(title)}</h3>{_img(figures[name], (pngs or {}).get(name))}'
                 f"<figcaption>{_e(captions.get(name, ''))} "
                 f"{_csv_link(frames[name], name) if name in frames else ''}</figcaption></figure>")
    # tables
    P.append('<h2 id="tables">Tables</h2>')
    P.append("<h3>Per iteration and phase (each iteration; warm-up and incomplete ones included, marked)</h3>")
    warm = set(D.warmup_iterations(data, rk))
    per = metrics.with_columns(
        note=pl.when(pl.col("iteration").is_in(list(warm))).then(pl.lit("warm-up"))
        .when(~pl.col("complete")).then(pl.lit("incomplete")).otherwise(pl.lit("")),
    ).select("iteration", "phase", "note", "wall_ns", "gpu_idle_ns", "h2d_bytes", "h2d_gbps", "d2h_bytes",
             "d2h_gbps", "pageable_count", "peak_bytes")
    P.append('<div class="scroll">' + _table(per, tid="per-iteration") + "</div>")
    P.append(_csv_link(metrics, "key_numbers"))
    sp = frames.get("4_update_sub_phases")
    if sp is not None:
        names = _sub_names(sp["sub_phase"].to_list())
        spt = sp.select(
            sub_phase=pl.col("sub_phase").replace_strict(names, default=pl.col("sub_phase")),
            wall_ns="wall_ns", gpu_busy_ns="gpu_busy_ns", cpu_only_ns="cpu_only_ns", h2d_bytes="h2d_bytes",
            h2d_gbps="h2d_gbps", d2h_bytes="d2h_bytes", d2h_gbps="d2h_gbps")
        P.append(f"<h3>Update sub-phases (mean per iteration over {_e(F.iterations_note(steady))})</h3>")
        P.append(_table(spt, tid="sub-phases"))
    if notes:
        P.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    body = "\n".join(P)
    js = plotly.offline.get_plotlyjs()
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>tracekit report: {_e(data.path.name)}</title><style>{_CSS}</style>"
            f"<script>{js}</script></head><body>\n{body}\n</body></html>\n")


def _sub_names(names: list[str]) -> dict:
    from tracekit.render.figures.common import _sub_phase_names

    return _sub_phase_names(names)


def _span(data: ReportData, rk: dict, it: int) -> tuple[int, int]:
    win = data.rank_windows(rk).filter(pl.col("iteration") == it)
    return int(win["start"].min()), int(win["end"].max())


def write_advice(data: ReportData, notes: list[str]) -> dict | None:
    """The advice of :func:`tracekit.analyze.sections.advice.advise` for the page (config from the
    capture manifest beside the trace, else inferred), or None when it cannot be had (a note
    says why)."""
    from tracekit.analyze.trace import dsconfig

    try:  # the advice of the trace's analysis (the one pipeline; --ds-config honoured)
        if getattr(data, "analysis", None) is not None:
            return data.analysis.advice_result()
        return data.sections.advise(dsconfig.load(data.path))
    except Exception as exc:  # noqa: BLE001 - the page is written without advice, and says so
        notes.append(f"advice skipped: {type(exc).__name__}: {exc}")
        return None
