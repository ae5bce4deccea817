"""What several commands of :mod:`tracekit.cli` share: errors as one line, the rank/gas checks.

Imports only the standard library and :mod:`tracekit.errors` (the package's start-up).
"""

from __future__ import annotations

import re

from tracekit.errors import TracekitError

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` as one line: line breaks (of polars' and SQLite's multi-line
    messages) and the blanks around them become one space, other control characters (from
    trace text) a visible escape."""
    text = re.sub(r"\s*[\r\n]+\s*", " ", str(exc)).strip()
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def path_error_line(exc: BaseException) -> str | None:
    """The one line for an OS error that a user's path causes wherever it is first touched
    (a path over the system's limit, ``ENAMETOOLONG``, or a symlink loop): the path as given and
    shortened (:func:`tracekit.userfiles.os_error`), not the 4 kB name twice over; None for
    any other exception."""
    import errno

    if isinstance(exc, OSError) and exc.errno in (errno.ENAMETOOLONG, errno.ELOOP) and exc.filename is not None:
        from tracekit.userfiles import os_error

        return one_line(os_error(exc.filename, exc))
    return None


def check_rank_gas(rank: int, gas: int | None) -> None:
    """Raise :class:`TracekitError` for a negative ``--rank`` or a ``--gas`` below 1 (``report``
    and ``compare``)."""
    if rank < 0:
        raise TracekitError("--rank must be 0 or more (ranks are numbered by pid, then device)")
    if gas is not None and gas < 1:
        raise TracekitError("--gas must be a positive integer")
