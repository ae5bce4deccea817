"""``tracekit report``: files written, report.md numbers, multi-rank and long iterations, bad input."""

from __future__ import annotations

import json
import sqlite3

import polars as pl
import pytest
from conftest import ZERO3_CUT, assert_one_line_error
from conftest import run_cli as run

from tracekit.render import figures as F
from tracekit.render import style as S
from tracekit.render import summary
from tracekit.render.data import ReportData

FIGURES = list(F.FIGURES)
#: Figures of a one-rank trace: the per-rank figure needs two ranks to compare.
ONE_RANK = [f for f in FIGURES if f != "6_ranks"]


@pytest.fixture(scope="module")
def report_dir(zero3_report):
    """``tracekit report ZERO3_CUT -o NEW/nested/r`` (conftest: run once per session, exit 0,
    no traceback)."""
    return zero3_report[1]


def test_report_writes_figures_data_and_markdown(report_dir):
    assert not (report_dir / "6_ranks.png").exists()  # one rank: nothing to compare
    for name in ONE_RANK:
        png = report_dir / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (report_dir / f"{name}.svg").read_text().lstrip().startswith("<?xml")
        assert (report_dir / "data" / f"{name}.csv").stat().st_size > 0
    md = (report_dir / "report.md").read_text()
    for name in ONE_RANK:
        assert f"]({name}.png)" in md
    assert "6_ranks" not in md
    assert (report_dir / "report.html").stat().st_size > 1_000_000
    assert "## Key numbers" in md and "## Findings" in md


