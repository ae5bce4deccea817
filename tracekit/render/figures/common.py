"""What the figures share: segment labels, titles, trace text made safe for matplotlib, and the
sub-phases of a phase (:mod:`tracekit.render.figures`).
"""

from __future__ import annotations

import polars as pl

from tracekit.render import style as S
from tracekit.render.data import ReportData
from tracekit.textsafe import mpl
from tracekit.vocab import short_name

PHASE_SHORT = {"forward": "F", "backward": "B", "update": "U", "other": "gap"}


def _segment_label(phase: str, micro_step, boundary: bool) -> str:
    label = PHASE_SHORT.get(phase, phase)
    if phase in ("forward", "backward") and micro_step is not None:
        label += str(micro_step)
    if boundary:
        label += "*"
    return label


def iterations_note(its: list[int]) -> str:
    """``iterations 1-3`` / ``iteration 2`` / ``iterations 1, 3, 4`` for titles."""
    if not its:
        return "no iteration"
    if len(its) == 1:
        return f"iteration {its[0]}"
    if its == list(range(its[0], its[-1] + 1)):
        return f"iterations {its[0]}–{its[-1]}"
    return "iterations " + ", ".join(str(i) for i in its)


def _title(data: ReportData) -> str:
    """The run line of every figure: trace, model size, ZeRO stage, offload, precision
    (:func:`tracekit.render.config.trace_config`)."""
    from tracekit.render.config import trace_config

    return _text(trace_config(data).label())


def _text(value, width: int | None = None) -> str:
    """Text from the trace (or built around it: a label holding a memory-kind or NVTX name)
    for a matplotlib title, label, tick, legend entry or text: control characters as visible
    escapes (an ESC in an NVTX name otherwise breaks the SVG and warns about a missing glyph),
    ``$`` escaped so that no mathtext is parsed (:func:`tracekit.textsafe.mpl`; ``a$\\frac{$b``
    would otherwise fail the whole figure). TeX is never used (:mod:`tracekit.render.style`
    sets ``text.usetex`` off). With ``width``, cut to that many characters with ``…`` (a
    300-character memory-kind name in a legend would squeeze the axes to nothing). Every trace
    string of the figures (this package's modules) goes through here."""
    s = "" if value is None else str(value)
    if width is not None and len(s) > width:
        s = s[: max(width - 1, 1)] + "…"
    return mpl(s)


#: Characters of a memory-kind name (pinned, pageable, ...) drawn in a label.
KIND_WIDTH = 32


def _short(name, width: int = 38) -> str:
    """:func:`tracekit.vocab.short_name` made safe for matplotlib (:func:`_text`)."""
    return _text(short_name(name, width))


def _sub_phase_names(names) -> dict:
    """Display name of each update sub-phase: ``(none)`` (no sub-range open) is the unmarked
    CPU optimizer step unless a range of the trace already marks that step."""
    names = [n for n in names if n]
    marked = any("optimizer_step" in n for n in names if n != "(none)")
    return {n: (S.UNMARKED_NAME if not marked else S.UNMARKED_NAME_MARKED) if n == "(none)" else n for n in names}


def _sub_phase_segments(data: ReportData, rk: dict, iteration: int, phase: str = "update") -> pl.DataFrame:
    """Self-time segments of ``phase``'s sub-phases in one iteration: ``sub_phase, s, e``."""
    wm = data.sections.rank_windows().filter(
        (pl.col("phase") == phase) & (pl.col("global_pid") == rk["global_pid"])
        & (pl.col("device") == rk["device"]) & (pl.col("iteration") == iteration)
    )
    if wm.height == 0:
        return pl.DataFrame(schema={"sub_phase": pl.String, "s": pl.Int64, "e": pl.Int64})
    seg = data.sections.self_segments(wm)
    return seg.select("sub_phase", "s", "e").sort("s")
