"""GPU operations (kernels, memcpy, memset) joined with the CUDA API call that launched them.

The launch is found by joining ``CUPTI_ACTIVITY_KIND_RUNTIME`` on ``correlationId`` within the
process (runtime rows carry ``globalTid``; the process is the thread id with its low 24 bits
cleared). Operations without a runtime record (tracing of the API off, or the call fell
outside the capture) fall back to their GPU start as launch time and have no launching thread.

Rows that cannot be placed or summed are set aside, counted and reported (issue 9, d04/d18),
never used: a NULL ``start`` or ``end``, a NULL ``globalPid``, ``end < start``, negative
``bytes``, ``bytes`` of :data:`MAX_PLAUSIBLE_BYTES` or more (a forged 9.2e18 would wrap the
int64 sums), and copies faster than any link or memory can move bytes (:data:`MAX_PLAUSIBLE_GBPS`
across a link, :data:`MAX_PLAUSIBLE_DEVICE_GBPS` within a device: 1e15 B in 0.25 ms would
read as 4e6 GB/s). The counts land in ``Export.set_aside`` under ``KIND_REASON`` keys
(:data:`SET_ASIDE_REASONS`); a table whose every row is set aside is an error.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.trace.export import Export, quote_ident
from tracekit.errors import TracekitError
from tracekit.vocab import global_pid_expr as global_pid

#: One copy or memset of this many bytes or more (1 PB, 1e15 B) is not real: no GPU or host
#: holds that much; such rows are set aside, which also keeps the byte sums far from int64's end.
MAX_PLAUSIBLE_BYTES = 10**15
#: A copy across a link (host <-> device, peer to peer) faster than this (GB/s = bytes per ns,
#: as tracekit computes it: bytes / max(duration, 1 ns)) is not real: PCIe 6 x16 moves 128 GB/s
#: per direction, NVLink-C2C 450; set aside.
MAX_PLAUSIBLE_GBPS = 10_000
#: The same bound for a copy within one device (D2D: HBM, 2.4 TB/s on an H200): set aside above it.
MAX_PLAUSIBLE_DEVICE_GBPS = 100_000

#: Why a GPU-operation row is set aside, in the order tested (a row counts under the first):
#: reason -> the words of the report.
SET_ASIDE_REASONS = {
    "without_time": "NULL start or end",
    "without_process": "NULL globalPid",
    "end_before_start": "end before start",
    "negative_bytes": "negative bytes",
    "implausible_bytes": f"bytes of {MAX_PLAUSIBLE_BYTES:.0e} or more",
    "implausible_rate": f"copies faster than {MAX_PLAUSIBLE_GBPS:,} GB/s across a link "
                        f"({MAX_PLAUSIBLE_DEVICE_GBPS:,} GB/s within a device)",
}
_TABLES = {"kernel": "CUPTI_ACTIVITY_KIND_KERNEL", "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
           "memset": "CUPTI_ACTIVITY_KIND_MEMSET"}

#: Columns of :func:`load_gpu_ops`.
GPU_OP_COLUMNS = {
    "kind": "kernel | memcpy | memset (Enum, see KINDS)",
    "start": "GPU start, ns",
    "end": "GPU end, ns",
    "global_pid": "process (nsys globalPid)",
    "device": "deviceId",
    "stream": "streamId",
    "correlation_id": "CUPTI correlationId",
    "bytes": "bytes moved or set (0 for kernels)",
    "direction": "H2D, D2H, D2D, P2P, ... for memcpy; null otherwise",
    "src_kind": "memcpy source memory kind (pageable, pinned, device, ...)",
    "dst_kind": "memcpy destination memory kind",
    "name_id": "kernel demangledName / shortName string id (null for copies)",
    "launch": "start of the launching CUDA API call, ns (GPU start when unknown)",
    "api_end": "end of the launching CUDA API call, ns (null when unknown)",
    "api_name_id": "string id of the API function (e.g. cudaMemcpyAsync)",
    "launch_tid": "globalTid of the launching thread (null when unknown)",
    "comm": "communication kernel (NCCL and the like, by name; tracekit.analyze.model.communication)",
    "collective": "collective kind of a communication kernel (AllReduce, SendRecv, ...), else null",
}

#: ``kind``'s categories. ``kind``, ``direction``, ``src_kind``, ``dst_kind`` and ``collective`` are
#: held as :class:`polars.Enum` (one byte a row instead of a 16-byte string view: 5 columns, about
#: 75 bytes an op, 22 MiB on a 10 GB trace; issue 24), each with its categories in lexical order, so
#: that a sort, ``min``/``max`` or ``unique().sort()`` orders them as it orders the strings. They
#: compare with string literals as strings do (a literal that is no category matches no row); what
#: leaves the model (a frame a section returns, the API's frames, the report) carries strings:
#: :func:`with_strings`.
KINDS = pl.Enum(["kernel", "memcpy", "memset"])
#: the columns of :data:`GPU_OP_COLUMNS` held as Enum
ENUM_COLUMNS = ("kind", "direction", "src_kind", "dst_kind", "collective")


def label_enum(labels: dict) -> pl.Enum:
    """The Enum of the distinct values of ``labels`` ({id: label}), in lexical order."""
    return pl.Enum(sorted({str(v) for v in labels.values()}))


def with_strings(frame):
    """``frame`` (a frame or lazy frame of rows of :func:`load_gpu_ops`, any of its columns) with
    its :data:`ENUM_COLUMNS` cast back to String (the types readers outside the model expect:
    ``.str`` methods, joins and concatenations with string columns); the other columns untouched."""
    schema = frame.collect_schema() if isinstance(frame, pl.LazyFrame) else frame.schema
    cast = [c for c in ENUM_COLUMNS if c in schema and isinstance(schema[c], pl.Enum)]
    return frame.with_columns(pl.col(cast).cast(pl.String)) if cast else frame


_SCHEMA = {
    "kind": pl.String,
    "start": pl.Int64,
    "end": pl.Int64,
    "global_pid": pl.Int64,
    "device": pl.Int64,
    "stream": pl.Int64,
    "correlation_id": pl.Int64,
    "bytes": pl.Int64,
    "copy_kind": pl.Int64,
    "src_kind_id": pl.Int64,
    "dst_kind_id": pl.Int64,
    "name_id": pl.Int64,
}


def _load_table(export: Export, table: str, kind: str) -> pl.DataFrame:
    cols = set(export.columns(table))
    if not cols:
        return pl.DataFrame(schema=_SCHEMA)

    def col(name: str, fallback: str = "NULL") -> str:
        return f'"{name}"' if name in cols else fallback

    name = col("demangledName", col("shortName"))
    sql = f"""SELECT '{kind}' AS kind, start, "end", {col('globalPid')} AS global_pid,
                     {col('deviceId')} AS device, {col('streamId')} AS stream,
                     {col('correlationId')} AS correlation_id, {col('bytes', '0')} AS bytes,
                     {col('copyKind')} AS copy_kind, {col('srcKind')} AS src_kind_id,
                     {col('dstKind')} AS dst_kind_id,
                     {name if kind == 'kernel' else 'NULL'} AS name_id
              FROM {quote_ident(table)}"""
    # read once per model (the sorted ops are a copy): not kept in the export's memo of repeated
    # queries (on a 2.5 GB trace, 7 MiB held for the whole run)
    return export.query(sql, schema=_SCHEMA, memo=False)


def load_gpu_ops(export: Export) -> pl.DataFrame:
    """Kernels, memcpys and memsets of the whole trace, one row each, sorted by GPU start.

    Returns a frame with the columns of :data:`GPU_OP_COLUMNS` (all times in ns, ``bytes`` in
    bytes). An export without CUDA tables gives an empty frame; callers that need GPU work
    call ``export.require("CUPTI_ACTIVITY_KIND_KERNEL", ...)`` first.

    Rows set aside (see the module doc) are counted in ``export.set_aside``
    (``{KIND}_{REASON}``: int, every kind and reason present). Raises :class:`TracekitError`
    when every row of a non-empty table is set aside, or when the bytes of all operations
    sum beyond what int64 holds.
    """
    parts = [set_aside(export, _load_table(export, table, kind), kind) for kind, table in _TABLES.items()]
    # sorted by GPU start now, not at the end: the sort's copy is one contiguous frame, so the
    # columns added below need no rechunk of the others (a whole copy of the ops at 16x: +52 MiB)
    ops = _sorted_by_start(parts)
    del parts
    if ops.height and float(ops["bytes"].cast(pl.Float64).sum()) >= 2.0**62:
        raise TracekitError(
            f"{export.path}: the copies and memsets add up to more than 4.6e18 bytes, beyond what "
            "tracekit's int64 sums hold; the export is damaged or was edited"
        )
    copy_labels = export.enum_labels("copy")
    mem_labels = export.enum_labels("mem")
    mem = label_enum(mem_labels)  # (one Enum for both sides: the host side is picked from either)
    ops = ops.with_columns(
        kind=pl.col("kind").cast(KINDS),
        direction=pl.col("copy_kind").replace_strict(copy_labels, default=None, return_dtype=label_enum(copy_labels)),
        src_kind=pl.col("src_kind_id").replace_strict(mem_labels, default=None, return_dtype=mem),
        dst_kind=pl.col("dst_kind_id").replace_strict(mem_labels, default=None, return_dtype=mem),
        bytes=pl.col("bytes").fill_null(0),
    )
    runtime = load_runtime(export, launches_only=True, ids=ops["correlation_id"].drop_nulls().unique())
    api = ["api_start", "api_end", "api_name_id", "launch_tid"]
    if runtime.height:
        # the launching call of each op by (process, correlation id), the api columns then put
        # beside the ops (no copy of the ops' other columns)
        row = _launch_rows(ops, runtime)
        runtime = runtime.select(api)
        for c in api:  # (each runtime column let go once gathered: not all four held beside the ops)
            ops = ops.with_columns(runtime.get_column(c).gather(row))
            runtime = runtime.drop(c)
        del runtime, row  # (not held while the kernels are annotated: 15 MiB at 16x the shared trace)
    else:
        ops = ops.with_columns(pl.lit(None, pl.Int64).alias(c) for c in api)
    ops = ops.with_columns(launch=pl.coalesce("api_start", "start"))
    from tracekit.analyze.model.communication import annotate

    kernel_ids = ops.select(pl.col("name_id").filter(pl.col("kind") == "kernel"))["name_id"]
    kernel_ids = kernel_ids.drop_nulls().unique().to_list()  # (the one column: no copy of the kernel rows)
    ops = annotate(ops, export.strings(kernel_ids))
    return ops.select(list(GPU_OP_COLUMNS))


def _sorted_by_start(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The rows of ``parts`` (frames of one schema) in one frame sorted by ``start``, the order
    ``pl.concat(parts).sort("start")`` gives, built a column at a time: each column of ``parts``
    is gathered into its sorted place and then let go, so that the sort holds the frames and
    one column more, not two copies of every column (+65 MiB at 16x the shared trace; issue 24).
    Empties ``parts``."""
    order = pl.concat([p.select("start") for p in parts], rechunk=False).get_column("start").arg_sort()
    cols = []
    for name in parts[0].columns:
        cols.append(pl.concat([p.get_column(name) for p in parts], rechunk=False).gather(order).rechunk())
        parts[:] = [p.drop(name) for p in parts]
    parts.clear()
    return pl.DataFrame(cols)


