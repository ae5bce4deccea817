"""An Nsight Systems SQLite export opened read-only, and SQLite's failures as one line each.

The export is opened through the SQLite URI ``file:PATH?mode=ro``: tracekit never writes to a
user's trace. A trace in WAL mode (file header bytes 18-19 = 2) would still get ``-wal`` and
``-shm`` files beside it from a read-only open, so it is opened with ``immutable=1`` when it has
no ``-wal`` file (or an empty one), and otherwise from a private copy of the trace and its
``-wal`` in a temporary folder (removed at :meth:`tracekit.analyze.trace.export.Export.close`),
so that changes a writer left in the ``-wal`` are read and nothing beside the trace is created
or changed.

What :class:`tracekit.analyze.trace.export.Export` opens its connections with: the file check
before SQLite sees it (:func:`_check_file`), the URI (:func:`_open_uri`), the connection
(:class:`TraceConnection`, whose every failure is :func:`db_error`'s one line).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from tracekit.errors import TracekitError
from tracekit.userfiles import shown

SQLITE_MAGIC = b"SQLite format 3\x00"
#: first bytes of a compressed file -> (format, the command that decompresses it beside itself)
COMPRESSED_MAGIC = {b"\xfd7zXZ\x00": ("xz", "xz -dk"), b"\x1f\x8b": ("gzip", "gzip -dk"),
                    b"\x28\xb5\x2f\xfd": ("zstd", "zstd -dk")}

_REEXPORT = "export it again with `nsys export --type sqlite REPORT.nsys-rep`"


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (``we"ird`` -> ``"we""ird"``)."""
    return '"' + str(name).replace('"', '""') + '"'


def _decode_replace(raw: bytes) -> str:
    """sqlite3 text factory: UTF-8, undecodable bytes as U+FFFD (a cp1251 time-zone name in
    ``META_DATA_EXPORT`` of a Windows capture, say)."""
    return raw.decode("utf-8", "replace")


def db_error(path: Path, exc: BaseException) -> TracekitError:
    """The one-line error for an SQLite failure while reading ``path``: a locked database, a
    damaged file, or another failure (the SQLite message is kept)."""
    msg = str(exc)
    low = msg.lower()
    if "locked" in low or "busy" in low:
        return TracekitError(
            f"{shown(path)}: the database is locked by another process ({msg}); wait until the writer "
            "(nsys export, sqlite3) is done, or analyze a copy of the file"
        )
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError) or any(
        w in low for w in ("malformed", "corrupt", "not a database", "disk i/o")
    ):
        return TracekitError(f"{shown(path)}: the SQLite file is truncated or corrupt ({msg}); {_REEXPORT}")
    return TracekitError(f"{shown(path)}: reading the trace failed ({msg}); {_REEXPORT}")


class _Rows:
    """The fetched rows of one statement: ``fetchone``, ``fetchall``, iteration, ``description``."""

    def __init__(self, rows: list, description) -> None:
        self._rows = rows
        self._i = 0
        self.description = description

    def fetchone(self):
        if self._i >= len(self._rows):
            return None
        self._i += 1
        return self._rows[self._i - 1]

    def fetchall(self) -> list:
        out, self._i = self._rows[self._i:], len(self._rows)
        return out

    def __iter__(self):
        while (row := self.fetchone()) is not None:
            yield row


class TraceConnection(sqlite3.Connection):
    """A read-only connection to a trace whose :meth:`execute` fetches every row and turns any
    SQLite failure (damaged page, lock, missing column) into a one-line
    :class:`~tracekit.errors.TracekitError` naming the file. Text is UTF-8; a statement
    that meets undecodable bytes is run again with replacement decoding."""

    trace_path: Path = Path("?")

    def execute(self, sql: str, params=()) -> _Rows:  # type: ignore[override]
        try:
            try:
                cur = super().execute(sql, params)
                return _Rows(cur.fetchall(), cur.description)
            except sqlite3.OperationalError as exc:
                if "decode" not in str(exc) or self.text_factory is _decode_replace:
                    raise
                self.text_factory = _decode_replace  # from now on for this connection
                cur = super().execute(sql, params)
                return _Rows(cur.fetchall(), cur.description)
        except sqlite3.DatabaseError as exc:
            raise db_error(self.trace_path, exc) from None



