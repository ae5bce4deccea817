"""The transfer sections of ``tracekit analyze`` (``--section``, ``--all``), without importing polars.

Kept apart from :mod:`tracekit.analyze.transfers` (which re-exports both names) so that the
command line can parse its options and answer from the result cache
(:mod:`tracekit.analyze.cache`) without loading the analysis stack.
"""

from __future__ import annotations

from tracekit.errors import TracekitError

SECTIONS = ("overlap", "contention", "sizes", "pageable", "memory", "timeline", "pcie", "opportunities")


def parse_sections(text: list[str] | str | None, all_: bool = False) -> tuple[str, ...]:
    """``"overlap,pageable"`` (or a list of such) -> sections; raises TracekitError for unknown."""
    if all_:
        return SECTIONS
    if not text:
        return ()
    items = [text] if isinstance(text, str) else list(text)
    out = []
    for item in items:
        for s in str(item).split(","):
            s = s.strip()
            if not s:
                continue
            if s == "all":
                return SECTIONS
            if s not in SECTIONS:
                raise TracekitError(f"--section {s!r}: choose from {', '.join(SECTIONS)} (or all)")
            if s not in out:
                out.append(s)
    return tuple(out)
