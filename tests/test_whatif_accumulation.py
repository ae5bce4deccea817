"""The ZeRO-1/2 accumulation round trip of the ``larger_micro_batch`` scenario, checked against
plain SQL on the committed what-if benchmark cuts (benchmarks/whatif/traces) and hand-made pieces.

The boundary backward of a ZeRO-2 offload run at gas 2 fetches the accumulated gradients back
(H2D) and copies the sum again (D2H); the recorded gas-1 run (``z2s_mb2``) has no H2D there."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import bench_cut

RANGE = ("SELECT coalesce(n.text, s.value), n.start, n.end FROM NVTX_EVENTS n "
         "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif_accum")
    out = {}
    for run in ("z2s_base3", "z2s_mb2", "z3s_base4"):
        out[run] = bench_cut(run, d)
    return out


def _union(iv):
    tot, end = 0, None
    for a, b in sorted(iv):
        if end is None or a > end:
            tot += b - a
            end = b
        elif b > end:
            tot += b - end
            end = b
    return tot


def _boundary_copies_sql(path):
    """Per boundary backward range (time order): {direction: (bytes, busy ns, host ns)} of the
    copies launched inside it (runtime API start within the range), busy = union of their GPU
    times, host = the sum of their runtime API calls' durations."""
    con = sqlite3.connect(path)
    wins = sorted((a, b) for n, a, b in con.execute(RANGE).fetchall() if n == "backward boundary")
    rows = con.execute("SELECT m.copyKind, m.bytes, m.start, m.end, r.start, r.end FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
                       "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId").fetchall()
    con.close()
    out = []
    for a, b in wins:
        per = {}
        for kind, name in ((1, "H2D"), (2, "D2H")):
            sel = [(s, e, n, re - launch) for k, n, s, e, launch, re in rows if k == kind and a <= launch <= b]
            per[name] = (sum(x[2] for x in sel), _union([(x[0], x[1]) for x in sel]), sum(x[3] for x in sel))
        out.append(per)
    return out


def _pieces(path):
    from tracekit.analyze.model import phases
    from tracekit.analyze.sections import whatif
    from tracekit.analyze.trace.export import Export

    with Export.open(path) as ex:
        return whatif.measure(ex, phases.build(ex))[0]


def test_boundary_copies_equal_sql(traces):
    """The measured boundary backward copies of z2s_base3 (steady iterations 1-4 of the cut)
    equal plain SQL per iteration; 268 MB H2D at gas 2 and none at gas 1 (z2s_mb2)."""
    p = _pieces(traces["z2s_base3"])
    sql = _boundary_copies_sql(traces["z2s_base3"])
    c = p["boundary_backward_copies"]
    assert len(sql) == len(p["iterations"]) == 4
    for j, per in enumerate(sql):
        assert c["h2d_bytes"][j] == per["H2D"][0]
        assert c["d2h_bytes"][j] == per["D2H"][0]
        assert c["h2d_ns"][j] == pytest.approx(per["H2D"][1], abs=1)
        assert c["d2h_ns"][j] == pytest.approx(per["D2H"][1], abs=1)
        assert c["h2d_host_ns"][j] == per["H2D"][2] and c["d2h_host_ns"][j] == per["D2H"][2]
        # pageable copies: the host waits longer than the copy engine runs
        assert per["H2D"][2] > per["H2D"][1] and per["D2H"][2] > per["D2H"][1]
        assert 260e6 < per["H2D"][0] < 275e6 and 800e6 < per["D2H"][0] < 810e6
    for per in _boundary_copies_sql(traces["z2s_mb2"]):
        assert per["H2D"][0] == 0 and 530e6 < per["D2H"][0] < 540e6


def test_round_trip_is_h2d_plus_its_share_of_d2h(traces):
    """accumulation_round_trip_ns = H2D time + D2H time x H2D bytes / D2H bytes, each direction's
    time the longer of its busy time and its calls' host time, from the SQL."""
    from tracekit.analyze.sections import whatif

    p = _pieces(traces["z2s_base3"])
    want = [max(per["H2D"][1:]) + max(per["D2H"][1:]) * per["H2D"][0] / per["D2H"][0]
            for per in _boundary_copies_sql(traces["z2s_base3"])]
    assert whatif.accumulation_round_trip_ns(p) == pytest.approx(want, abs=2)
    assert all(45e6 < v < 75e6 for v in want)  # ~60 ms per iteration on this run (busy times alone ~42)


def test_hand_made_round_trip():
    from tracekit.analyze.sections import whatif

    pieces = {"boundary_backward_copies": {"h2d_bytes": [100.0, 0.0, 300.0], "h2d_ns": [10.0, 0.0, 30.0],
                                           "d2h_bytes": [300.0, 200.0, 100.0], "d2h_ns": [60.0, 40.0, 20.0]}}
    # 10 + 60 x 1/3; 0 + 40 x 0; 30 + 20 x min(3, 1)
    assert whatif.accumulation_round_trip_ns(pieces) == pytest.approx([30.0, 0.0, 50.0])
    # the host time of the calls counts where it is the longer: H2D max(10, 16), D2H max(60, 90) / 3
    pieces["boundary_backward_copies"].update(h2d_host_ns=[16.0, 0.0, 5.0], d2h_host_ns=[90.0, 10.0, 20.0])
    assert whatif.accumulation_round_trip_ns(pieces) == pytest.approx([46.0, 0.0, 50.0])
    assert whatif.accumulation_round_trip_ns({}) == []


def test_zero2_scenario_saves_the_round_trip_and_zero3_does_not(traces):
    """The scenario's backward saving on ZeRO-2 exceeds the ZeRO-3 rule by exactly the mean round
    trip; on ZeRO-3 (z3s_base4) the rule is unchanged (the boundary's copies stay)."""
    from tracekit.analyze.sections import whatif

    p = _pieces(traces["z2s_base3"])
    rt = whatif.accumulation_round_trip_ns(p)
    with_rt = whatif._larger_micro_batch(p, False, True)
    without = whatif._larger_micro_batch(p, False, False)
    diff = without["phase_delta_ns"]["backward"] - with_rt["phase_delta_ns"]["backward"]
    assert diff == pytest.approx(sum(rt) / len(rt), rel=1e-9)
    assert with_rt["phase_delta_ns"]["forward"] == without["phase_delta_ns"]["forward"]
    p3 = _pieces(traces["z3s_base4"])
    pred = {r["scenario"]: r for r in whatif.predict(p3, {"zero_optimization.stage": 3}, {})}["larger_micro_batch"]
    assert pred["phase_delta_ns"] == whatif._larger_micro_batch(p3, False, False)["phase_delta_ns"]
