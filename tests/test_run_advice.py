"""Advice once per run (tracekit.analyze.run_advice): each change once, with its spread."""

from tracekit.analyze.run_advice import per_run


def test_real_advice_one_rank(zero3_analysis):
    j = zero3_analysis.to_json()
    items = j["advice"]
    assert items, "the fixture has advice"
    runs = j["advice_per_run"]
    changes = {(i["scenario"], i["knob"], i["change"]) for i in items}
    assert len(runs) == len(changes)
    assert all(r["ranks"] == 1 and r["saving_spread_ms"] == 0 for r in runs)


def test_real_advice_copied_to_a_second_rank(zero3_analysis):
    # the fixture's per-rank items and a copy as another rank (pid + 1, 10 % slower, saving +2 ms)
    items = zero3_analysis.to_json()["advice"]
    other = [dict(i, pid=i["pid"] + 1, baseline_iteration_ms=i["baseline_iteration_ms"] * 1.1,
                  saving_ms_per_iteration=i["saving_ms_per_iteration"] + 2.0) for i in items]
    runs = per_run(items + other)
    assert len(runs) == len({(i["scenario"], i["knob"], i["change"]) for i in items})
    for r in runs:
        assert r["ranks"] == 2
        assert abs(r["saving_spread_ms"] - 2.0) < 1e-9
        assert r["slowest"]["pid"] == items[0]["pid"] + 1


def test_synthetic_items_tie_names_first_rank():
    a = {"scenario": "s", "knob": "k", "change": "x", "pid": 1, "device": 0, "problem": "p1",
         "baseline_iteration_ms": 100.0, "saving_ms_per_iteration": 10.0, "confidence": "high"}
    b = dict(a, pid=2, device=1, problem="p2", saving_ms_per_iteration=4.0)
    c = dict(a, knob="other", saving_ms_per_iteration=1.0)
    runs = per_run([a, b, c])
    assert [r["knob"] for r in runs] == ["k", "other"]
    assert runs[0]["saving_ms_per_iteration"] == {"min": 4.0, "mean": 7.0, "max": 10.0}
    assert runs[0]["slowest"]["pid"] == 1 and runs[0]["problem"] == "p1"
