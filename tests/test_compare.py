"""``tracekit compare``: differences per phase and iteration, JSON, figure, bad input."""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import ZERO3_CUT
from conftest import run_cli as run

from tracekit.report import compare as C
from tracekit.report import style as S
from tracekit.report import summary
from tracekit.report.data import ReportData


@pytest.fixture(scope="module")
def cut2(tmp_path_factory):
    """Iteration 2 of the fixture, cut again with tracekit trim (a second, different trace)."""
    out = tmp_path_factory.mktemp("cut") / "iter2.sqlite"
    rc, _out, err = run("trim", ZERO3_CUT, out, "--iterations", "2-2", "--keep-metrics", "PCIe")
    assert rc == 0, err
    return out


def test_compare_with_itself_is_zero():
    d = ReportData.load(ZERO3_CUT)
    res = C.compare_data(d, d)
    for r in res["per_phase"] + res["per_iteration"]:
        for m, v in r["metrics"].items():
            assert v["delta"] in (0, 0.0, None), (r["phase"], m, v)
    d.close()


def test_compare_two_cuts_per_iteration(cut2):
    """A = iterations 1-2, B = iteration 2 alone: position 0 compares A's iteration 1 with B's
    iteration 2, so B's side equals A's own iteration-2 numbers and delta = it2 - it1."""
    res = C.compare_paths(ZERO3_CUT, cut2)
    assert res["a"]["iterations"] == [1, 2] and res["b"]["iterations"] == [2]
    da = ReportData.load(ZERO3_CUT)
    m = summary.iteration_metrics(da, da.rank(0))
    da.close()
    rows = [r for r in res["per_iteration"] if r["position"] == 0]
    assert {r["a_iteration"] for r in rows} == {1} and {r["b_iteration"] for r in rows} == {2}
    for r in rows:
        if r["phase"] == "other":
            continue  # the cut's leading gap is not the same window
        a1 = m.filter((pl.col("iteration") == 1) & (pl.col("phase") == r["phase"])).row(0, named=True)
        a2 = m.filter((pl.col("iteration") == 2) & (pl.col("phase") == r["phase"])).row(0, named=True)
        for k in ("wall_ns", "h2d_bytes", "d2h_bytes", "pageable_count", "pageable_bytes"):
            v = r["metrics"][k]
            assert v["a"] == a1[k] and v["b"] == a2[k], (r["phase"], k)
            assert v["delta"] == a2[k] - a1[k]
            if a1[k]:
                assert v["pct"] == pytest.approx(100 * (a2[k] - a1[k]) / a1[k])
        # exposed copy time and overlap come from the same copies in both traces
        assert r["metrics"]["h2d_exposed_ns"]["b"] == a2["h2d_exposed_ns"]
    # per phase: means over the steady iterations of each side
    upd = next(r for r in res["per_phase"] if r["phase"] == "update")["metrics"]["wall_ns"]
    a_upd = m.filter(pl.col("phase") == "update")["wall_ns"]
    assert upd["a"] == pytest.approx(a_upd.mean()) and upd["b"] == a_upd[1]


def test_compare_cli_table_json_and_figure(cut2, tmp_path):
    rc, out, err = run("compare", ZERO3_CUT, cut2)
    assert rc == 0, err
    assert "per phase, mean per iteration" in out and "update" in out and "wall time" in out
    rc, out, err = run("compare", ZERO3_CUT, cut2, "--json", "-o", tmp_path / "c")
    assert rc == 0, err
    res = json.loads(out)
    assert json.loads((tmp_path / "c" / "compare.json").read_text()) == res
    assert (tmp_path / "c" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "c" / "compare.svg").exists()
    fig, frame = C.compare_figure(res)
    # bars: A and B per phase equal the JSON's means (in the panel's unit)
    bars = {p.get_gid(): p for ax in fig.axes for p in ax.patches if p.get_gid()}
    for r in res["per_phase"]:
        for m in ("wall_ns", "h2d_bytes", "peak_bytes"):
            _label, div, _unit = C.METRICS[m]
            v = r["metrics"][m]
            assert bars[f"a:{m}:{r['phase']}"].get_height() == pytest.approx((v["a"] or 0) / div)
            assert bars[f"b:{m}:{r['phase']}"].get_height() == pytest.approx((v["b"] or 0) / div)
    S.close(fig)


def test_compare_bad_input(tmp_path):
    rc, out, err = run("compare", ZERO3_CUT, tmp_path / "nope.sqlite")
    assert rc == 2 and "Traceback" not in err and err.strip().endswith("no such file")
    rc, out, err = run("compare", ZERO3_CUT, ZERO3_CUT, "--rank", "2")
    assert rc == 2 and "--rank 2: this trace has 1 rank(s)" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "f").write_text("x")
    rc, out, err = run("compare", ZERO3_CUT, ZERO3_CUT, "-o", tmp_path / "f")
    assert rc == 2 and "exists and is not a directory" in err
