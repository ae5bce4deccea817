"""Temporary files of tracekit's naming, and the one writer that renames them into place.

Every file tracekit writes (the trace cache's entries, ``tracekit report``'s files, ``--out``)
goes through :func:`write_temporary`: a ``.tmp-tk-<pid>-<16 hex>-<host>`` created exclusively
beside its final name, written whole, fsynced, then renamed over it (:func:`write_replacing`,
or :class:`tracekit.output.OutputSet` for a set of files). A writer killed between the two
leaves its temporary; :func:`remove_stale_temporaries` deletes those whose writer is gone
(:func:`stale_temporary`), nothing else. The trace cache (:mod:`tracekit.analyze.trace.cache`)
says when it runs it.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import stat
import time
from pathlib import Path

#: A temporary file untouched this long (seconds) is stale whoever wrote it.
STALE_TMP_S = 3600


_TMP = re.compile(r"\.tmp-tk-(\d{1,10})-[0-9a-f]{16}-([A-Za-z0-9._-]{0,64})\Z")


_TMP_V1 = re.compile(r"\.tmp-[a-z0-9_]{8}(?:\.parquet)?\Z")  # tempfile.mkstemp names of format 1


_HOST = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64]


def _pid_gone(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, OSError):
        return False
    return False


def _owned(st: os.stat_result) -> bool:
    return not hasattr(os, "geteuid") or st.st_uid == os.geteuid()


def temporary_name(path: str) -> str:
    """A fresh temporary name of tracekit's naming beside ``path``:
    ``.tmp-tk-<pid>-<16 hex>-<host>`` in the same folder (what :func:`stale_temporary` knows)."""
    return os.path.join(os.path.dirname(path), f".tmp-tk-{os.getpid()}-{secrets.token_hex(8)}-{_HOST}")


def _discard(tmp: str, dir_fd: int | None) -> None:
    """Remove the temporary ``tmp`` of a failed write; one already gone is fine."""
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except OSError:
        pass


def write_temporary(path: str, data, *, dir_fd: int | None = None, mode: int = 0o600,
                    fsync: bool = True) -> str:
    """Write ``data`` to a new temporary beside ``path`` (relative to ``dir_fd`` when given) and
    return the temporary's path, for the caller to rename over ``path``: a
    :func:`temporary_name` created exclusively (``O_EXCL``, never following a link; file mode
    ``mode``), written whole, fsynced when ``fsync``. ``data``: bytes-like, or a callable given
    the open binary file (``data(fh)``: a library writing a large file itself, e.g. polars'
    ``write_csv``). The temporary is removed when anything fails, an interrupt included; the
    exception is raised (OSError for a full disk)."""
    tmp = temporary_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=dir_fd)
    try:
        if callable(data):
            with os.fdopen(fd, "wb", closefd=False) as fh:
                data(fh)
        else:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _discard(tmp, dir_fd)
        raise
    try:
        os.close(fd)  # (a network file system may report a full disk only here)
    except BaseException:
        _discard(tmp, dir_fd)
        raise
    return tmp


def write_replacing(path: str, data, *, dir_fd: int | None = None, mode: int = 0o600,
                    fsync: bool = True) -> None:
    """Write ``data`` (as :func:`write_temporary` takes it) as ``path`` (relative to ``dir_fd``
    when given): a :func:`write_temporary` beside it, then renamed over ``path``, so a reader
    never sees a partial file under its name and a link named ``path`` is replaced, not written
    through. The temporary is removed when anything fails; the OSError is raised. What the
    cache's entries are written with; a set of output files is written the same way and renamed
    in together (:class:`tracekit.output.OutputSet`)."""
    tmp = write_temporary(path, data, dir_fd=dir_fd, mode=mode, fsync=fsync)
    try:
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _discard(tmp, dir_fd)
        raise


def stale_temporary(name: str, st: os.stat_result, now: float | None = None) -> bool:
    """True when ``name`` (with its ``lstat`` result ``st``) is a temporary of tracekit's naming,
    ``.tmp-tk-<pid>-<16 hex>-<host>`` (what the cache and ``tracekit report`` write before
    renaming), a regular file of the current user, and stale: its writer's pid is gone on this
    host (the host is in the name; another host's pid says nothing here), or nobody touched it
    for :data:`STALE_TMP_S` seconds. A live writer's fresh temporary is never stale."""
    m = _TMP.match(name)
    if m is None or not stat.S_ISREG(st.st_mode) or not _owned(st):
        return False
    now = time.time() if now is None else now
    return now - st.st_mtime > STALE_TMP_S or (m.group(2) == _HOST and _pid_gone(int(m.group(1))))


def remove_stale_temporaries(folder: str | Path | int, legacy: bool = False) -> list[str]:
    """Delete the :func:`stale_temporary` files directly in ``folder`` (a path, or a directory
    file descriptor); nothing else (other names, links, folders, files of other users) is
    touched. ``legacy``: also the ``tempfile.mkstemp`` names of a format-1 cache. Returns the
    names removed; never raises (a folder that cannot be listed removes nothing)."""
    removed: list[str] = []
    fd = None
    try:
        if isinstance(folder, int):
            dfd = folder
        else:
            fd = dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        now = time.time()
        for name in os.listdir(dfd):
            mine = _TMP.match(name) is not None
            if not mine and not (legacy and _TMP_V1.match(name)):
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stale_temporary(name, st, now) if mine else (stat.S_ISREG(st.st_mode) and _owned(st)):
                    os.unlink(name, dir_fd=dfd)
                    removed.append(name)
            except OSError:
                pass
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)
    return removed
