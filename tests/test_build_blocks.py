"""The phase model's reads done a column or a block at a time (issue 24): the ops' sort, the
window search and the sub-phase search in blocks give what a plain loop finds."""

import numpy as np
import polars as pl
import pytest
from test_phases_synthetic import MAIN, MS, build, step_with_sub_ranges

from tracekit.analyze.model import gpu_ops, phases


def _parts(rng, n, ties):
    hi = n // 3 if ties else 10 * n
    out = []
    for k in range(3):
        m = n + k * 7
        starts = rng.choice(hi, m, replace=not ties) if not ties else rng.integers(0, hi, m)
        out.append(pl.DataFrame({"start": starts.astype(np.int64), "part": [k] * m, "row": np.arange(m),
                                 "label": [f"r{k}-{i}" for i in range(m)]}))
    return out


@pytest.mark.parametrize("ties", [False, True])
def test_sorted_by_start_is_a_sort_of_the_rows(ties):
    rng = np.random.default_rng(7)
    parts = _parts(rng, 500, ties)
    rows = [r for p in parts for r in p.iter_rows()]
    got = gpu_ops._sorted_by_start(list(parts))
    assert got.columns == ["start", "part", "row", "label"]
    out = list(got.iter_rows())
    assert sorted(out) == sorted(rows)  # the same rows
    assert all(a[0] <= b[0] for a, b in zip(out, out[1:]))  # by start
    if not ties:
        assert out == sorted(rows, key=lambda r: r[0])


def _window_rows_loop(ops, w):
    out = []
    for pid, launch in ops.select("global_pid", "launch").iter_rows():
        best = None
        for i, (wp, ws) in enumerate(w.select("global_pid", "w_start").iter_rows()):
            if pid is not None and launch is not None and wp == pid and ws <= launch:
                if best is None or ws >= w["w_start"][best]:
                    best = i
        out.append(best)
    return out


def test_window_rows_equal_a_loop():
    rng = np.random.default_rng(3)
    # two processes, repeated window starts, a process without windows, null pid and launch
    w = pl.DataFrame({"global_pid": [1, 2, 1, 1, 2, 1], "w_start": [0, 5, 10, 10, 20, 30]})
    pid = rng.choice([1, 2, 3], 300).tolist()
    launch = rng.integers(-5, 40, 300).tolist()
    pid[0], launch[1] = None, None
    ops = pl.DataFrame({"global_pid": pid, "launch": launch}, schema={"global_pid": pl.Int64, "launch": pl.Int64})
    assert phases._window_rows(ops, w).to_list() == _window_rows_loop(ops, w)


@pytest.mark.parametrize("block", [1, 2, 32_768])
def test_sub_phase_search_in_blocks(tmp_path, monkeypatch, block):
    monkeypatch.setattr(phases, "_ATTRIBUTE_BLOCK", block)
    t = step_with_sub_ranges()
    t.copy(46 * MS, 47 * MS, 8, 1, pid=1, tid=MAIN, launch=46 * MS)
    t.copy(50 * MS, 51 * MS, 8, 1, pid=1, tid=MAIN, launch=None)  # no launching thread
    t.copy(53 * MS, 54 * MS, 8, 1, pid=1, tid=MAIN, launch=53 * MS)
    t.copy(60 * MS, 61 * MS, 16, 1, pid=1, tid=MAIN, launch=56 * MS)
    m, _ = build(t, tmp_path)
    sub = m.ops.filter(pl.col("phase") == "update").sort("start")["sub_phase"].to_list()
    assert sub == ["cpu_adam", None, "copy_back", None]


@pytest.mark.parametrize("block", [1, 3, 1000])
def test_launch_rows_in_blocks_equal_a_loop(monkeypatch, block):
    """Each op's runtime row, matched a block of ops at a time, against a dict lookup per op:
    two processes, ids repeated across them, ops without a match, null ids and processes (of ops
    and of runtime rows)."""
    monkeypatch.setattr(gpu_ops, "_LAUNCH_BLOCK", block)
    rng = np.random.default_rng(11)
    n_rt = 300
    rt = pl.DataFrame({"global_pid": rng.choice([1 << 24, 2 << 24], n_rt),
                       "correlation_id": rng.choice(400, n_rt, replace=False)}).unique(
        ["global_pid", "correlation_id"], maintain_order=True)
    # runtime rows without a thread (a damaged export): their process is null and matches no op
    rt = rt.with_columns(pl.when(pl.int_range(pl.len()) % 29 == 0).then(None).otherwise(pl.col("global_pid"))
                         .alias("global_pid"))
    ops = pl.DataFrame({"global_pid": rng.choice([1 << 24, 2 << 24, 3 << 24], 700),
                        "correlation_id": rng.integers(0, 500, 700)})
    ops = ops.with_columns(pl.when(pl.int_range(pl.len()) % 17 == 0).then(None).otherwise(pl.col("correlation_id"))
                           .alias("correlation_id"),
                           pl.when(pl.int_range(pl.len()) % 23 == 0).then(None).otherwise(pl.col("global_pid"))
                           .alias("global_pid"))
    where = {(p, c): i for i, (p, c) in enumerate(rt.iter_rows()) if p is not None}
    want = [where.get((p, c)) if p is not None and c is not None else None for p, c in ops.iter_rows()]
    assert gpu_ops._launch_rows(ops, rt).to_list() == want
    assert sum(w is not None for w in want) > 100  # (the case matches many)
