"""Cut a smaller, valid nsys export: the time window of some iterations plus what readers need.

Used to make test fixtures from large traces (``tracekit trim IN OUT --iterations A-B``).
The input is attached read-only; the output is written with sqlite-utils to a temporary file
beside OUT and renamed into place, so a failed trim leaves no partial OUT.

What is kept:

- every table's schema, exactly as in the input (``sqlite_master.sql``);
- rows of tables with a ``start`` column (CUDA activity, NVTX, ...) that overlap the window
  [t0, t1) of the iterations, where t0 is the start of the iteration's first window (including
  the data-loading gap before it) and t1 the end of the last update, or later when a CPU
  optimizer worker's ``cpu_optimizer_step it=N ...`` range of a kept iteration N ends later
  (ZenFlow steps iteration N's CPU update during iteration N+1's forward: the cut then keeps that
  part of N+1, an incomplete iteration, so that the overlap can be measured); NVTX domain-create rows
  always; CUDA runtime calls are kept when they launched a kept operation or overlap the window;
- ``CUDA_GPU_MEMORY_USAGE_EVENTS`` before t1, so memory in use at t0 stays known;
- ``GPU_METRICS`` rows in the window, optionally only metrics whose name matches
  ``keep_metrics``;
- all rows of tables without a time column (TARGET_INFO_*, ENUM_*, PROCESSES, ThreadNames,
  metadata), except ``StringIds``, reduced to the ids that kept rows use;
- a table ``TRACEKIT_TRIM`` (name, value) recording the source, iterations (``A-B``; no such
  row for a time cut) or time range, and window.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from urllib.parse import quote

import polars as pl
import sqlite_utils

from tracekit.analyze.model import phases
from tracekit.analyze.trace.export import Export
from tracekit.errors import TracekitError
from tracekit.userfiles import shown

# integer columns that hold StringIds ids
_STRING_COLUMN = re.compile(r"(?i)(name|text)")


def parse_range(text: str) -> tuple[int, int]:
    """``"A-B"`` or ``"A"`` -> (A, B); raises TracekitError for anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", text or "")
    if not m:
        raise TracekitError(f"--iterations {text!r}: expected A-B (e.g. 1-2) or a single index")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) is not None else a
    if b < a:
        raise TracekitError(f"--iterations {text!r}: the last iteration comes before the first")
    return a, b


def iteration_window(export: Export, first: int, last: int, **build_args) -> tuple[int, int]:
    """[t0, t1) in ns covering iterations ``first``..``last`` of every process."""
    model = phases.build(export, **build_args)
    w = model.windows.filter(pl.col("iteration").is_between(first, last))
    if w.height == 0:
        found = model.windows["iteration"].drop_nulls().unique().sort().to_list()
        raise TracekitError(
            f"{shown(export.path)}: no iteration {first}-{last} in this trace (it has {found or 'none'})"
        )
    return int(w["start"].min()), int(w["end"].max())


def worker_step_end(export: Export, first: int, last: int) -> int:
    """The latest end (ns) of the closed ``cpu_optimizer_step it=N ...`` ranges (domain
    ``tracekit``, any process) with ``first <= N <= last``; 0 when there is none."""
    from tracekit.analyze.model import nvtx
    from tracekit.analyze.sections.cpu_update import CPU_STEP

    if not export.has("NVTX_EVENTS"):
        return 0
    r = phases.set_aside_unclosed(export, nvtx.load_ranges(export), pl.DataFrame(
        schema={"global_pid": pl.Int64, "end": pl.Int64, "api_end": pl.Int64}))
    r = r.filter((pl.col("domain") == phases.TRACEKIT_DOMAIN) & ~pl.col("unclosed"))
    r = r.with_columns(it=pl.col("name").str.extract(CPU_STEP, 1).cast(pl.Int64, strict=False))
    r = r.filter(pl.col("it").is_between(first, last))
    return int(r["end"].max()) if r.height else 0


