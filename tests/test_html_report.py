"""``report.html``: self-contained, escaped, numbers equal SQL on the fixture, and it loads in a
real browser (headless Chromium through Selenium) with no console error, every figure and table
present and non-empty. Screenshots go to ``$TRACEKIT_SCREENSHOT_DIR`` when set (else the test's
temporary folder)."""

from __future__ import annotations

import base64
import os
import re
import shutil
import sqlite3
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
from conftest import ZERO3_CUT

from tracekit.render import figures as F
from tracekit.render.report import write_report


@pytest.fixture(scope="module")
def report(zero3_report):
    res, out = zero3_report  # conftest: written once per session
    return res, (out / "report.html")


class _Tables(HTMLParser):
    """Tables by id: list of rows (list of cell texts), and every tag's attributes."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.tags: list[tuple[str, dict]] = []
        self._cur = None
        self._row = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self._cur = self.tables.setdefault(a.get("id") or f"t{len(self.tables)}", [])
        elif tag == "tr" and self._cur is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self._cur.append(self._row)
            self._row = None
        elif tag == "table":
            self._cur = None

    def handle_data(self, d):
        if self._cell is not None:
            self._cell.append(d)


def _parse(path: Path) -> _Tables:
    p = _Tables()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def test_html_is_self_contained(report):
    res, page = report
    text = page.read_text(encoding="utf-8")
    assert page in res.files
    assert page.stat().st_size < 8_000_000  # plotly.js (4.8 MB) once, figures and data
    assert text.count("Plotly.newPlot") == 1 and text.count("plotly.js v") <= 2  # the library inlined once
    p = _parse(page)
    for tag, a in p.tags:  # nothing fetched from anywhere: every src/href is inline or an anchor
        for attr in ("src", "href"):
            v = a.get(attr)
            if v is not None:
                assert v.startswith(("data:", "#")), (tag, attr, v[:80])
        assert tag != "link"
    # every figure drawn for this trace is inlined as a PNG, with its CSV
    drawn = [n for n in F.FIGURES if n in res.figures]
    assert set(drawn) == set(F.FIGURES) - {"6_ranks"}  # one rank: no per-rank figure
    imgs = [a["src"] for t, a in p.tags if t == "img"]
    assert len(imgs) == len(drawn)
    for src in imgs:
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    downloads = {a["download"]: a["href"] for t, a in p.tags if t == "a" and "download" in a}
    for name in drawn:
        csv = base64.b64decode(downloads[f"{name}.csv"].split(",", 1)[1]).decode()
        assert csv == pl.read_csv(res.out_dir / "data" / f"{name}.csv", infer_schema_length=None).write_csv() \
            or csv.splitlines()[0] == (res.out_dir / "data" / f"{name}.csv").read_text().splitlines()[0]


def test_html_numbers_equal_sql(report):
    """Key numbers (update: mean wall ms and H2D MB per iteration) and the timeline's copy CSV
    (each copy of the shown iteration) against plain SQL on the fixture."""
    res, page = report
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    steps = con.execute(
        """SELECT e.start, e."end" FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId
           WHERE s.value = 'DeepSpeedZeroOptimizer_Stage3.step' ORDER BY e.start""").fetchall()
    h2d = 0
    for lo, hi in steps:
        (b,) = con.execute(
            """SELECT coalesce(sum(m.bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
               ON r.correlationId = m.correlationId WHERE m.copyKind = 1 AND r.start >= ? AND r.start < ?""",
            (lo, hi)).fetchone()
        h2d += b
    p = _parse(page)
    key = p.tables["key-numbers"]
    head, rows = key[0], {r[0]: r for r in key[1:]}
    upd = rows["update"]
    assert float(upd[head.index("wall ms")].replace(",", "")) == pytest.approx(
        sum(e - s for s, e in steps) / len(steps) / 1e6, rel=1e-3)
    assert float(upd[head.index("H2D MB")].replace(",", "")) == pytest.approx(h2d / len(steps) / 1e6, rel=1e-3)
    # per-iteration table: one row per iteration and phase, with the update's wall time
    per = p.tables["per-iteration"]
    ph = per[0]
    got = sorted(float(r[ph.index("wall ms")].replace(",", "")) for r in per[1:] if r[ph.index("phase")] == "update")
    assert got == pytest.approx(sorted((e - s) / 1e6 for s, e in steps), rel=1e-3)
    # the copies of the shown iteration: the timeline CSV equals the H2D/D2H memcpys overlapping its span
    downloads = {a["download"]: a["href"] for t, a in p.tags if t == "a" and "download" in a}
    csv = base64.b64decode(downloads["timeline_copies.csv"].split(",", 1)[1]).decode()
    cp = pl.read_csv(csv.encode(), infer_schema_length=None)
    it = res.iteration
    t0 = steps[it - 2][1] if it >= 2 else None  # iteration N spans from the previous update's end
    t1 = steps[it - 1][1]
    if t0 is None:
        (t0,) = con.execute("""SELECT min(e.start) FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId
                               WHERE s.value = 'DeepSpeedEngine.forward'""").fetchone()
    want = con.execute("""SELECT start, "end", bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY
                          WHERE copyKind IN (1, 2) AND "end" > ? AND start < ? ORDER BY start, "end", bytes""",
                       (t0, t1)).fetchall()
    con.close()
    assert sorted(cp.select("start_ns", "end_ns", "bytes").rows()) == sorted(want)
    assert (cp["gbps"] - cp["bytes"] / cp["duration_ns"].clip(lower_bound=1)).abs().max() < 1e-9


def test_html_escapes_trace_text(tmp_path):
    """An NVTX name with markup is shown as text, never parsed: the page holds no such tag."""
    from synthetic import SyntheticTrace, gtid

    t = SyntheticTrace()
    tid = gtid(7, 1)
    T = 100_000_000
    evil = "<img src=x onerror=alert(1)></script><b>"
    for it in range(3):
        b = it * T
        for name, a, e in [("forward", 0, 0.3), ("backward", 0.3, 0.6), ("update", 0.6, 1.0)]:
            t.range(name, b + int(a * T), b + int(e * T) - 1000, tid=tid, domain="tracekit")
        t.range(evil, b + int(0.65 * T), b + int(0.8 * T), tid=tid, domain="tracekit")
        t.kernel(b + int(0.05 * T), b + int(0.2 * T), 7, 1, launch=b + int(0.01 * T))
        t.copy(b + int(0.66 * T), b + int(0.7 * T), 1 << 26, 1, 7, 1, launch=b + int(0.66 * T), src=0, dst=2)
    path = t.write(tmp_path / "evil.sqlite")
    res = write_report(path, tmp_path / "r")
    text = (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    body = text.split("</head>", 1)[1]
    assert evil not in text and "<img src=x" not in text
    tags = _parse(tmp_path / "r" / "report.html").tags
    assert not any("onerror" in a for _t, a in tags)
    assert all(a["src"].startswith("data:image/png;base64,") for t, a in tags if t == "img")
    assert "&lt;img src=x onerror=alert(1)&gt;&lt;/script&gt;&lt;b&gt;" in body  # shown as text in the tables
    assert "\\u0026lt;img src=x onerror=alert(1)\\u0026gt;" in body  # plotly JSON: escaped, no raw < or &
    assert res.figures


# ------------------------------------------------------------------ real browser
def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None)
    if browser and driver:
        return browser, driver
    return None


def _driver(profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = _chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def _shot_dir(tmp_path: Path) -> Path:
    d = Path(os.environ.get("TRACEKIT_SCREENSHOT_DIR") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.mark.browser
def test_html_in_headless_chromium(report, tmp_path):
    if _chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser test: chromium and chromium-driver are missing (.ci/run installs them)")
        pytest.skip("no chromium / chromedriver on this machine (Debian: apt-get install chromium chromium-driver)")
    res, page = report
    profile = tempfile.mkdtemp(prefix="tk-chromium-")
    drv = _driver(profile)
    try:
        drv.set_page_load_timeout(120)
        drv.get(page.as_uri())
        # plotly draws synchronously in newPlot; wait for its SVG anyway
        for _ in range(100):
            if drv.execute_script("return document.querySelectorAll('#timeline-plot .main-svg').length") > 0:
                break
            drv.implicitly_wait(0.1)
        errors = [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
        assert errors == []
        # the interactive timeline: its traces and drawn bars
        n_traces = drv.execute_script("return document.getElementById('timeline-plot').data.length")
        n_copies = drv.execute_script(
            "const gd = document.getElementById('timeline-plot');"
            "return gd._fullData.map((t, i) => (t.name || '').includes('copies') ? gd.calcdata[i].length : 0)"
            ".reduce((a, n) => a + n, 0)")
        bars = drv.execute_script("return document.querySelectorAll('#timeline-plot g.point').length")
        con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
        win = pl.read_csv(res.out_dir / "data" / "2_iteration_timeline.csv", infer_schema_length=None) \
            .filter(pl.col("series") == "phase")
        (want_copies,) = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind IN (1, 2)
                                        AND "end" > ? AND start < ?""", (win["t_ns"].min(), win["t_end_ns"].max())).fetchone()
        (biggest_pageable,) = con.execute("""SELECT max(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1
                                             AND srcKind = 0 AND "end" > ? AND start < ?""",
                                          (win["t_ns"].min(), win["t_end_ns"].max())).fetchone()
        con.close()
        assert n_traces >= 5 and n_copies == want_copies and bars > want_copies
        # every static figure decoded and drawn
        sizes = drv.execute_script(
            "return Array.from(document.querySelectorAll('figure.static-fig img')).map(i => [i.naturalWidth, i.naturalHeight])")
        assert len(sizes) == len(res.figures) and all(w > 300 and h > 200 for w, h in sizes)
        # every table has rows
        rows = drv.execute_script(
            "return Object.fromEntries(Array.from(document.querySelectorAll('table')).map(t => [t.id, t.tBodies[0].rows.length]))")
        assert set(rows) >= {"config-table", "key-numbers", "per-iteration", "sub-phases"}
        assert all(n > 0 for n in rows.values())
        # column headers as drawn: labels with units, never a raw snake_case key (issue 23)
        heads = drv.execute_script("return Array.from(document.querySelectorAll('table thead th'))"
                                   ".map(t => t.textContent.trim())")
        assert "H2D GB/s" in heads and "wall ms" in heads
        assert not [h for h in heads if re.fullmatch(r"[a-z0-9]+(_[a-zA-Z0-9]+)+", h)]
        # hover a copy: plotly's own hover shows its bytes, bandwidth, phase and sub-phase
        drv.execute_script("document.getElementById('timeline').scrollIntoView()")
        drv.execute_script("""
            const gd = document.getElementById('timeline-plot');
            const i = gd.data.findIndex(t => (t.name || '').startsWith('H2D copies (pageable'));
            const cd = gd.calcdata[i];  // the largest pageable H2D copy
            let k = 0; for (let j = 0; j < cd.length; j++) if (cd[j].s > cd[k].s) k = j;
            Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: k}], gd._fullData[i].xaxis + gd._fullData[i].yaxis);""")
        hover = drv.execute_script("return Array.from(document.querySelectorAll('.hoverlayer text')).map(t => t.textContent).join(' | ')")
        assert f"{biggest_pageable / 1e6:,.3f} MB in" in hover and "GB/s" in hover and "phase: update" in hover
        assert "sub-phase: DeepSpeedZeroOptimizer_Stage3._reassign_or_swap_out_partitioned_parameters" in hover
        shots = _shot_dir(tmp_path)
        drv.save_screenshot(str(shots / "report_html_hover.png"))
        height = drv.execute_script("return document.body.scrollHeight")
        drv.set_window_size(1400, min(int(height) + 100, 16000))
        assert drv.save_screenshot(str(shots / "report_html_full.png"))
        assert (shots / "report_html_full.png").stat().st_size > 50_000
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)
