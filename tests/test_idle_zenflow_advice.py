"""ZenFlow with gradient_accumulation_steps 1: the idle section offers no larger micro-batch.

An iteration of ZenFlow holds update_interval training steps (4 forwards here), which are not
accumulation micro-steps: merging them into one micro-batch would change the training, and the
what-if model says so (its ``larger_micro_batch`` row: not applicable, "ZenFlow: ...")."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

FIX = Path(__file__).resolve().parent / "fixtures"
TRACE = FIX / "zenflow_cut.sqlite"


def test_no_micro_batch_item_on_zenflow_gas1():
    from tracekit.analysis import analyze

    cfg = json.loads((FIX / "zenflow_capture.json").read_text())["deepspeed_config"]
    assert cfg["gradient_accumulation_steps"] == 1 and cfg["zero_optimization"]["zenflow"]["update_interval"] == 4
    con = sqlite3.connect(f"file:{TRACE}?mode=ro", uri=True)
    fwd = con.execute("SELECT count(*) FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                      "WHERE s.value = 'forward'").fetchone()[0]
    con.close()
    assert fwd >= 4  # the steps an iteration holds (a trap for a forward-counting rule)
    res = analyze(TRACE).to_json()
    assert all(a.get("scenario") != "larger_micro_batch" for a in res["advice"])
    assert all("gradient_accumulation_steps" not in (a.get("knob") or "") for a in res["advice"])
    (row,) = [p for p in res["predictions"] if p["scenario"] == "larger_micro_batch"]
    assert not row["applicable"] and row["why_not"].startswith("ZenFlow")
