"""Proof by splitting: a two-rank export split into one file per process
(benchmarks/split_ranks.py) gives, as a folder, the same per-rank phase times and one host."""

import importlib.util
import sqlite3
from pathlib import Path

import pytest
from conftest import PUBLIC
from test_waiting_ranks import _skew_trace

import tracekit

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("split_ranks", ROOT / "benchmarks" / "split_ranks.py")
split_ranks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(split_ranks)


def _check(whole_path, tmp_path):
    parts = split_ranks.split(whole_path, tmp_path / "split")
    assert len(parts) == 2
    for p in parts:  # each split holds one process's kernels only (plain SQL)
        with sqlite3.connect(p) as con:
            assert con.execute("SELECT COUNT(DISTINCT globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == 1
    whole = tracekit.analyze_many([whole_path], cache=False).summary
    folder = tracekit.analyze_many([tmp_path / "split"], cache=False).summary
    assert folder["one_run"] is True
    key = lambda r: r["pid"]  # noqa: E731
    a = sorted(whole["rank_rows"], key=key)
    b = sorted(folder["rank_rows"], key=key)
    assert [(r["pid"], r["device"], r["phase_ns"], r["per_iteration"]) for r in a] == \
        [(r["pid"], r["device"], r["phase_ns"], r["per_iteration"]) for r in b]
    assert len(folder["run"]["hosts"]) == 1
    offsets = list(folder["run"]["clock"]["start_offset_ns"].values())
    # the splits keep the original's capture start: offsets 0 (None where the export has none)
    assert len(offsets) == 2 and len(set(offsets)) == 1 and offsets[0] in (0, None)


def test_split_synthetic_two_rank(tmp_path):
    # no two-GPU fixture in tests/fixtures: the synthetic two-rank trace of test_waiting_ranks
    _check(_skew_trace(tmp_path, "synthetic_split_whole.sqlite"), tmp_path)


def test_split_public_two_gpu(tmp_path):
    path = PUBLIC / "nsys-ai__mfu_2gpu_before.sqlite"
    if not path.exists():
        pytest.skip(f"{path} not present")
    _check(path, tmp_path)
