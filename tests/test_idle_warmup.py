"""The idle findings' "per steady iteration" leaves the warm-up out (the one warm-up rule,
tracekit.analyze.model.steady), checked on the real ZeRO-3 run with its iteration 0
(``ds_zero3_offload_iter0-3.sqlite``) against plain SQL over the DeepSpeed NVTX ranges."""

from __future__ import annotations

import sqlite3
from pathlib import Path

FULL_RUN = Path(__file__).resolve().parent / "fixtures" / "ds_zero3_offload_iter0-3.sqlite"
FWD, UPD = "DeepSpeedEngine.forward", "DeepSpeedZeroOptimizer_Stage3.step"


def _forward_ns_per_iteration(path: Path) -> dict[int, int]:
    """Sum of the forward ranges' wall time per iteration (iteration i: after the i-th optimizer
    step's end, before the next one's)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("SELECT s.value, e.start, e.end FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                       "WHERE s.value IN (?, ?) AND e.end IS NOT NULL ORDER BY e.start", (FWD, UPD)).fetchall()
    con.close()
    ends = [e for n, _, e in rows if n == UPD]
    out: dict[int, int] = {}
    for n, s, e in rows:
        if n == FWD:
            i = sum(1 for x in ends if x <= s)
            out[i] = out.get(i, 0) + (e - s)
    return out


def test_idle_forward_finding_is_over_iterations_1_to_3():
    from tracekit.analysis import analyze

    res = analyze(FULL_RUN).to_json()
    (f,) = [f for f in res["findings"] if f["topic"] == "idle" and f["phase"] == "forward"]
    per = _forward_ns_per_iteration(FULL_RUN)
    steady = [i for i in per if i in (1, 2, 3)]
    assert steady == [1, 2, 3] and f["values"]["iterations"] == 3
    # tracekit's forward phase holds DeepSpeed's forward range and the host time around it, so its
    # wall is at least the ranges' and within 5 % here; with iteration 0 (its second forward alone
    # 528 ms) the mean would be ~2x larger
    want = sum(per[i] for i in steady) / 3
    assert want <= f["values"]["wall_ns"] <= 1.05 * want
    assert f["values"]["wall_ns"] < (sum(per.values()) / len(per))
