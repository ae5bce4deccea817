"""The many-trace table's numbers are per steady iteration (the one warm-up rule), as a single
trace's are: the real ZeRO-3 run with its iteration 0 gives the same mean as plain SQL over its
DeepSpeed ranges, iterations 1-3."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from test_warmup_rule import FULL_RUN, _sql_iterations


def test_rank_row_steady_mean_equals_sql(tmp_path):
    from tracekit.analyze import multi
    from tracekit.options import Options

    d = tmp_path / "runs"
    d.mkdir()
    shutil.copyfile(FULL_RUN, d / "full_run.sqlite")
    shutil.copyfile(Path(__file__).resolve().parent / "fixtures" / "zero3_offload_gas2_cut.sqlite", d / "cut.sqlite")
    walls, _ = _sql_iterations(FULL_RUN)
    out = multi.analyze_many([d], Options(), cache=False, jobs=1)
    (row,) = [r for r in out["summary"]["rank_rows"] if r["trace"].endswith("full_run.sqlite")]
    assert row["steady_iterations"] == [1, 2, 3]
    assert row["steady_mean_iteration_ns"] == pytest.approx(sum(walls[1:4]) / 3, abs=1)
    assert sum(row["steady_phase_ns"].values()) == pytest.approx(row["steady_mean_iteration_ns"], abs=1)
    rc, text, _ = run_cli("analyze", d, "--no-cache")
    assert rc == 0 and "ms per steady iteration, warm-up apart" in text
    assert f"{sum(walls[1:4]) / 3 / 1e6:,.1f}" in text
