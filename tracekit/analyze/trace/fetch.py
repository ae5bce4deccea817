"""A query's rows fetched into a polars frame: through the ADBC SQLite driver (Arrow) when it is
installed (:func:`reader`), else through the standard library's ``sqlite3``; both give equal
frames. A value whose type does not fit its column is one line naming table, column and value
(:func:`_type_error`). What :meth:`tracekit.analyze.trace.export.Export.query` reads with (no
cache, no memo: those are the Export's).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl

from tracekit.analyze.trace.sqlite_file import _REEXPORT, _open_uri
from tracekit.errors import TracekitError
from tracekit.userfiles import shown


def reader() -> str:
    """The row reader :meth:`Export.query` uses: ``"adbc"`` (ADBC SQLite driver, Arrow) when
    ``adbc-driver-sqlite`` is installed, else ``"sqlite3"``. The environment variable
    ``TRACEKIT_SQLITE_READER=sqlite3`` forces the standard library."""
    global _READER
    if _READER is None:
        choice = os.environ.get("TRACEKIT_SQLITE_READER", "").strip().lower()
        if choice == "sqlite3":
            _READER = "sqlite3"
        else:
            try:
                import importlib.util

                ok = importlib.util.find_spec("adbc_driver_sqlite") is not None
            except (ImportError, ValueError):
                ok = False
            _READER = "adbc" if ok else "sqlite3"
    return _READER


_READER: str | None = None


def _inline_params(sql: str, params: tuple) -> str | None:
    """``sql`` with each ``?`` replaced by the SQL literal of its parameter (ints, floats,
    strings, None); None when a parameter has another type or the SQL quotes a ``?``."""
    if not params:
        return sql
    if "'?" in sql or "?'" in sql or sql.count("?") != len(params):
        return None
    out = []
    parts = sql.split("?")
    for part, value in zip(parts, params):
        if value is None:
            lit = "NULL"
        elif isinstance(value, bool):
            lit = str(int(value))
        elif isinstance(value, int):
            lit = str(int(value))
        elif isinstance(value, float):
            lit = repr(value)
            if lit in ("nan", "inf", "-inf"):
                return None
        elif isinstance(value, str):
            lit = "'" + value.replace("'", "''") + "'"
        else:
            return None
        out.append(part + lit)
    out.append(parts[-1])
    return "".join(out)


def query_adbc(export, sql: str, params: tuple, schema: dict | None) -> pl.DataFrame | None:
    """The rows of ``sql`` for ``export`` (a :class:`~tracekit.analyze.trace.export.Export`,
    whose ADBC connection is opened on first use and kept in its ``_adbc``) fetched through ADBC
    (Arrow batches, no Python objects per row); None when it cannot
    (driver missing, a parameter it cannot inline, a column whose values do not fit the
    type ADBC inferred from the first rows): the caller then uses sqlite3.

    The frame's columns are ADBC's Arrow buffers, not copies, and any one of them kept keeps its
    whole batch alive (every column of it, the text included): a caller that keeps a few
    columns of many results copies them (``pl.concat(..., rechunk=True)``), as
    :func:`tracekit.analyze.model.nvtx.load_ranges` does (issue 24)."""
    try:
        literal_sql = _inline_params(sql, params)
        if literal_sql is None:
            return None
        # the low-level ADBC API: Arrow C streams that polars imports without pyarrow
        import adbc_driver_manager
        import adbc_driver_sqlite

        if export._adbc is None:
            db = adbc_driver_sqlite.connect(export.uri or _open_uri(export.path)[0])
            export._adbc = (db, adbc_driver_manager.AdbcConnection(db))
        stmt = adbc_driver_manager.AdbcStatement(export._adbc[1])
        try:
            stmt.set_options(**{adbc_driver_sqlite.StatementOptions.BATCH_ROWS.value: "65536"})
            stmt.set_sql_query(literal_sql)
            stream, _ = stmt.execute_query()
            frame = pl.DataFrame(stream).rechunk()
        finally:
            stmt.close()
        if schema is not None:
            if frame.width != len(schema):
                return None
            frame = frame.rename(dict(zip(frame.columns, schema))).cast(schema, strict=True)
        for name, dtype in frame.schema.items():
            if dtype == pl.String:  # ADBC passes invalid UTF-8 through: it must not reach polars
                frame[name].cast(pl.Binary).cast(pl.String, strict=True)
        return frame
    except Exception:
        return None


def query_sqlite3(conn, path: Path, sql: str, params: tuple, schema: dict | None) -> pl.DataFrame:
    """The rows of ``sql`` through ``conn`` (a :class:`~tracekit.analyze.trace.sqlite_file.TraceConnection`
    to ``path``), as a frame with ``schema`` (else names from the SQL, types inferred). Raises
    :class:`TracekitError` when SQLite fails or a value does not fit its column's type."""
    cur = conn.execute(sql, params)  # TracekitError for SQLite failures
    rows = cur.fetchall()
    names = [d[0] for d in cur.description]
    try:
        if schema is None:
            return pl.DataFrame(rows, schema=names, orient="row", infer_schema_length=None)
        return pl.DataFrame(rows, schema=schema, orient="row")
    except Exception as exc:  # a value that does not fit its column's type
        raise _type_error(path, sql, rows, names, schema, exc) from None



def _type_error(path: Path, sql: str, rows: list, names: list[str], schema: dict | None,
                exc: BaseException) -> TracekitError:
    """The one-line error for a value whose type does not fit its column (text or a real in an
    integer column, an integer beyond int64), naming table, column and value."""
    m = re.search(r'(?is)\bFROM\s+"?([A-Za-z_][\w]*)', sql)
    table = m.group(1) if m else "the trace"
    cols = list(schema) if schema is not None else names
    want = {pl.Int64: "an integer", pl.Float64: "a number", pl.String: "text"}
    for j, col in enumerate(cols):
        dtype = schema.get(col) if schema is not None else None
        for row in rows:
            v = row[j]
            if v is None:
                continue
            if dtype == pl.Int64:
                ok = isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63
            elif dtype == pl.Float64:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            elif dtype == pl.String:
                ok = isinstance(v, str)
            else:
                ok = True
            if not ok:
                val = v if not isinstance(v, str) else v[:40]
                return TracekitError(
                    f"{shown(path)}: {table} column {col} holds {val!r} ({type(v).__name__}) where "
                    f"{want.get(dtype, 'another type')} is expected; the export is damaged or was edited; {_REEXPORT}"
                )
    first = str(exc).splitlines()[0][:120]
    return TracekitError(f"{shown(path)}: {table}: values of unexpected types ({first}); {_REEXPORT}")
