"""The ranks side by side per steady iteration (tracekit.analyze.run_summary): a hand-made
result of two ranks with a warm-up iteration and collective waits, expected values by hand."""

import pytest

from tracekit.analyze.run_summary import across_ranks, steady_iterations

MS = 1_000_000


def _rank(no, pid, walls):
    """Iterations 0..n-1, each forward (40 %) + update (60 %) of ``walls[i]`` ms."""
    its = [{"index": i, "complete": True, "phases": [
        {"phase": "forward", "wall_ns": 0.4 * w * MS, "gpu_idle_ns": 0.1 * w * MS},
        {"phase": "update", "wall_ns": 0.6 * w * MS, "gpu_idle_ns": 0.3 * w * MS}]} for i, w in enumerate(walls)]
    return {"rank": no, "pid": pid, "device": no, "iterations": its, "totals": {}}


def test_warm_up_apart_and_the_slowest_named():
    r0, r1 = _rank(0, 10, [900, 100, 102]), _rank(1, 11, [900, 150, 152])
    assert steady_iterations(r0) == [1, 2]  # iteration 0, the warm-up, apart
    waits = [{"rank": 0, "iteration": i, "phase": "forward", "wait_ns": w * MS, "collective_ns": 2 * w * MS}
             for i, w in ((0, 50), (1, 20), (2, 22))]
    waits += [{"rank": 1, "iteration": i, "phase": "forward", "wait_ns": 1 * MS, "collective_ns": 3 * MS}
              for i in (0, 1, 2)]
    ar = across_ranks({"ranks": [r0, r1], "waiting_ranks": {"per_rank": waits}})
    a, b = ar["per_rank"]
    assert (a["iteration_ns"], b["iteration_ns"]) == (101 * MS, 151 * MS)  # means of 100, 102 and 150, 152
    assert a["iteration_spread_ns"] == 2 * MS and a["gpu_idle_share"] == 0.4
    assert a["phase_ns"] == {"forward": pytest.approx(40.4 * MS), "update": pytest.approx(60.6 * MS)}
    assert a["wait_ns"] == 21 * MS and b["wait_ns"] == 1 * MS  # per steady iteration, warm-up apart
    it = ar["phases"][0]
    assert it["phase"] == "iteration" and it["mean_ns"] == 126 * MS and it["slowest_rank"] == 1
    assert ar["slowest_rank"] == 1 and ar["basis"] == "steady" and ar["collectives"] is True
    assert ar["waits_most"] == {"rank": 0, "wait_ns": 21 * MS, "others_mean_ns": 1 * MS}


def test_within_the_spread_no_rank_stands_out():
    # rank 1 is 6 % slower on the mean, but rank 0's iterations spread over 20 ms
    ar = across_ranks({"ranks": [_rank(0, 10, [500, 90, 110]), _rank(1, 11, [500, 105, 107])]})
    assert [r["iteration_ns"] for r in ar["per_rank"]] == [100 * MS, 106 * MS]
    assert ar["slowest_rank"] is None and ar["waits_most"] is None and ar["collectives"] is False
