"""One vocabulary in the report (issue 23): labelled table headers with units, true/false,
fixed-notation numbers, and ``compare`` never printing a percentage of zero."""

from __future__ import annotations

import io
import re
from html.parser import HTMLParser

import polars as pl
import pytest

from tracekit.render import compare as C
from tracekit.render.html import _table
from tracekit.vocab import UNITS_LINE, fmt_change, fmt_column, fmt_plain

SNAKE = re.compile(r"[a-z0-9]+(_[a-zA-Z0-9]+)+")
#: a number in e-notation (1.6e-05, 2E+3)
ENOTATION = re.compile(r"\d(\.\d+)?[eE][+-]?\d+")


class _Cells(HTMLParser):
    """Header and body cells of every table of a page: ``{table id: (headers, [cells])}``."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, tuple[list[str], list[str]]] = {}
        self._tid = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._tid = a.get("id") or f"t{len(self.tables)}"
            self.tables[self._tid] = ([], [])
        elif tag in ("th", "td") and self._tid is not None:
            self._cell = (tag, [])

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._cell is not None:
            kind, parts = self._cell
            self.tables[self._tid][0 if kind == "th" else 1].append("".join(parts).strip())
            self._cell = None
        elif tag == "table":
            self._tid = None

    def handle_data(self, d):
        if self._cell is not None:
            self._cell[1].append(d)


@pytest.fixture(scope="module")
def page(zero3_report):
    res, out = zero3_report
    p = _Cells()
    p.feed((out / "report.html").read_text())
    return p.tables, (out / "report.md").read_text()


def test_html_headers_are_labels_with_units(page):
    tables, _md = page
    want = {"key-numbers": {"wall ms", "share", "GPU idle", "H2D MB", "H2D GB/s", "D2H GB/s", "copy time hidden",
                            "GPU memory peak GB"},
            "per-iteration": {"iteration", "phase", "wall ms", "GPU idle ms", "H2D MB", "H2D GB/s"},
            "sub-phases": {"sub-phase", "wall ms", "GPU busy ms", "CPU only ms", "H2D GB/s"},
            "advice-summary": {"knob", "change", "predicted iteration ms (95 % interval)", "confidence"}}
    for tid, labels in want.items():
        heads = tables[tid][0]
        assert labels <= set(heads), (tid, heads)
    for tid, (heads, _cells) in tables.items():
        assert not [h for h in heads if SNAKE.fullmatch(h)], (tid, heads)


def test_no_python_bools_or_enotation_in_tables(page):
    tables, md = page
    cells = [c for _h, cs in tables.values() for c in cs]
    md_cells = [c.strip() for line in md.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    assert len(cells) > 50 and len(md_cells) > 50
    for c in cells + md_cells:
        if c == UNITS_LINE:  # the units' definitions (ms = 1e6 ns), no measured number
            continue
        assert not re.search(r"\b(True|False)\b", c), c
        assert not ENOTATION.search(c), c
    # the config's booleans as JSON writes them
    cfg = dict(zip(tables["config-table"][0], tables["config-table"][1]))
    assert cfg["setting zero_optimization.offload_optimizer.pin_memory"] == "true (trace)"


def test_report_leads_with_headline_and_advice(page):
    tables, md = page
    lines = md.splitlines()
    assert lines[2].startswith("**ds\\_zero3\\_offload\\_iter1-2.sqlite · GPU 0") and "ZeRO-3" in lines[2]
    assert "bf16" in lines[2] and "gradient accumulation 2" in lines[2]
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert lines[first_table].startswith("| knob | change | predicted iteration ms (95 % interval)")
    assert first_table < md.index("## Config") and first_table < lines.index("## Key numbers (mean per iteration)")
    rows = tables["advice-summary"][1]
    assert rows and "not a config key" in " ".join(rows) and "no config key" not in " ".join(rows)


def test_numbers_hand_made():
    assert fmt_plain(1.6e-05) == "0.000016"
    assert fmt_plain(0.0123) == "0.0123"
    assert fmt_plain(1234.56) == "1,234.6"
    assert fmt_plain(True) == "true" and fmt_plain(False) == "false"
    assert fmt_column("h2d_gbps", 52.44) == "52.4"
    assert fmt_column("wall_ns", 125_512_000) == "125.5"
    assert fmt_column("peak_bytes", 2_940_000_000) == "2.94"
    assert fmt_column("overlap_ratio", 0.5) == "50%"
    assert fmt_column("gpu_idle_share", 0.001) == "<1%"
    assert fmt_change(0, 0) == "–" and fmt_change(0, 3.0) == "new" and fmt_change(10, 11) == "+10%"
    html = _table(pl.DataFrame({"wall_ns": [16.0], "pinned": [True], "h2d_gbps": [1.6e-05]}))
    p = _Cells()
    p.feed(html)
    heads, cells = p.tables["t0"] if "t0" in p.tables else next(iter(p.tables.values()))
    assert heads == ["wall ms", "pinned", "H2D GB/s"]
    assert cells == ["0.000016", "true", "0.000016"]


def _result(a_wall, b_wall, a_h2d, b_h2d, a_pin=True, b_pin=False):
    def d(a, b):
        delta = b - a
        return {"a": a, "b": b, "delta": delta, "pct": None if not a else 100.0 * delta / a}

    zero = {m: d(0, 0) for m in C.METRICS}
    metrics = {**zero, "wall_ns": d(a_wall, b_wall), "h2d_bytes": d(a_h2d, b_h2d)}
    per_it = [{"position": k, "a_iteration": k, "b_iteration": k, "phase": "update", "metrics": metrics}
              for k in range(2)]
    expl = [{"key": "zero_optimization.offload_optimizer.pin_memory", "a": a_pin, "b": b_pin, "scenario": "pin_memory",
             "applicable": True, "why_not": None, "predicted_cost_ms": 12.0, "predicted_b_iteration_ms": 100.0,
             "b_iteration_ms": 112.0, "basis": "hand-made", "confidence": "medium", "phases": {},
             "measured_iteration_delta_ms": 10.0,
             "advice": {"problem": "p", "knob": "DeepSpeed code (no config key)", "change": "c",
                        "saving_ms_per_iteration": 12.0}}]
    return {"a": {"trace": "a.sqlite", "pid": 1, "device": 0, "iterations": [1, 2]},
            "b": {"trace": "b.sqlite", "pid": 1, "device": 0, "iterations": [1, 2]},
            "per_phase": [{"phase": "update", "metrics": metrics}], "iteration_total": {"wall_ns": d(a_wall, b_wall)},
            "per_iteration": per_it, "per_sub_phase": [
                {"phase": "update", "sub_phase": "x", "role": "cpu_adam",
                 "metrics": {"wall_ns": d(0, 5e6), "cpu_ns": d(0, 5e6)}}],
            "config": [{"key": "zero_optimization.offload_optimizer.pin_memory", "a": a_pin, "b": b_pin,
                        "a_source": "config", "b_source": "config", "differs": True}],
            "explanations": expl}


def _printed(result) -> str:
    from rich.console import Console

    buf = io.StringIO()
    C.render(result, console=Console(file=buf, width=200, color_system=None), wide=True)
    return buf.getvalue()


def test_compare_never_prints_a_percentage_of_zero():
    out = _printed(_result(100e6, 110e6, 0, 268e6))
    h2d = next(line for line in out.splitlines() if re.search(r"\bH2D\s+MB\b", line))
    assert "%" not in h2d and "inf" not in h2d and h2d.rstrip().endswith("new")
    wall = next(line for line in out.splitlines() if re.search(r"\bwall\s+ms\b", line))
    assert wall.rstrip().endswith("+10%")
    sub = next(line for line in out.splitlines() if line.startswith("│ x"))
    assert "%" not in sub and "new" in sub
    # per-iteration cells: the H2D delta from 0 says "new", never "(+inf%)"
    assert "+268.0 (new)" in out and "inf" not in out
    # config values as JSON writes them, one wording for the knob no key sets
    assert "pin_memory true (A) -> false (B)" in out and "True" not in out and "False" not in out
    assert "not a config key" in out and "no config key" not in out
