"""The layout every section table of the terminal output shares (the transfer and idle sections):
cells, the columns the default 80-column tables drop, and the table itself."""

from __future__ import annotations

from rich.console import Console

from tracekit.render.terminal import add_num_column, new_table
from tracekit.textsafe import text as _t
from tracekit.vocab import phase_label


def cell_text(v) -> str:
    """A text cell: ``""`` for None, else ``str(v)``."""
    return "" if v is None else str(v)


def phase_cell(r: dict) -> str:
    """A row's phase as the tables name it (:func:`tracekit.vocab.phase_label`)."""
    return phase_label(r, inferred=False)


def iteration_cell(r: dict) -> str:
    """A row's iteration number, ``""`` when it has none."""
    return "" if r.get("iteration") is None else str(r["iteration"])


#: columns left out of the default (80-column) section tables; ``--wide`` shows them
NARROW_DROP = {"H2D exposed ms", "D2H exposed ms", "both dirs ms", "windows", "same-dir ms", "bidir ms",
               "host ms", "blocking", "min GB", "device GB", "samples", "idle %", "implied peak GB/s",
               "size to", "copy ms", "start ms", "H2D MB", "D2H MB",
               "launch p99 us", "queue p50 us", "kernel p50 us", "waiting ms"}
TEXT_COLUMNS = ("phase", "sub-phase", "kind", "dir", "host", "iter")


def section_table(console: Console, title: str, rows: list[dict], cols: list[tuple], limit: int | None = None,
                  wide: bool = True) -> None:
    """Print ``rows`` (dicts) as one table titled ``title``; ``cols``: ``(header, key, fmt)`` with
    ``key`` a row key or a function of the row and ``fmt`` the cell's formatter. Text columns
    (:data:`TEXT_COLUMNS`) fold, the others are right-aligned numbers; without ``wide`` the
    columns of :data:`NARROW_DROP` are left out (when 3 or more remain). ``limit``: the rows shown,
    then a line saying how many more there are. No rows: one line ``TITLE: none``."""
    if not rows:
        console.print(_t(f"{title}: none"))
        return
    if not wide:
        kept = [c for c in cols if c[0] not in NARROW_DROP]
        cols = kept if len(kept) >= 3 else cols
    t = new_table(title, wide)
    for name, _, _ in cols:
        if name in TEXT_COLUMNS:
            t.add_column(name, overflow="fold")
        else:
            add_num_column(t, name)
    shown = rows if limit is None else rows[:limit]
    for r in shown:
        t.add_row(*[_t(fmt(key(r) if callable(key) else r.get(key))) for _, key, fmt in cols])
    console.print(t)
    if limit is not None and len(rows) > limit:
        console.print(_t(f"  ... {len(rows) - limit} more rows (--json or --out for all)"))
