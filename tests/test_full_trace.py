"""The issue's acceptance check on the full shared trace (skipped when ../shared is absent)."""

import sqlite3

from tracekit.analyze.result import analyze_path


def test_full_trace_four_iterations_with_boundary_and_copies_in_the_right_phase(full_trace):
    res = analyze_path(full_trace)
    (rank,) = res["ranks"]
    its = rank["iterations"]
    assert [it["index"] for it in its] == [0, 1, 2, 3]
    for it in its:
        phases = [(p["phase"], p["micro_step"], p["boundary"]) for p in it["phases"] if p["phase"] != "other"]
        assert phases == [("forward", 0, False), ("backward", 0, False), ("forward", 1, False),
                          ("backward", 1, True), ("update", None, False)]
    con = sqlite3.connect(f"file:{full_trace}?mode=ro", uri=True)
    # all pinned D2H copies (the gradients) of the trace, by SQL, launched inside a backward range
    d2h_in_bwd = con.execute(
        """SELECT sum(m.bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
           JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
           JOIN NVTX_EVENTS n ON n.textId = (SELECT id FROM StringIds WHERE value = 'DeepSpeedEngine.backward')
           WHERE m.copyKind = 2 AND r.start >= n.start AND r.start < n."end" """).fetchone()[0]
    h2d_in_step = con.execute(
        """SELECT sum(m.bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
           JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
           JOIN NVTX_EVENTS n ON n.textId = (SELECT id FROM StringIds WHERE value = 'DeepSpeedZeroOptimizer_Stage3.step')
           WHERE m.copyKind = 1 AND r.start >= n.start AND r.start < n."end" """).fetchone()[0]
    con.close()
    assert rank["totals"]["backward"]["d2h_bytes"] == d2h_in_bwd > 4e9
    assert rank["totals"]["update"]["h2d_bytes"] == h2d_in_step > 1e9