def parse_time_range(export: Export, text: str) -> tuple[int, int]:
    """``"A:B"`` -> [t0, t1) in ns. A and B are seconds on the trace's timeline (``41.5``) or
    percentages of the capture (``50%``; the capture spans ``ANALYSIS_DETAILS`` startTime to
    stopTime, else the first to the last CUDA/NVTX timestamp); an empty side means the
    capture's start or end. Raises TracekitError for anything else, an empty range, a
    percentage outside 0%..100%, a window that misses the capture or holds no CUDA activity
    (each message names the capture's span, so that a fitting range can be chosen)."""
    m = re.fullmatch(r"\s*([0-9.]*)\s*(%?)\s*:\s*([0-9.]*)\s*(%?)\s*", text or "")
    if not m:
        raise TracekitError(f"--time-range {text!r}: expected A:B in seconds (41.5:82) or percent (50%:100%)")
    lo, hi = capture_span(export)
    span = f"the capture spans {lo / 1e9:.6g}:{hi / 1e9:.6g} s (0%:100%)"

    def point(num: str, pct: str, default: int) -> int:
        if not num:
            return default
        try:
            v = float(num)
        except ValueError:
            raise TracekitError(f"--time-range {text!r}: {num!r} is not a number") from None
        if pct and not 0 <= v <= 100:
            raise TracekitError(f"--time-range {text!r}: {num}% is outside the capture; {span}")
        return int(lo + (hi - lo) * v / 100) if pct else int(v * 1e9)

    t0, t1 = point(m.group(1), m.group(2), lo), point(m.group(3), m.group(4), hi + 1)
    if t1 <= t0:
        raise TracekitError(f"--time-range {text!r}: the end comes before the start")
    if t1 <= lo or t0 > hi:
        raise TracekitError(f"--time-range {text!r}: outside the capture; {span}")
    if not _has_activity(export, t0, t1):
        raise TracekitError(f"--time-range {text!r}: no CUDA activity in this window (the cut would be empty); "
                            f"{_activity_span(export) or span}")
    return t0, t1


_ACTIVITY = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
             "CUPTI_ACTIVITY_KIND_RUNTIME")


def _has_activity(export: Export, t0: int, t1: int) -> bool:
    """Whether a CUDA kernel, copy, memset or runtime call overlaps [t0, t1)."""
    for table in _ACTIVITY:
        if {"start", "end"} <= set(export.tables.get(table, {})):
            row = export.conn.execute(f'SELECT 1 FROM {table} WHERE start < ? AND "end" > ? LIMIT 1',
                                      (t1, t0)).fetchone()
            if row:
                return True
    return False


def _activity_span(export: Export) -> str | None:
    """``"its CUDA activity spans A:B s"`` (first start, last end of the tables of
    :data:`_ACTIVITY`), None without any."""
    lo = hi = None
    for table in _ACTIVITY:
        if {"start", "end"} <= set(export.tables.get(table, {})):
            a, b = export.conn.execute(f'SELECT min(start), max("end") FROM {table}').fetchone()
            if a is not None:
                lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
    return None if lo is None else f"its CUDA activity spans {lo / 1e9:.6g}:{hi / 1e9:.6g} s"


def capture_span(export: Export) -> tuple[int, int]:
    """(start, stop) of the capture in ns: ``ANALYSIS_DETAILS`` when recorded, else the first
    and last timestamps of the CUDA and NVTX tables."""
    if {"startTime", "stopTime"} <= set(export.tables.get("ANALYSIS_DETAILS", {})):
        row = export.conn.execute("SELECT min(startTime), max(stopTime) FROM ANALYSIS_DETAILS").fetchone()
        if row and row[0] is not None and row[1] is not None:
            return int(row[0]), int(row[1])
    lo, hi = None, None
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"):
        if {"start", "end"} <= set(export.tables.get(table, {})):
            a, b = export.conn.execute(f'SELECT min(start), max("end") FROM {table}').fetchone()
            lo = a if lo is None or (a is not None and a < lo) else lo
            hi = b if hi is None or (b is not None and b > hi) else hi
    if lo is None or hi is None:
        raise TracekitError(f"{shown(export.path)}: no timestamps to measure the capture by")
    return int(lo), int(hi)


