"""Trace text (paths, NVTX names) is printed as data: no rich markup, no emoji codes, no terminal
escapes, no Markdown (issue 9, defect d08; ``../shared/repro/d08_rich_markup_in_names.sh``).

Each CLI test plants the text in a copy of the fixture (a file name, or a StringIds value
rewritten with plain SQL) and checks the bytes tracekit prints or writes.
"""

from __future__ import annotations

import io
import shutil
import sqlite3

import pytest
from conftest import FIXTURES, run_cli
from rich.console import Console

from tracekit import textsafe as T

FX = FIXTURES / "ds_zero3_offload_iter1-2.sqlite"
NAME = "_reassign_or_swap_out_partitioned_parameters"  # a DeepSpeed NVTX range of the fixture
OSC = "\x1b]0;pwned\x07"  # "set the terminal title": must never reach a terminal raw


# ------------------------------------------------------------------ the helper itself
@pytest.mark.parametrize("raw,shown", [
    ("plain [v1] :red_circle: *x*", "plain [v1] :red_circle: *x*"),
    ("a\x1bb", "a\\x1bb"),
    (OSC, "\\x1b]0;pwned\\x07"),
    ("l1\nl2\tx\r", "l1\\nl2\\tx\\r"),
    ("\x00\x7f\x9b", "\\x00\\x7f\\x9b"),          # NUL, DEL, the 8-bit CSI
    ("ab\u202ecd\u2066", "ab\\u202ecd\\u2066"),   # bidi override and isolate
    ("x\udcff", "x\\udcff"),                      # lone surrogate (surrogateescape)
    ("Zürich 東京 ü", "Zürich 東京 ü"),            # letters are kept
    (None, ""),
    (42, "42"),
])
def test_clean(raw, shown):
    assert T.clean(raw) == shown


def test_clean_brute_force_no_control_left():
    """Every code point 0..0x10FFFF: the cleaned form has no Cc, bidi control or surrogate, and
    printable characters are kept."""
    import unicodedata

    bad = {0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069}
    for cp in range(0x110000):
        ch = chr(cp)
        out = T.clean(ch)
        is_bad = unicodedata.category(ch) in ("Cc", "Cs") or cp in bad
        if is_bad:
            assert out != ch and out.startswith("\\") and out.isascii() and out.isprintable(), hex(cp)
        else:
            assert out == ch, hex(cp)


def _printed(obj) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(obj)
    return buf.getvalue()


@pytest.mark.parametrize("raw", ["run[v1].sqlite", "exp[/]r0", "[bold]x[/bold]", "a:red_circle:b",
                                 "x [link=http://e]y[/link]"])
def test_text_and_markup_print_literally(raw):
    assert _printed(T.text(raw)).rstrip("\n") == raw
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(f"[bold]{T.markup(raw)}[/bold]", emoji=False)
    assert buf.getvalue().rstrip("\n") == raw


def test_md_escapes_inline_syntax():
    assert T.md("_a_ *b* `c` [l](u) <b> x|y ~~s~~ &amp; \\") == (
        "\\_a\\_ \\*b\\* \\`c\\` \\[l\\](u) \\<b\\> x\\|y \\~\\~s\\~\\~ \\&amp; \\\\")
    assert T.md("5.2 GB/s - ok") == "5.2 GB/s - ok"  # no noise where nothing can act


@pytest.mark.parametrize("raw,span", [
    ("run.sqlite", "`run.sqlite`"),
    ("a`b", "``a`b``"),
    ("``x", "``` ``x ```"),
    ("a|b", "`a\\|b`"),
    ("a\x1b", "`a\\x1b`"),
])
def test_md_code(raw, span):
    assert T.md_code(raw) == span


def test_mpl_dollar():
    assert T.mpl("cost $5$ and $x") == "cost \\$5\\$ and \\$x"


# ------------------------------------------------------------------ the commands
def _trace_with_name(tmp_path, suffix: str, file_name: str = "t.sqlite"):
    """A copy of the fixture whose NVTX range NAME is renamed NAME + suffix (plain SQL)."""
    dst = tmp_path / file_name
    shutil.copyfile(FX, dst)
    con = sqlite3.connect(dst)
    n = con.execute("UPDATE StringIds SET value = value || ? WHERE value LIKE ?", (suffix, f"%{NAME}")).rowcount
    con.commit()
    con.close()
    assert n >= 1
    return dst


def test_analyze_bracketed_file_name_shown_as_is(tmp_path):
    trace = tmp_path / "run[v1].sqlite"
    shutil.copyfile(FX, trace)
    rc, out, err = run_cli("analyze", trace, "--no-cache", "--wide")  # the full path: --wide (issue 23)
    assert rc == 0, err
    assert out.splitlines()[0].startswith(f"{trace}  nsys 2025.3.2.0")


def test_analyze_closing_tag_in_folder_name(tmp_path):
    (tmp_path / "exp[").mkdir()
    trace = tmp_path / "exp[" / "]r0.sqlite"
    shutil.copyfile(FX, trace)
    rc, out, err = run_cli("analyze", trace, "--no-cache", "--wide")
    assert rc == 0, err
    assert "MarkupError" not in err and f"{trace}  nsys" in out


