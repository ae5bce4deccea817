"""``tracekit compare``: differences per phase and iteration, JSON, figure, bad input."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from conftest import ZERO3_CUT
from conftest import run_cli as run

from tracekit.render import compare as C
from tracekit.render import style as S
from tracekit.render import summary
from tracekit.render.data import ReportData


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
    assert "per phase, mean per iteration" in out and re.search(r"\bupdate\s+wall\s+ms\b", out)
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


# ------------------------------------------------------------------ the advice pairs (real H200 cuts)
from conftest import FIXTURES  # noqa: E402

PAIR = str(FIXTURES / "advice_pair_{}.sqlite")


def _sql_range_ms(path, name) -> tuple[float, int]:
    """Plain SQL: summed duration (ms) of NVTX ranges called ``name`` that start inside one of
    DeepSpeed's optimizer-step ranges, and the number of those step ranges."""
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    q = ("SELECT e.start, e.\"end\" FROM NVTX_EVENTS e JOIN StringIds s ON e.textId = s.id WHERE s.value = ? "
         "ORDER BY e.start")
    steps = con.execute(q, ("DeepSpeedZeroOptimizer_Stage3.step",)).fetchall()
    rows = con.execute(q, (name,)).fetchall()
    con.close()
    inside = [(s, e) for s, e in rows if any(a <= s < b for a, b in steps)]
    return sum(e - s for s, e in inside) / 1e6, len(steps)


def _step_ms(path) -> float:
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ends = [r[0] for r in con.execute(
        "SELECT e.\"end\" FROM NVTX_EVENTS e JOIN StringIds s ON e.textId = s.id "
        "WHERE s.value = 'DeepSpeedZeroOptimizer_Stage3.step' ORDER BY e.start")]
    con.close()
    return (ends[1] - ends[0]) / 1e6


@pytest.fixture(scope="module")
def pin_vs_base():
    return C.compare_paths(PAIR.format("pin"), PAIR.format("base"))


def test_compare_sub_phases_against_sql(pin_vs_base):
    """Update sub-phases of A (pin) and B (base): mean per steady iteration of the overflow-check and
    tracekit's cpu_optimizer_step ranges equals plain SQL's sum over the cut's 2 optimizer steps / 2."""
    res = pin_vs_base
    assert res["a"]["iterations"] == [1, 2] and res["b"]["iterations"] == [1, 2]
    subs = {r["role"]: r["metrics"]["wall_ns"] for r in res["per_sub_phase"]}
    for role, name in (("overflow_check", "DeepSpeedZeroOptimizer_Stage3._overflow_check_and_loss_scale_update"),
                       ("cpu_adam", "cpu_optimizer_step")):
        for side, variant in (("a", "pin"), ("b", "base")):
            ms, steps = _sql_range_ms(PAIR.format(variant), name)
            assert steps == 2
            assert subs[role][side] / 1e6 == pytest.approx(ms / 2, rel=1e-6), (role, side)
        assert subs[role]["delta"] == pytest.approx(subs[role]["b"] - subs[role]["a"])


def test_compare_config_keys_and_explanation(pin_vs_base):
    """The manifests beside the cuts differ in pin_memory only (read here as plain JSON); the
    explanation is the pin_memory advice item, predicted on B: B's iteration with pin_memory true
    within 20 % of A's measured step (plain SQL)."""
    man = {r: json.loads((FIXTURES / f"advice_pair_{r}.json").read_text())["deepspeed_config"] for r in ("pin", "base")}
    assert man["pin"]["zero_optimization"]["offload_optimizer"]["pin_memory"] is True
    assert man["base"]["zero_optimization"]["offload_optimizer"]["pin_memory"] is False
    differs = [c for c in pin_vs_base["config"] if c["differs"]]
    assert [(c["key"], c["a"], c["b"]) for c in differs] == [
        ("zero_optimization.offload_optimizer.pin_memory", True, False)]
    (e,) = pin_vs_base["explanations"]
    assert e["scenario"] == "pin_memory" and e["applicable"] and e["predicted_cost_ms"] > 0
    assert e["advice"]["knob"] == "zero_optimization.offload_optimizer.pin_memory"
    assert e["advice"]["saving_ms_per_iteration"] == pytest.approx(e["predicted_cost_ms"], abs=1e-3)
    a_ms = _step_ms(PAIR.format("pin"))
    assert abs(e["predicted_b_iteration_ms"] - a_ms) / a_ms <= 0.20
    # the cost lies in backward (the gradient copies), where B is measured slower
    assert e["phases"]["backward"]["predicted_ms"] > 0.9 * e["predicted_cost_ms"]
    assert e["phases"]["backward"]["measured_delta_ms"] > 0


def test_compare_bf16_to_fp16_explained_by_overflow_check():
    """A bf16, B fp16: the bf16 item's cost on B is B's overflow check (plain SQL: summed
    _overflow_check_and_loss_scale_update ranges of the 2 steps / 2)."""
    res = C.compare_paths(PAIR.format("bf16"), PAIR.format("base"))
    (e,) = [x for x in res["explanations"] if x["key"] == "precision"]
    assert (e["a"], e["b"], e["scenario"]) == ("bf16", "fp16", "bf16")
    ms, steps = _sql_range_ms(PAIR.format("base"), "DeepSpeedZeroOptimizer_Stage3._overflow_check_and_loss_scale_update")
    assert e["predicted_cost_ms"] == pytest.approx(ms / steps, abs=1e-3)  # rounded to the microsecond


def test_compare_fail_above_sets_exit_code_with_json(tmp_path):
    """pin -> base is > 20 % slower (plain SQL step times); --json still prints the whole comparison
    and exits 1; base -> pin exits 0."""
    assert _step_ms(PAIR.format("base")) > 1.2 * _step_ms(PAIR.format("pin"))
    rc, out, err = run("compare", PAIR.format("pin"), PAIR.format("base"), "--json", "--fail-above", "20")
    assert rc == 1, err
    res = json.loads(out)
    assert res["regressions"]["fail_above_pct"] == 20
    assert "iteration" in {r["what"] for r in res["regressions"]["slower"]}
    assert "regression: iteration" in err and "Traceback" not in err
    rc, out, err = run("compare", PAIR.format("base"), PAIR.format("pin"), "--json", "--fail-above", "20")
    assert rc == 0, err
    assert json.loads(out)["regressions"]["slower"] == []
    rc, out, err = run("compare", PAIR.format("base"), PAIR.format("pin"), "--fail-above", "-3")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--fail-above" in err
