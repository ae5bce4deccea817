"""gradient_clipping read from a SuperOffload trace without its config.

DeepSpeed's SuperOffloadOptimizer_Stage3 (superoffload_stage3.py) waits for each CPU sub-group's
step inside ``step()`` only with gradient clipping on (``_step_with_clipping`` ->
``_wait_for_single_async_result``); without it the sub-groups were stepped during backward and
``step()`` waits once (``_wait_for_async_operations``). tracekit's hook names both waits
``cpu_update_wait``. The counts are checked by plain SQL on the benchmark's cut traces, whose
configs (benchmarks/whatif/manifests) give gradient_clipping 1.0 (so_base: unset, DeepSpeed
0.19.8's default) and 0.0 (so_noclip).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import bench_cut

from tracekit.analyze.model import phases
from tracekit.analyze.sections import whatif
from tracekit.analyze.trace import dsconfig
from tracekit.analyze.trace.export import Export

MANIFESTS = Path(__file__).resolve().parent.parent / "benchmarks" / "whatif" / "manifests"


def _waits_per_update(db: Path) -> list[int]:
    """cpu_update_wait ranges inside each closed ``update`` range (plain SQL)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT u.start, (SELECT count(*) FROM NVTX_EVENTS w JOIN StringIds sw ON sw.id = w.textId "
        "WHERE sw.value = 'cpu_update_wait' AND w.start >= u.start AND w.end <= u.end) "
        "FROM NVTX_EVENTS u JOIN StringIds su ON su.id = u.textId WHERE su.value = 'update' AND u.end IS NOT NULL "
        "ORDER BY u.start").fetchall()
    con.close()
    return [n for _, n in rows]


@pytest.mark.parametrize("run, clip", [("so_base", 1.0), ("so_noclip", 0.0)])
def test_clipping_inferred_from_the_waits(run, clip, tmp_path):
    cfg = json.loads((MANIFESTS / f"{run}.ds.json").read_text())
    version = json.loads((MANIFESTS / f"{run}.json").read_text())["versions"]["deepspeed"]
    assert version == "0.19.8"  # unset gradient_clipping is 1.0 since 0.19.3
    assert cfg.get("gradient_clipping", 1.0) == clip
    db = bench_cut(run, tmp_path)
    waits = _waits_per_update(db)
    assert waits and all(w == (11 if clip else 1) for w in waits), waits  # 10 sub-groups, all on the CPU
    with Export.open(db) as ex:
        pieces = whatif.measure(ex, phases.build(ex))[0]
    facts = whatif.trace_facts(pieces)
    assert facts["cpu_wait_calls"] == pytest.approx(sum(waits) / len(waits))
    got = dsconfig.infer_settings(facts).get("gradient_clipping")
    if clip:
        assert got[0] == dsconfig.CLIPPING_ON and "11 cpu_update_wait ranges per update" in got[1]
    else:
        assert got is None  # one wait: clipping off, or on with no CPU sub-group; not told apart


def test_no_clipping_scenario_offered_without_the_config(tmp_path):
    """Without a manifest the so_base trace still gets the no-clipping prediction, the same as
    with its config (gradient_clipping 1.0): the saving does not read the threshold."""
    db = bench_cut("so_base", tmp_path)
    with Export.open(db) as ex:
        pieces = whatif.measure(ex, phases.build(ex))[0]
    from tracekit.analyze.sections import advice

    inferred = advice.settings_map(dsconfig.settings({}, dsconfig.infer_settings(whatif.trace_facts(pieces))))
    given = dict(inferred, gradient_clipping=1.0)
    a = {r["scenario"]: r for r in whatif.predict(pieces, inferred, {})}["superoffload_no_clipping"]
    b = {r["scenario"]: r for r in whatif.predict(pieces, given, {})}["superoffload_no_clipping"]
    assert a["applicable"] and b["applicable"]
    assert a["saving_ns"] == b["saving_ns"] > 0
