"""Terminal table of the CPU optimizer step per iteration (``cpu_update`` of the result,
:mod:`tracekit.analyze.sections.cpu_update`). Read from the result dict only; text from the trace is
printed as data. Units on screen: ms (1e6 ns)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tracekit.textsafe import text as _t


def _ms(ns) -> str:
    return "" if ns is None else f"{ns / 1e6:,.2f}"


def _share(part, whole) -> str:
    return f"{100 * part / whole:.0f}%" if whole else ""


def _phases(d: dict) -> str:
    top = sorted(((v, k) for k, v in (d or {}).items() if v >= 0.05e6), reverse=True)
    return ", ".join(f"{k} {v / 1e6:,.1f}" for v, k in top)


def render_cpu_update(console: Console, head: str, rank: dict, notes: list[str] | None = None) -> None:
    """For one rank of the result: one row per iteration with CPU optimizer ranges (busy,
    hidden behind GPU compute, exposed, overlapped, the training's cpu_update_wait time, where
    the overlapped part ran), then the mean per steady iteration, a legend, and ``notes`` (ranges
    left out). Prints nothing for a rank without ``cpu_optimizer_step`` ranges."""
    its = [it for it in rank.get("iterations", []) if it.get("cpu_update")
           and (it["cpu_update"]["ranges"] or it["complete"])]  # an incomplete one without ranges: a cut's edge
    if not its:
        return
    steady = rank.get("cpu_update_steady") or {}
    workers = sorted({w for it in its for w in it["cpu_update"].get("workers", []) if w != rank["pid"]})
    where = (f"in worker process{'es' if len(workers) > 1 else ''} {', '.join(map(str, workers))}" if workers
             else "on the training's own process")
    t = Table(title=_t(f"{head}: CPU optimizer step per iteration (cpu_optimizer_step ranges {where}; ms)"),
              title_justify="left", header_style="bold")
    for c in ("iter", "busy", "hidden", "hidden %", "exposed", "exposed %", "overlapped", "cpu_update_wait",
              "ranges", "overlapped during (ms)"):
        t.add_column(c, justify="left" if c in ("iter", "overlapped during (ms)") else "right", overflow="fold")
    warm = set(steady.get("warmup") or [])
    for it in its:
        c = it["cpu_update"]
        mark = " (warm-up)" if it["index"] in warm else "" if it["complete"] else " (incomplete)"
        t.add_row(*map(_t, (
            f"{it['index']}{mark}", _ms(c["busy_ns"]), _ms(c["hidden_ns"]), _share(c["hidden_ns"], c["busy_ns"]),
            _ms(c["exposed_ns"]), _share(c["exposed_ns"], c["busy_ns"]), _ms(c.get("overlapped_ns")),
            _ms(c["wait_ns"]) if c["wait_ns"] else "", str(c["ranges"]), _phases(c.get("overlapped_by_phase")),
        )))
    console.print(t)
    if steady:
        rng = steady["iterations"]
        basis = f"mean over steady iterations {rng[0]}-{rng[-1]}" if len(rng) > 1 else f"iteration {rng[0]}"
        if steady.get("warmup"):
            plural = "s" if len(steady["warmup"]) > 1 else ""
            basis += f", warm-up iteration{plural} {', '.join(map(str, steady['warmup']))} apart"
        b = steady["busy_ns"]
        line = (f"per iteration ({basis}): CPU optimizer step {_ms(b)} ms, hidden behind GPU compute "
                f"{_ms(steady['hidden_ns'])} ms ({_share(steady['hidden_ns'], b) or '0%'}), exposed "
                f"{_ms(steady['exposed_ns'])} ms ({_share(steady['exposed_ns'], b) or '0%'})")
        if steady.get("wait_ns"):
            line += f", the training in cpu_update_wait {_ms(steady['wait_ns'])} ms"
        console.print(_t(line))
    console.print(_t("busy = union of the step's ranges (iteration from it=N in their names, else by time); hidden = "
                     "compute kernels of this rank running meanwhile; exposed = the training waiting for it "
                     "(cpu_update_wait, or inside update for a step on the training's own thread) with the GPU idle; "
                     "overlapped = not waited for"))
    for n in notes or []:
        console.print(_t(f"CPU optimizer ranges set aside: {n}"))
