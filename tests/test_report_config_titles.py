"""The report's figure titles say what ``analyze`` says about the config, not what the file name
suggests: a trace copied to a misleading name (``zero2_fp16_gas8_offload``) keeps the stage,
precision and gas its analysis found (found by a new-user run: the titles said ZeRO-2, fp16,
grad. accumulation 8 while report.md said ZeRO-3, bf16, gas 2)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from conftest import run_cli

FIX = Path(__file__).resolve().parent / "fixtures"


def test_titles_follow_the_analysis_not_the_file_name(tmp_path):
    src = tmp_path / "zero2_fp16_gas8_offload.sqlite"
    shutil.copyfile(FIX / "ds_zero3_offload_iter1-2.sqlite", src)
    rc, js, _ = run_cli("analyze", src, "--json", "--no-cache")
    assert rc == 0
    v = {s["key"]: s["value"] for s in json.loads(js)["config"]["settings"]}
    assert v["zero_optimization.stage"] == 3 and v["precision"] == "bf16" and v["gradient_accumulation_steps"] == 2
    out = tmp_path / "rep"
    rc, _, err = run_cli("report", src, "-o", out)
    assert rc == 0, err
    svgs = sorted(out.glob("*.svg"))
    assert svgs
    for svg in svgs:
        text = svg.read_text()
        titles = set(re.findall(r"ZeRO-\d[^<\n]*", text))
        assert titles, svg.name
        for t in titles:
            assert t.startswith("ZeRO-3") and "bf16" in t and "grad. accumulation 2" in t, (svg.name, t)
            assert "file name" not in t and "fp16" not in t
