"""Writing tracekit's outputs: old complete or new complete, never a cut file (issue 25).

Every file a command writes (``analyze --out``'s frames, ``report -o``'s figures, data,
``report.md`` / ``report.html`` and its ``--perfetto`` file, ``compare -o``'s files, ``trim``'s
output) belongs to an :class:`OutputSet`: each file is written to an exclusive temporary of
tracekit's naming beside its final name and fsynced
(:func:`tracekit.analyze.trace.temporaries.write_temporary`, the one writer the trace cache uses too);
only once every file of the set is written are they all renamed over their names, with SIGINT
and SIGTERM held meanwhile (:func:`tracekit.signals.deferred`), and their folders fsynced. So a
full disk, an error, ^C or SIGTERM while the set is written leaves the earlier files as they were
and no temporary behind (folders the set created are removed again when empty); a crash of the
machine leaves at most stale temporaries, which the next run writing there removes
(:func:`tracekit.analyze.trace.temporaries.remove_stale_temporaries`).

Where a command writes is checked before any analysis (:func:`check_folder`,
:func:`check_file`): a folder that is a file, cannot be created, or exists and is not writable
is one line, exit 2, before minutes of work. A full disk is one line, ``disk full ...``, exit
2 (:func:`write_error`), and so is a full disk under stdout (:func:`checked_stdout`: every
write to stdout is checked; a short write is never dropped silently).
"""

from __future__ import annotations

import errno
import io
import os
import re
import sys
from pathlib import Path

from tracekit.errors import TracekitError

_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_FULL_TEXT = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122",
              "database or disk is full")


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_errno(exc: BaseException) -> int | None:
    """The errno of ``exc``: an OSError's own, or the ``(os error N)`` that polars' Rust errors
    quote (its OSErrors carry none)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno
    m = _OS_ERROR.search(str(exc))
    return int(m.group(1)) if m else None


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` means the disk (or the user's quota) is full: an OSError with ``ENOSPC``
    or ``EDQUOT``, or a library's error quoting it (polars: ``No space left on device (os error
    28)``, sometimes inside a ComputeError; SQLite: ``database or disk is full``)."""
    if os_errno(exc) in _FULL:
        return True
    text = str(exc)
    return any(t in text for t in _FULL_TEXT)


def is_size_limit(exc: BaseException) -> bool:
    """Whether ``exc`` is the file size limit (``ulimit -f``: ``EFBIG``)."""
    return os_errno(exc) == errno.EFBIG