def _connect(uri: str, path: Path) -> TraceConnection:
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, factory=TraceConnection, timeout=5.0)
    except sqlite3.DatabaseError as exc:
        raise db_error(path, exc) from None
    conn.trace_path = path
    return conn


def _open_uri(path: Path) -> tuple[str, object]:
    """The URI to open ``path`` with, and the temporary folder of a private copy (or None).

    Rollback-journal traces: ``mode=ro``. WAL-mode traces (header bytes 18-19 = 2) without a
    ``-wal`` file, or with an empty one: ``mode=ro&immutable=1`` (nothing is created beside
    the trace). With a non-empty ``-wal`` (changes not yet checkpointed): a private copy of the
    trace and its ``-wal``, opened ``mode=ro`` in a temporary folder.
    """
    import shutil
    import tempfile

    real = path.resolve()
    with open(real, "rb") as fh:
        head = fh.read(20)
    wal_mode = len(head) >= 20 and head[18] == 2 and head[19] == 2
    if not wal_mode:
        return f"file:{quote(str(real))}?mode=ro", None
    wal = real.with_name(real.name + "-wal")
    if not wal.exists() or wal.stat().st_size == 0:
        return f"file:{quote(str(real))}?mode=ro&immutable=1", None
    private = tempfile.TemporaryDirectory(prefix="tracekit-wal-")
    try:
        copy = Path(private.name) / "trace.sqlite"
        shutil.copyfile(real, copy)
        shutil.copyfile(wal, Path(private.name) / "trace.sqlite-wal")
    except OSError as exc:
        private.cleanup()
        raise TracekitError(
            f"{shown(path)}: a WAL-mode trace with pending changes in {wal.name}, and copying both to a "
            f"private folder to read them failed ({exc}); checkpoint it (`sqlite3 {path.name} "
            "'PRAGMA wal_checkpoint'`) or free space in the temporary folder"
        ) from None
    return f"file:{quote(str(copy))}?mode=ro", private


def _check_file(path: Path) -> None:
    """One line (:class:`TracekitError`) unless ``path`` is a regular file that starts like an
    SQLite database: missing, a directory, a pipe or FIFO (``analyze <(cat t.sqlite)``, which
    SQLite cannot read: it seeks), a device, a path over the system's limit
    (:func:`tracekit.userfiles.check_regular`), an nsys report, empty, or another file."""
    import stat

    from tracekit.userfiles import check_regular, os_error

    try:
        st = os.stat(path)
    except OSError as exc:
        raise os_error(path, exc) from None
    if stat.S_ISDIR(st.st_mode):
        raise TracekitError(f"{shown(path)}: is a directory; pass an nsys .sqlite export")
    check_regular(path, why="SQLite reads its database at random offsets; save the export to a file first "
                            "(`cat ... > trace.sqlite`) and pass that")
    suffix = "".join(path.suffixes[-1:]).lower()
    try:  # O_NONBLOCK: a FIFO swapped in since the check does not block the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            head = os.read(fd, 16)
        finally:
            os.close(fd)
    except OSError as exc:
        raise os_error(path, exc) from None
    if head == SQLITE_MAGIC:
        return
    for magic, (kind, tool) in COMPRESSED_MAGIC.items():
        if head.startswith(magic):  # what tests/fixtures ship (NAME.sqlite.xz); nothing reads it compressed
            raise TracekitError(f"{shown(path)} is {kind}-compressed: decompress it first (`{tool} {shown(path)}`)")
    if suffix in (".nsys-rep", ".qdrep", ".qdstrm"):
        raise TracekitError(
            f"{shown(path)}: this is an Nsight Systems report, not its SQLite export; run "
            f"`nsys export --type sqlite {path}` and analyze the .sqlite it writes (`tracekit capture` "
            "records and exports in one go)"
        )
    if not head:
        raise TracekitError(f"{shown(path)}: file is empty; pass an nsys .sqlite export")
    raise TracekitError(
        f"{shown(path)}: not an SQLite file; pass the .sqlite written by `nsys export --type sqlite`"
    )