#: ops matched to their launches at a time (:func:`_launch_rows`)
_LAUNCH_BLOCK = 32_768


def _launch_rows(ops: pl.DataFrame, runtime: pl.DataFrame) -> pl.Series:
    """Per op, the row of ``runtime`` (unique on ``global_pid, correlation_id``) with its
    process and correlation id, null for none: what a left join on the two keys finds, from a
    binary search per process over the runtime's sorted ids (a hash join of 320k rows held
    ~95 MiB at 16x the shared trace; this holds the runtime's two key columns sorted and a few
    arrays of :data:`_LAUNCH_BLOCK` ops; issue 24)."""
    r_pid = runtime["global_pid"].to_numpy()
    r_cid = runtime["correlation_id"].to_numpy()
    order = np.lexsort((r_cid, r_pid))  # by process, then id
    r_pid, r_cid = r_pid[order], r_cid[order]
    pids = np.unique(r_pid)
    # (the processes as numpy gives them: a runtime row without a thread makes them floats, NaN for
    # that row, which no op's process equals)
    bounds = [(p, np.searchsorted(r_pid, p, side="left"), np.searchsorted(r_pid, p, side="right")) for p in pids]
    del r_pid
    row = np.full(ops.height, -1, dtype=np.int64)
    for lo in range(0, ops.height, _LAUNCH_BLOCK):
        o_pid = ops["global_pid"].slice(lo, _LAUNCH_BLOCK).fill_null(-1).to_numpy()
        o_cid = ops["correlation_id"].slice(lo, _LAUNCH_BLOCK)
        o_ok = o_cid.is_not_null().to_numpy()
        o_cid = o_cid.fill_null(0).to_numpy()
        for pid, a, b in bounds:
            mine = np.flatnonzero((o_pid == pid) & o_ok)
            pos = a + np.searchsorted(r_cid[a:b], o_cid[mine])
            hit = pos < b
            hit[hit] = r_cid[pos[hit]] == o_cid[mine[hit]]
            row[lo + mine[hit]] = order[pos[hit]]
    out = pl.Series("row", row)
    return out.set(out < 0, None)