def trim(
    src: str | Path,
    dst: str | Path,
    iterations: str | None = None,
    drop: list[str] | None = None,
    keep_metrics: str | None = None,
    force: bool = False,
    time_range: str | None = None,
    **build_args,
) -> dict:
    """Write the cut of ``src`` to ``dst``; returns {table: rows kept} and the window.

    The window is that of ``iterations`` (``"A-B"``) or, instead, ``time_range`` (``"A:B"``,
    see :func:`parse_time_range`); a time cut numbers its iterations from 0 again.
    Raises TracekitError when ``dst`` exists (without ``force``), equals ``src``, the
    iterations are not in the trace, or not exactly one of the two windows is given.
    """
    src, dst = Path(src), Path(dst)
    if dst.exists() and dst.resolve() == src.resolve():
        raise TracekitError(f"{dst}: output would overwrite the input trace; choose another name")
    if dst.exists() and not force:
        raise TracekitError(f"{dst}: already exists; pass --force to overwrite it")
    if dst.is_dir():
        raise TracekitError(f"{dst}: is a directory; give the output file's name")
    if not dst.parent.is_dir():
        raise TracekitError(f"{dst.parent}: no such directory for the output")
    if not os.access(dst.parent, os.W_OK):
        raise TracekitError(f"{dst.parent}: not writable; choose another output folder")
    if keep_metrics:
        try:
            re.compile(keep_metrics)
        except re.error as exc:
            raise TracekitError(f"--keep-metrics {keep_metrics!r}: bad regular expression ({exc})") from None
    if (iterations is None) == (time_range is None):
        raise TracekitError("trim: pass either --iterations A-B or --time-range A:B")
    drop_set = {d for d in (drop or [])}
    with Export.open(src) as export:
        if time_range is not None:
            t0, t1 = parse_time_range(export, time_range)
        else:
            first, last = parse_range(iterations)
            t0, t1 = iteration_window(export, first, last, **build_args)
            t1 = max(t1, worker_step_end(export, first, last))
        tables = dict(export.conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall())
        indexes = [r[0] for r in export.conn.execute(
            "SELECT sql FROM sqlite_master WHERE type='index' AND sql IS NOT NULL").fetchall()]
        columns = export.tables
    unknown = drop_set - set(tables)
    if unknown:
        raise TracekitError(f"--drop {sorted(unknown)}: no such table in {shown(src)}")
    from tracekit.output import OutputSet

    counts: dict[str, int] = {}

    def fill(tmp: str) -> None:  # the cut, written into the set's exclusive temporary
        try:
            db = sqlite_utils.Database(tmp)
        except (OSError, sqlite3.Error) as exc:
            raise TracekitError(f"{dst}: cannot write the output ({exc})") from None
        try:
            _copy_cut(db, src, tables, indexes, columns, drop_set, t0, t1, keep_metrics, time_range,
                      None if time_range is not None else (first, last), counts)
        except sqlite3.OperationalError as exc:
            from tracekit.output import is_disk_full

            if is_disk_full(exc):
                raise
            if "unable to open" in str(exc) or "disk I/O error" in str(exc):  # (SQLite's word for EFBIG, EIO)
                raise TracekitError(f"{dst}: cannot write the output ({exc}); it is left as it was: check the "
                                    "free space and the file size limit (ulimit -f)") from None
            raise
        finally:
            db.close()

    # one file renamed over DST once written whole: a full disk, an error, ^C or SIGTERM leave
    # DST as it was and no temporary (tracekit.output)
    with OutputSet(str(dst)) as output:
        output.add_by_path(dst, fill)
    return {"window_ns": (t0, t1), "rows": counts}


