"""Issue 25, report safety and out-of-range data (e05, e06, e17, e18 of ``../shared/repro/`` and
the Low items): trace text in report.html's plotly strings is escaped exactly once; trace text
in matplotlib figures is never mathtext; CSV text cells never start a formula; figure saves
print no layout warnings; Perfetto tracks never hold overlapping events; out-of-range
GPU_METRICS samples and too-fast copies are set aside and said so.

Every expected value is computed here: plain SQL on the (synthetic, mutated) trace, a
brute-force loop, plotly's own entity rules written out, matplotlib's own mathtext test, or a
reference trace from which the out-of-range rows were deleted.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import shutil
import sqlite3
import tempfile
import warnings
from xml.etree import ElementTree

import matplotlib.text
import polars as pl
import pytest
from conftest import ZERO3_CUT
from test_pcie_streaming import plain, same, synthetic
from test_robustness import MEMCPY, analyze_json, cli, sql1, synthetic_copy, total_bytes

from tracekit.analyze.model import phases
from tracekit.analyze.sections import pcie_metrics
from tracekit.analyze.sections.transfers import PER_WINDOW
from tracekit.analyze.trace.export import Export
from tracekit.render import html as H
from tracekit.render import style as S
from tracekit.render.report import write_report
from tracekit.textsafe import csv_cell, csv_frame

#: A memory-kind name (ENUM_CUDA_MEM_KIND, lower case: tracekit lower-cases unknown kind names)
#: with mathtext, a live link, both quotes, an entity, a hover-template field and 240 more
#: characters (long enough to squeeze a legend's axes to nothing).
KIND = 'tk$\\frac{$b <a href="https://evil.example/x">"q" \'r\' &amp; %{x}</a>' + "x" * 240
#: An NVTX sub-phase name that a spreadsheet would run.
FORMULA = '=HYPERLINK("http://evil.example/y","z")'
SUB_PHASE = "DeepSpeedZeroOptimizer_Stage3._reassign_or_swap_out_partitioned_parameters"


def plotly_decode(s: str) -> str:
    """What plotly.js shows for the text of one of its strings (svg_text_utils.convertEntities):
    ``&mu; &amp; &lt; &gt; &nbsp; &times; &plusmn; &deg;`` and numeric entities decoded, once;
    any other entity (``&quot;``) left as written."""
    named = {"mu": "\u03bc", "amp": "&", "lt": "<", "gt": ">", "nbsp": "\xa0", "times": "\xd7", "plusmn": "\xb1",
             "deg": "\xb0"}

    def one(m):
        r = m.group(1)
        if r.startswith("#"):
            return chr(int(r[2:], 16) if r[1] == "x" else int(r[1:]))
        return named.get(r, m.group(0))

    return re.sub(r"&(#\d+|#x[\da-fA-F]+|[a-z]+);", one, s)


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _strings(v)


def _plotly_json(page: str) -> tuple[list, dict]:
    """The data and layout of the page's ``Plotly.newPlot`` call, as the browser reads them."""
    i = page.index("Plotly.newPlot('timeline-plot',") + len("Plotly.newPlot('timeline-plot',")
    dec = json.JSONDecoder()
    data, j = dec.raw_decode(page, i)
    layout, _ = dec.raw_decode(page, j + 1)
    return data, layout


