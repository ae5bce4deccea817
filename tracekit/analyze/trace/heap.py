"""Giving the C heap's freed pages back to the operating system (issue 24: flat memory).

Rows read from a trace arrive through SQLite and the ADBC driver, which allocate with the C
library's ``malloc``; polars copies what it keeps into its own allocator (jemalloc). glibc keeps
the freed ``malloc`` memory in its arenas for reuse by later ``malloc`` calls, which polars never
makes, so each large read left its size in the process's resident memory for the rest of the run
(about 75-90 MiB after the phase model's reads of a 10 GB trace). :func:`release` asks glibc to
return it (``malloc_trim(0)``); elsewhere (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_trim = None
_looked = False


def release() -> bool:
    """Return the C heap's free pages to the OS (glibc ``malloc_trim(0)``): True when glibc
    released some, False when it released none or the C library has no such call. Costs about
    a millisecond per hundred MiB of heap; never raises."""
    global _trim, _looked
    if not _looked:
        _looked = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _trim = getattr(libc, "malloc_trim", None)
            if _trim is not None:
                _trim.argtypes = [ctypes.c_size_t]
                _trim.restype = ctypes.c_int
        except (OSError, AttributeError):
            _trim = None
    if _trim is None:
        return False
    try:
        return bool(_trim(0))
    except Exception:  # (a foreign C library: nothing to do)
        return False
