"""Safe display of text that comes from a trace or from a path (issue 9, defect d08).

NVTX range and domain names, StringIds values, file names and command lines are *data*: they
may hold rich markup (``run[v1].sqlite``, ``[/]``), emoji codes (``:red_circle:``), Markdown
(``*``, ``_``, backticks, ``|``) or terminal control sequences (ESC, OSC ``ESC ] 0;title BEL``,
the 8-bit CSI ``\\x9b``). tracekit never lets them act:

- :func:`clean` replaces every control character by a visible escape (``\\x1b``, ``\\n``, ...);
- :func:`text` gives a :class:`rich.text.Text` (never parsed as markup or emoji) of the cleaned
  string, for tables and ``console.print``;
- :func:`markup` escapes a cleaned string for embedding in a rich markup string;
- :func:`md` and :func:`md_code` make a cleaned string inert in Markdown text and code spans;
- :func:`mpl` makes it inert in a matplotlib label (no mathtext ``$...$``);
- :func:`csv_cell` / :func:`csv_frame` make it inert in a CSV opened by a spreadsheet (no
  formula: ``=HYPERLINK(...)`` in an NVTX name).

Which characters count as control characters: Unicode general category ``Cc`` (C0 controls
U+0000-U+001F, DEL U+007F, C1 controls U+0080-U+009F), the bidirectional overrides and isolates
(U+202A-U+202E, U+2066-U+2069; they reorder what a terminal shows, CVE-2021-42574 "Trojan
Source"), and lone surrogates (U+D800-U+DFFF, from ``surrogateescape`` decoding; they cannot be
written as UTF-8). Everything else, including non-ASCII letters, is kept as is.
"""

from __future__ import annotations

import re

__all__ = ["clean", "text", "markup", "md", "md_code", "mpl", "csv_cell", "csv_frame"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def clean(value: object) -> str:
    """``str(value)`` with each control character replaced by a visible escape.

    ``"a\\x1b]0;x\\x07"`` -> ``"a\\\\x1b]0;x\\\\x07"`` (the backslash is a literal character);
    newline, carriage return and tab become ``\\n``, ``\\r``, ``\\t``; other C0/C1 controls
    ``\\xHH``; bidi overrides and lone surrogates ``\\uHHHH``. None gives ``""``. A string
    without such characters is returned unchanged (same object). Never raises.
    """
    if value is None:
        return ""
    s = value if isinstance(value, str) else str(value)
    if _CONTROL.search(s) is None:
        return s
    return _CONTROL.sub(_escape, s)


def text(value: object, style: str = "") -> "Text":  # noqa: F821 - rich imported lazily
    """A :class:`rich.text.Text` of :func:`clean` ``(value)`` with ``style``: printed
    literally by rich (no markup, no emoji codes, no highlighting)."""
    from rich.text import Text

    return Text(clean(value), style=style)


def markup(value: object) -> str:
    """:func:`clean` ``(value)`` escaped for a rich markup string (``[`` -> ``\\[``), so
    that ``console.print(f"[bold]{markup(name)}[/bold]")`` shows ``name`` as written.
    Prefer :func:`text`; with markup strings also pass ``emoji=False``."""
    from rich.markup import escape

    return escape(clean(value))


# CommonMark: any ASCII punctuation may be backslash-escaped; these are the ones that act
# inside a line: emphasis, code spans, links and images, raw HTML and autolinks, entities,
# GFM table cells and strikethrough. Block syntax (#, >, -, +, 1.) acts only at the start of
# a line, where tracekit never puts trace text.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&])")


def md(value: object) -> str:
    """:func:`clean` ``(value)`` for Markdown running text and table cells (CommonMark /
    GitHub), not at the start of a line: every character that Markdown reads as inline
    syntax (``\\ ` * _ [ ] < > | ~ &``) is backslash-escaped, so ``_a_ [x](y) | <b>``
    renders as those characters. Newlines are already ``\\n`` escapes, so the text stays
    on its line."""
    return _MD_SPECIAL.sub(r"\\\1", clean(value))


def md_code(value: object) -> str:
    """A Markdown code span showing :func:`clean` ``(value)`` literally: delimited by one
    backtick more than the longest backtick run inside, padded with spaces when the text
    starts or ends with a backtick. ``|`` is written ``\\|`` (GitHub tables end cells at a
    bare ``|``, even in code spans; GitHub shows ``|``)."""
    s = clean(value).replace("|", "\\|")
    runs = [len(r) for r in re.findall(r"`+", s)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def mpl(value: object) -> str:
    """:func:`clean` ``(value)`` for a matplotlib title, label or tick: ``$`` escaped
    (``\\$``) so that no mathtext is parsed."""
    return clean(value).replace("$", r"\$")


#: What a spreadsheet reads as the start of a formula (OWASP, "CSV Injection"): ``= + - @``,
#: tab and carriage return.
CSV_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: str) -> str:
    """A text cell for a CSV file: prefixed with a single quote when it starts with one of
    :data:`CSV_FORMULA_START` (OWASP's rule), so that Excel, LibreOffice and Google Sheets show
    ``=HYPERLINK("http://x","y")`` as text instead of running it; otherwise unchanged. For text
    cells only: numbers are written as numbers (``-5`` stays ``-5``)."""
    return "'" + value if value.startswith(CSV_FORMULA_START) else value


def csv_frame(frame):
    """``frame`` (a polars DataFrame) with :func:`csv_cell` applied to every cell of its
    String columns (nulls kept), for ``write_csv``; the same frame (no copy) when no text cell
    needs it. Other columns (numbers, booleans, dates) are unchanged."""
    import polars as pl

    text = [c for c, t in frame.schema.items() if t == pl.String]
    if not text:
        return frame
    starts = "^[" + "".join(re.escape(c) for c in CSV_FORMULA_START) + "]"
    risky = [c for c in text if frame[c].str.contains(starts).any()]
    if not risky:
        return frame
    return frame.with_columns(
        pl.when(pl.col(c).str.contains(starts)).then(pl.lit("'") + pl.col(c)).otherwise(pl.col(c)).alias(c)
        for c in risky)
