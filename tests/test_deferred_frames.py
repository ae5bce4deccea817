"""File-only frames built when read (issue 24): the GPU memory timeline is not held for the run
but built from the trace opened again when ``--out`` or ``Analysis.frames`` asks for it; it holds
what plain SQL on the fixture says, and a trace changed since the analysis is one error line."""

import os
import shutil
import sqlite3

import pytest
from conftest import ZERO3_CUT

import tracekit
from tracekit.errors import TracekitError

#: memKind ids of the device kinds the timeline counts (ENUM_CUDA_MEM_KIND: Device, Array, Managed,
#: Device Static, Managed Static)
_DEVICE_KIND_IDS = (2, 3, 4, 5, 6)


def test_memory_timeline_when_read(tmp_path):
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(ZERO3_CUT, trace)
    a = tracekit.analyze(trace, cache=False, sections=("memory",))
    tr = a._transfers(("memory",))
    assert "memory_timeline" in tr.deferred and "memory_timeline" not in tr.stored  # (not built yet)
    tl = a.frames["memory_timeline"]
    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    kinds = ",".join(map(str, _DEVICE_KIND_IDS))
    n, net = db.execute(f"SELECT count(*), sum(CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END) "
                        f"FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memoryOperationType IN (0, 1) "
                        f"AND memKind IN ({kinds})").fetchone()
    db.close()
    assert tl.height == n > 5000
    assert tl["delta_bytes"].sum() == net
    assert tl["bytes_in_use"][-1] == net  # (one rank: the running sum's last value)
    assert {"iteration", "phase", "window_id"} <= set(tl.columns)


def test_changed_trace_is_one_line(tmp_path):
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(ZERO3_CUT, trace)
    a = tracekit.analyze(trace, cache=False, sections=("memory",))
    a._transfers(("memory",))
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(TracekitError, match="changed since it was analyzed"):
        a.frames["memory_timeline"]