def set_aside(export: Export, ops: pl.DataFrame, kind: str) -> pl.DataFrame:
    """``ops`` (rows of one table, :func:`_load_table`) without the rows that cannot be used,
    counting them per reason in ``export.set_aside[f"{kind}_{reason}"]`` (every reason of
    :data:`SET_ASIDE_REASONS` that applies to ``kind``; ``implausible_rate`` to memcpys only).

    Raises :class:`TracekitError` naming the table and the columns when every row is set aside.
    """
    b = pl.col("bytes").fill_null(0)
    conds = {
        "without_time": pl.col("start").is_null() | pl.col("end").is_null(),
        "without_process": pl.col("global_pid").is_null(),
        "end_before_start": pl.col("end") < pl.col("start"),
        "negative_bytes": b < 0,
        "implausible_bytes": b >= MAX_PLAUSIBLE_BYTES,
    }
    if kind == "memcpy":  # GB/s = bytes per ns; within a device (D2D) HBM's bound
        d2d = [i for i, label in export.enum_labels("copy").items() if label == "D2D"]
        bound = pl.when(pl.col("copy_kind").is_in(d2d)).then(MAX_PLAUSIBLE_DEVICE_GBPS).otherwise(MAX_PLAUSIBLE_GBPS)
        conds["implausible_rate"] = b.cast(pl.Float64) / (pl.col("end") - pl.col("start")).clip(lower_bound=1) > bound
    reason = pl.lit(None, pl.String)
    for name in reversed(list(conds)):  # the first matching condition wins
        reason = pl.when(conds[name]).then(pl.lit(name)).otherwise(reason)
    tagged = ops.with_columns(_reason=reason)
    counts = dict.fromkeys(conds, 0)
    for name, n in tagged.group_by("_reason").len().iter_rows():
        if name is not None:
            counts[name] = int(n)
    for name, n in counts.items():
        export.set_aside[f"{kind}_{name}"] = n
    dropped = sum(counts.values())
    if ops.height and dropped == ops.height:
        why = ", ".join(f"{SET_ASIDE_REASONS[k]}: {n:,}" for k, n in counts.items() if n)
        raise TracekitError(
            f"{export.path}: every one of the {ops.height:,} rows of {_TABLES[kind]} is unusable "
            f"({why}); no GPU operation of this kind can be placed in time; the export is damaged "
            "or was edited: export it again with `nsys export --type sqlite REPORT.nsys-rep`"
        )
    return tagged.filter(pl.col("_reason").is_null()).drop("_reason") if dropped else ops


