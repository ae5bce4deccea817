"""Reading bytes that polars may choke on without Rust's panic text reaching the terminal (d02).

A cache entry whose checksum matches can still hold a Parquet payload that polars cannot decode
(written by another polars version, damaged before it was checksummed, or forged). polars then
panics: pyo3 turns the panic into an exception, which the cache treats as a miss, but Rust's
panic hook has already written ``thread '...' panicked at ...``, the message and a backtrace
to file descriptor 2, which no Python handler can stop.

:func:`panic_text_hidden` points fd 2 at a temporary file while such a read runs and, when the
last concurrent reader is done, points it back and writes what was captured less the panic text
(:func:`drop_panic_text`): anything else written meanwhile, by any thread, is delayed, not lost
(unless the process dies during the read: then what it wrote in that window is gone with the
temporary file; the reads are of cache entries, milliseconds each).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from contextlib import contextmanager

_PANIC = re.compile(rb"^thread '.*' (\(\d+\) )?panicked at ")
_OWN = b"tracekit: "

_lock = threading.Lock()
_depth = 0
_saved: int | None = None
_capture = None


def drop_panic_text(data: bytes) -> bytes:
    """``data`` (captured stderr) without Rust panics: the blank lines right before a
    ``thread '...' panicked at`` line, that line and every line after it (the message, the
    backtrace, the note) are left out, until a line holding tracekit's own ``tracekit: ``
    prefix, which is kept from there on."""
    out, held, in_panic = [], [], False
    for line in data.splitlines(keepends=True):
        if _PANIC.match(line):
            in_panic, held = True, []  # and the blank line Rust writes before it
        elif in_panic and _OWN in line:
            in_panic = False
            out.append(line[line.index(_OWN):])
        elif not in_panic:
            if not line.strip():
                held.append(line)
                continue
            out.extend(held)
            out.append(line)
            held = []
    return b"".join(out + held)


def _flush() -> None:
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


@contextmanager
def panic_text_hidden():
    """Run the block with fd 2 captured (see module doc); nested and concurrent uses share one
    capture. Where fd 2 cannot be redirected (no temporary file, no spare descriptor) the block
    runs as it is."""
    global _depth, _saved, _capture
    with _lock:
        if _depth == 0:
            try:
                import tempfile

                _flush()
                cap = tempfile.TemporaryFile(prefix="tracekit-stderr-")
                try:
                    saved = os.dup(2)
                except OSError:
                    cap.close()
                    raise
                os.dup2(cap.fileno(), 2)
                _saved, _capture = saved, cap
            except (OSError, ImportError):
                _saved = _capture = None
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                _flush()
                cap, saved = _capture, _saved
                _saved = _capture = None
                try:
                    os.dup2(saved, 2)
                finally:
                    os.close(saved)
                try:
                    cap.seek(0)
                    rest = drop_panic_text(cap.read())
                    cap.close()
                    while rest:
                        rest = rest[os.write(2, rest):]
                except OSError:
                    pass


def read_parquet(payload):
    """``polars.read_parquet`` of the bytes ``payload`` (bytes or memoryview), or None when polars
    cannot read them (an exception or a Rust panic, whose text is hidden: :func:`panic_text_hidden`)."""
    import io

    import polars as pl

    with panic_text_hidden():
        try:
            return pl.read_parquet(io.BytesIO(payload))  # (a copy: polars keeps the buffer)
        except (Exception, _panic_exception()):
            return None


def _panic_exception() -> type:
    """pyo3's PanicException (a BaseException: ``except Exception`` misses it), or a stand-in."""
    try:
        from polars.exceptions import PanicException
    except ImportError:  # pragma: no cover - older polars
        return Exception
    return PanicException
