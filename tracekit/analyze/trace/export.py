"""Open an Nsight Systems SQLite export read-only and load the columns an analysis needs.

The export is opened through the SQLite URI ``file:PATH?mode=ro``: tracekit never writes to a
user's trace (a WAL-mode trace with pending changes is read from a private copy, removed at
:meth:`Export.close`): :mod:`tracekit.analyze.trace.sqlite_file`. Rows are fetched into polars by
:mod:`tracekit.analyze.trace.fetch` (ADBC or sqlite3), a large table in rowid ranges on worker
threads by :mod:`tracekit.analyze.trace.chunks`; this module holds the :class:`Export` that runs them.

Reading is defensive (issue 9): text that is not valid UTF-8 is decoded with U+FFFD
replacement characters; identifiers are quoted; a table tracekit reads that lacks one of the
columns of :data:`REQUIRED_COLUMNS`, a value of the wrong type (text in an integer column), a
damaged page and a locked database are each reported as one line naming the table, column or
condition (:class:`~tracekit.errors.TracekitError`, exit code 2). Tables and columns are
resolved through ``sqlite_master`` and ``PRAGMA table_info``; a table the trace lacks loads as
an empty frame (nsys creates tables lazily, so a missing table means "nothing recorded"), until an analysis calls
:meth:`Export.require`, which raises :class:`~tracekit.errors.MissingDataError` naming the
table and the nsys option that records it.

Schema version: ``META_DATA_EXPORT`` (nsys >= 2023.3) or ``EXPORT_META_DATA`` (older) hold
``EXPORT_SCHEMA_VERSION``; exports with neither table are reported as ``"pre-2022"``.

Over 500 lines because it is one class: opening and checking, the schema, the query path (memo,
cache, pending reads) and the reads ahead on threads share one connection's state; what stands
alone is in sqlite_file.py, fetch.py and chunks.py.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from tracekit.analyze.trace import enums, fetch
from tracekit.analyze.trace.chunks import _ChunkReader, _rowid_split
from tracekit.analyze.trace.sqlite_file import (
    _REEXPORT,
    _check_file,
    _connect,
    _open_uri,
    db_error,
    quote_ident,
)
from tracekit.errors import MissingDataError, TracekitError
from tracekit.userfiles import shown

# SQLite declared types -> polars dtypes for the columns tracekit loads.
_DTYPES = {"INTEGER": pl.Int64, "REAL": pl.Float64, "TEXT": pl.String, "": pl.String}

#: Columns that every Nsight Systems export tracekit knows has in these tables (all public
#: exports in ``shared/traces/public`` and the fixtures have them, from schema pre-2022 to
#: 3.25); a present table without one of them is damaged or edited, and is reported at open.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "StringIds": ("id", "value"),
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "globalPid", "deviceId", "correlationId"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "globalPid", "deviceId", "correlationId", "bytes", "copyKind"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "globalPid", "deviceId", "bytes"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId"),
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid"),
    "GPU_METRICS": ("timestamp", "metricId", "value"),
    "TARGET_INFO_GPU_METRICS": ("metricId", "metricName"),
    "CUDA_GPU_MEMORY_USAGE_EVENTS": ("start", "globalPid", "deviceId", "bytes", "memKind", "memoryOperationType"),
}


@dataclass
class Export:
    """A read-only view of one nsys SQLite export.

    Attributes:
        path: the file.
        tables: table name -> {column name: declared SQLite type}, from ``sqlite_master``.
        schema_version: ``EXPORT_SCHEMA_VERSION`` (e.g. ``"3.20.3"``) or ``"pre-2022"``.
        nsys_version: ``EXPORT_PRODUCT_VERSION`` when the export records it, else ``None``.
        first_iteration: index of the first iteration in the file: 0, or the first iteration
            kept by ``tracekit trim`` (read from its ``TRACEKIT_TRIM`` table).

    Raises (from :meth:`open`): :class:`TracekitError` (exit code 2) for a missing file, a
    non-SQLite file, an xz/gzip/zstd-compressed export, an ``.nsys-rep``/``.qdrep`` report, an
    nvprof database, an SQLite file that is not an nsys export, and a truncated or corrupt file.
    """

    path: Path
    conn: sqlite3.Connection
    tables: dict[str, dict[str, str]]
    schema_version: str
    nsys_version: str | None
    first_iteration: int = 0
    _cache: dict = field(default_factory=dict, repr=False)
    #: Parquet cache of query results (:class:`tracekit.analyze.trace.cache.TraceCache`), or None.
    cache: object = field(default=None, repr=False)
    _adbc: object = field(default=None, repr=False)
    _pending: dict = field(default_factory=dict, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)
    #: SQLite URI the connections use (the trace, or a private copy of a WAL-mode trace).
    uri: str = field(default="", repr=False)
    #: temporary folder of the private copy of a WAL-mode trace (removed at :meth:`close`).
    _private: object = field(default=None, repr=False)
    #: rows set aside while loading, by reason (e.g. ``memcpy_without_time``), filled by the
    #: loaders (:func:`tracekit.analyze.model.gpu_ops.load_gpu_ops`, :func:`tracekit.analyze.model.nvtx.load_ranges`).
    set_aside: dict = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | Path, cache: "bool | object" = False) -> "Export":
        """Open ``path`` read-only and recognise it as an nsys export (see class doc).

        ``cache``: True keeps a Parquet cache of every query beside the trace
        (:mod:`tracekit.analyze.trace.cache`); a :class:`~tracekit.analyze.trace.cache.TraceCache` uses that
        one; False (the default) reads the trace every time.
        """
        path = Path(path)
        _check_file(path)
        uri, private = _open_uri(path)
        try:
            conn = _connect(uri, path)
            names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")]
            tables: dict[str, dict[str, str]] = {}
            for name in names:
                info = conn.execute(f"PRAGMA table_info({quote_ident(name)})").fetchall()
                tables[str(name)] = {str(r[1]): str(r[2] or "").upper() for r in info}
        except BaseException:
            if private is not None:
                private.cleanup()
            raise
        exp = cls(path=path, conn=conn, tables=tables, schema_version="pre-2022", nsys_version=None,
                  uri=uri, _private=private)
        try:
            if "StringTable" in tables and "StringIds" not in tables:
                raise TracekitError(
                    f"{shown(path)}: this is an nvprof database, not an Nsight Systems export; "
                    "profile with `nsys profile` (or `tracekit capture`) and export to SQLite"
                )
            if "StringIds" not in tables:
                raise TracekitError(
                    f"{shown(path)}: SQLite file is not an Nsight Systems export (no StringIds table); "
                    "pass the .sqlite written by `nsys export --type sqlite`"
                )
            exp._check_columns()
            exp._read_metadata()
            exp._check_readable()
        except BaseException:
            exp.close()
            raise
        if cache is True:
            from tracekit.analyze.trace.cache import TraceCache

            cache = TraceCache(path)
        exp.cache = cache or None
        return exp

    def _sibling(self) -> "Export":
        """Another connection to the same file (same URI, private copy included), without cache
        or memo: for reads in background threads."""
        return Export(path=self.path, conn=_connect(self.uri, self.path), tables=self.tables,
                      schema_version=self.schema_version, nsys_version=self.nsys_version,
                      first_iteration=self.first_iteration, uri=self.uri)

    def _check_columns(self) -> None:
        """A table of :data:`REQUIRED_COLUMNS` that lacks one of its columns is an error."""
        for table, needed in REQUIRED_COLUMNS.items():
            have = self.tables.get(table)
            if have is None:
                continue
            for col in needed:
                if col not in have:
                    raise TracekitError(
                        f"{shown(self.path)}: {table} has no column {col} (dropped or renamed: the export "
                        f"is damaged or was edited); {_REEXPORT}"
                    )

    def _read_metadata(self) -> None:
        if "TRACEKIT_TRIM" in self.tables and {"name", "value"} <= set(self.tables["TRACEKIT_TRIM"]):
            # a cut made by `tracekit trim`: keep iteration numbers
            meta = dict(self.conn.execute("SELECT name, value FROM TRACEKIT_TRIM").fetchall())
            value = meta.get("iterations")
            if value is not None:
                m = re.fullmatch(r"\s*(\d+)(?:\s*-\s*\d+)?\s*", str(value))
                if not m:
                    raise TracekitError(
                        f"{shown(self.path)}: TRACEKIT_TRIM says iterations = {str(value)[:60]!r}, not A-B "
                        "(the table was edited, or not written by `tracekit trim`); cut the trace again "
                        "with `tracekit trim`"
                    )
                self.first_iteration = int(m.group(1))
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if table in self.tables and {"name", "value"} <= set(self.tables[table]):
                meta = dict(self.conn.execute(f"SELECT name, value FROM {quote_ident(table)}").fetchall())
                version = meta.get("EXPORT_SCHEMA_VERSION")
                product = meta.get("EXPORT_PRODUCT_VERSION")
                self.schema_version = str(version) if version else "unknown"
                self.nsys_version = str(product) if product is not None else None
                return

    def _check_readable(self) -> None:
        """Read the last row of the main tables and every row of the small ones: a truncated or
        damaged file fails here (one line), not mid-analysis."""
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "GPU_METRICS", "StringIds"):
            if table in self.tables:
                self.conn.execute(f"SELECT * FROM {quote_ident(table)} ORDER BY rowid DESC LIMIT 1")
        for table in _SMALL_TABLES:
            if table in self.tables:
                self.conn.execute(f"SELECT * FROM {quote_ident(table)} LIMIT 10000")
                self._quick_check(table)

    def _quick_check(self, table: str) -> None:
        """``PRAGMA quick_check(TABLE)`` (SQLite >= 3.33; about 1 ms for a small table): a damaged
        page is an error even where reading its rows happens to succeed (seen with the SQLite
        build that the Arrow driver loads into the process, depending on which library is bound
        first). Older SQLite, which cannot check one table, skips it."""
        try:
            rows = sqlite3.Connection.execute(self.conn, f"PRAGMA quick_check({quote_ident(table)})").fetchall()
        except sqlite3.DatabaseError as exc:
            if "malformed" in str(exc) or "corrupt" in str(exc):
                raise db_error(self.path, exc) from None
            return
        if rows and rows[0][0] != "ok":
            raise db_error(self.path, sqlite3.DatabaseError("database disk image is malformed")) from None

    def close(self) -> None:
        """Close the SQLite connection (and the Arrow reader's, when one was opened); remove the
        private copy of a WAL-mode trace."""
        for pending in list(self._pending.values()):
            if isinstance(pending, _ChunkReader):
                pending.close()
        self._pending.clear()
        self.conn.close()
        if self._adbc is not None:
            for handle in reversed(self._adbc):
                try:
                    handle.close()
                except Exception:
                    pass
            self._adbc = None
        if self._private is not None:
            self._private.cleanup()
            self._private = None

    def __enter__(self) -> "Export":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ schema
    def has(self, table: str, min_rows: int = 0) -> bool:
        """True when the export has ``table`` (and, if ``min_rows`` > 0, at least that many rows)."""
        if table not in self.tables:
            return False
        if min_rows <= 0:
            return True
        n = self.conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM {quote_ident(table)} LIMIT ?)", (min_rows,))
        return n.fetchone()[0] >= min_rows

    def columns(self, table: str) -> list[str]:
        """Column names of ``table`` (empty list when the table is absent)."""
        return list(self.tables.get(table, {}))

    def require(self, table: str, purpose: str) -> None:
        """Raise :class:`MissingDataError` unless ``table`` exists and has rows.

        The message names the file (the path as given for a CUDA table, else its name), the
        table, what needed it (``purpose``) and the nsys option that records it
        (:data:`tracekit.analyze.trace.enums.RECORDED_BY`);
        for a CUDA table, what the export holds and whether CUDA tracing was on
        (:func:`tracekit.analyze.trace.recording.missing_cuda_advice`: ``-t cuda`` is suggested
        only when it was off or unknown).
        """
        if not self.has(table, min_rows=1):
            option = enums.RECORDED_BY.get(table, "the matching -t option")
            state = "has no rows in" if table in self.tables else "is missing from"
            if option == "-t cuda" and table != "TARGET_INFO_GPU":
                from tracekit.analyze.trace.recording import missing_cuda_advice

                raise MissingDataError(f"{shown(self.path)}: {table} {state} this trace, and {purpose} needs it; "
                                       + missing_cuda_advice(self))
            raise MissingDataError(
                f"{shown(self.path)}: {table} {state} this trace, and {purpose} needs it; "
                f"record it with `nsys profile {option}`"
            )

    def capture_end(self) -> int | None:
        """End of the capture in ns (``ANALYSIS_DETAILS.stopTime``), or None when not recorded."""
        if "stopTime" not in self.tables.get("ANALYSIS_DETAILS", {}):
            return None
        row = self.conn.execute("SELECT max(stopTime) FROM ANALYSIS_DETAILS").fetchone()
        if not row or row[0] is None:
            return None
        if not isinstance(row[0], int):
            raise TracekitError(f"{shown(self.path)}: ANALYSIS_DETAILS.stopTime holds {row[0]!r}, not an integer "
                                f"time in ns; {_REEXPORT}")
        return row[0]

    # ------------------------------------------------------------------ loading
    def load(
        self,
        table: str,
        columns: list[str] | dict[str, str],
        where: str | None = None,
        params: tuple = (),
    ) -> pl.DataFrame:
        """Load ``columns`` of ``table`` into a polars frame.

        ``columns`` is a list of column names or a mapping {output name: SQL expression}.
        Columns that the table lacks load as nulls (older exports miss a few); a table the
        export lacks gives an empty frame with the requested columns. Integer columns are
        ``Int64``; ``where`` is an SQL condition with ``?`` placeholders bound to ``params``.
        """
        cols = dict(zip(columns, columns)) if isinstance(columns, list) else dict(columns)
        present = self.tables.get(table)
        schema = {}
        exprs = []
        for out, expr in cols.items():
            if present is not None and expr in present:
                dtype = _DTYPES.get(present[expr], pl.String)
                exprs.append(f"{quote_ident(expr)} AS {quote_ident(out)}")
            elif present is not None and expr not in present and _is_plain_name(expr):
                dtype = pl.Int64
                exprs.append(f"NULL AS {quote_ident(out)}")
            else:  # an SQL expression: typed as integer unless cast otherwise by the caller
                dtype = pl.Int64
                exprs.append(f"{expr} AS {quote_ident(out)}")
            schema[out] = dtype
        if present is None:
            return pl.DataFrame(schema=schema)
        sql = f"SELECT {', '.join(exprs)} FROM {quote_ident(table)}"
        if where:
            sql += f" WHERE {where}"
        return self.query(sql, params, schema)

    def query(self, sql: str, params: tuple = (), schema: dict | None = None, memo: bool = True) -> pl.DataFrame:
        """Run ``sql`` on the export and return the rows as a polars frame with ``schema``.

        ``schema`` ({name: polars dtype}) names the result columns in order and fixes their
        types; without it, names come from the SQL and types are inferred. With a cache
        (:attr:`cache`), a query already answered for this trace is read from Parquet; a
        result of at most 200,000 rows is also kept in memory for repeats of the same query
        (``memo=False``: not kept, for a table read once per run).
        Rows are fetched through the ADBC SQLite driver straight into Arrow when it is
        installed (:func:`tracekit.analyze.trace.fetch.reader`), else through the standard library's ``sqlite3``; both
        give equal frames. Raises :class:`TracekitError` when SQLite fails.
        """
        mkey = _prefetch_key(sql, params, schema)
        if mkey in self._memo:  # asked before in this run (several analyses share small tables)
            return self._memo[mkey]
        frame = self._query_uncached_memo(sql, params, schema, mkey)
        if memo and frame.height <= _MEMO_MAX_ROWS:
            self._memo[mkey] = frame
        return frame

    def _query_uncached_memo(self, sql: str, params: tuple, schema: dict | None, mkey: tuple) -> pl.DataFrame:
        key = None
        if self.cache is not None:
            key = self.cache.query_key(sql, params, schema)
            hit = self.cache.get_frame(key)
            if hit is not None:
                return hit
        frame = None
        pending = self._pending.pop(mkey, None) if self._pending else None
        if pending is not None:
            frame = pending.result()  # re-raises what the background read raised
        if frame is None:
            frame = self._read(sql, params, schema)
        if key is not None:
            self.cache.put_frame(key, frame)
        return frame

    def _read(self, sql: str, params: tuple, schema: dict | None) -> pl.DataFrame:
        """The rows of ``sql`` from the trace itself: ADBC when available, else sqlite3 (no
        cache, no memo)."""
        frame = fetch.query_adbc(self, sql, params, schema) if fetch.reader() == "adbc" else None
        return frame if frame is not None else fetch.query_sqlite3(self.conn, self.path, sql, params, schema)

    def query_chunks(self, sql: str, params: tuple = (), schema: dict | None = None, table: str | None = None,
                     chunk_rows: int = 2_000_000, workers: int = 1):
        """The rows of ``sql`` as a sequence of frames, one per range of ``chunk_rows`` rowids
        of ``table``, in rowid order: concatenated, the frames are the rows one
        :meth:`query` returns, in its order (a rowid table is scanned in rowid order), but at
        most ``workers + 2`` chunks are held at a time, so a caller that reduces each chunk
        before asking for the next needs memory for a few chunks, not for the table.

        ``sql`` must be a plain ``SELECT ... FROM table WHERE condition`` (no join, subquery,
        grouping, order or limit) and ``schema`` given; otherwise the whole result is returned
        as one frame (:meth:`query`). ``workers`` threads read the next chunks while the
        caller works on the current one, each on its own read-only connection. With a cache,
        each chunk is a cache entry of its own (read from it when present, stored when read);
        chunks are never kept in the memo. A reader started by :meth:`prefetch_chunks` with
        the same arguments is taken over. Raises :class:`TracekitError` when SQLite fails
        (from the step that reads the failing chunk).
        """
        key = ("chunks", *_prefetch_key(sql, params, schema), table, chunk_rows)
        rd = self._pending.pop(key, None) if self._pending else None
        if rd is None:
            rd = self._chunk_reader(sql, params, schema, table, chunk_rows, workers)
        if rd is None:
            yield self.query(sql, params, schema)
            return
        try:
            yield from rd
        finally:
            rd.close()

    def prefetch_chunks(self, sql: str, params: tuple = (), schema: dict | None = None, table: str | None = None,
                        chunk_rows: int = 2_000_000, workers: int = 1) -> bool:
        """Start reading the first chunks of :meth:`query_chunks` (same arguments) in the
        background now, so that the scan overlaps work done before the chunks are asked for;
        at most ``workers + 2`` chunks are read ahead. Returns False, starting nothing, when
        such a read is pending already or the query cannot be split."""
        key = ("chunks", *_prefetch_key(sql, params, schema), table, chunk_rows)
        if key in self._pending:
            return False
        rd = self._chunk_reader(sql, params, schema, table, chunk_rows, workers)
        if rd is None:
            return False
        self._pending[key] = rd
        return True

    def _chunk_reader(self, sql, params, schema, table, chunk_rows, workers) -> "_ChunkReader | None":
        split = _rowid_split(sql, table) if table and schema is not None else None
        if split is None:
            return None
        lo = self.conn.execute(f"SELECT min(rowid) FROM {quote_ident(table)}").fetchone()[0]
        hi = self.conn.execute(f"SELECT max(rowid) FROM {quote_ident(table)}").fetchone()[0]
        if lo is None:
            return None
        step = max(1, int(chunk_rows))
        queries = [split.format(a=a, b=min(a + step, hi + 1) - 1) + " ORDER BY rowid" for a in range(lo, hi + 1, step)]
        return _ChunkReader(self, queries, tuple(params), schema, max(1, int(workers)))

    def prefetch(
        self, sql: str, params: tuple = (), schema: dict | None = None, table: str | None = None, parts: int = 1
    ) -> bool:
        """Start reading a (large) query in a background thread, on its own read-only connection.

        A later :meth:`query` with the same ``sql``, ``params`` and ``schema`` waits for that
        read instead of starting its own, so the scan overlaps the analysis work done
        meanwhile (SQLite and the Arrow reader release the GIL). Returns False, starting
        nothing, when the query is already cached, answered in this run or pending. A prefetch never consumed
        costs one scan and is dropped.

        With ``parts`` > 1, ``table`` and a ``schema``, a query of the form ``SELECT ... FROM
        table WHERE condition`` (no join, subquery, grouping, order or limit) is read as
        ``parts`` rowid ranges of ``table`` in parallel threads, each on its own connection,
        and the pieces are concatenated in rowid order: the rows a single scan returns, in
        its order, in a fraction of the time (a full scan of a table without a usable index
        is the slowest part of reading ``GPU_METRICS``). Other queries are read in one piece.
        """
        import threading
        from concurrent.futures import Future

        pkey = _prefetch_key(sql, params, schema)
        if pkey in self._pending or pkey in self._memo:
            return False
        if self.cache is not None and self.cache.has_frame(self.cache.query_key(sql, params, schema)):
            return False
        fut: Future = Future()

        split = _rowid_split(sql, table) if parts > 1 and table and schema is not None else None

        def one(query: str) -> pl.DataFrame:
            with self._sibling() as other:
                return other.query(query, params, schema)

        def run() -> None:
            try:
                if split is None:
                    fut.set_result(one(sql))
                    return
                with self._sibling() as other:  # one aggregate per query: SQLite then seeks, not scans
                    lo = other.conn.execute(f"SELECT min(rowid) FROM {quote_ident(table)}").fetchone()[0]
                    hi = other.conn.execute(f"SELECT max(rowid) FROM {quote_ident(table)}").fetchone()[0]
                if lo is None:
                    fut.set_result(one(sql))
                    return
                edges = [lo + (hi - lo + 1) * k // parts for k in range(parts)] + [hi + 1]
                queries = [split.format(a=edges[k], b=edges[k + 1] - 1) for k in range(parts)]
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(parts, thread_name_prefix="tracekit-prefetch") as pool:
                    pieces = list(pool.map(one, queries))
                fut.set_result(pl.concat(pieces, rechunk=True))
            except BaseException as exc:  # handed to the consumer
                fut.set_exception(exc)

        self._pending[pkey] = fut
        threading.Thread(target=run, name="tracekit-prefetch", daemon=True).start()
        return True

    def gpus(self) -> pl.DataFrame:
        """``TARGET_INFO_GPU``: ``device`` (id), ``name``, ``total_memory`` (bytes),
        ``bus_location``; empty when the export lacks the table."""
        return self.load("TARGET_INFO_GPU", {"device": "id", "name": "name", "total_memory": "totalMemory",
                                              "bus_location": "busLocation"})

    def processes(self) -> pl.DataFrame:
        """``PROCESSES``: ``global_pid``, ``pid``, ``name`` (the executable)."""
        return self.load("PROCESSES", {"global_pid": "globalPid", "pid": "pid", "name": "name"})

    def thread_names(self) -> pl.DataFrame:
        """``ThreadNames``: ``global_tid`` and ``name_id`` (a StringIds id; resolve with :meth:`strings`)."""
        return self.load("ThreadNames", {"global_tid": "globalTid", "name_id": "nameId"})

    # ------------------------------------------------------------------ strings and enums
    def strings(self, ids: list[int] | None = None) -> dict[int, str]:
        """``StringIds`` as {id: value}; only ``ids`` when given. A value that is not text
        (NULL, a number, a blob) becomes its string form (a blob decoded as UTF-8 with
        replacement); rows whose id is not an integer are left out."""
        if ids is not None:
            ids = [int(i) for i in ids if i is not None]
            if not ids:
                return {}
            out: dict[int, str] = {}
            for i in range(0, len(ids), 900):
                chunk = ids[i : i + 900]
                marks = ",".join("?" * len(chunk))
                out.update(_string_rows(
                    self.conn.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", chunk)
                ))
            return out
        if "strings" not in self._cache:
            self._cache["strings"] = _string_rows(self.conn.execute("SELECT id, value FROM StringIds"))
        return self._cache["strings"]

    def enum_labels(self, kind: str) -> dict[int, str]:
        """Labels of ``kind`` ("copy" or "mem"): from the export's ENUM table, else built in.
        Rows of the ENUM table whose id is not an integer are ignored."""
        table, by_name, builtin = {
            "copy": ("ENUM_CUDA_MEMCPY_OPER", enums.COPY_KIND_BY_NAME, enums.COPY_KIND),
            "mem": ("ENUM_CUDA_MEM_KIND", enums.MEM_KIND_BY_NAME, enums.MEM_KIND),
        }[kind]
        out = dict(builtin)
        if table in self.tables and {"id", "name"} <= set(self.tables[table]):
            for id_, name in self.conn.execute(f"SELECT id, name FROM {quote_ident(table)}"):
                if isinstance(id_, int):
                    out[id_] = by_name.get(name, str(name).lower())
        return out


#: Small tables read whole at open (a damaged page in them fails there, as one line).
_SMALL_TABLES = ("ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "TRACEKIT_TRIM", "ANALYSIS_DETAILS",
                 "META_DATA_EXPORT", "EXPORT_META_DATA", "TARGET_INFO_GPU", "TARGET_INFO_GPU_METRICS",
                 "PROCESSES", "ThreadNames")


def _string_rows(rows) -> dict[int, str]:
    out: dict[int, str] = {}
    for id_, value in rows:
        if not isinstance(id_, int):
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        out[id_] = "" if value is None else str(value)
    return out



#: Query results up to this many rows are kept for the life of the Export and returned again
#: to a repeated query (polars frames are immutable; tracekit never mutates one in place).
_MEMO_MAX_ROWS = 200_000


def _prefetch_key(sql: str, params: tuple, schema: dict | None) -> tuple:
    return (sql, tuple(params), tuple((k, str(v)) for k, v in (schema or {}).items()))




def _is_plain_name(expr: str) -> bool:
    return expr.isidentifier()