# ------------------------------------------------------------------ one hostile report
@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The fixture with memory kind 0 (pageable) named :data:`KIND` and the sub-phase
    :data:`SUB_PHASE` named :data:`FORMULA` (synthetic), reported with a Perfetto export;
    every matplotlib text of every figure collected as it is saved, and every warning."""
    d = tmp_path_factory.mktemp("hostile")
    trace = d / "synthetic_hostile.sqlite"
    shutil.copyfile(ZERO3_CUT, trace)
    con = sqlite3.connect(trace)
    con.execute("UPDATE ENUM_CUDA_MEM_KIND SET name = ? WHERE id = 0", (KIND,))
    con.execute("UPDATE StringIds SET value = ? WHERE value = ?", (FORMULA, SUB_PHASE))
    con.commit()
    con.close()
    texts: list[tuple[str, str]] = []
    orig = S.figure_bytes

    def collecting(fig, ext, dpi=None):
        out = orig(fig, ext, dpi)  # laid out and drawn: every text as drawn
        texts.extend((fig.get_suptitle() or "", t.get_text()) for t in fig.findobj(matplotlib.text.Text))
        return out

    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mp.setattr(S, "figure_bytes", collecting)
        res = write_report(trace, d / "r", perfetto=d / "t.json")
    return {"trace": trace, "res": res, "out": d / "r", "texts": texts, "warnings": list(caught),
            "perfetto": json.loads((d / "t.json").read_text(encoding="utf-8"))}


def test_plotly_text_escapes_each_special_character_once():
    s = H._plotly_text(KIND)
    assert not set(s) & set("<>\"'%")  # nothing plotly reads as markup, or a template reads as a field
    assert plotly_decode(s) == KIND  # shown as written: decoded once by plotly's own rules
    assert "&quot;" not in s and "&#x27;" not in s  # entities plotly does not decode would show literally
    assert H._plotly_text("a\x1b[31mb") == "a\\x1b[31mb"  # control characters as visible escapes


def test_html_plotly_strings_hold_no_trace_markup(hostile):
    """e05: no ``<a href`` from the trace in any plotly string (legend, hover, annotation),
    and the memory-kind name decodes, by plotly's rules, to exactly the trace's name: escaped
    exactly once (no ``&quot;`` shown, no ``&amp;lt;``)."""
    page = (hostile["out"] / "report.html").read_text(encoding="utf-8")
    assert not re.search(r'(\\u003c|<)a href=(\\"|")https://evil\.example', page)
    data, layout = _plotly_json(page)
    strings = list(_strings(data)) + list(_strings(layout))
    tags = {t.lower() for s in strings for t in re.findall(r"<\s*(/?\w+)", s)}
    assert tags <= {"br", "extra", "/extra"}  # tracekit's own markup only
    assert not any("&quot;" in s for s in strings)
    names = {plotly_decode(t.get("name", "")) for t in data}
    kinds = {n for n in names if "copies" in n}
    assert f"H2D copies ({KIND})" in kinds  # the 6 pageable H2D copies of the fixture
    hovers = [plotly_decode(t["hovertemplate"]) for t in data if "copies (" in t.get("name", "")]
    assert any(h.startswith(f"H2D copy, {KIND} host memory<br>") for h in hovers)
    ann = [plotly_decode(a.get("text", "")) for a in layout.get("annotations", [])]
    assert any(a.startswith(KIND + " ") and a.endswith(" GB/s") for a in ann)  # the pageable reference line


def test_figures_draw_trace_text_as_plain_text(hostile):
    """e06: the report is written, and no matplotlib text of any figure is mathtext
    (matplotlib's own test, ``Text._preprocess_math``); the memory-kind name is drawn as
    written (cut to 32 characters), ``$`` and all."""
    res = hostile["res"]
    assert (hostile["out"] / "report.md").exists() and res.figures
    drawn = []
    probe = matplotlib.text.Text()
    for _sup, s in hostile["texts"]:
        shown, is_math = probe._preprocess_math(s)
        if re.fullmatch(r"\$\\mathdefault\{[^$]*\}\$", s):  # matplotlib's own log-axis tick labels
            continue
        assert is_math is False, s
        drawn.append(shown)
    assert any(KIND[:31] + "…" in s for s in drawn)
    svgs = sorted(hostile["out"].glob("*.svg"))
    assert len(svgs) == len(res.figures)
    for p in svgs:  # the trace text in element ids is escaped: each SVG parses, and holds no link
        root = ElementTree.parse(p).getroot()
        assert not [e for e in root.iter() if e.tag.rsplit("}", 1)[-1] == "a"], p.name


def test_report_prints_no_layout_or_glyph_warning(hostile):
    msgs = [str(w.message) for w in hostile["warnings"]]
    assert not [m for m in msgs if "layout not applied" in m or "missing from" in m]


def test_figure_bytes_quiets_the_layout_warning_savefig_prints():
    """A legend entry of 300 characters collapses a constrained layout: plain ``savefig``
    warns, :func:`tracekit.render.style.figure_bytes` does not (and still draws the PNG)."""
    def fig():
        f, ax = S.new_figure(1, 1, width=4, height=3)
        ax.plot([0, 1], [0, 1], label="y" * 300)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        return f

    f = fig()
    with pytest.warns(UserWarning, match="constrained_layout not applied"):
        f.savefig(io.BytesIO(), format="png")
    S.close(f)
    f = fig()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        png = S.figure_bytes(f, "png", 50)
    S.close(f)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ CSV formula cells
def test_csv_cell_rule():
    for lead in ("=", "+", "-", "@", "\t", "\r"):
        assert csv_cell(lead + "1+2") == "'" + lead + "1+2"
    for ok in ("", "a=b", " =x", "'=x", "1", "–5", "pinned"):
        assert csv_cell(ok) == ok
    f = pl.DataFrame({"name": [FORMULA, "update", None, "-x", "@SUM(A1)"], "n": [-1, 2, 3, -4, 5],
                      "x": [-1.5, None, 0.0, 2.0, -3.0]})
    got = list(csv.reader(io.StringIO(csv_frame(f).write_csv())))
    assert got[0] == ["name", "n", "x"]
    assert [r[0] for r in got[1:]] == ["'" + FORMULA, "update", "", "'-x", "'@SUM(A1)"]
    assert [r[1] for r in got[1:]] == ["-1", "2", "3", "-4", "5"]  # numbers stay numbers
    assert [r[2] for r in got[1:]] == ["-1.5", "", "0.0", "2.0", "-3.0"]
    plain_frame = pl.DataFrame({"name": ["a", "b"], "n": [-1, 1]})
    assert csv_frame(plain_frame) is plain_frame


def _cells(text: str) -> list[str]:
    return [c for row in csv.reader(io.StringIO(text)) for c in row]


def test_report_csvs_quote_formula_names(hostile):
    """The report's data/*.csv and report.html's CSV downloads: the NVTX name starts with
    ``'`` wherever it is a cell; no cell starts a formula."""
    files = sorted((hostile["out"] / "data").glob("*.csv"))
    assert files
    seen = 0
    for p in files:
        for c in _cells(p.read_text(encoding="utf-8")):
            assert not c.startswith(("=", "+", "@", "\t", "\r")) and not re.match(r"-[^\d.]", c), (p.name, c)
            seen += c == "'" + FORMULA
    assert seen > 0
    page = (hostile["out"] / "report.html").read_text(encoding="utf-8")
    links = re.findall(r'download="([^"]+)" href="data:text/csv;base64,([^"]+)"', page)
    sub = [base64.b64decode(b).decode() for n, b in links if n == "4_update_sub_phases.csv"]
    assert sub and "'" + FORMULA in _cells(sub[0])


def test_out_csvs_quote_formula_names(hostile, tmp_path):
    rc, out, err = cli("analyze", hostile["trace"], "--no-cache", "--out", tmp_path / "o")
    assert rc == 0, err
    cells = _cells((tmp_path / "o" / "sub_phases.csv").read_text(encoding="utf-8"))
    assert "'" + FORMULA in cells and FORMULA not in cells


# ------------------------------------------------------------------ Perfetto tracks
def test_perfetto_tracks_never_overlap(hostile):
    """Brute force over the export: on every (pid, tid) the complete events, in start order,
    each start at or after the previous one's end (integer ns); every kernel of the trace is
    there once, and the fixture's overlapping kernels (counted in SQL) made extra tracks."""
    ev = hostile["perfetto"]["traceEvents"]
    by_track: dict = {}
    for e in ev:
        if e["ph"] == "X":
            s = round(e["ts"] * 1000)
            by_track.setdefault((e["pid"], e["tid"]), []).append((s, s + round(e["dur"] * 1000), e["name"]))
    for key, spans in by_track.items():
        spans.sort()
        for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
            assert s1 >= e0, (key, n0, (s0, e0), n1, (s1, e1))
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    kernels = sorted(con.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall())
    con.close()
    overlapping, run_end = 0, None
    for s, e in kernels:  # kernels starting before an earlier one ended (one device in the fixture)
        overlapping += run_end is not None and s < run_end
        run_end = e if run_end is None else max(run_end, e)
    got = sorted((round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000)) for e in ev
                 if e.get("cat") == "kernel")
    assert got == kernels
    extra = {e["tid"] for e in ev if e["name"] == "thread_name" and e["args"]["name"].startswith("kernels #")}
    assert overlapping > 0 and extra
    assert all(tid // 1000 == 6 for tid in extra)  # next to the kernels lane (tid 6)
    names = {(e["pid"], e["tid"]) for e in ev if e["name"] == "thread_name"}
    assert set(by_track) <= names  # every track used is named


# ------------------------------------------------------------------ GPU_METRICS out of range
def _out_of_range_pair(tmp_path, shuffle=False):
    """(mutated, reference): the synthetic PCIe trace with RX samples of 1e308 %, TX samples of
    -5 % and one RX of +inf, and the same trace with those rows deleted."""
    src = synthetic(tmp_path, "pcie_src.sqlite", shuffle=shuffle)
    bad, ref = tmp_path / "synthetic_pcie_bad.sqlite", tmp_path / "synthetic_pcie_ref.sqlite"
    shutil.copyfile(src, bad)
    con = sqlite3.connect(bad)
    con.executescript("""UPDATE GPU_METRICS SET value = 1e308 WHERE metricId = 20 AND rowid % 17 = 1;
                         UPDATE GPU_METRICS SET value = -5 WHERE metricId = 21 AND rowid % 13 = 2;
                         UPDATE GPU_METRICS SET value = 9e999 WHERE metricId = 20 AND rowid = 5;""")
    con.commit()
    con.close()
    shutil.copyfile(bad, ref)
    con = sqlite3.connect(ref)
    con.execute("DELETE FROM GPU_METRICS WHERE metricId IN (20, 21) AND NOT (value BETWEEN 0 AND 100)")
    con.commit()
    con.close()
    return bad, ref


@pytest.mark.parametrize("chunk,shuffle", [(None, False), (50, False), (7, False), (50, True)])
def test_out_of_range_samples_are_set_aside(tmp_path, monkeypatch, chunk, shuffle):
    """Streamed (several chunk sizes) and read whole (samples out of time order): the frames
    equal the plain computation on the trace without the out-of-range rows, and the counts set
    aside equal SQL's."""
    bad, ref = _out_of_range_pair(tmp_path, shuffle)
    if chunk is not None:
        monkeypatch.setattr(pcie_metrics, "CHUNK_ROWIDS", chunk)
    con = sqlite3.connect(f"file:{bad}?mode=ro", uri=True)
    want_aside = dict(con.execute("""SELECT CASE metricId WHEN 20 THEN 'H2D' ELSE 'D2H' END, count(*) FROM GPU_METRICS
                                     WHERE metricId IN (20, 21) AND NOT (value BETWEEN 0 AND 100) GROUP BY 1"""))
    con.close()
    assert want_aside["H2D"] > 1 and want_aside["D2H"] > 1
    with Export.open(bad) as e:
        m = phases.build(e)
        want = plain(ref, m, 80.0)
        red = pcie_metrics.reduce_pcie(e, m, 80.0, keep_samples=True)
        assert red.streamed is not shuffle
        assert red.set_aside == want_aside
        same(red.series, want["series"])
        same(pcie_metrics.pcie_phase_stats(e, m, by=PER_WINDOW, reduction=red), want["pcie"])
        same(pcie_metrics.pcie_saturation(e, m, 80.0, reduction=red), want["pcie_saturation"])
        whole = pcie_metrics.pcie_series(e)  # the figures' series (no model)
        assert whole["value_pct"].is_between(0, 100).all()
        assert whole.height == sql1(ref, "SELECT count(*) FROM GPU_METRICS WHERE metricId IN (20, 21)")


def test_e17_json_pct_within_range_and_a_note(tmp_path):
    p = synthetic_copy(tmp_path, "pcie_range",
                       """UPDATE GPU_METRICS SET value = 1e308 WHERE metricId = 20 AND rowid % 100 = 1;
                          UPDATE GPU_METRICS SET value = -5 WHERE metricId = 21 AND rowid % 100 = 2""")
    n = sql1(p, "SELECT count(*) FROM GPU_METRICS WHERE metricId IN (20, 21) AND NOT (value BETWEEN 0 AND 100)")
    rc, out, err = cli("analyze", p, "--section", "pcie", "--no-cache", "--json")
    assert rc == 0, err
    pct = [v for k, v in _items(json.loads(out)) if k.endswith("_pct") and isinstance(v, (int, float))]
    assert pct and all(0 <= v <= 100 for v in pct)
    rc, out, err = cli("analyze", p, "--section", "pcie", "--no-cache")
    assert rc == 0
    note = [ln for ln in (out + err).splitlines() if "set aside" in ln and "GPU_METRICS" in ln]
    assert len(note) == 1 and f"{n:,} GPU_METRICS sample(s) outside 0-100 %" in note[0]


def _dicts(x):
    if isinstance(x, dict):
        yield x
        for v in x.values():
            yield from _dicts(v)
    elif isinstance(x, list):
        for v in x:
            yield from _dicts(v)


def _items(x, key=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _items(v, k)
    elif isinstance(x, list):
        for v in x:
            yield from _items(v, key)
    else:
        yield key, x


# ------------------------------------------------------------------ implausible copies
def test_e18_too_fast_and_petabyte_copies_are_set_aside(tmp_path):
    """Every 5th copy 1e14 B (under the byte cut, far above any link: set aside for its rate),
    every 7th other one exactly 1e15 B (the byte cut is inclusive), every 3rd other D2D copy at
    50,000 GB/s (within a device's bound: kept). Counts and kept H2D bytes against SQL; no
    GB/s above 10,000 in --json."""
    p = synthetic_copy(tmp_path, "fast_copies",
                       f"UPDATE {MEMCPY} SET bytes = 100000000000000 WHERE rowid % 5 = 0",
                       f"UPDATE {MEMCPY} SET bytes = 1000000000000000 WHERE rowid % 7 = 0 AND rowid % 5 != 0",
                       f"""UPDATE {MEMCPY} SET bytes = 50000 * max("end" - start, 1)
                           WHERE copyKind = 8 AND rowid % 3 = 0 AND rowid % 5 != 0 AND rowid % 7 != 0""")
    rate = """bytes * 1.0 / max("end" - start, 1) > CASE copyKind WHEN 8 THEN 100000 ELSE 10000 END"""
    want_rate = sql1(p, f"SELECT count(*) FROM {MEMCPY} WHERE bytes < 1000000000000000 AND {rate}")
    want_bytes = sql1(p, f"SELECT count(*) FROM {MEMCPY} WHERE bytes >= 1000000000000000")
    kept_d2d = sql1(p, f"SELECT count(*) FROM {MEMCPY} WHERE copyKind = 8 AND bytes * 1.0 / max(\"end\" - start, 1) "
                       "BETWEEN 10000 AND 100000")
    assert want_rate > 0 and want_bytes > 0 and kept_d2d > 0
    res = analyze_json(p)
    a = res["gpu_op_anomalies"]
    assert a["memcpy_implausible_rate"] == want_rate and a["memcpy_implausible_bytes"] == want_bytes
    kept_h2d = sql1(p, f"SELECT sum(bytes) FROM {MEMCPY} WHERE copyKind = 1 AND bytes < 1000000000000000 "
                       f"AND NOT ({rate})")
    assert total_bytes(res, "h2d_bytes") == kept_h2d
    fast = [(d.get("direction"), k, v) for d in _dicts(res) for k, v in d.items()
            if "gbps" in k and isinstance(v, (int, float)) and v > 10_000]
    assert fast and all(direction == "D2D" and v == pytest.approx(50_000) for direction, k, v in fast)  # kept D2D only
    rc, out, err = cli("analyze", p, "--no-cache")
    assert rc == 0 and "GPU operations set aside" in out and f"{want_rate:,} memcpy implausible rate" in out


def test_copies_of_the_fixture_are_all_kept():
    """The bound is far from real copies: none of the fixture's is set aside."""
    res = analyze_json(ZERO3_CUT)
    assert not any(res["gpu_op_anomalies"].values())
    assert total_bytes(res, "h2d_bytes") == sql1(ZERO3_CUT, f"SELECT sum(bytes) FROM {MEMCPY} WHERE copyKind = 1")


# ------------------------------------------------------------------ the page in a browser
def test_html_legend_in_headless_chromium(hostile):
    """In a real browser: the legend shows the memory-kind name exactly as the trace holds it
    (quotes, ``&amp;``, ``%{x}``, no ``&quot;``), and the plot holds no link."""
    from test_html_report import _chromium, _driver

    if _chromium() is None:
        pytest.skip("no chromium / chromedriver on this machine (Debian: apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="tk-chromium-")
    drv = _driver(profile)
    try:
        drv.set_page_load_timeout(120)
        drv.get((hostile["out"] / "report.html").as_uri())
        for _ in range(100):
            if drv.execute_script("return document.querySelectorAll('#timeline-plot .legendtext').length") > 0:
                break
            drv.implicitly_wait(0.1)
        legend = drv.execute_script(
            "return Array.from(document.querySelectorAll('#timeline-plot .legendtext')).map(t => t.textContent)")
        assert f"H2D copies ({KIND})" in legend
        assert not any("&quot;" in t or "&#34;" in t or "&lt;" in t for t in legend)
        assert drv.execute_script("return document.querySelectorAll('#timeline-plot a').length") == 0
        notes = drv.execute_script("return document.querySelectorAll('#timeline-plot .annotation-text').length")
        assert notes > 0
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_tracks_first_fit_synthetic():
    """Hand-made lane: 150 kernels all running at once, then back-to-back ones, then nested
    ones: tracks never overlap (brute force over every pair), the first track is the lane's
    own tid, and no extra tid collides with another lane's."""
    from tracekit.render import perfetto as P

    events: list[dict] = []
    tr = P._Tracks(events)
    spans = [(0, 1000)] * 150 + [(1000, 2000), (2000, 3000), (3000, 3000), (3000, 9000), (4000, 5000), (4500, 4600)]
    got = [(tr.tid(1, "kernels", s, e), s, e) for s, e in spans]
    assert got[0][0] == P.TRACKS["kernels"] and len({t for t, _s, _e in got[:150]}) == 150
    for i, (t0, s0, e0) in enumerate(got):
        for t1, s1, e1 in got[i + 1:]:
            if t0 == t1:
                assert e0 <= s1 or e1 <= s0, ((t0, s0, e0), (t1, s1, e1))
    assert [t for t, _s, _e in got[150:153]] == [P.TRACKS["kernels"]] * 3  # back to back: the lane's own
    others = {tid * P.TRACK_STRIDE + k for tid in P.TRACKS.values() if tid != P.TRACKS["kernels"] for k in range(1, 200)}
    assert not {t for t, _s, _e in got} & (others | (set(P.TRACKS.values()) - {P.TRACKS["kernels"]}))
    named = {e["tid"] for e in events if e["name"] == "thread_name"}
    assert named == {t for t, _s, _e in got} - {P.TRACKS["kernels"]}
