"""One look for every figure: phase colours, direction colours, unit choice and tick formats.

Units: time in ns internally; axes show ns/µs/ms/s picked from the span (:func:`time_unit`);
sizes in GB (1e9 B) or MB (1e6 B); rates in GB/s (1e9 B/s). Copy-size buckets are powers of
two and are labelled in binary units (KiB, MiB, GiB) because that is what they are.
"""

from __future__ import annotations

import io
import warnings

import matplotlib

matplotlib.use("Agg")  # figures are written to files; never open a window
# text is drawn by matplotlib itself, never by TeX (a matplotlibrc's usetex would hand trace
# text to LaTeX: `_`, `%`, `#` would fail); `$` in trace text is escaped where it is drawn
matplotlib.rcParams["text.usetex"] = False

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

#: Phase -> colour, the same in every figure.
PHASE_COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "update": "#55A868",
    "other": "#A0A0A0",
}
PHASES = tuple(PHASE_COLORS)
#: Copy direction -> colour (distinct from the phase colours).
DIRECTION_COLORS = {"H2D": "#8172B3", "D2H": "#C44E52"}
#: Host memory kind -> hatch (pinned plain, pageable hatched).
HOST_KIND_HATCH = {"pinned": "", "pageable": "xx"}
MEMORY_COLOR = "#222222"
#: The idle categories of :mod:`tracekit.analyze.sections.idle` (:data:`tracekit.vocab.IDLE_CATEGORIES`):
#: busy dark, the host's time in CUDA API calls orange, between them grey, waiting on collectives red.
IDLE_COLORS = {"gpu_busy_ns": "#4C72B0", "in_api_ns": "#DD8452", "between_api_ns": "#B0B0B0",
               "waiting_ns": "#C44E52"}
CONTENTION_COLORS = {"same-direction": "#E377C2", "bidirectional": "#BCBD22"}
#: Colours for update sub-phases (categorical, after the phase colours are taken).
SUB_PHASE_CYCLE = [
    "#1B9E77", "#D95F02", "#7570B3", "#E7298A", "#66A61E", "#E6AB02", "#A6761D", "#17BECF",
]
#: The update's unmarked time (no NVTX sub-range open) and sub-phases not named in a figure.
UNMARKED_COLOR = "#3B3B3B"
OTHER_SUB_COLOR = "#C8C8C8"
#: Display name of the ``(none)`` sub-phase of the update: with DeepSpeed's own ranges it is
#: the CPU optimizer step (DeepSpeed does not mark it); with a capture that marks the step,
#: just unmarked time.
UNMARKED_NAME = "(none): unmarked = the CPU optimizer step"
UNMARKED_NAME_MARKED = "(none): no sub-range open"

DPI = 150


def phase_color(phase: str) -> str:
    """Colour of ``phase`` (grey for anything unknown)."""
    return PHASE_COLORS.get(phase, PHASE_COLORS["other"])


def time_unit(span_ns: float) -> tuple[float, str]:
    """``(divisor, label)`` for showing a time span of ``span_ns``: µs below 2 ms, ms below
    20 s, else s. A 1 s iteration reads in ms, a 60 s one in s."""
    span_ns = abs(float(span_ns or 0))
    if span_ns < 2e6:
        return 1e3, "µs"
    if span_ns < 20e9:
        return 1e6, "ms"
    return 1e9, "s"


def number_formatter(decimals: int | None = None) -> FuncFormatter:
    """Tick labels with thousands separators and as few decimals as the tick step needs."""

    def fmt(v, _pos=None):
        if decimals is not None:
            return f"{v:,.{decimals}f}"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 100 or float(v).is_integer():
            return f"{v:,.0f}"
        if a >= 1:
            return f"{v:,.1f}".rstrip("0").rstrip(".")
        return f"{v:.3g}"

    return FuncFormatter(fmt)


