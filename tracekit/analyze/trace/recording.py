"""What an export says about how it was recorded, and what it holds: for the messages about
missing data (issue 25: never suggest ``-t cuda`` to someone whose CUDA tracing was on).

Whether CUDA (and NVTX) tracing was on is read from, in order:

1. ``META_DATA_CAPTURE`` (nsys >= 2023.3): a ``CAPTURE_EVENT_TYPE`` row ``Cuda`` (``NvtxEvents``
   for NVTX), or ``PROCESS_<n>:COLLECT_CUDA_TRACE`` = ``true`` (``COLLECT_NVTX_TRACE``); when
   the table lists capture event types and none of them is CUDA, CUDA tracing was off;
2. rows in ``CUPTI_ACTIVITY_KIND_RUNTIME`` (CUDA runtime calls are recorded by ``-t cuda``
   only), or in ``NVTX_EVENTS`` for NVTX;
3. ``PROFILER_OVERHEAD`` (nsys 2021-2026): an entry named ``CUDA profiling ...`` or ``CUPTI ...``
   (``NVTX profiling ...``) is the tracer's own start-up, so the tracing was on.

Anything else is unknown (the oldest exports have none of these tables). Nothing here raises for
a damaged small table: a setting that cannot be read is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

#: tables whose rows :func:`holds` counts, with the words for them
_HELD = (
    ("CUPTI_ACTIVITY_KIND_KERNEL", "kernel", "kernels"),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", "copy", "copies"),
    ("CUPTI_ACTIVITY_KIND_MEMSET", "memset", "memsets"),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUDA runtime call", "CUDA runtime calls"),
    ("NVTX_EVENTS", "NVTX event", "NVTX events"),
    ("TARGET_INFO_GPU", "GPU description", "GPU descriptions"),
)


@dataclass(frozen=True)
class Traced:
    """Whether one kind of tracing was on: ``on`` True/False/None (unknown), ``basis`` the
    evidence in words (e.g. ``"META_DATA_CAPTURE lists Cuda"``; empty when unknown)."""

    on: bool | None
    basis: str = ""


def _rows(export, sql: str, params: tuple = ()) -> list:
    try:
        return list(export.conn.execute(sql, params).fetchall())
    except Exception:  # a damaged or odd small table: the setting is unknown
        return []


def _count(export, table: str) -> int:
    if table not in export.tables:
        return 0
    r = _rows(export, f'SELECT count(*) FROM "{table}"')
    return int(r[0][0]) if r and isinstance(r[0][0], int) else 0


def traced(export, kind: str = "cuda") -> Traced:
    """Whether ``kind`` (``"cuda"`` or ``"nvtx"``) tracing was on when ``export`` was recorded
    (see the module doc for the evidence, in order). ``export``: an open
    :class:`~tracekit.analyze.trace.export.Export`."""
    event, collect, table, overhead = (
        ("Cuda", "COLLECT_CUDA_TRACE", "CUPTI_ACTIVITY_KIND_RUNTIME", ("CUDA profiling", "CUPTI"))
        if kind == "cuda" else ("NvtxEvents", "COLLECT_NVTX_TRACE", "NVTX_EVENTS", ("NVTX profiling", "NVTX early")))
    cols = export.tables.get("META_DATA_CAPTURE", {})
    if {"name", "value"} <= set(cols):
        rows = _rows(export, "SELECT name, value FROM META_DATA_CAPTURE WHERE name = 'CAPTURE_EVENT_TYPE' "
                             "OR name LIKE 'PROCESS_%:' || ? OR name = ?", (collect, collect))
        types = [str(v) for n, v in rows if n == "CAPTURE_EVENT_TYPE"]
        if event in types:
            return Traced(True, f"META_DATA_CAPTURE lists {event}")
        if any(str(v).lower() == "true" for n, v in rows if n != "CAPTURE_EVENT_TYPE"):
            return Traced(True, f"META_DATA_CAPTURE says {collect} true")
        if types:
            return Traced(False, f"META_DATA_CAPTURE lists {', '.join(types)}, not {event}")
    if _count(export, table):
        return Traced(True, f"{table} has rows")
    if {"nameId"} <= set(export.tables.get("PROFILER_OVERHEAD", {})):
        names = _rows(export, "SELECT DISTINCT s.value FROM PROFILER_OVERHEAD p JOIN StringIds s ON s.id = p.nameId")
        hit = sorted(str(n[0]) for n in names if any(str(n[0]).startswith(o) for o in overhead))
        if hit:
            return Traced(True, f"PROFILER_OVERHEAD has '{hit[0]}'")
    return Traced(None)


def holds(export) -> str:
    """What ``export`` holds of the tables tracekit reads, in words, e.g. ``"990 CUDA runtime
    calls, 13,513 NVTX events, 1 GPU description"``; ``"none of CUDA's or NVTX's tables"`` when it has
    no rows in any of them."""
    parts = []
    for table, one, many in _HELD:
        n = _count(export, table)
        if n:
            parts.append(f"{n:,} {one if n == 1 else many}")
    return ", ".join(parts) if parts else "none of CUDA's or NVTX's tables"


def missing_cuda_advice(export) -> str:
    """The end of the message for an export without CUDA kernels and copies: what it holds
    (:func:`holds`), what is missing, and what to do, by whether CUDA tracing was on
    (:func:`traced`): ``-t cuda`` is suggested only when it was off or unknown."""
    t = traced(export, "cuda")
    held = f"the export holds {holds(export)} and no kernel or copy"
    if t.on:
        return (f"CUDA tracing was on ({t.basis}) but no kernel or copy was recorded ({held}); record a "
                "window where the GPU works (a later or longer --delay/--duration, --capture-range, or "
                "`tracekit capture`) and let the program exit normally so that nsys flushes its CUDA buffers")
    if t.on is False:
        return f"CUDA tracing was off ({t.basis}; {held}); record it with `nsys profile -t cuda`"
    return f"{held}, and does not say whether CUDA tracing was on; record it with `nsys profile -t cuda`"
