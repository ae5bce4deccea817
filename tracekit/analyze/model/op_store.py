"""The GPU operations of a phase model kept out of the process's memory (issue 24: flat memory).

``model.ops`` is the largest frame of an analysis: one row per kernel, copy and memset with 25
columns, about 150 bytes an op (46 MiB for the 320 k ops of 16 copies of the shared 624 MB trace).
Every section reads a few of its columns, most of them only in some rows, yet an in-memory frame
is held whole for the run. :class:`OpStore` writes the frame once to a file, a block of
:data:`BLOCK_ROWS` rows of one column at a time (each piece polars' own Arrow IPC bytes, so that
dtypes, nulls and Enum categories come back exactly), and :meth:`OpStore.scan` gives a polars
``LazyFrame`` (an IO source, :func:`polars.io.plugins.register_io_source`) whose projection and
filter polars hands to the store: a query reads, one block at a time, the columns its filter
reads, then each column it selects, cut at once to the rows the filter keeps. A section that reads
``start, end`` of the copies holds those two columns of the copies, plus one block of the
columns it reads, whatever the size of the trace. (Polars' own ``scan_ipc`` read every
projected column whole and filtered after: +97 MiB for the host copies of a 10 GB trace.)

The file is created in the system's temporary folder (``TMPDIR``) and unlinked at once: it is
read through its open descriptor (``os.pread``), so it is gone when the store is closed or the
process ends, however it ends (SIGKILL included); nothing is left on disk and no name of it is
visible to another process. Where the folder cannot be written (full disk, read-only),
:func:`spill_blocks` returns None and the frame stays in memory (the results are the same).
"""

from __future__ import annotations

import io
import os
import tempfile
import weakref
from collections.abc import Iterable, Iterator

import polars as pl

#: rows per block: the most a query holds of one column beyond the rows it keeps (256 KiB of an
#: Int64 column)
BLOCK_ROWS = 32_768


class OpStore:
    """A frame in an unlinked file, read back by column and block (see the module doc).
    ``schema``, ``columns`` and ``height`` are those of the frame written; :meth:`scan` and
    :meth:`read` give its rows back exactly (dtypes, Enum categories, nulls and row order).
    Raises OSError when the file cannot be made or written. Built by :func:`spill_blocks`."""

    def __init__(self, blocks: Iterable[pl.DataFrame], folder: str | None = None):
        """``blocks`` (frames of one schema, at least one; :func:`frame_blocks` cuts a frame into
        them) written as they come, one held at a time: the rows of their concatenation."""
        fd, name = tempfile.mkstemp(prefix="tracekit-ops-", suffix=".bin", dir=folder)
        try:
            os.unlink(name)  # (read through fd from now on: nothing to clean up, ever)
            #: per block, {column: (offset, length)} of its piece of each column
            self._blocks: list[dict[str, tuple[int, int]]] = []
            at, height, first = 0, 0, None
            for part in blocks:
                if first is None:
                    first = part.head(0)
                elif part.schema != first.schema:
                    raise ValueError(f"a block's columns differ from the first's: {part.schema} != {first.schema}")
                where = {}
                for c in part.columns:
                    buf = io.BytesIO()
                    part.select(c).write_ipc(buf, compression="uncompressed")
                    data = buf.getbuffer()
                    os.pwrite(fd, data, at)
                    where[c] = (at, len(data))
                    at += len(data)
                    del data, buf
                self._blocks.append(where)
                height += part.height
                del part
            if first is None:
                raise ValueError("no block to write")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.schema = first.schema
        self.columns = first.columns
        self.height = height
        self._closer = weakref.finalize(self, os.close, fd)

    def _column(self, where: dict, column: str) -> pl.DataFrame:
        offset, length = where[column]
        data = os.pread(self._fd, length, offset)
        if len(data) != length:
            raise OSError(f"the GPU operations' file was cut short ({len(data)} of {length} bytes)")
        return pl.read_ipc(io.BytesIO(data))

    def _batches(self, with_columns, predicate, n_rows, _batch_size):
        """The IO source of :meth:`scan`: per block, the columns the predicate reads, the rows it
        keeps, then each column asked for, read and cut to those rows one at a time (a block of
        every column is never held at once)."""
        cols = list(self.columns) if with_columns is None else list(with_columns)
        if not cols and self.columns:  # (no column named: one read for the row count)
            cols = [self.columns[0]]
        left = n_rows
        for where in self._blocks:
            if left is not None and left <= 0:
                break
            keep = None
            have: dict[str, pl.Series] = {}
            if predicate is not None:
                have = {c: self._column(where, c).to_series() for c in predicate.meta.root_names()}
                keep = pl.DataFrame(list(have.values())).select(predicate.fill_null(False)).to_series()
                if not keep.any():
                    continue
                if keep.all():
                    keep = None
            out = []
            for c in cols:
                col = have[c] if c in have else self._column(where, c).to_series()
                out.append(col if keep is None else col.filter(keep))
                del col
            del have
            part = pl.DataFrame(out)
            if left is not None:
                part = part.head(left)
                left -= part.height
            yield part

    def scan(self) -> pl.LazyFrame:
        """The rows as a ``LazyFrame``: what a query selects and filters is all that is read."""
        from polars.io.plugins import register_io_source

        return register_io_source(self._batches, schema=self.schema)

    def read(self) -> pl.DataFrame:
        """The whole frame, read back (a copy in memory, for the readers of every column)."""
        return self.scan().collect()

    def close(self) -> None:
        """Close the file (its space is freed); later reads fail."""
        self._closer()


def frame_blocks(frame: pl.DataFrame, rows: int = BLOCK_ROWS) -> Iterator[pl.DataFrame]:
    """``frame`` cut into slices of ``rows`` rows (no copy), at least one (an empty frame gives
    itself: the store keeps its schema)."""
    return (frame.slice(lo, rows) for lo in range(0, max(frame.height, 1), rows))


def spill_blocks(blocks: Iterable[pl.DataFrame], folder: str | None = None) -> OpStore | None:
    """The frames ``blocks`` (one schema) written to an :class:`OpStore` as they come, or None
    when the store cannot be made (the temporary folder not writable or full): the caller then
    builds the frame in memory."""
    try:
        return OpStore(blocks, folder)
    except OSError:
        return None
