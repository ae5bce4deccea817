"""``tracekit trim --time-range``: time cuts for the scaling benchmark (issue 6)."""

from __future__ import annotations

import sqlite3

import pytest

from tracekit.analyze.trace.export import Export
from tracekit.analyze.trim import capture_span, parse_time_range, trim
from tracekit.cli import main
from tracekit.errors import TracekitError


def _count(path, table, where="1"):
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        return c.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0]


def test_parse_time_range(zero3_cut):
    with Export.open(zero3_cut) as e:
        lo, hi = capture_span(e)
        assert parse_time_range(e, "50%:100%") == (lo + (hi - lo) // 2, hi)
        assert parse_time_range(e, "75:75.5") == (75_000_000_000, 75_500_000_000)  # its CUDA work: 74.8-76.1 s
        assert parse_time_range(e, ":") == (lo, hi + 1)
        for bad in ("x", "5:1", "1-2", "50%",
                    "1.5:2"):  # no CUDA activity there: the cut would be empty
            with pytest.raises(TracekitError, match="--time-range"):
                parse_time_range(e, bad)


def test_time_cut_keeps_the_window(zero3_cut, tmp_path):
    dst = tmp_path / "half.sqlite"
    out = trim(zero3_cut, dst, time_range="50%:100%")
    t0, t1 = out["window_ns"]
    n_src = _count(zero3_cut, "GPU_METRICS", f"timestamp >= {t0} AND timestamp < {t1}")
    assert _count(dst, "GPU_METRICS") == n_src > 0
    assert _count(dst, "GPU_METRICS", f"timestamp < {t0}") == 0
    with Export.open(dst) as e:
        assert e.first_iteration == 0  # a time cut numbers iterations from 0


def test_trim_needs_exactly_one_window(zero3_cut, tmp_path, capsys):
    assert main(["trim", str(zero3_cut), str(tmp_path / "a.sqlite")]) == 2
    assert main(["trim", str(zero3_cut), str(tmp_path / "b.sqlite"), "--iterations", "1", "--time-range", ":"]) == 2
    assert "either --iterations" in capsys.readouterr().err
    assert main(["trim", str(zero3_cut), str(tmp_path / "c.sqlite"), "--time-range", "75%:100%"]) == 0
    assert "time range 75%:100%" in capsys.readouterr().out
