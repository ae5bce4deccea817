"""The one width rule of tracekit's terminal output (issue 10), and the house table style.

``tracekit analyze`` (one trace and many) and ``tracekit compare`` lay their tables out for
:func:`terminal_width`; the default tables fit it without cutting a number, ``--wide`` shows
every column. Colours as rich decides: none when ``NO_COLOR`` is set or the output is no
terminal. A rendering kept in the result cache is keyed on :func:`view`.
"""

from __future__ import annotations

import os
import re
import sys

from rich import box
from rich.console import Console
from rich.table import Table

from tracekit.textsafe import text as _t

#: Width of output that goes to no terminal (a pipe, a file) and no ``$COLUMNS``: 80, as a
#: terminal's default (issue 23); ``--wide`` output gets :data:`WIDE_WIDTH`.
PIPE_WIDTH = 80
WIDE_WIDTH = 240
#: The narrowest layout: below it the tables would cut numbers (at 40 columns "626.9" broke over
#: two lines and the advice's "#" column vanished), so a narrower terminal gets lines this wide
#: (its own wrapping keeps every number whole).
MIN_WIDTH = 72


def terminal_width(wide: bool = False, stream=None) -> int:
    """The width every terminal table of tracekit is laid out for (``analyze`` of one trace
    and of many, ``compare``): ``$COLUMNS`` when set, else the terminal's width, else (not a
    terminal) :data:`PIPE_WIDTH`, or :data:`WIDE_WIDTH` with ``wide``; never below
    :data:`MIN_WIDTH`."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return max(int(cols), MIN_WIDTH)
    stream = stream or sys.stdout
    try:
        if stream.isatty():
            return max(os.get_terminal_size(stream.fileno()).columns, MIN_WIDTH)
    except (AttributeError, OSError, ValueError):
        pass
    return WIDE_WIDTH if wide else PIPE_WIDTH


def make_console(wide: bool = False, file=None, **kwargs) -> Console:
    """A rich console of :func:`terminal_width` on ``file`` (stdout); colours as rich decides
    (none when ``NO_COLOR`` is set or the output is no terminal)."""
    return Console(file=file, width=terminal_width(wide, file), **kwargs)


def view(wide: bool = False, fmt: str = "table") -> dict:
    """How :func:`render` would draw on this stdout: width, colour system, ``NO_COLOR``,
    terminal or not, ``wide`` and format (the key of a rendering kept in the result cache)."""
    c = make_console(wide)
    return {"width": c.width, "color_system": c.color_system, "no_color": bool(c.no_color),
            "terminal": c.is_terminal, "wide": wide, "format": fmt}


def new_table(title: str, wide: bool = False) -> Table:
    """A table of the house style: title left, bold header, light rules (no vertical borders,
    so that 80 columns hold more); at least as wide as its title, so that the title wraps only
    at the console's width."""
    return Table(title=_t(title), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                 pad_edge=False, collapse_padding=False, min_width=len(title))


def add_num_column(t: Table, name: str) -> None:
    """A right-aligned number column that never cuts a number (folds it at worst)."""
    t.add_column(name, justify="right", overflow="fold", no_wrap=False)



def fold_identifier(name: str, width: int) -> str:
    """``name`` folded onto lines of at most ``width`` characters, only after a ``.``, ``_``
    or ``/`` (``DeepSpeedZeroOptimizer_`` / ``Stage3.step``), never mid-word; a part longer
    than ``width`` stays whole on its line. Lines joined by ``\\n``."""
    parts = re.findall(r"[^._/]*[._/]|[^._/]+$", name) or [name]
    lines = [""]
    for part in parts:
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def fold_text(text: str, width: int) -> str:
    """``text`` wrapped at spaces onto lines of at most ``width`` characters; a word longer
    than ``width`` (an identifier) folds by :func:`fold_identifier`. Numbers are never cut."""
    lines: list[str] = []
    cur = ""
    for word in text.split():
        pieces = fold_identifier(word, width).split("\n") if len(word) > width else [word]
        for w in pieces:
            if cur and len(cur) + 1 + len(w) > width:
                lines.append(cur)
                cur = w
            else:
                cur = f"{cur} {w}" if cur else w
    lines.append(cur)
    return "\n".join(lines)
