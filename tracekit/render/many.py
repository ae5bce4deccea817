"""Many traces in the terminal, and the cached terminal output of one trace.

:func:`render_many` prints the per-rank table and the summary across ranks of
:func:`tracekit.analyze.multi.analyze_many` (``--format csv|md``: :func:`many_text`);
:func:`cached_view` / :func:`store_view` keep what ``tracekit analyze`` printed for one trace, per
terminal view (:func:`view_of`), in the trace's cache, so a second run answers without polars.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tracekit.analyze.multi import options_dict
from tracekit.vocab import PHASES


def missing_text(summary: dict) -> str:
    """The missing rank numbers of a summary (:func:`tracekit.analyze.multi.summarize_ranks`)
    as text: ``1, 4, 5`` one by one, a run of three or more as ``7-12``, and then the count
    (``2-99 (98 ranks)``)."""
    ranges = summary.get("missing_rank_ranges")
    if ranges is None:  # a summary without ranges: the listed numbers
        return ", ".join(map(str, summary["missing_ranks"]))
    parts = []
    for a, b in ranges:
        parts.extend([str(a)] if a == b else [str(a), str(b)] if b == a + 1 else [f"{a}-{b}"])
    count = summary.get("missing_ranks_count", 0)
    return ", ".join(parts) + (f" ({count:,} ranks)" if any(b >= a + 2 for a, b in ranges) else "")

#: the narrowest the per-rank table's trace column gets (names fold after "." / "_" to fit the
#: width the number columns leave, never below this)
NAME_WIDTH = 16


def render_many(out: dict, console=None, wide: bool = False) -> None:
    """Print the per-rank table and the summary across ranks of :func:`analyze_many`'s dict
    (rich tables of :func:`tracekit.render.terminal.terminal_width`; ms = 1e6 ns)."""
    from rich.text import Text

    from tracekit.render.terminal import add_num_column, fold_identifier, make_console, new_table
    from tracekit.textsafe import markup, text
    from tracekit.vocab import fmt_ms

    console = console or make_console(wide)
    s = out["summary"]

    def ms(v):
        return fmt_ms(v, 1)

    # the default fits 80 columns: numbers keep their full width (min_width), the trace name
    # folds; --wide adds pid and device and spells the phase names out
    heads = ["rank", "pid", "dev", "iters", "mean iter", *PHASES] if wide else \
        ["rank", "iters", "iter ms", "fwd", "bwd", "update", "other"]
    rows = []
    for r in s["rank_rows"]:
        label = r["rank"] if r["rank"] is not None else r["node"]
        steady = r.get("steady_iterations")
        mean = r.get("steady_mean_iteration_ns") if steady else r["mean_iteration_ns"]
        per_phase = r.get("steady_phase_ns") if steady else {}
        nums = {"rank": "" if label is None else str(label), "pid": str(r["pid"]), "dev": str(r["device"]),
                "iters": str(len(steady) if steady else r["iterations"]), "mean iter": ms(mean)}
        nums["iter ms"] = nums["mean iter"]
        for p, short in zip(PHASES, ("fwd", "bwd", "update", "other")):
            nums[p] = nums[short] = ms(per_phase.get(p))
        # file names are never markup, and fold only after a "." or "_"
        rows.append((Path(r["trace"]).name, [nums[h] for h in heads]))
    widths = [max([len(col) if wide else len(col.split()[-1])] + [len(v[i]) for _, v in rows])
              for i, col in enumerate(heads)]
    name_w = max(NAME_WIDTH, console.width - sum(widths) - 3 * len(heads) - 4)  # 3: a column's padding and rule
    t = new_table(f"{s['ranks']} rank{'s' if s['ranks'] != 1 else ''} in {s['traces']} "
                  f"trace{'s' if s['traces'] != 1 else ''} (ms per steady iteration, warm-up apart; "
                  "iters: steady ones)", wide)
    t.add_column("trace", overflow="fold", min_width=min(name_w, max(len(n) for n, _ in rows) if rows else name_w))
    for i, col in enumerate(heads):
        add_num_column(t, col)
        t.columns[-1].min_width = widths[i]
    for name, cells in rows:  # file names are never markup, and fold only after a "." or "_"
        t.add_row(Text("\n").join(text(x) for x in fold_identifier(name, name_w).split("\n")), *cells)
    console.print(t)
    if s["per_phase"]:
        t = new_table("Across ranks (ms in all: each rank's phase time summed over its iterations)", wide)
        t.add_column("phase")
        for col in ("min", "mean", "max", "spread", "spread %"):
            add_num_column(t, col)
        t.add_column("slowest", overflow="fold")
        for phase, v in s["per_phase"].items():
            who = v["slowest"]  # None: no rank stands out (tracekit.analyze.significance)
            t.add_row(
                phase, ms(v["min_ns"]), ms(v["mean_ns"]), ms(v["max_ns"]), ms(v["spread_ns"]),
                "" if v["spread_share"] is None else f"{100 * v['spread_share']:.1f}%",
                text("–" if who is None else f"{Path(who['trace']).name} pid {who['pid']}"),
            )
        console.print(t)
        if any(v["slowest"] is None for v in s["per_phase"].values()):
            console.print(text("slowest: – where no rank's phase time differs from the next one's by at least "
                               "1 ms and 5 %"))
    if s.get("note"):
        console.print(text(f"note: {s['note']}"))
    elif s["slowest_rank"]:
        w = s["slowest_rank"]
        console.print(
            text(f"slowest rank: {Path(w['trace']).name} pid {w['pid']} device {w['device']} "
            f"({ms(w['mean_iteration_ns'])} ms per iteration)")
        )
    elif sum(1 for r in s["rank_rows"] if r["iterations"]) > 1:
        console.print(text("slowest rank: none stands out (no rank's mean iteration differs from the next one's "
                           "by at least 1 ms and 5 % and beyond their iteration-to-iteration spread)"))
    if s["missing_ranks"]:
        console.print(f"[bold red]missing ranks:[/] {missing_text(s)}")
    for w in s["ranks_without_iterations"]:
        console.print(f"[yellow]no iterations:[/] {markup(Path(w['trace']).name)} pid {w['pid']}", emoji=False)
    for r in s["rank_rows"]:
        if r.get("unclosed_iterations"):
            its = ", ".join(map(str, r["unclosed_iterations"]))
            console.print(text(f"{Path(r['trace']).name} pid {r['pid']}: iteration {its} left out of the table "
                               "above (a phase range never closed; see tracekit analyze on that trace)"))
    for line in run_lines(out.get("run")):
        console.print(text(line))


def run_lines(run: dict | None) -> list[str]:
    """The traces as one job (``run`` of :func:`tracekit.analyze.multi.analyze_many`, issue 24),
    in plain lines: ranks per host, how the clocks were aligned, then the host-contention and
    waiting-rank findings computed across the files (the per-rank communication findings are
    in ``--json``'s ``run.findings``). Empty for one trace or different runs."""
    if not run or not run.get("one_run") or not run.get("hosts"):
        return []
    c = run["clock"]
    skew = "not measured" if c["residual_skew_ns"] is None else f"{c['residual_skew_ns']:,} ns"
    per_host = ", ".join(f"{h}: {n}" for h, n in run["ranks_per_host"].items())
    lines = [f"one run: {run['ranks']} ranks on {len(run['hosts'])} host{'s' if len(run['hosts']) > 1 else ''} "
             f"({per_host}); clocks: {c['method']} (residual skew {skew})"]
    lines += [f"run: {f['text']}" for f in run.get("findings") or [] if f["topic"] in ("host-contention", "waiting-rank")]
    return lines


# ---------------------------------------------------------------------- cached terminal output
def view_of(phase: str | None, wide: bool = False, fmt: str = "table") -> dict | None:
    """How :func:`tracekit.render.tables.render` would draw on this stdout
    (:func:`tracekit.render.terminal.view`: width, colours, NO_COLOR, terminal or not, wide,
    format) and the phase: the key of a cached rendering; None when stdout is not UTF-8 (rich
    then picks other characters, which a cached text could not honour)."""
    enc = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
    if enc != "utf8":
        return None
    from tracekit.render.terminal import view

    return {**view(wide, fmt), "phase": phase}


def cached_view(path: str | Path, options, phase: str | None, wide: bool = False,
                fmt: str = "table") -> tuple[dict | None, str | None]:
    """(view, text): the output stored for ``path``, ``options`` and this stdout's view
    (:func:`view_of`), or None as text. The entry shares the result's key, so it goes stale
    with it (trace changed, tracekit edited)."""
    view = view_of(phase, wide, fmt)
    path = Path(path)
    if view is None or not path.is_file():
        return view, None
    from tracekit.analyze.trace.cache import TraceCache

    try:
        tc = TraceCache(path)
    except OSError:
        return view, None
    return view, tc.get_text(tc.result_key(options_dict(options), str(path)) + "-" + _view_key(view))


def _view_key(view: dict) -> str:
    import hashlib
    import json

    return hashlib.sha1(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]


def render_to_text(analysis, fmt: str = "table", wide: bool = False) -> str:
    """What ``tracekit analyze`` prints for :class:`tracekit.analysis.Analysis` ``analysis`` in
    ``fmt`` (table: ANSI styles included when stdout is a colour terminal; csv; md)."""
    from tracekit.render import tables as render

    return render.render_text(analysis, fmt, wide)


def store_view(path: str | Path, options, view: dict | None, text: str) -> None:
    """Keep ``text`` (the output for ``view``) in the trace's cache; errors ignored."""
    if view is None:
        return
    from tracekit.analyze.trace.cache import TraceCache

    try:
        tc = TraceCache(path)
    except OSError:
        return
    tc.put_text(tc.result_key(options_dict(options), str(path)) + "-" + _view_key(view), text)


def many_text(many, fmt: str) -> str:
    """``--format csv|md`` for several traces: the per-rank rows of the summary
    (:func:`rank_rows`; ms = 1e6 ns in md, ns in csv). ``many``: :func:`analyze_many`'s dict
    (only its ``summary`` is read) or a :class:`tracekit.analysis_many.ManyAnalysis`."""
    import polars as pl

    rows = (many["summary"] if isinstance(many, dict) else many.summary)["rank_rows"]
    flat = [{"trace": r["trace"], "rank": r["rank"] if r["rank"] is not None else r["node"], "pid": r["pid"],
             "device": r["device"], "iterations": r["iterations"], "mean_iteration_ns": r["mean_iteration_ns"],
             **{f"{p}_ns": r["phase_ns"].get(p, 0) for p in PHASES}} for r in rows]
    f = pl.DataFrame(flat, infer_schema_length=None)
    if fmt == "csv":
        from tracekit.textsafe import csv_frame

        return csv_frame(f).write_csv()
    from tracekit.render.tables import markdown_table
    from tracekit.vocab import fmt_ms

    head = ["trace", "rank", "pid", "dev", "iters", "mean iter ms", *[f"{p} ms" for p in PHASES]]
    body = [[Path(r["trace"]).name, "" if r["rank"] is None else str(r["rank"]), str(r["pid"]), str(r["device"]),
             str(r["iterations"]), fmt_ms(r["mean_iteration_ns"], 1), *[fmt_ms(r[f"{p}_ns"], 1) for p in PHASES]]
            for r in flat]
    return markdown_table(head, body, right=range(1, len(head)))
