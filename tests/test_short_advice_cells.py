"""The default screen's advice cells: the change whole where it fits two lines, its knob left out
when the change names it, the long config keys abbreviated as the header line does."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli

from tracekit.render.short import advice_text

FIX = Path(__file__).resolve().parent / "fixtures"
ONE = str(FIX / "ds_zero3_offload_iter1-2.sqlite")


def test_hand_made_cells():
    mb = {"knob": "train_micro_batch_size_per_gpu / gradient_accumulation_steps",
          "change": "micro-batch x 2, gradient_accumulation_steps 2 -> 1 (same global batch; needs memory)"}
    assert advice_text(mb) == "micro-batch x 2, gas 2 -> 1"
    off = {"knob": "zero_optimization.offload_optimizer.device",
           "change": "cpu -> none (keep the optimizer on the GPU)"}
    assert advice_text(off) == "offload_optimizer.device: cpu -> none"
    pin = {"knob": "zero_optimization.offload_optimizer.pin_memory", "change": "false -> true when memory allows"}
    assert advice_text(pin) == "offload_optimizer.pin_memory: false -> true"
    code = {"knob": "DeepSpeed code (no config key)", "change": "issue the D2H on a side stream"}
    assert advice_text(code) == "DeepSpeed code: issue the D2H on a side stream"


def test_fixture_top_items_are_whole():
    """On the README's fixture the two largest savings print whole (no ellipsis), each as its
    --json change up to the first parenthesis, abbreviated."""
    rc, js, _ = run_cli("analyze", ONE, "--no-cache", "--json")
    assert rc == 0
    advice = json.loads(js)["advice"]
    rc, out, _ = run_cli("analyze", ONE, "--no-cache", env={"COLUMNS": "80"})
    lines = out.splitlines()
    for i, a in enumerate(advice[:2], 1):
        at = next(k for k, x in enumerate(lines) if x.startswith(f"{i} "))
        cell = [lines[at][4:38].strip()] + [x[4:38].strip() for x in lines[at + 1:at + 2] if x.startswith("    ")]
        text = " ".join(c for c in cell if c)
        assert "…" not in text
        want = a["change"].split(" (")[0].replace("gradient_accumulation_steps", "gas")
        assert want in text, (text, a["change"])
