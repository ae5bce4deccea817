"""``tracekit report --perfetto FILE``: tracekit's view of a trace as a Chrome / Perfetto
trace-event JSON (open it in ui.perfetto.dev or chrome://tracing).

The file is the JSON object form of the trace-event format::

    {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}

Per process with GPU work (``pid`` = the process id, named by a ``process_name`` metadata
event), one track (``tid``) each for: phases (``ph: "X"`` complete events, name ``forward``,
``backward``, ``update`` or ``gap``, args ``iteration, micro_step, boundary``), update
sub-phases (innermost NVTX range self time, ``(none)`` = no range open), H2D copies, D2H
copies, other copies (D2D, ...), kernels, and findings (``ph: "i"`` instant events, scope
``p``, at the start of the phase they are about, else at the process's first event). Copy
events carry ``args: {bytes, gbps, host_kind, direction, iteration, phase, sub_phase,
start_ns, end_ns}``: every memcpy of the trace is one event.

Tracks never hold overlapping events (Perfetto draws a slice that overlaps another on its track
without nesting in it wrongly, or drops it): concurrent kernels (several streams, or a stream's
kernels that overlap) and concurrent copies of one direction go on extra tracks of their lane,
``tid`` = lane tid x :data:`TRACK_STRIDE` + k (k = 1, 2, ...; named ``kernels #2``, ...), sorted
right after it.
Each event takes the first of its lane's tracks that is free at its start (:class:`_Tracks`).

Times: ``ts`` and ``dur`` in µs (the format's unit) as decimals with 3 places, so they are
exact to the ns; the exact integer ns are also in ``args.start_ns`` / ``args.end_ns`` of
copies. Names from the trace are data (JSON strings), never markup.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracekit.analyze.model.gpu_ops import with_strings
from tracekit.render.data import ReportData, host_kind

#: Track (tid) of each lane inside a process.
TRACKS = {"phases": 1, "sub-phases": 2, "H2D copies": 3, "D2H copies": 4, "other copies": 5, "kernels": 6,
          "findings": 7}

#: Extra tracks of lane L are L x TRACK_STRIDE + k: room for more concurrent events than a GPU
#: runs (128 concurrent kernels per device).
TRACK_STRIDE = 1000


def _us(ns: int) -> float:
    return round(int(ns) / 1000.0, 3)


class _Tracks:
    """The track (``tid``) of each complete event of a lane, so that no two events of a track
    overlap: first fit over the lane's tracks (the lane's own tid first, then tid x
    :data:`TRACK_STRIDE` + k),
    events given in start order per lane. A new track's ``thread_name`` and
    ``thread_sort_index`` metadata are appended to ``events``."""

    def __init__(self, events: list[dict]) -> None:
        self.events = events
        self.ends: dict[tuple[int, int], list[int]] = {}  # (pid, lane tid) -> end (ns) per track

    def tid(self, pid: int, lane: str, start: int, end: int) -> int:
        """The tid for an event of ``lane`` from ``start`` to ``end`` (ns)."""
        base = TRACKS[lane]
        ends = self.ends.setdefault((pid, base), [])
        for k, e in enumerate(ends):
            if e <= start:
                ends[k] = max(end, start)
                return base if k == 0 else base * TRACK_STRIDE + k
        ends.append(max(end, start))
        k = len(ends) - 1
        if k == 0:
            return base
        tid = base * TRACK_STRIDE + k
        self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": f"{lane} #{k + 1}"}})
        self.events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                            "args": {"sort_index": tid}})
        return tid


def trace_events(data: ReportData, findings: list[dict] | None = None) -> dict:
    """The trace-event document (a dict, see the module doc) of every rank of ``data``."""
    from tracekit.render.figures.common import _segment_label

    events: list[dict] = []
    tracks = _Tracks(events)
    ops_all = data.model.ops
    windows = data.model.windows
    names = _kernel_names(data)
    for i in range(data.ranks.height):
        rk = data.rank(i)
        pid = int(rk["pid"]) * 100 + int(rk["device"]) if data.ranks.filter(
            pl.col("pid") == rk["pid"]).height > 1 else int(rk["pid"])
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"rank {i}: pid {rk['pid']} GPU {rk['device']}"}})
        for lane, tid in TRACKS.items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid * TRACK_STRIDE}})
        win = windows.filter(pl.col("global_pid") == rk["global_pid"]).sort("start")
        first = {}
        for r in win.iter_rows(named=True):
            label = _segment_label(r["phase"], r["micro_step"], r["boundary"])
            events.append({"ph": "X", "cat": "phase", "name": r["phase"] if r["phase"] != "other" else "gap",
                           "pid": pid, "tid": tracks.tid(pid, "phases", r["start"], r["end"]), "ts": _us(r["start"]),
                           "dur": _us(r["end"] - r["start"]),
                           "args": {"iteration": r["iteration"], "micro_step": r["micro_step"],
                                    "boundary": bool(r["boundary"]), "label": label}})
            first.setdefault((r["iteration"], r["phase"]), r["start"])
        wm = data.sections.rank_windows().filter(
            (pl.col("global_pid") == rk["global_pid"]) & (pl.col("device") == rk["device"])
            & (pl.col("phase") == "update"))
        if wm.height:
            seg = data.sections.self_segments(wm).sort("s")
            for s, e, name, it in seg.select("s", "e", "sub_phase", "iteration").iter_rows():
                events.append({"ph": "X", "cat": "sub_phase", "name": name, "pid": pid,
                               "tid": tracks.tid(pid, "sub-phases", s, e), "ts": _us(s), "dur": _us(e - s),
                               "args": {"iteration": it}})
        ops = with_strings(ops_all.filter((pl.col("global_pid") == rk["global_pid"]) & (pl.col("device") == rk["device"])))
        cp = ops.filter(pl.col("kind") == "memcpy").with_columns(host_kind=host_kind()).sort("start")
        for r in cp.select("start", "end", "bytes", "direction", "host_kind", "iteration", "phase",
                           "sub_phase").iter_rows(named=True):
            d = r["direction"]
            lane = f"{d} copies" if d in ("H2D", "D2H") else "other copies"
            dur = r["end"] - r["start"]
            events.append({"ph": "X", "cat": "copy", "name": f"{d} {r['bytes']:,} B", "pid": pid,
                           "tid": tracks.tid(pid, lane, r["start"], r["end"]), "ts": _us(r["start"]), "dur": _us(dur),
                           "args": {"bytes": r["bytes"], "gbps": r["bytes"] / max(dur, 1), "direction": d,
                                    "host_kind": r["host_kind"], "iteration": r["iteration"], "phase": r["phase"],
                                    "sub_phase": r["sub_phase"], "start_ns": r["start"], "end_ns": r["end"]}})
        ks = ops.filter(pl.col("kind") == "kernel").sort("start")
        for s, e, nid, it, ph in ks.select("start", "end", "name_id", "iteration", "phase").iter_rows():
            events.append({"ph": "X", "cat": "kernel", "name": names.get(nid, "kernel"), "pid": pid,
                           "tid": tracks.tid(pid, "kernels", s, e), "ts": _us(s), "dur": _us(e - s),
                           "args": {"iteration": it, "phase": ph}})
        t_first = int(win["start"].min()) if win.height else int(ops["start"].min() or 0)
        for f in findings or []:
            if f.get("pid") != rk["pid"] or f.get("device") not in (None, rk["device"]):
                continue
            at = min((v for (it, p), v in first.items() if p == f.get("phase")), default=t_first)
            events.append({"ph": "i", "s": "p", "cat": "finding", "name": str(f.get("topic")), "pid": pid,
                           "tid": TRACKS["findings"], "ts": _us(at),
                           "args": {"text": str(f.get("text")), "phase": f.get("phase")}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"source": str(data.path.name), "written_by": "tracekit report --perfetto",
                          "time_unit": "ts/dur in µs (3 decimals = exact ns)"}}


def _kernel_names(data: ReportData) -> dict:
    """``name_id -> kernel name`` from StringIds (short names), empty when unavailable."""
    ids = [int(x) for x in data.model.ops.filter(pl.col("kind") == "kernel")["name_id"].drop_nulls().unique().to_list()]
    if not ids:
        return {}
    con = data.export.conn
    out = {}
    try:
        for k in range(0, len(ids), 900):
            chunk = ids[k:k + 900]
            q = f"SELECT id, value FROM StringIds WHERE id IN ({','.join('?' * len(chunk))})"
            out.update({i: v for i, v in con.execute(q, chunk)})
    except Exception:  # noqa: BLE001
        return {}
    return out


def perfetto_bytes(data: ReportData, findings: list[dict] | None = None) -> bytes:
    """:func:`trace_events` of ``data`` as the compact ASCII JSON of a ``--perfetto`` file."""
    from tracekit.analyze.trace.cache import dumps_strict

    # NaN/inf -> null: strict JSON
    return dumps_strict(trace_events(data, findings), separators=(",", ":"), ensure_ascii=True).encode("ascii")


def write_perfetto(data: ReportData, path: str | Path, findings: list[dict] | None = None) -> Path:
    """Write :func:`perfetto_bytes` of ``data`` to ``path`` (parent folders created) as a
    one-file :class:`tracekit.output.OutputSet` (a temporary of tracekit's naming, created
    exclusively, fsynced, then renamed over ``path``: a link named ``path`` is replaced, not
    written through; a full disk leaves the earlier file as it was); stale temporaries of a
    killed run in that folder are removed first. ``tracekit report`` puts the file into the
    report's own set instead (:func:`tracekit.render.report_cache.add_perfetto`). Returns the
    path. Raises :class:`TracekitError` when it cannot be written (checked before the events
    are built)."""
    from tracekit.output import OutputSet, check_file
    from tracekit.render.report_cache import add_perfetto

    check_file(path, f"--perfetto {path}")
    text = perfetto_bytes(data, findings)
    with OutputSet(f"--perfetto {path}") as output:
        p = add_perfetto(output, path, text)
    return p