def test_report_key_numbers_equal_sql(report_dir):
    """The update row of report.md: mean wall time and H2D MB per iteration from the NVTX step
    ranges and the copies launched inside them (plain SQL)."""
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    steps = con.execute(
        """SELECT e.start, e."end" FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId
           WHERE s.value = 'DeepSpeedZeroOptimizer_Stage3.step'""").fetchall()
    h2d = 0
    for lo, hi in steps:
        (b,) = con.execute(
            """SELECT coalesce(sum(m.bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
               ON r.correlationId = m.correlationId WHERE m.copyKind = 1 AND r.start >= ? AND r.start < ?""",
            (lo, hi)).fetchone()
        h2d += b
    con.close()
    wall_ms = sum(e - s for s, e in steps) / len(steps) / 1e6
    row = next(line for line in (report_dir / "report.md").read_text().splitlines() if line.startswith("| update |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == f"{wall_ms:,.1f}"
    assert cells[4] == f"{h2d / len(steps) / 1e6:,.1f}"
    kn = pl.read_csv(report_dir / "data" / "key_numbers.csv")
    upd = kn.filter(pl.col("phase") == "update").sort("iteration")
    assert upd["wall_ns"].to_list() == [e - s for s, e in steps]


def test_report_pdf_and_json(tmp_path):
    rc, out, err = run("report", ZERO3_CUT, "-o", tmp_path / "r", "--format", "pdf", "--json", "--iteration", "1")
    assert rc == 0, err
    res = json.loads(out)
    assert res["iteration"] == 1 and res["rank"]["pid"] == 642
    assert (tmp_path / "r" / "3_copy_sizes.pdf").read_bytes()[:4] == b"%PDF"
    assert set(res["figures"]) == set(ONE_RANK)
    assert res["html"].endswith("report.html") and res["perfetto"] is None


@pytest.mark.parametrize(
    "args,pattern",
    [
        (["--rank", "3"], "--rank 3: this trace has 1 rank(s): 0 (pid 642 device 0)"),
        (["--rank", "-1"], "--rank must be 0 or more"),
        (["--iteration", "9"], "--iteration 9: this trace has iterations 1..2"),
        (["--format", "png"], "--format 'png': choose svg or pdf"),
    ],
)
def test_report_bad_options(tmp_path, args, pattern):
    assert_one_line_error(*run("report", ZERO3_CUT, "-o", tmp_path / "r", *args), pattern)


def test_report_bad_inputs(tmp_path):
    assert_one_line_error(*run("report", tmp_path / "missing.sqlite", "-o", tmp_path / "r"), "no such file")
    (tmp_path / "file").write_text("x")
    assert_one_line_error(*run("report", ZERO3_CUT, "-o", tmp_path / "file"), "exists and is not a directory")
    (tmp_path / "x.txt").write_text("not a db")
    assert_one_line_error(*run("report", tmp_path / "x.txt", "-o", tmp_path / "r"), "not an SQLite file")


# ------------------------------------------------------------------ long iterations, two ranks
def two_rank_trace(path, iteration_s: float = 60.0):
    """Two processes, three iterations of ``iteration_s`` seconds each, tracekit NVTX ranges,
    no memory events and no GPU metrics; rank 1 (pid 20) is 10% slower."""
    from synthetic import SyntheticTrace, gtid

    t = SyntheticTrace()
    for pid, slow in ((10, 1.0), (20, 1.1)):
        tid = gtid(pid, 1)
        T = int(iteration_s * 1e9 * slow)
        for it in range(3):
            base = it * T
            phases = [("forward", 0.0, 0.25), ("backward", 0.25, 0.6), ("update", 0.6, 1.0)]
            for name, a, b in phases:
                t.range(name, base + int(a * T), base + int(b * T) - 1000, tid=tid, domain="tracekit")
            t.kernel(base + int(0.05 * T), base + int(0.2 * T), pid, 1, launch=base + int(0.01 * T))
            t.copy(base + int(0.3 * T), base + int(0.4 * T), 2 << 30, 2, pid, 1, launch=base + int(0.26 * T),
                   src=2, dst=1)
            t.copy(base + int(0.9 * T), base + int(0.95 * T), 1 << 30, 1, pid, 1, launch=base + int(0.85 * T),
                   src=0, dst=2)
    return t.write(path)


def test_long_iterations_two_ranks(tmp_path):
    path = two_rank_trace(tmp_path / "long.sqlite")
    d = ReportData.load(path)
    assert d.ranks.height == 2
    fig, frame = F.iteration_breakdown(d, rank=1)
    assert fig.axes[0].get_ylabel() == "wall time (s)"
    assert frame.group_by("iteration").agg(pl.col("wall_ns").sum())["wall_ns"].max() > 60e9
    S.close(fig)
    fig, frame = F.iteration_timeline(d, rank=0)
    assert fig.axes[-1].get_xlabel() == "time since iteration start (s)"
    h2d = frame.filter(pl.col("series") == "H2D")  # the 1 GiB pageable copy of iteration 1, as an interval
    T = 60_000_000_000
    assert h2d.select("t_ns", "t_end_ns", "bytes").rows() == [(T + int(0.9 * T), T + int(0.95 * T), 1 << 30)]
    pcie = frame.filter(pl.col("series").str.starts_with("pcie"))
    assert pcie.height == 0  # no GPU metrics: no PCIe panel
    assert frame.filter(pl.col("series") == "memory").height == 0  # no memory events: panel says so
    S.close(fig)
    fig, frame = F.rank_summary(d)
    walls = frame.group_by("pid").agg(pl.col("wall_ns").sum()).sort("pid")["wall_ns"].to_list()
    assert walls[1] == pytest.approx(1.1 * walls[0], rel=1e-3)
    S.close(fig)
    d.close()
    rc, out, err = run("report", path, "-o", tmp_path / "r", "--rank", "1")
    assert rc == 0, err
    md = (tmp_path / "r" / "report.md").read_text()
    assert "shown: rank 1 (pid 20 GPU 0)" in md
    assert (tmp_path / "r" / "6_ranks.png").exists() and "](6_ranks.png)" in md  # two ranks: compared


def test_summary_iteration_metrics_equal_phase_table():
    d = ReportData.load(ZERO3_CUT)
    rk = d.rank(0)
    m = summary.iteration_metrics(d, rk)
    t = d.rank_table(rk).group_by("iteration", "phase").agg(pl.col("wall_ns").sum(), pl.col("h2d_bytes").sum())
    j = m.join(t, on=["iteration", "phase"], suffix="_t")
    assert j.height == m.height
    assert (j["wall_ns"] == j["wall_ns_t"]).all() and (j["h2d_bytes"] == j["h2d_bytes_t"]).all()
    d.close()


def test_progress_steps_are_reported(zero3_report_steps):
    """write_report calls step() for loading stages and each figure (the CLI shows them in a
    rich status line on stderr while a large trace loads): the calls of the session's report
    of the fixture (conftest's ``zero3_report``)."""
    seen = zero3_report_steps
    assert seen[:3] == ["opening the export", "finding phases and attributing GPU work", "per-phase breakdown"]
    assert sum(m.startswith("figure ") for m in seen) == len(FIGURES)


def test_report_on_full_shared_trace(full_trace, tmp_path):
    """The issue's acceptance: the five figures and the summary on the full shared trace, the
    timeline iteration the median one, and its copy bytes equal to SQL on the trace."""
    from tracekit.render.report import write_report

    res = write_report(full_trace, tmp_path / "r")
    assert res.iteration == 3  # walls 3159, 628, 674, 642 ms: median of the complete ones
    for name in ONE_RANK:
        assert (tmp_path / "r" / f"{name}.png").stat().st_size > 10_000
    tl = pl.read_csv(tmp_path / "r" / "data" / "2_iteration_timeline.csv", infer_schema_length=None)
    bands = tl.filter(pl.col("series") == "phase")
    t0, t1 = bands["t_ns"].min(), bands["t_end_ns"].max()
    h2d = tl.filter(pl.col("series") == "H2D")
    con = sqlite3.connect(f"file:{full_trace}?mode=ro", uri=True)
    want = con.execute("""SELECT start, "end", bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY
                          WHERE copyKind = 1 AND "end" > ?1 AND start < ?2""", (t0, t1)).fetchall()
    con.close()
    assert sorted(h2d.select("t_ns", "t_end_ns", "bytes").rows()) == sorted(want)
    # a 55 GB/s pinned copy reads 55 GB/s (copies drawn as intervals, never binned wider than themselves)
    pinned = h2d.filter((pl.col("label") == "pinned") & (pl.col("bytes") >= 1 << 20))
    assert pinned["value"].max() > 50
    # the page a user shares: a few MB for the 624 MB trace
    assert (tmp_path / "r" / "report.html").stat().st_size < 8_000_000
    # the warm-up iteration 0 (3.2 s) is drawn apart from the steady ones (~0.65 s)
    f1 = pl.read_csv(tmp_path / "r" / "data" / "1_iteration_breakdown.csv")
    assert f1.group_by("iteration").agg(pl.col("wall_ns").sum()).sort("iteration")["wall_ns"][0] > 3e9
    md = (tmp_path / "r" / "report.md").read_text()
    assert "over iterations 1–3 (iteration 0, the warm-up step, is left out)" in md
    row = next(line for line in md.splitlines() if line.startswith("| update |"))
    assert [c.strip() for c in row.strip("|").split("|")][4] == "268.2"  # H2D MB per update


@pytest.mark.parametrize("trace", sorted(ZERO3_CUT.parent.glob("*.sqlite")), ids=lambda p: p.name)
def test_report_on_every_fixture(trace, tmp_path, request):
    """Every real fixture (DeepSpeed ranges or tracekit's own capture ranges) gives all figures,
    and figure 1's stacks add up to the iteration spans. The zero-3 cut's report is the
    session's (conftest's ``zero3_report``: the same ``write_report`` call)."""
    from tracekit.render.report import write_report

    if trace == ZERO3_CUT:
        res, out = request.getfixturevalue("zero3_report")
    else:
        res, out = write_report(trace, tmp_path / "r"), tmp_path / "r"
    assert set(res.figures) == set(ONE_RANK)
    f1 = pl.read_csv(out / "data" / "1_iteration_breakdown.csv")
    d = ReportData.load(trace)
    spans = d.iteration_spans(d.rank(0))
    d.close()
    got = f1.group_by("iteration").agg(pl.col("wall_ns").sum()).sort("iteration")
    assert got["wall_ns"].to_list() == (spans["end_ns"] - spans["start_ns"]).to_list()