_RUNTIME_SCHEMA = {
    "correlation_id": pl.Int64,
    "api_start": pl.Int64,
    "api_end": pl.Int64,
    "api_name_id": pl.Int64,
    "launch_tid": pl.Int64,
}


def _runtime_query(export: Export) -> tuple[str, tuple, dict] | None:
    """``(sql, params, schema)`` of the runtime rows :func:`load_runtime` reads (in rowid chunks,
    :data:`_CHUNK_ROWS` each); None when the table lacks the columns to join on."""
    cols = set(export.columns("CUPTI_ACTIVITY_KIND_RUNTIME"))
    if not {"correlationId", "globalTid", "start"} <= cols:
        return None
    name = "nameId" if "nameId" in cols else "NULL"
    sql = f"""SELECT correlationId, start, "end", {name}, globalTid
            FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId > 0"""
    return (sql, (), _RUNTIME_SCHEMA)


#: CUPTI_ACTIVITY_KIND_RUNTIME rowids per chunk of :func:`load_runtime`' read: at most three
#: chunks are held at a time, each cut to the launches at once (issue 24: the rows held do not
#: grow with the calls that launched nothing, three quarters of a DeepSpeed trace's calls)
_CHUNK_ROWS = 32_768


def _chunk_args(q: tuple[str, tuple, dict]) -> dict:
    sql, params, schema = q
    return {"sql": sql, "params": params, "schema": schema, "table": "CUPTI_ACTIVITY_KIND_RUNTIME",
            "chunk_rows": _CHUNK_ROWS, "workers": 1}


