"""Freed C-heap pages go back to the OS (tracekit.analyze.trace.heap, issue 24): glibc keeps
freed blocks below its mmap threshold for reuse; after :func:`release` the process's resident
memory falls by what was freed. Measured on this process with blocks it allocates itself."""

import ctypes
import ctypes.util
import sys

import pytest

from tracekit.analyze.trace import heap


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_returns_freed_blocks():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if getattr(libc, "malloc_trim", None) is None:
        pytest.skip("not glibc")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    n, size = 40_000, 1024  # 40 MiB of small blocks (below the mmap threshold: from the heap)
    blocks = [libc.malloc(size) for _ in range(n)]
    for b in blocks:
        ctypes.memset(b, 1, size)  # touched: resident
    keep = libc.malloc(size)  # (a live block above them: glibc cannot give the top back by itself)
    before = _rss_mib()
    for b in blocks:
        libc.free(b)
    freed = _rss_mib()
    assert heap.release() is True
    after = _rss_mib()
    libc.free(keep)
    assert before - freed < 10  # freeing alone gave (almost) nothing back
    assert freed - after > 30  # release did: most of the 40 MiB