def _copy_cut(db, src: Path, tables: dict, indexes: list, columns: dict, drop_set: set, t0: int, t1: int,
              keep_metrics, time_range, its, counts: dict) -> None:
    """Copy the rows of ``src`` in the window ``t0..t1`` into the empty database ``db`` (see
    :func:`trim`), fill ``counts`` ({table: rows kept}) and vacuum."""
    db.conn.create_function(
        "REGEXP", 2, lambda pattern, value: value is not None and re.search(pattern, value) is not None
    )
    db.execute(f"ATTACH DATABASE 'file:{quote(str(src.resolve()))}?mode=ro' AS src")
    for name, sql in tables.items():
        if name == "sqlite_sequence":
            continue
        db.execute(sql)
        if name in drop_set or name in ("StringIds", "TRACEKIT_TRIM"):  # a cut of a cut: its own rows only
            continue
        cols = columns.get(name, {})
        where, params = _filter(name, cols, t0, t1, keep_metrics, set(tables))
        db.execute(f'INSERT INTO main."{name}" SELECT * FROM src."{name}" {where}', params)
    _keep_used_strings(db, tables, columns, drop_set)
    for sql in indexes:
        try:
            db.execute(sql)
        except Exception:  # an index on a dropped table's column is not worth failing for
            pass
    db.conn.commit()
    db.execute("DETACH DATABASE src")
    db["TRACEKIT_TRIM"].insert_all(
        [
            {"name": "source", "value": src.name},
            # a time cut has no "iterations" row: Export reads it as the first iteration kept (A-B only)
            *([{"name": "iterations", "value": f"{its[0]}-{its[1]}"}] if its is not None else []),
            {"name": "time_range", "value": time_range or ""},
            {"name": "window_start_ns", "value": str(t0)},
            {"name": "window_end_ns", "value": str(t1)},
            {"name": "dropped", "value": ",".join(sorted(drop_set))},
            {"name": "keep_metrics", "value": keep_metrics or ""},
        ]
    )
    for name in tables:
        if name != "sqlite_sequence":
            counts[name] = db.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
    db.vacuum()


def _filter(name: str, cols: dict, t0: int, t1: int, keep_metrics: str | None, present: set) -> tuple[str, tuple]:
    if name == "CUDA_GPU_MEMORY_USAGE_EVENTS" and "start" in cols:
        return "WHERE start < ?", (t1,)
    if name == "CUPTI_ACTIVITY_KIND_RUNTIME" and {"start", "end", "correlationId"} <= set(cols):
        # calls that overlap the window, and those that launched kept GPU work
        ops = [t for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                           "CUPTI_ACTIVITY_KIND_MEMSET") if t in present]
        if not ops:
            return 'WHERE start < ? AND "end" > ?', (t1, t0)
        launched = " UNION ".join(f'SELECT correlationId FROM src."{t}" WHERE start < ? AND "end" > ?' for t in ops)
        return (
            f'WHERE (start < ? AND "end" > ?) OR (correlationId IN ({launched}) AND start < ?)',
            (t1, t0, *([t1, t0] * len(ops)), t1),
        )
    if name == "NVTX_EVENTS" and "start" in cols:
        return 'WHERE eventType = 75 OR (start < ? AND coalesce("end", start + 1) > ?)', (t1, t0)
    if name == "GPU_METRICS" and "timestamp" in cols:
        where, params = "WHERE timestamp >= ? AND timestamp < ?", (t0, t1)
        if keep_metrics:
            where += (
                " AND metricId IN (SELECT metricId FROM src.TARGET_INFO_GPU_METRICS"
                " WHERE metricName REGEXP ?)"
            )
            params += (keep_metrics,)
        return where, params
    if "start" in cols:
        if "end" in cols:
            return 'WHERE start < ? AND coalesce("end", start + 1) > ?', (t1, t0)
        return "WHERE start >= ? AND start < ?", (t0, t1)
    if "timestamp" in cols:
        return "WHERE timestamp >= ? AND timestamp < ?", (t0, t1)
    return "", ()


def _keep_used_strings(db: sqlite_utils.Database, tables: dict, columns: dict, drop: set) -> None:
    parts = []
    for name in tables:
        if name in drop or name == "StringIds" or name.startswith("ENUM_"):
            continue
        for col, typ in columns.get(name, {}).items():
            if typ == "INTEGER" and _STRING_COLUMN.search(col):
                parts.append(f'SELECT "{col}" AS id FROM main."{name}"')
    if not parts:
        db.execute("INSERT INTO main.StringIds SELECT * FROM src.StringIds")
        return
    used = " UNION ".join(parts)
    db.execute(f"INSERT INTO main.StringIds SELECT * FROM src.StringIds WHERE id IN ({used})")