def _strerror(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


def write_error(label: str, name, exc: BaseException, kept: str = "the files there are as they were") -> str:
    """The one line for ``exc`` raised while writing ``name`` of the output ``label`` (``--out
    DIR``, ``-o DIR``, ``--perfetto FILE``, ``stdout``): ``disk full ...`` for a full disk, the
    file size limit for ``EFBIG``, else ``cannot write ...``; ``kept`` says what became of the
    earlier output."""
    where = f"{label} ({name}: {_strerror(exc)})" if name else f"{label} ({_strerror(exc)})"
    if is_disk_full(exc):
        return f"disk full writing {where}: {kept}; free some space or write elsewhere"
    if is_size_limit(exc):
        return f"file size limit (ulimit -f) reached writing {where}: {kept}; raise the limit or write less"
    if os_errno(exc) in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{label}: is not writable ({_strerror(exc)}): {kept}; choose another place"
    return f"{label}: cannot write it ({name + ': ' if name else ''}{_strerror(exc)}): {kept}"


def _nearest_existing(p: Path) -> Path:
    q = p
    while not os.path.lexists(q) and q != q.parent:
        q = q.parent
    return q


def _writable(p: Path) -> bool:
    return os.access(p, os.W_OK | os.X_OK)


def check_folder(path: str | Path, label: str) -> None:
    """Check, before any work, that the folder ``path`` can be written or created: raises
    :class:`TracekitError` (``label`` leads the line, e.g. ``--out runs``) when it is a file,
    exists and is not writable, or cannot be created (its nearest existing parent is a file or
    not writable). Creates nothing."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise TracekitError(f"{label}: exists and is not a directory")
    if p.is_dir():
        if not _writable(p):
            raise TracekitError(f"{label}: is not writable; choose another folder or make it writable")
        return
    q = _nearest_existing(p)
    if not q.is_dir():
        raise TracekitError(f"{label}: cannot create the directory ({q} is not a directory)")
    if not _writable(q):
        raise TracekitError(f"{label}: cannot create the directory ({q} is not writable)")


def check_file(path: str | Path, label: str) -> None:
    """Check, before any work, that the file ``path`` can be written (replaced by a file of
    the same folder): raises :class:`TracekitError` when it is a directory or its folder is
    not writable or cannot be created (:func:`check_folder`). Creates nothing."""
    p = Path(path)
    if p.is_dir():
        raise TracekitError(f"{label}: is a directory; give a file name such as trace.json")
    parent = p.parent
    if parent.exists() and not parent.is_dir():
        raise TracekitError(f"{label}: cannot write it ({parent} is not a directory)")
    if parent.is_dir():
        if not _writable(parent):
            raise TracekitError(f"{label}: cannot write it ({parent} is not writable)")
        return
    check_folder(parent, label)


class OutputSet:
    """Files written as one set (see the module doc): :meth:`folder` creates (or checks) a
    folder, :meth:`add` writes a file's temporary, :meth:`commit` renames them all into place,
    :meth:`abort` removes the temporaries and the folders created. As a context manager: commit
    when the block ends normally, abort when it raises (an interrupt included).

    ``label`` names the output in error lines (``--out DIR``, ``-o DIR``)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._staged: list[tuple[str, str]] = []  # (temporary, final path)
        self._made: list[Path] = []  # folders this set created, parents first
        self.done = False

    def __enter__(self) -> "OutputSet":
        return self

    def __exit__(self, typ, exc, tb) -> None:
        if typ is None:
            self.commit()
        else:
            self.abort()

    def folder(self, path: str | Path, label: str | None = None) -> Path:
        """Create ``path`` (and its missing parents) when missing and remove the stale
        temporaries of a killed run in it; returns it. Raises :class:`TracekitError` (after
        :meth:`abort`) when it is a file, cannot be created or is not writable."""
        from tracekit.analyze.trace.temporaries import remove_stale_temporaries

        label = label or self.label
        p = Path(path)
        try:
            check_folder(p, label)
            missing = []
            q = p
            while not os.path.lexists(q) and q != q.parent:
                missing.append(q)
                q = q.parent
            for d in reversed(missing):
                try:
                    os.mkdir(d)
                except FileExistsError:
                    if not d.is_dir():
                        raise TracekitError(f"{label}: exists and is not a directory") from None
                    continue
                except OSError as exc:
                    raise TracekitError(f"{label}: cannot create the directory ({_strerror(exc)})") from None
                self._made.append(d)
        except BaseException:
            self.abort()
            raise
        remove_stale_temporaries(p)
        return p

    def add(self, path: str | Path, data, label: str | None = None) -> Path:
        """Write ``data`` (bytes-like, or a callable given the open binary file, as
        :func:`tracekit.analyze.trace.temporaries.write_temporary` takes it) to a temporary beside
        ``path``, renamed over ``path`` by :meth:`commit`; returns ``path``. Raises
        :class:`TracekitError` (``disk full ...`` for a full disk), after :meth:`abort`."""
        from tracekit.analyze.trace.temporaries import write_temporary

        p = Path(path)
        try:
            tmp = write_temporary(str(p), data, mode=0o666, fsync=True)
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError) or (isinstance(exc, Exception) and os_errno(exc) is not None):
                raise TracekitError(write_error(label or self.label, p.name, exc)) from None
            raise
        self._staged.append((tmp, str(p)))
        return p

    def add_by_path(self, path: str | Path, fill, label: str | None = None) -> Path:
        """Like :meth:`add`, for a library that writes a file by its name (SQLite): an empty
        exclusive temporary is created beside ``path``, ``fill(temporary path)`` writes it,
        then it is fsynced and staged. Raises :class:`TracekitError` for a full disk or an
        OSError (after :meth:`abort`); ``fill``'s other exceptions are raised as they are."""
        from tracekit.analyze.trace.temporaries import write_temporary

        p = Path(path)
        tmp = None
        try:
            tmp = write_temporary(str(p), b"", mode=0o666, fsync=False)
            self._staged.append((tmp, str(p)))
            fill(tmp)
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError) or (isinstance(exc, Exception) and (is_disk_full(exc) or is_size_limit(exc))):
                raise TracekitError(write_error(label or self.label, p.name, exc, "nothing was replaced")) from None
            raise
        return p

    def commit(self) -> list[Path]:
        """Rename every written file over its name, SIGINT and SIGTERM held meanwhile, then
        fsync their folders; returns the paths. Raises :class:`TracekitError` (after
        :meth:`abort`, nothing renamed) when a final name is a directory."""
        from tracekit import signals

        for _tmp, final in self._staged:
            if os.path.isdir(final) and not os.path.islink(final):
                self.abort()
                raise TracekitError(f"{self.label}: {final} is a directory; nothing was written")
        done: list[Path] = []
        with signals.deferred():
            try:
                for tmp, final in self._staged:
                    os.replace(tmp, final)
                    done.append(Path(final))
            except OSError as exc:
                self._staged = self._staged[len(done):]
                self.abort()
                raise TracekitError(write_error(self.label, None, exc, "some files were replaced")) from None
            self._staged = []
            self._made = []
            self.done = True
            for d in dict.fromkeys(os.path.dirname(str(p)) or "." for p in done):
                _fsync_dir(d)
        return done

    def abort(self) -> None:
        """Remove the temporaries written so far and the folders this set created (when empty),
        SIGINT and SIGTERM held meanwhile; never raises an OSError."""
        from tracekit import signals

        with signals.deferred():
            for tmp, _final in self._staged:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            self._staged = []
            for d in reversed(self._made):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
            self._made = []


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- stdout
class _FdWriter(io.RawIOBase):
    """File descriptor ``fd`` as a raw stream whose ``write`` writes everything or raises (a
    short write, e.g. the disk filling up, is continued; the next ``write(2)`` reports ENOSPC):
    CPython's unbuffered text stdout drops the rest of a short write silently."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    failed = False  # a write failed (the disk-full line then names stdout)

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n = len(view)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            _FdWriter.failed = True
            raise
        return n

    def close(self) -> None:  # the descriptor stays open (it is the process's stdout)
        super().close()


def checked_stdout() -> None:
    """Replace ``sys.stdout`` (when it is the process's own, on descriptor 1) by the same text
    stream (encoding, errors, buffering) over :class:`_FdWriter`, so that every failed write
    raises. Nothing else changes: the same bytes reach descriptor 1."""
    out = sys.stdout
    if out is None or out is not sys.__stdout__ or not isinstance(out, io.TextIOWrapper):
        return
    try:
        if out.fileno() != 1:
            return
        out.flush()
    except (OSError, ValueError):
        return
    raw = _FdWriter(1)
    unbuffered = not hasattr(out.buffer, "raw")  # PYTHONUNBUFFERED / python -u: text over raw FileIO
    stream = raw if unbuffered else io.BufferedWriter(raw)
    sys.stdout = io.TextIOWrapper(stream, encoding=out.encoding, errors=out.errors, newline="\n",
                                  line_buffering=out.line_buffering, write_through=out.write_through or unbuffered)


def stdout_failed() -> bool:
    """Whether a write to stdout failed (through :func:`checked_stdout`)."""
    return _FdWriter.failed


def stdout_name() -> str:
    """``stdout`` and, when it is a file, its path (for a disk-full line)."""
    try:
        target = os.readlink("/proc/self/fd/1")
    except OSError:
        return "stdout"
    return f"stdout ({target})" if target.startswith("/") else "stdout"


def drop_stdout() -> None:
    """After stdout failed: send whatever is left to /dev/null, so that the interpreter's final
    flush does not fail a second time (a second line on stderr)."""
    try:
        sys.stdout = open(os.devnull, "w")
    except OSError:
        pass
