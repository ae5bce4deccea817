"""Terminal tables for many GPUs (issue 12): rank order, host-level copy contention, waiting
ranks. Reads only the analysis dict (:mod:`tracekit.analyze.sections.multi_gpu`'s keys), like
:mod:`tracekit.render.tables`. Units on screen: ms (1e6 ns), MB (1e6 B), GB/s (1e9 B/s).
Host names and phase names are trace text: printed as data (:mod:`tracekit.textsafe`).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tracekit.render.terminal import add_num_column, new_table
from tracekit.textsafe import text as _t
from tracekit.vocab import fmt_gbps, fmt_mb, fmt_ms, fmt_pct, fmt_size


def _ms(v):
    return fmt_ms(v, 2)


def _mb(v):
    return fmt_mb(v, 1)


def _rate(v):
    return fmt_gbps(v, 1)


def _pct(v):
    return fmt_pct(v, 0)


def _size(b):
    return fmt_size(b)


def _table(title: str, cols: list[str], wide: bool = False) -> Table:
    """A table of :func:`tracekit.render.terminal.new_table` (the width rule of every terminal
    table): the first column text, the others numbers that are never cut."""
    t = new_table(title, wide)
    for i, c in enumerate(cols):
        if i == 0:
            t.add_column(c, overflow="fold")
        else:
            add_num_column(t, c)
    return t


def render_rank_order(console: Console, result: dict) -> None:
    """One line: where the rank numbers come from (when there are two or more ranks)."""
    ro = result.get("rank_order")
    if ro and len(result.get("ranks", [])) > 1:
        console.print(_t(f"rank numbers: {ro['source']} ({ro['note']})"))


def render_multi_gpu(console: Console, result: dict, wide: bool = False) -> None:
    """Host-level copy contention per host with two or more GPUs, and waiting ranks."""
    for h in result.get("hosts", []):
        hc = h["host_contention"]
        if len(hc["devices"]) < 2:
            continue
        gpus = ", ".join(map(str, hc["devices"]))
        if not hc["concurrent_ns"]:
            console.print(_t(f"host {h['host']}: no host-level copy contention: copies of GPUs {gpus} were never in "
                             f"flight together ({_ms(hc['copy_busy_ns'])} ms of copy time in total)"))
            continue
        t = _table(f"host {h['host']}: copies of GPUs {gpus} in flight together, totals per iteration and phase "
                   "(phase of the copy that opened each window)",
                   ["iter", "phase", "windows", "concurrent ms", "both H2D ms", "both D2H ms", "one of each ms",
                    "H2D MB", "D2H MB"], wide)
        for r in hc["phases"]:
            t.add_row(*map(_t, ("" if r["iteration"] is None else str(r["iteration"]), r["phase"] or "",
                                str(r["windows"]), _ms(r["concurrent_ns"]), _ms(r["h2d_ns"]), _ms(r["d2h_ns"]),
                                _ms(r["mixed_ns"]), _mb(r["h2d_bytes"]), _mb(r["d2h_bytes"]))))
        t.add_section()
        t.add_row(*map(_t, ("total", "", str(len(hc["windows"])), _ms(hc["concurrent_ns"]), _ms(hc["h2d_ns"]),
                            _ms(hc["d2h_ns"]), _ms(hc["mixed_ns"]), _mb(hc["h2d_bytes"]), _mb(hc["d2h_bytes"]))))
        console.print(t)
        if hc["bandwidth"]:
            b = _table(f"host {h['host']}: copy bandwidth with another GPU copying vs the same size class alone "
                       "(whole trace)", ["dir", "host", "size", "copies", "MB", "GB/s", "alone GB/s", "alone size",
                                         "slower"], wide)
            for r in hc["bandwidth"]:
                lo = r["bucket"]
                b.add_row(*map(_t, (r["direction"], r["host_kind"] or "", f"{_size(2 ** lo)}-{_size(2 ** (lo + 1))}",
                                    str(r["copies"]), _mb(r["bytes"]), _rate(r["gbps"]), _rate(r["alone_gbps"]),
                                    "" if r["alone_bucket"] is None else _size(2 ** r["alone_bucket"]),
                                    _pct(r["slower_share"]))))
            console.print(b)
    w = result.get("waiting_ranks") or {}
    per = w.get("per_rank") or []
    if per:
        t = _table("time in collectives and waiting for the last rank, per rank, iteration and phase (totals)",
                   ["rank", "device", "iter", "phase", "collectives", "collective ms", "waiting ms", "waiting",
                    "arrived last"], wide)
        for r in per:
            t.add_row(*map(_t, (str(r["rank"]), str(r["device"]), "" if r["iteration"] is None else str(r["iteration"]),
                                r["phase"], str(r["collectives"]), _ms(r["collective_ns"]), _ms(r["wait_ns"]),
                                _pct(r["wait_share"]), str(r["last_arrivals"]))))
        console.print(t)
        from tracekit.analyze.significance import differs

        for s in w.get("slowest") or []:
            at = "" if s["iteration"] is None else f"iteration {s['iteration']} "
            others_mean = s["others_wait_ns"] / max(s["ranks"] - 1, 1)
            if not differs(others_mean, s["wait_ns"], "ns"):  # the one rule of a comparative claim
                console.print(_t(f"{at}{s['phase']}: no rank stands out (the other ranks waited "
                                 f"{_ms(s['others_wait_ns'])} ms in all, rank {s['rank']} {_ms(s['wait_ns'])} ms)"))
                continue
            console.print(_t(f"slowest rank in {at}{s['phase']}: rank {s['rank']} (device {s['device']}); the other "
                             f"ranks waited {_ms(s['others_wait_ns'])} ms for it; {s['reason']}"))
        if w.get("unmatched_collectives"):
            console.print(_t(f"{w['unmatched_collectives']} collective kernels had no counterpart on another rank "
                             "(not in the waiting figures)"))
