"""``style.figure_bytes`` writes what ``Figure.savefig`` writes, with one draw per format.

Every figure of a report (the ZeRO-3 fixture; ``6_ranks`` on a two-rank synthetic trace) is
drawn twice and saved PNG, SVG, PDF in that order, once by matplotlib's own ``savefig`` (the
independent reference) and once by ``figure_bytes``: the bytes must be equal (SVG ids and
PDF/SVG dates pinned with ``svg.hashsalt`` and ``SOURCE_DATE_EPOCH``). Counting
``Figure.draw`` and the layout engine shows the saving: savefig draws twice per format (a
pre-draw only for the layout, then the real one), figure_bytes once, and both lay out once.
"""

from __future__ import annotations

import io

import matplotlib
import matplotlib.figure as mfig
import matplotlib.layout_engine as mle
import pytest

from tracekit.render import figures as F
from tracekit.render import style as S
from tracekit.render.data import ReportData

FORMATS = (("png", S.DPI), ("svg", None), ("pdf", None))
TIMED = ("2_iteration_timeline", "5_overlap_contention")


@pytest.fixture(scope="module")
def zero3(zero3_report_data):
    return zero3_report_data  # conftest: loaded once per session


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from test_report import two_rank_trace

    d = ReportData.load(two_rank_trace(tmp_path_factory.mktemp("two") / "t.sqlite", iteration_s=0.5))
    yield d
    d.close()


@pytest.fixture
def counted(monkeypatch):
    """Pinned SVG ids and dates; counts of ``Figure.draw`` (class method) and layout runs."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    monkeypatch.setitem(matplotlib.rcParams, "svg.hashsalt", "tracekit-test")
    n = {"draw": 0, "layout": 0}
    draw, execute = mfig.Figure.draw, mle.ConstrainedLayoutEngine.execute

    def counting_draw(self, renderer):
        n["draw"] += 1
        return draw(self, renderer)

    def counting_execute(self, fig):
        n["layout"] += 1
        return execute(self, fig)

    monkeypatch.setattr(mfig.Figure, "draw", counting_draw)
    monkeypatch.setattr(mle.ConstrainedLayoutEngine, "execute", counting_execute)
    return n


def plain(fig, ext, dpi) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format=ext, dpi=dpi)
    return buf.getvalue()


def drawn(data, name):
    fn = F.FIGURES[name][0]
    if name == "6_ranks":
        return fn(data)[0]
    if name in TIMED:
        return fn(data, rank=0, iteration=data.pick_iteration(data.rank(0), None))[0]
    return fn(data, rank=0)[0]


@pytest.mark.parametrize("name", list(F.FIGURES))
def test_same_bytes_as_savefig_one_draw_per_format(zero3, two_ranks, counted, name):
    data = two_ranks if name == "6_ranks" else zero3
    ref, fig = drawn(data, name), drawn(data, name)
    assert ref.get_layout_engine() is not None  # new_figure: constrained layout
    counted.update(draw=0, layout=0)
    want = [plain(ref, ext, dpi) for ext, dpi in FORMATS]
    assert counted == {"draw": 2 * len(FORMATS), "layout": len(FORMATS)}
    counted.update(draw=0, layout=0)
    got = [S.figure_bytes(fig, ext, dpi) for ext, dpi in FORMATS]
    assert counted == {"draw": len(FORMATS), "layout": len(FORMATS)}
    for (ext, _), a, b in zip(FORMATS, want, got):
        assert a == b, f"{name}.{ext} differs from savefig's"
    assert "draw" not in vars(fig)  # nothing left on the figure: savefig after it is savefig
    assert plain(fig, "svg", None) == plain(ref, "svg", None)
    S.close(ref)
    S.close(fig)


def test_no_layout_engine_and_errors(counted):
    """A figure without a layout engine is plain savefig; a failing savefig (unknown format)
    leaves no patched ``draw`` behind."""
    import matplotlib.pyplot as plt

    ref, fig = (plt.figure(figsize=(3, 2)) for _ in range(2))
    for f in (ref, fig):
        f.add_subplot().plot([0, 1, 3], [2, 0, 1], label="x")
    assert [plain(ref, e, d) for e, d in FORMATS] == [S.figure_bytes(fig, e, d) for e, d in FORMATS]
    lay, _ = S.new_figure(width=3, height=2)
    with pytest.raises(ValueError):
        S.figure_bytes(lay, "no-such-format")
    assert "draw" not in vars(lay)
    for f in (ref, fig, lay):
        S.close(f)


def test_a_savefig_without_pre_draw_falls_back(counted):
    """Should matplotlib lay out inside the real draw (no pre-draw, the engine left on), the
    layout-only stand-in would draw nothing: figure_bytes then saves by plain savefig, so the
    picture is never empty."""
    import matplotlib.image as mimage
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig, ax = S.new_figure(width=3, height=2)
    ax.bar([0, 1], [3, 1], color="black")
    # a print_figure with no pre-draw: the PNG is drawn with the layout engine still on
    fig.canvas.print_figure = lambda fname, format=None, dpi=None, **kw: FigureCanvasAgg.print_png(fig.canvas, fname)
    counted.update(draw=0, layout=0)
    png = S.figure_bytes(fig, "png", 50)
    assert counted == {"draw": 1, "layout": 2}  # the stand-in laid out, then savefig's own draw
    pixels = mimage.imread(io.BytesIO(png))
    assert (pixels[..., :3] < 0.1).all(axis=-1).sum() > 100  # the black bars are there
    S.close(fig)