def tidy_axis(ax, which: str = "y", nbins: int = 6) -> None:
    """Readable ticks on one axis: at most ``nbins`` intervals and compact labels."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    axis.set_major_locator(MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_formatter(number_formatter())


def size_label(nbytes: float) -> str:
    """Binary size label of a power-of-two bucket start: ``512 B``, ``4 KiB``, ``256 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:g} {unit}"
    return f"{nbytes:g} B"


def new_figure(nrows: int = 1, ncols: int = 1, *, width: float = 10, height: float = 5, **kw):
    """A figure of ``nrows`` x ``ncols`` axes with the house style (constrained layout)."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), layout="constrained", **kw)
    return fig, axes


def style_axes(ax) -> None:
    """Light grid behind the data, no top/right spines."""
    ax.set_axisbelow(True)
    ax.grid(True, axis="y", color="#E5E5E5", linewidth=0.8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def close(fig) -> None:
    """Free a figure's memory (pyplot keeps every figure until closed)."""
    plt.close(fig)


def figure_bytes(fig, ext: str, dpi: float | None = None) -> bytes:
    """``fig`` saved as ``ext`` (png, svg, pdf), with the bytes :meth:`Figure.savefig` gives,
    at about 20 % less CPU for a figure with a layout engine (every figure of
    :func:`new_figure`).

    ``savefig`` lays a constrained-layout figure out in a pre-draw: a whole
    ``figure.draw(renderer)`` with the renderer's drawing turned off, whose only use is the
    layout it runs first; then the real draw, layout off. Here that pre-draw runs the layout
    alone (the engine's ``execute``, as ``Figure.draw`` would, same renderer, dpi and canvas,
    since it runs inside ``savefig``); the real draw is ``Figure.draw`` itself. The bytes are
    the same (tests/test_figures.py compares PNG, SVG and PDF with ``savefig``'s on every
    figure). Each format is still laid out for itself: the layout depends on the renderer's
    text metrics (Agg at ``dpi`` for PNG, 72 dpi vector metrics for SVG/PDF) and on the
    positions it starts from, so one layout cannot serve PNG and SVG without moving the
    SVG's axes (up to about 1 % of the figure on the 624 MB trace's timeline). Call the
    formats in the same order as before (PNG first) to keep the bytes. Should a matplotlib
    save without that pre-draw (no real draw reached here), the figure is saved again by plain
    ``savefig``. The warnings of :data:`QUIET_WARNINGS` are not printed.
    """
    with warnings.catch_warnings():
        for message in QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        return _figure_bytes(fig, ext, dpi)


#: matplotlib warnings that ``report`` does not print (they went to the user's stderr, with a
#: line of tracekit's code): a layout that cannot be made (axes squeezed to nothing by a long
#: label; the figure is drawn without it, as matplotlib does), and a character of trace text
#: that the font has no glyph for (drawn as a box).
QUIET_WARNINGS = (r"constrained_layout not applied", r"[Tt]ight.?layout not applied",
                  r"Glyph \d+ .*missing from (current )?font")


def _figure_bytes(fig, ext: str, dpi: float | None) -> bytes:
    buf = io.BytesIO()
    engine = fig.get_layout_engine()
    if engine is None:
        fig.savefig(buf, format=ext, dpi=dpi)
        return buf.getvalue()

    drawn = []

    def draw(renderer):
        # savefig's pre-draw has the figure's own engine; the real draw has a placeholder
        # (savefig sets layout_engine="none" for it), and _get_renderer's probe shadows this
        if fig.get_layout_engine() is engine:
            if fig.axes:
                try:
                    engine.execute(fig)
                except ValueError:  # as Figure.draw: a layout that cannot be made is skipped
                    pass
            return
        drawn.append(True)
        type(fig).draw(fig, renderer)

    fig.draw = draw
    try:
        fig.savefig(buf, format=ext, dpi=dpi)
    finally:
        fig.__dict__.pop("draw", None)
    if not drawn:  # a matplotlib that saves otherwise: never an empty picture, savefig's own
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=dpi)
    return buf.getvalue()
