"""Split a multi-GPU nsys SQLite export into one export per process (the proof of the
many-traces analysis: a folder of the splits must give the same per-rank numbers).

    python benchmarks/split_ranks.py two_gpu.sqlite OUT_DIR     # OUT_DIR/rank<i>.sqlite, pid order

Each split is a copy of the export with the rows of every other process deleted: rows of a
table with a ``globalPid`` column, or with ``globalTid`` (pid = globalTid >> 24 & 0xFFFFFF)
whose process is another. Tables without either (strings, target info, the session start
time) are kept whole, and so are the NVTX domain names (``eventType`` 75: a domain another
process registered first names this one's ranges too), so every split keeps the capture start and host of the original.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

_PID = "((({col}) >> 24) & 16777215)"


def processes(path: str | Path) -> list[int]:
    """The pids that launched CUDA kernels in ``path`` (sorted)."""
    with sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True) as con:
        return [r[0] for r in con.execute(
            f"SELECT DISTINCT {_PID.format(col='globalPid')} FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1")]


def split(path: str | Path, out_dir: str | Path) -> list[Path]:
    """Write ``out_dir/rank<i>.sqlite`` for the i-th pid of :func:`processes`; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for i, pid in enumerate(processes(path)):
        dst = out_dir / f"rank{i}.sqlite"
        shutil.copyfile(path, dst)
        con = sqlite3.connect(dst)
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for t in tables:
                cols = {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')}
                col = "globalPid" if "globalPid" in cols else "globalTid" if "globalTid" in cols else None
                if col:
                    keep = " AND eventType != 75" if t == "NVTX_EVENTS" else ""  # domain names: kept whole
                    con.execute(f'DELETE FROM "{t}" WHERE {col} IS NOT NULL AND {_PID.format(col=col)} != ?{keep}',
                                (pid,))
            con.commit()
            con.execute("VACUUM")
        finally:
            con.close()
        made.append(dst)
    return made


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: split_ranks.py EXPORT.sqlite OUT_DIR", file=sys.stderr)
        sys.exit(2)
    for p in split(sys.argv[1], sys.argv[2]):
        print(p)