def _launch_ids(export: Export) -> pl.Series:
    """The correlation ids of every kernel, memcpy and memset of the export (any process)."""
    parts = [export.query(f"SELECT correlationId AS correlation_id FROM {quote_ident(t)}",
                          schema={"correlation_id": pl.Int64}, memo=False)["correlation_id"]
             for t in _TABLES.values() if "correlationId" in export.columns(t)]
    return pl.concat(parts).drop_nulls().unique() if parts else pl.Series("correlation_id", [], pl.Int64)


def prefetch_runtime(export: Export, launches_only: bool = True) -> bool:
    """Start reading the first chunks of the rows of :func:`load_runtime` in a background thread
    (the largest table the phase model reads after NVTX_EVENTS), so that the scan overlaps the
    other reads. The same chunks serve ``launches_only`` or not (the filter is applied as they
    are consumed); False when there is nothing to start."""
    q = _runtime_query(export)
    return q is not None and export.prefetch_chunks(**_chunk_args(q))


def load_runtime(export: Export, launches_only: bool = False, ids: pl.Series | None = None) -> pl.DataFrame:
    """CUDA runtime calls that have a correlation id: ``correlation_id, api_start, api_end,
    api_name_id, launch_tid, global_pid`` (ns; Int64). Calls with correlation id 0 launch
    nothing. ``launches_only``: only the calls whose correlation id is one of a kernel, memcpy
    or memset of the export (what :func:`load_gpu_ops` joins; any call sharing such an id
    is kept, so the join finds what it would find among all the calls); ``ids``: those
    correlation ids when the caller has them (else read from the GPU tables).

    The table is read in rowid chunks, each filtered before the next is read (a correlation id
    repeated within a process keeps its first call in rowid order)."""
    q = _runtime_query(export)
    if q is None:
        return pl.DataFrame(schema=_RUNTIME_SCHEMA | {"global_pid": pl.Int64})
    if launches_only and ids is None:
        ids = _launch_ids(export)
    wanted = None if not launches_only else ids.implode()
    pieces = []
    for chunk in export.query_chunks(**_chunk_args(q)):
        pieces.append(chunk if wanted is None else chunk.filter(pl.col("correlation_id").is_in(wanted)))
        del chunk
    rt = pl.concat(pieces) if pieces else pl.DataFrame(schema=_RUNTIME_SCHEMA)
    del pieces
    rt = rt.with_columns(global_pid=global_pid(pl.col("launch_tid")))
    # correlation ids are unique per process; keep the first should an export repeat one (the
    # ids alone checked first: a hash of one Int64 column, not of 320k structs at 16x, +69 MiB)
    if rt["correlation_id"].n_unique() < rt.height:
        rt = rt.unique(subset=["global_pid", "correlation_id"], keep="first", maintain_order=True)
    return rt