def test_analyze_nvtx_name_with_terminal_escape(tmp_path):
    trace = _trace_with_name(tmp_path, OSC + "[/] :red_circle: [bold]")
    import os

    wide = {**{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}, "COLUMNS": "240"}
    # 240 columns: the finding's sentence on one line (piped output is 80 wide since issue 23)
    rc, out, err = run_cli("analyze", trace, "--no-cache", "--phase", "update", "--all", env=wide)
    assert rc == 0, err
    assert "\x1b" not in out and "\x07" not in out
    shown = NAME + "\\x1b]0;pwned\\x07[/] :red_circle: [bold]"
    # the pageable finding names the range: escaped, markup and emoji code as written
    assert f"pageable H2D in {shown} in 2 copies" in out


def test_analyze_nvtx_name_closing_tag(tmp_path):
    trace = _trace_with_name(tmp_path, "[/]")
    rc, out, err = run_cli("analyze", trace, "--no-cache", "--phase", "update")
    assert rc == 0, err
    assert NAME + "[/]" in out


def test_compare_prints_paths_as_data(tmp_path):
    a = tmp_path / "a[v1].sqlite"
    b = _trace_with_name(tmp_path, "", "b[bold]x\x1b.sqlite")
    shutil.copyfile(FX, a)
    import os

    wide = {**{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}, "COLUMNS": "240"}
    rc, out, err = run_cli("compare", a, b, env=wide)  # 240: each path on its line (piped is 80 wide)
    assert rc == 0, err
    lines = out.splitlines()
    b_shown = str(b).replace("\x1b", "\\x1b")
    assert lines[0].startswith(f"A {a}  (pid")
    assert lines[1].startswith(f"B {b_shown}  (pid")
    assert "\x1b" not in out


@pytest.mark.usefixtures("cheap_figures")
def test_report_md_escapes_trace_text(tmp_path):
    trace = _trace_with_name(tmp_path, "*x*|`y`" + OSC, "r_[1]_.sqlite")
    rc, out, err = run_cli("report", trace, "-o", tmp_path / "rep")
    assert rc == 0, err
    md = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    assert "\x1b" not in md and "\x07" not in md
    assert "# tracekit report: r\\_\\[1\\]\\_.sqlite" in md.splitlines()
    assert f"- trace: `{trace}`" in md
    # the finding naming the range: inline syntax escaped, the escape sequence visible
    want = ("pageable H2D in \\_reassign\\_or\\_swap\\_out\\_partitioned\\_parameters"
            "\\*x\\*\\|\\`y\\`\\\\x1b\\]0;pwned\\\\x07 in 2 copies")
    assert want in md
    # the caption's code span: fenced by two backticks (the name holds one), | escaped for tables
    assert ("Longest: ``DeepSpeedZeroOptimizer_Stage3._reassign_or_swap_out_partitioned_parameters"
            "*x*\\|`y`\\x1b]0;pwned\\x07`` ") in md


def test_report_files_hold_no_raw_control_characters(tmp_path):
    """An NVTX range name with ESC/BEL (a sub-phase of the update) reaches the figures, the SVG,
    report.html and stderr only as visible escapes: the SVG stays well-formed XML and matplotlib
    does not warn about a missing glyph."""
    import xml.etree.ElementTree as ET

    trace = _trace_with_name(tmp_path, OSC + " $x$", "t\x1b[31m.sqlite")
    out_dir = tmp_path / "rep"
    rc, out, err = run_cli("report", trace, "-o", out_dir)
    assert rc == 0, err
    for text in (out, err):
        assert "\x1b" not in text and "\x07" not in text
    assert "Glyph" not in err
    svgs = sorted(out_dir.glob("*.svg"))
    assert svgs
    for svg in svgs:
        raw = svg.read_bytes()
        assert b"\x1b" not in raw and b"\x07" not in raw, svg.name
        ET.fromstring(raw)  # well-formed
    page = (out_dir / "report.html").read_text()
    assert "\x1b" not in page and "\x07" not in page
    assert "\\x1b]0;pwned\\x07" in page


@pytest.mark.usefixtures("cheap_figures")
def test_wrote_lines_show_control_characters_escaped(tmp_path):
    """The success lines of report, analyze --out and trim name paths the user chose: a control
    character in them is printed as its escape, never as the raw byte (a terminal would run it)."""
    odd = tmp_path / "o\x1b[31mut\x07"
    odd.mkdir()
    rc, out, err = run_cli("report", FX, "-o", odd / "rep")
    assert rc == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert f"wrote {tmp_path}/o\\x1b[31mut\\x07/rep/report.md, " in out
    rc, out, err = run_cli("analyze", FX, "--section", "sizes", "--out", odd / "csv")
    assert rc == 0, err
    assert "\x1b" not in out + err and f"files to {tmp_path}/o\\x1b[31mut\\x07/csv (" in err
    rc, out, err = run_cli("trim", FX, odd / "t.sqlite", "--iterations", "1")
    assert rc == 0, err
    assert "\x1b" not in out + err and f"wrote {tmp_path}/o\\x1b[31mut\\x07/t.sqlite (" in out
