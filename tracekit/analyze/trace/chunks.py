"""Reading one table's rows in rowid ranges ("chunks"), a few ranges ahead on worker threads.

What :meth:`tracekit.analyze.trace.export.Export.query_chunks` and ``prefetch_chunks`` run:
:func:`_rowid_split` turns a plain ``SELECT ... FROM table WHERE condition`` into one query per
rowid range, and :class:`_ChunkReader` reads them in order, each worker thread on a read-only
connection of its own (``Export._sibling``), with the trace cache consulted per chunk.
"""

from __future__ import annotations

import re

import polars as pl

_SPLITTABLE = re.compile(r"(?is)^\s*(SELECT\s.+?\sFROM\s+\"?(\w+)\"?)\s+WHERE\s(.+)$")


def _rowid_split(sql: str, table: str) -> str | None:
    """``sql`` as a format string with ``{a}``/``{b}`` bounding ``table``'s rowid, when it is a
    plain ``SELECT ... FROM table WHERE condition``; else None."""
    m = _SPLITTABLE.match(sql)
    if not m or m.group(2) != table or "{" in sql or "}" in sql:
        return None
    if re.search(r"(?i)\b(select|join|group\s+by|order\s+by|limit|union|having|window)\b", m.group(3)):
        return None
    if re.search(r"(?i)\b(join|distinct)\b|,", m.group(1).split("FROM")[-1] if "FROM" in m.group(1) else ""):
        return None
    return f"{m.group(1)} WHERE ({m.group(3)}) AND rowid BETWEEN {{a}} AND {{b}}"


class _ChunkReader:
    """Reads ``queries`` (rowid ranges of one table, in order) with ``workers`` threads, at most
    ``workers + 2`` results held at a time; iterating yields them in order. Cache lookups and
    stores happen in the consuming thread. ``export``: the :class:`~tracekit.analyze.trace.export.Export`
    whose trace and cache are read (each worker reads through a sibling of it)."""

    def __init__(self, export, queries: list[str], params: tuple, schema: dict, workers: int) -> None:
        import threading
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        self.export, self.queries, self.params, self.schema = export, queries, params, schema
        self.ahead = workers + 2
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="tracekit-chunks")
        self.local = threading.local()
        self.siblings: list = []  # the Exports of the worker threads
        self.lock = threading.Lock()
        self.todo = deque(range(len(queries)))
        self.inflight: deque = deque()
        self.closed = False
        self._fill()

    def _key(self, i: int):
        c = self.export.cache
        return c.query_key(self.queries[i], self.params, self.schema) if c is not None else None

    def _fill(self) -> None:
        while self.todo and len(self.inflight) < self.ahead:
            i = self.todo.popleft()
            key = self._key(i)
            if key is not None and self.export.cache.has_frame(key):
                self.inflight.append((i, key, None))  # read from the cache when its turn comes
            else:
                self.inflight.append((i, key, self.pool.submit(self._read, i)))

    def _read(self, i: int) -> pl.DataFrame:
        other = getattr(self.local, "export", None)
        if other is None:
            other = self.local.export = self.export._sibling()
            with self.lock:
                self.siblings.append(other)
        return other._read(self.queries[i], self.params, self.schema)

    def __iter__(self):
        while self.inflight:
            i, key, fut = self.inflight.popleft()
            frame = None
            if fut is None:
                frame = self.export.cache.get_frame(key)  # counts a hit, or a miss when it went bad
                if frame is None:  # the entry went bad since: read the trace
                    fut = self.pool.submit(self._read, i)
            elif key is not None:
                self.export.cache.misses += 1  # no entry: read from the trace, counted as a miss
            if frame is None:
                frame = fut.result()  # re-raises what the read raised
                if key is not None:
                    self.export.cache.put_frame(key, frame)
            self._fill()
            yield frame

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for _, _, fut in self.inflight:
            if fut is not None:
                fut.cancel()
        self.inflight.clear()
        self.todo.clear()
        self.pool.shutdown(wait=True)
        for other in self.siblings:
            try:
                other.close()
            except Exception:
                pass
        self.siblings.clear()
