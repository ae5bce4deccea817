"""Which traces of a folder belong to one training run (the one-run rule).

``tracekit analyze runs/`` compares ranks (slowest rank, spread of phase times) only among
exports of one run: comparing a ZeRO-2 trace with a ZeRO-3 trace of another day as "rank 0"
and "rank 1" names a "slowest rank" that means nothing.

The rule. Two exports belong to one run when both hold:

1. **Same launch**: where both have a capture manifest beside them
   (:func:`tracekit.analyze.trace.dsconfig.manifest_for`), its ``command_line`` and its
   ``deepspeed_config`` are equal (one launcher command, one DeepSpeed config: the per-rank
   manifests of one ``tracekit capture`` differ only in ``rank``). An export without a
   manifest is not held to this.
2. **Captured together**: their capture start times (nsys table
   ``TARGET_INFO_SESSION_START_TIME.utcEpochNs``, UTC ns) differ by at most
   :data:`MAX_START_GAP_NS` (the ranks of one launch start their profilers within seconds of
   each other; unrelated runs are minutes to days apart). An export whose start time cannot be
   read (an old or synthetic export without the table) is not held to this.

Groups are formed by taking the exports in start-time order and adding each to the group of
its launch whose latest start is within the gap (a chain: ranks started one after another
stay one run). A folder in more than one group gets one note
(:func:`note`) and per-trace results, no comparison across ranks. Host names
(``TARGET_INFO_SYSTEM_ENV`` ``Hostname``) are read for the record (``host`` of
:func:`identity`), not used by the rule: the ranks of one run may be on many hosts.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

#: the largest difference of capture start times (ns) of two exports of one run: 5 minutes
MAX_START_GAP_NS = 300 * 10**9


def identity(path: str | Path) -> dict:
    """What the rule reads of one export: ``{"trace": str, "start_ns": int | None (UTC epoch
    ns of the capture's start), "host": str | None, "launch": str | None (the manifest's
    command line and DeepSpeed config as one JSON text, None without a readable manifest)}``.
    Never raises: what cannot be read is None."""
    from tracekit.analyze.trace.dsconfig import manifest_for, read_manifest

    out = {"trace": str(path), "start_ns": None, "host": None, "launch": None}
    try:
        con = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        try:
            row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
            out["start_ns"] = int(row[0]) if row and row[0] is not None else None
        except sqlite3.Error:
            pass
        try:
            row = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1").fetchone()
            out["host"] = str(row[0]) if row else None
        except sqlite3.Error:
            pass
        finally:
            con.close()
    except sqlite3.Error:
        pass
    m = manifest_for(path)
    if m is not None:
        doc, _ = read_manifest(m)
        if doc:
            out["launch"] = json.dumps([doc.get("command_line"), doc.get("deepspeed_config")], sort_keys=True)
    return out


def group(idents: list[dict], gap_ns: int = MAX_START_GAP_NS) -> list[list[int]]:
    """Split exports into runs by the rule of this module. ``idents``: :func:`identity` dicts.
    Returns lists of indices into ``idents`` (each sorted; groups ordered by their first
    index); one list holding every index when all belong to one run."""
    order = sorted(range(len(idents)), key=lambda i: (idents[i]["start_ns"] is None, idents[i]["start_ns"] or 0, i))
    groups: list[dict] = []  # {"launch", "last_ns", "members"}
    for i in order:
        d = idents[i]
        home = None
        for g in groups:
            if d["start_ns"] is not None and g["last_ns"] is not None and d["start_ns"] - g["last_ns"] > gap_ns:
                continue
            if d["launch"] is not None and g["launch"] is not None and d["launch"] != g["launch"]:
                continue
            home = g
        if home is None:
            groups.append({"launch": d["launch"], "last_ns": d["start_ns"], "members": [i]})
        else:
            home["members"].append(i)
            home["last_ns"] = d["start_ns"] if d["start_ns"] is not None else home["last_ns"]
            home["launch"] = home["launch"] or d["launch"]
    out = [sorted(g["members"]) for g in groups]
    return sorted(out, key=lambda m: m[0])


def note(groups: list[list[int]], paths: list[str | Path]) -> str | None:
    """The one line said when ``groups`` hold more than one run, else None."""
    if len(groups) <= 1:
        return None
    return (f"these {len(paths)} traces are {len(groups)} different runs (capture manifests or capture start "
            f"times more than {MAX_START_GAP_NS // 10**9 // 60} min apart differ: docs/transfers.md, "
            "\"Many traces\"); each trace is reported on its own, ranks are not compared")


def run_view(idents: list[dict], rows: list[dict]) -> dict:
    """The traces of one run seen together: ``{"hosts": {host: [{"trace", "rank", "pid",
    "device"}]}, "clock": {"basis": str, "start_offset_ns": {trace: ns after the earliest
    capture start}, "residual_skew_ns": None}}``. ``rows``: the rank rows of
    :func:`tracekit.analyze.multi.rank_rows`. The clocks of the exports are aligned on their
    capture start (UTC epoch ns of each host's clock): an event at trace time ``t`` of trace
    ``f`` is at ``t + start_offset_ns[f]`` on the common axis; the hosts' own clock error (NTP,
    typically below 1 ms) is not measured, hence ``residual_skew_ns`` None. A host that
    cannot be read is ``"?"``."""
    host_of = {}
    for d in idents:  # a result's trace may be spelled otherwise than the path: match the name too
        host_of[d["trace"]] = host_of[Path(d["trace"]).name] = d["host"] or "?"
    hosts: dict[str, list[dict]] = {}
    for r in rows:
        t = str(r["trace"])
        hosts.setdefault(host_of.get(t, host_of.get(Path(t).name, "?")), []).append(
            {k: r[k] for k in ("trace", "rank", "pid", "device")})
    starts = [d["start_ns"] for d in idents if d["start_ns"] is not None]
    first = min(starts) if starts else None
    return {
        "hosts": hosts,
        "clock": {"basis": "TARGET_INFO_SESSION_START_TIME.utcEpochNs (UTC ns at each capture's start)",
                  "start_offset_ns": {d["trace"]: (d["start_ns"] - first if d["start_ns"] is not None else None)
                                      for d in idents},
                  "residual_skew_ns": None},
    }
