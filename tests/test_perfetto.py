"""``tracekit report --perfetto FILE``: the file follows the trace-event format (checked by a
small schema of the format's required fields per event type) and its copy events are the
trace's memcpys (plain SQL), its phase events the NVTX phase ranges."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter

import pytest
from conftest import ZERO3_CUT, assert_one_line_error
from conftest import run_cli as run


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    d = tmp_path_factory.mktemp("pf")
    rc, out, err = run("report", ZERO3_CUT, "-o", d / "r", "--perfetto", d / "sub" / "trace.json")
    assert rc == 0, err
    assert "trace.json" in out
    return json.loads((d / "sub" / "trace.json").read_text(encoding="utf-8"))


def _check_event(e: dict) -> None:
    """The trace-event format (Chrome's 'Trace Event Format' document): every event has ph, pid,
    tid (ints) and name; X events ts and dur (µs, numbers >= 0); i events ts and a scope g/p/t;
    M events one of the metadata names with args."""
    assert isinstance(e["name"], str) and isinstance(e["pid"], int) and isinstance(e["tid"], int)
    assert e["ph"] in ("X", "i", "M")
    if e["ph"] == "X":
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
    elif e["ph"] == "i":
        assert isinstance(e["ts"], (int, float)) and e["s"] in ("g", "p", "t")
    else:
        assert e["name"] in ("process_name", "thread_name", "thread_sort_index", "process_sort_index")
        assert isinstance(e["args"], dict)
    if "args" in e:
        assert isinstance(e["args"], dict)


def test_trace_event_format(doc):
    assert set(doc) >= {"traceEvents"} and doc["displayTimeUnit"] in ("ms", "ns")
    for e in doc["traceEvents"]:
        _check_event(e)
    cats = Counter(e.get("cat") for e in doc["traceEvents"])
    assert cats["phase"] > 0 and cats["sub_phase"] > 0 and cats["kernel"] > 0 and cats["finding"] > 0
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    lanes = {n.split(" #")[0] for n in names}  # a lane's extra tracks (overlapping events) are "kernels #2", ...
    assert lanes == {"phases", "sub-phases", "H2D copies", "D2H copies", "other copies", "kernels", "findings"}


def test_copy_events_equal_sql(doc):
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    want = Counter(con.execute('SELECT start, "end", bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY').fetchall())
    (n_kernels,) = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.close()
    copies = [e for e in doc["traceEvents"] if e.get("cat") == "copy"]
    got = Counter((e["args"]["start_ns"], e["args"]["end_ns"], e["args"]["bytes"]) for e in copies)
    assert got == want
    for e in copies:  # ts/dur in µs, exact to the ns
        assert round(e["ts"] * 1000) == e["args"]["start_ns"]
        assert round(e["dur"] * 1000) == e["args"]["end_ns"] - e["args"]["start_ns"]
    assert sum(1 for e in doc["traceEvents"] if e.get("cat") == "kernel") == n_kernels


def test_phase_events_equal_nvtx(doc):
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    steps = con.execute("""SELECT e.start, e."end" FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId
                           WHERE s.value = 'DeepSpeedZeroOptimizer_Stage3.step' ORDER BY e.start""").fetchall()
    con.close()
    upd = sorted((round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000)) for e in doc["traceEvents"]
                 if e.get("cat") == "phase" and e["name"] == "update")
    assert upd == steps


def test_perfetto_to_a_directory_is_one_line_error(tmp_path):
    assert_one_line_error(*run("report", ZERO3_CUT, "-o", tmp_path / "r", "--perfetto", tmp_path),
                          "is a directory")
