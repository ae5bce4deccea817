"""Files named by the user (a trace, ``--ds-config``, the capture manifest beside a trace):
checked before they are opened and shown as the user gave them (issue 25).

- :func:`shown`: a path for a message: as given (not resolved), control characters escaped,
  and a path longer than :data:`MAX_SHOWN` characters shortened to ``head...tail``;
- :func:`check_regular`: ``stat`` the path and refuse anything but a regular file (a FIFO, a
  process substitution ``<(...)``, a device, a socket, a directory), or a path the system
  cannot take (``ENAMETOOLONG``), with one line;
- :func:`read_limited`: the bytes of a small file (a config, a manifest), opened without
  blocking on a FIFO and refused above a size cap instead of read whole.

No polars here: the command line calls it before any analysis.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from tracekit.errors import TracekitError

#: Longest path a message shows whole; a longer one becomes its first 60 and last
#: ``MAX_SHOWN - 63`` characters around ``...`` (the file name stays readable).
MAX_SHOWN = 160


def shown(path: str | os.PathLike | None) -> str:
    """``path`` as the user gave it, for a message: :func:`tracekit.textsafe.clean` of it,
    shortened to ``head...tail`` (:data:`MAX_SHOWN` characters) when longer. Never raises."""
    from tracekit.textsafe import clean

    if path is None:
        return ""
    try:
        s = os.fspath(path)
    except TypeError:
        s = str(path)
    if isinstance(s, bytes):
        s = s.decode("utf-8", "surrogateescape")
    s = clean(s)
    if len(s) <= MAX_SHOWN:
        return s
    return s[:60] + "..." + s[-(MAX_SHOWN - 63):]


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``a FIFO (named pipe)``, ...)."""
    if stat.S_ISFIFO(mode):
        return "a pipe or FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def os_error(path, exc: OSError, what: str = "") -> TracekitError:
    """The one-line error for ``exc`` raised on ``path``: the path as given (:func:`shown`),
    never the long or resolved name the OS error carries; ``what`` prefixes it
    (``--ds-config``)."""
    head = f"{what} {shown(path)}" if what else shown(path)
    if exc.errno == errno.ENAMETOOLONG:
        s = os.fspath(path) if isinstance(path, (str, os.PathLike)) else ""
        s = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
        longest = max((len(part.encode("utf-8", "surrogateescape")) for part in s.split(os.sep)), default=0)
        what_long = (f"a name of {longest:,} bytes in it, over the {_name_max()} bytes the file system allows"
                     if longest > _name_max() else f"{len(s):,} characters, over the system's limit")
        return TracekitError(f"{head}: path too long ({what_long}); move or link the file to a shorter path")
    if exc.errno == errno.ENOENT:
        return TracekitError(f"{head}: no such file")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return TracekitError(f"{head}: permission denied; make it readable")
    if exc.errno == errno.ELOOP:
        return TracekitError(f"{head}: too many levels of symbolic links")
    return TracekitError(f"{head}: cannot read it ({exc.strerror or type(exc).__name__})")


def check_regular(path: str | Path, what: str = "", why: str = "") -> os.stat_result:
    """``os.stat(path)`` when ``path`` is a regular file (a symlink to one included); else a
    :class:`TracekitError`, one line: the path as given, what it is instead (``a pipe or
    FIFO``: ``analyze <(cat t.sqlite)`` or ``mkfifo``; a device; a directory) and ``why`` a
    regular file is needed; missing, unreadable or too long paths as :func:`os_error` says."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise os_error(path, exc, what) from None
    except ValueError:  # a NUL in the name
        raise TracekitError(f"{what + ' ' if what else ''}{shown(path)}: a NUL character in the path") from None
    if not stat.S_ISREG(st.st_mode):
        head = f"{what} {shown(path)}" if what else shown(path)
        raise TracekitError(f"{head}: {kind_of(st.st_mode)}, not a regular file" + (f"; {why}" if why else ""))
    return st


def read_limited(path: str | Path, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Opened with ``O_NONBLOCK`` (a FIFO swapped in after the check does not block) and checked
    again on the open descriptor. Raises :class:`TracekitError` (one line naming ``what`` and
    the path as given) for a file that is not regular (:func:`check_regular`), larger than
    ``limit`` bytes (by its size, before reading; or grown past it while read), or unreadable."""
    check_regular(path, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise os_error(path, exc, what) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TracekitError(f"{what} {shown(path)}: {kind_of(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise TracekitError(f"{what} {shown(path)}: {st.st_size:,} bytes, over the {_size(limit)} limit "
                                "for this file")
        chunks, total = [], 0
        while True:
            b = os.read(fd, min(1 << 20, limit + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
            if total > limit:
                raise TracekitError(f"{what} {shown(path)}: grew past the {_size(limit)} limit for this file "
                                    "while read")
        return b"".join(chunks)
    except OSError as exc:
        raise os_error(path, exc, what) from None
    finally:
        os.close(fd)


def _name_max() -> int:
    try:
        return int(os.pathconf(".", "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"
