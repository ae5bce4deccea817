"""Build small *synthetic* nsys-like SQLite exports for edge cases (not real traces).

Only the tables and columns tracekit reads are created, with the column names of a real
nsys 2025 export. Times are in ns. Thread and process ids follow nsys' layout: globalPid =
pid << 24, globalTid = globalPid + tid.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

PUSH_POP, START_END, MARK, DOMAIN = 59, 60, 34, 75


def gpid(pid: int) -> int:
    return pid << 24


def gtid(pid: int, tid: int) -> int:
    return (pid << 24) + tid


class SyntheticTrace:
    """Collects rows, then :meth:`write` makes the SQLite file."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        self.nvtx: list[tuple] = []
        self.kernels: list[tuple] = []
        self.memcpy: list[tuple] = []
        self.runtime: list[tuple] = []
        self.domains: dict[str, int] = {}
        self._corr = 0
        self.stop_time: int | None = None  # ANALYSIS_DETAILS.stopTime when set

    def sid(self, s: str) -> int:
        if s not in self.strings:
            self.strings[s] = len(self.strings) + 1
        return self.strings[s]

    def domain(self, name: str, tid: int) -> int:
        if name not in self.domains:
            did = len(self.domains) + 1
            self.domains[name] = did
            self.nvtx.append((0, None, DOMAIN, name, tid, None, None, did))
        return self.domains[name]

    def range(self, name, start, end, tid, domain: str | None = None, event_type=PUSH_POP,
              end_tid=None, use_text=False):
        did = self.domain(domain, tid) if domain else 0
        text, text_id = (name, None) if use_text else (None, self.sid(name))
        self.nvtx.append((start, end, event_type, text, tid, end_tid if end_tid is not None else (tid if end is not None else None), text_id, did))

    def mark(self, name, t, tid):
        self.nvtx.append((t, None, MARK, name, tid, None, None, 0))

    def _launch(self, tid, launch, api_end, name="cudaLaunchKernel"):
        self._corr += 1
        if launch is not None:
            self.runtime.append((launch, api_end if api_end is not None else launch + 1000, tid, self._corr, self.sid(name)))
        return self._corr

    def kernel(self, start, end, pid, tid, launch=None, device=0, stream=7, name="k"):
        c = self._launch(gtid(pid, tid), launch, None)
        self.kernels.append((start, end, device, stream, c, gpid(pid), self.sid(name)))

    def copy(self, start, end, nbytes, kind, pid, tid, launch=None, device=0, src=1, dst=2, stream=8,
             api_end=None, api="cudaMemcpyAsync"):
        """kind: 1 = H2D, 2 = D2H, 8 = D2D; src/dst: 0 pageable, 1 pinned, 2 device."""
        c = self._launch(gtid(pid, tid), launch, api_end, api)
        self.memcpy.append((start, end, device, stream, c, gpid(pid), nbytes, kind, src, dst))

    def write(self, path: Path, with_enums: bool = True) -> Path:
        path = Path(path)
        con = sqlite3.connect(path)
        con.executescript(
            """
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
            CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, "end" INTEGER, eventType INTEGER NOT NULL,
                rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
                endGlobalTid INTEGER, textId INTEGER, domainId INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
                deviceId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
                demangledName INTEGER, shortName INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
                deviceId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
                bytes INTEGER, copyKind INTEGER, srcKind INTEGER, dstKind INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
                globalTid INTEGER, correlationId INTEGER, nameId INTEGER);
            """
        )
        con.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
                        [("EXPORT_SCHEMA_VERSION", "3.20.3"), ("EXPORT_PRODUCT_VERSION", "synthetic")])
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in self.strings.items()])
        con.executemany(
            "INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid, endGlobalTid, textId, domainId)"
            " VALUES (?,?,?,?,?,?,?,?)", self.nvtx)
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?)",
                        [k + (k[-1],) for k in self.kernels])
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?,?,?,?,?,?,?,?,?,?)", self.memcpy)
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?)", self.runtime)
        if self.stop_time is not None:
            con.execute("CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER, duration INTEGER, startTime INTEGER, stopTime INTEGER)")
            con.execute("INSERT INTO ANALYSIS_DETAILS VALUES (0, ?, 0, ?)", (self.stop_time, self.stop_time))
        if with_enums:
            con.executescript(
                """CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER, name TEXT, label TEXT);
                   INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (1,'CUDA_MEMCPY_KIND_HTOD','Host-to-Device'),
                     (2,'CUDA_MEMCPY_KIND_DTOH','Device-to-Host'), (8,'CUDA_MEMCPY_KIND_DTOD','Device-to-Device');"""
            )
        con.commit()
        con.close()
        return path
