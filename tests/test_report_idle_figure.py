"""Figure 7 of the report, where the GPU idle time goes per phase (issue 22): the bars drawn
(read from the matplotlib patches, not pixels) equal the four categories of docs/idle.md
computed here from the fixture with plain SQL and interval arithmetic; and the same categories
per time bin in report.html's interactive timeline."""

from __future__ import annotations

import base64
import sqlite3

import numpy as np
import pytest
from conftest import ZERO3_CUT

from tracekit.render import figures as F

#: the fixture's phase ranges (DeepSpeed's NVTX ranges; iterations 1-2, both steady)
RANGES = {"forward": "DeepSpeedEngine.forward", "backward": "DeepSpeedEngine.backward",
          "update": "DeepSpeedZeroOptimizer_Stage3.step"}
CATS = ("gpu_busy_ns", "in_api_ns", "between_api_ns", "waiting_ns")


def _union(iv) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _intersect(a, b) -> list[tuple[int, int]]:
    """Both sorted and disjoint."""
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(iv) -> int:
    return sum(e - s for s, e in iv)


@pytest.fixture(scope="module")
def by_sql():
    """Per phase: ns per steady iteration of each category, from SQL."""
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    ops = []
    corr = set()
    for t in ("KERNEL", "MEMCPY", "MEMSET"):
        for s, e, c in con.execute(f'SELECT start, "end", correlationId FROM CUPTI_ACTIVITY_KIND_{t}'):
            ops.append((s, e))
            corr.add(c)
    (comm,) = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                             WHERE s.value LIKE '%nccl%'""").fetchone()
    assert comm == 0  # one GPU: no collective, so nothing is waiting
    calls = con.execute('SELECT start, "end", correlationId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME').fetchall()
    launching = {tid for _s, _e, c, tid in calls if c in corr}
    api = _union([(s, e) for s, e, _c, tid in calls if tid in launching])
    busy = _union(ops)
    out = {}
    for phase, name in RANGES.items():
        win = con.execute("""SELECT e.start, e."end" FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId
                             WHERE s.value = ? ORDER BY e.start""", (name,)).fetchall()
        assert len(win) in (2, 4)  # two iterations (two micro-steps each for forward/backward)
        w = _union(win)
        wall = _length(w)
        b = _length(_intersect(busy, w))
        api_w = _intersect(api, w)
        in_api = _length(api_w) - _length(_intersect(api_w, busy))
        out[phase] = {"wall_ns": wall / 2, "gpu_busy_ns": b / 2, "in_api_ns": in_api / 2,
                      "between_api_ns": (wall - b - in_api) / 2, "waiting_ns": 0.0}
    con.close()
    return out


@pytest.fixture(scope="module")
def drawn(zero3_report_data):
    fig, frame = F.idle_breakdown(zero3_report_data, rank=0)
    bars = {p.get_gid(): p for ax in fig.axes for p in ax.patches if p.get_gid()}
    yield fig, frame, bars
    from tracekit.render import style as S

    S.close(fig)


def test_bar_heights_equal_sql(by_sql, drawn):
    _fig, frame, bars = drawn
    assert frame["iterations"].to_list() == [2] * 4  # both iterations of the fixture are steady
    assert frame["phase"].to_list() == ["forward", "backward", "update", "other"]
    for phase, want in by_sql.items():
        bottom = 0.0
        for c in CATS:
            bar = bars[f"{c}:{phase}"]
            # heights in ms per steady iteration, stacked in this order from 0
            assert bar.get_height() * 1e6 == pytest.approx(want[c], abs=1.0), (phase, c)
            assert bar.get_y() * 1e6 == pytest.approx(bottom, abs=1.0), (phase, c)
            bottom += want[c]
        assert bottom == pytest.approx(want["wall_ns"], abs=2.0)
    # the idle time is most of forward (the fixture is host-bound there)
    f = by_sql["forward"]
    assert (f["wall_ns"] - f["gpu_busy_ns"]) / f["wall_ns"] > 0.9


def test_frame_equals_json_idle_breakdown(drawn, zero3_analysis):
    """The frame (the figure's CSV) holds the per-phase sums of ``--json``'s idle_breakdown."""
    _fig, frame, _bars = drawn
    j = zero3_analysis.to_json()
    sums: dict[str, dict[str, float]] = {}
    for it in j["ranks"][0]["iterations"]:
        for ph in it["phases"]:
            s = sums.setdefault(ph["phase"], dict.fromkeys(CATS, 0.0))
            for c in CATS:
                s[c] += ph["idle_breakdown"][c]
    for r in frame.iter_rows(named=True):
        for c in CATS:
            assert r[c] == pytest.approx(sums[r["phase"]][c] / 2, abs=1.0)
        assert r["wall_ns"] == pytest.approx(sum(r[c] for c in CATS), abs=1.0)


def test_report_writes_and_lists_the_figure(zero3_report):
    res, out = zero3_report
    assert (out / "7_idle_breakdown.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "7_idle_breakdown.svg").exists() and (out / "data" / "7_idle_breakdown.csv").exists()
    md = (out / "report.md").read_text()
    assert "](7_idle_breakdown.png)" in md and "mostly between CUDA API calls" in md
    html = (out / "report.html").read_text()
    assert 'id="fig-7_idle_breakdown"' in html
    assert "7_idle_breakdown" in res.figures


def _values(v) -> np.ndarray:
    """A plotly figure-dict array: a list, an ndarray or plotly's typed array ``{dtype, bdata}``."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).astype(np.float64)
    return np.asarray(v, dtype=np.float64)


def test_html_timeline_idle_row(zero3_report_data, zero3_analysis):
    """The interactive timeline's idle row: per category, its ms over the bins of the shown
    iteration equal the iteration's ``idle_breakdown`` of ``--json`` summed over its phases, and
    the four shares of each bin stack to 100 %."""
    from tracekit.render.html import timeline_figure

    data = zero3_report_data
    rk = data.rank(0)
    it = data.pick_iteration(rk, None)
    fig = timeline_figure(data, rk, it)
    traces = {t["meta"]: t for t in fig["data"] if t.get("meta") in CATS}
    assert set(traces) == set(CATS)
    j = next(i for i in zero3_analysis.to_json()["ranks"][0]["iterations"] if i["index"] == it)
    for c in CATS:
        want = sum(ph["idle_breakdown"][c] for ph in j["phases"])
        got = _values(traces[c]["customdata"])
        assert got.sum() * 1e6 == pytest.approx(want, abs=1.0 * got.size)
    tops = _values(traces["waiting_ns"]["base"]) + _values(traces["waiting_ns"]["y"])
    assert tops.size > 100 and np.allclose(tops, 100.0)
    assert [t["name"] for t in fig["data"] if t.get("meta") in CATS] == [
        "GPU busy", "in CUDA API calls", "between CUDA API calls", "waiting on collectives"]
