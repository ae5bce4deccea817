"""What a new user found trying tracekit from its README: a partial ``--phase-map``, ``compare A A``,
``--iteration N`` and the advice, compressed or report inputs, and ``report`` on several ranks.

Expectations come from plain SQL on the fixtures (tests/fixtures/README.md) or hand-made files."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli

FIXTURES = Path(__file__).parent / "fixtures"
ZERO3 = FIXTURES / "zero3_offload_gas2_cut.sqlite"  # tracekit capture ranges, iterations 1-2
DS = FIXTURES / "ds_zero3_offload_iter1-2.sqlite"  # DeepSpeed's own ranges only

DOMAIN_RANGES_SQL = """
select coalesce(n.text, s.value) as name, n.start, n.end
from NVTX_EVENTS n
left join StringIds s on s.id = n.textId
join NVTX_EVENTS d on d.eventType = 75 and d.domainId = n.domainId and d.text = ?
where n.eventType = 59
order by n.start
"""


def domain_ranges(path: Path, domain: str) -> list[tuple[str, int, int]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [(str(n), int(s), int(e)) for n, s, e in con.execute(DOMAIN_RANGES_SQL, (domain,))]
    finally:
        con.close()


def phase_rows(result: dict) -> list[tuple[int, str, int, int]]:
    """(iteration, phase, start_ns, wall_ns) of every non-``other`` phase row of rank 0."""
    return sorted((it["index"], p["phase"], p["start_ns"], p["wall_ns"])
                  for it in result["ranks"][0]["iterations"] for p in it["phases"] if p["phase"] != "other")


# ---------------------------------------------------------------- 1. a partial --phase-map
def test_partial_phase_map_keeps_the_built_in_phases():
    """``--phase-map update=^update$`` on a tracekit capture: forward and backward still come
    from tracekit's ranges (they used to be dropped into 'other': iteration 1 was 130.9 ms,
    its update alone)."""
    rc, out, err = run_cli("analyze", ZERO3, "--no-cache", "--json", "--phase-map", "update=^update$")
    assert rc == 0, err
    res = json.loads(out)
    assert res["phase_source"] == {"669": "phase-map+tracekit"}
    # the SQL reference: tracekit's phase ranges inside the `iteration 1` and `iteration 2` ranges
    ranges = domain_ranges(ZERO3, "tracekit")
    its = {int(n.split()[1]): (s, e) for n, s, e in ranges if re.fullmatch(r"iteration \d+", n)}
    phase_of = {"forward": "forward", "backward": "backward", "backward boundary": "backward", "update": "update"}
    want = sorted((i, phase_of[n], s, e - s) for n, s, e in ranges if n in phase_of
                  for i in (1, 2) if its[i][0] <= s < its[i][1])
    assert [r[1] for r in want].count("forward") == 4 and [r[1] for r in want].count("backward") == 4
    assert phase_rows(res) == want


def test_partial_phase_map_on_deepspeed_ranges():
    """Only the update renamed (to DeepSpeed's own step range): forward and backward are
    DeepSpeed's ``DeepSpeedEngine.forward/backward`` ranges, exactly."""
    rc, out, err = run_cli("analyze", DS, "--no-cache", "--json",
                           "--phase-map", r"update=^DeepSpeedZeroOptimizer_Stage3\.step$")
    assert rc == 0, err
    res = json.loads(out)
    assert res["phase_source"] == {"642": "phase-map+DeepSpeed"}
    names = {"DeepSpeedEngine.forward": "forward", "DeepSpeedEngine.backward": "backward",
             "DeepSpeedZeroOptimizer_Stage3.step": "update"}
    want = [(names[n], s, e - s) for n, s, e in domain_ranges(DS, "DeepSpeed") if n in names]
    got = [(p, s, w) for _i, p, s, w in phase_rows(res)]
    assert sorted(got) == sorted(want)
    assert len(want) == 2 * (2 + 2 + 1)  # two iterations of gas 2: 2 forward, 2 backward, 1 step


def test_partial_phase_map_note_on_the_default_screen():
    rc, out, err = run_cli("analyze", ZERO3, "--no-cache", "--phase-map", "update=^update$")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[2] == "pid 669: phases not in --phase-map keep the built-in names (tracekit NVTX)"
    assert "backward" not in "".join(lines[:2])  # the header is unchanged


def test_phase_map_item_that_matches_nothing_is_one_line():
    """A named phase whose regex matches no range would be dropped silently: exit 2, one line."""
    rc, out, err = run_cli("analyze", ZERO3, "--no-cache", "--phase-map", "update=^update$",
                           "--phase-map", "forward=^fwd$")
    assert_one_line_error(rc, out, err, "")
    assert err.strip() == (
        "tracekit: error: --phase-map forward=^fwd$: matched no NVTX range in " + str(ZERO3)
        + " (the other items did); fix the name (`nsys stats -r nvtx_sum` lists them) or leave the item out "
        "to keep the built-in names for that phase")
    rc, out, err = run_cli("analyze", DS, "--no-cache", "--phase-map", "update=^update$")  # nothing at all
    assert_one_line_error(rc, out, err, "--phase-map update=^update$: matched no NVTX range in")


# ---------------------------------------------------------------- 4. compressed and report inputs
@pytest.mark.parametrize("command", [["analyze", "X", "--no-cache"], ["report", "X", "-o", "T/r", "--no-cache"],
                                     ["compare", str(ZERO3), "X", "--no-cache"],
                                     ["trim", "X", "T/t.sqlite", "--iterations", "1"]])
def test_xz_input_is_one_line(command, tmp_path):
    """An export compressed as the fixtures are shipped (``NAME.sqlite.xz``): nothing in
    tracekit reads it compressed (tests/conftest.py decompresses the fixtures), so it says how."""
    xz = FIXTURES / "zenflow_cut.sqlite.xz"
    assert xz.read_bytes()[:6] == b"\xfd7zXZ\x00"
    args = [str(xz) if c == "X" else c.replace("T/", f"{tmp_path}/") for c in command]
    rc, out, err = run_cli(*args)
    assert_one_line_error(rc, out, err, "")
    assert err.strip() == f"tracekit: error: {xz} is xz-compressed: decompress it first (`xz -dk {xz}`)"
    assert not (tmp_path / "r").exists() and not (tmp_path / "t.sqlite").exists()


def test_gzip_input_is_one_line(tmp_path):
    gz = tmp_path / "run.sqlite.gz"
    with open(ZERO3, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    rc, out, err = run_cli("analyze", gz, "--no-cache")
    assert_one_line_error(rc, out, err, "")
    assert err.strip() == f"tracekit: error: {gz} is gzip-compressed: decompress it first (`gzip -dk {gz}`)"


@pytest.mark.parametrize("suffix", [".nsys-rep", ".qdrep"])
def test_report_input_is_one_line(suffix, tmp_path):
    rep = tmp_path / f"run{suffix}"
    rep.write_bytes(b"\x00\x01NSYS report, not SQLite" * 10)
    for args in (["analyze", rep], ["report", rep, "-o", tmp_path / "r"], ["compare", ZERO3, rep]):
        rc, out, err = run_cli(*args, "--no-cache")
        assert_one_line_error(rc, out, err, "")
        assert err.strip() == (
            f"tracekit: error: {rep}: this is an Nsight Systems report, not its SQLite export; run "
            f"`nsys export --type sqlite {rep}` and analyze the .sqlite it writes (`tracekit capture` records "
            "and exports in one go)")


# ---------------------------------------------------------------- 2. compare A A, rows zero on both sides
ZERO2 = FIXTURES / "zero2_offload_gas2_cut.sqlite"
SAME_FILE = "A and B are the same trace (the same file): every difference is 0"


def _deltas(res: dict) -> list:
    return [d["delta"] for sec in ("per_phase", "per_iteration") for r in res[sec] for d in r["metrics"].values()]


def test_compare_same_file_says_so():
    rc, out, err = run_cli("compare", ZERO2, ZERO2, "--no-cache")
    assert rc == 0, err
    lines = out.splitlines()
    b = next(i for i, line in enumerate(lines) if line.startswith("B "))
    assert lines.index(SAME_FILE) in (b + 1, b + 2)  # under the B line (which may wrap once)
    assert out.count("same trace") == 1
    rc, out, err = run_cli("compare", ZERO2, ZERO2, "--no-cache", "--json")
    res = json.loads(out)
    assert res["same_trace"] == "the same file"
    assert set(_deltas(res)) <= {0, 0.0, None} and len(_deltas(res)) == (4 + 2 * 4) * 10  # 4 phases, 2 iterations


def test_compare_byte_identical_copy_says_so(tmp_path):
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(ZERO2, copy)
    rc, out, err = run_cli("compare", ZERO2, copy, "--no-cache")
    assert rc == 0, err
    assert "A and B are the same trace (byte-identical files): every difference is 0" in out.splitlines()
    copy.write_bytes(copy.read_bytes()[:-1] + b"\x01")  # one byte changed in the last page: not the same
    rc, out, err = run_cli("compare", ZERO2, copy, "--no-cache", "--json")
    assert rc == 0, err
    assert "same_trace" not in json.loads(out)


def test_compare_different_traces_no_same_line():
    rc, out, err = run_cli("compare", ZERO2, ZERO3, "--no-cache")
    assert rc == 0, err
    assert "same trace" not in out


def _console():
    import io

    from rich.console import Console

    buf = io.StringIO()
    return buf, Console(file=buf, width=100, color_system=None)


def test_compare_rows_zero_on_both_sides_are_folded():
    """A hand-made comparison: H2D 12 kB in both (shows 0.0 MB), D2H 0 in both, wall 100 ms vs
    110 ms, pageable copies 1 vs 1, one sub-phase of 0.02 ms in both (shows 0.0 ms)."""
    from tracekit.render import compare as C

    def diff(a, b):
        return {"a": a, "b": b, "delta": b - a, "pct": 100.0 * (b - a) / a if a else None}

    metrics = {m: diff(0, 0) for m in C.METRICS}
    metrics.update(wall_ns=diff(100_000_000, 110_000_000), h2d_bytes=diff(12_000, 12_000),
                   pageable_count=diff(1, 1))
    sub = {"phase": "update", "sub_phase": "gradient norm (grad_norm)", "role": "grad_norm",
           "metrics": {"wall_ns": diff(20_000, 20_000), "cpu_ns": diff(0, 0)}}
    result = {"a": {"trace": "a.sqlite", "pid": 1, "device": 0, "iterations": [1]},
              "b": {"trace": "b.sqlite", "pid": 1, "device": 0, "iterations": [1]},
              "per_phase": [{"phase": "update", "metrics": metrics}],
              "per_iteration": [], "iteration_total": {"wall_ns": diff(100_000_000, 110_000_000)},
              "per_sub_phase": [sub], "config": [], "explanations": []}
    buf, console = _console()
    C.render(result, console=console)
    out = buf.getvalue()
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("update", "pageable", "H2D"))]
    assert rows == [["update", "wall", "ms", "100.0", "110.0", "+10.0", "+10%"],
                    ["pageable", "copies", "count", "1", "1", "0", "±0%"]]
    assert "gradient norm" not in out and "update sub-phases" not in out
    assert "2 rows showing 0 on both sides not listed; --json has every value" in out.splitlines()
    assert "same trace" not in out


def test_compare_folded_rows_stay_in_json():
    """zenflow_cut's update copies a few kB H2D per iteration: not in the table, in --json."""
    zen = FIXTURES / "zenflow_cut.sqlite"
    if not zen.exists():
        pytest.skip("zenflow_cut.sqlite is decompressed by tests/conftest.py")
    rc, out, err = run_cli("compare", zen, zen, "--no-cache", "--json")
    res = json.loads(out)
    upd = next(r for r in res["per_phase"] if r["phase"] == "update")["metrics"]
    assert 0 < upd["h2d_bytes"]["a"] < 50_000 and upd["h2d_bytes"]["a"] == upd["h2d_bytes"]["b"]
    rc, out, err = run_cli("compare", zen, zen, "--no-cache")
    table = out.split("per phase, mean per iteration")[1].split("update sub-phases")[0]
    listed, phase = set(), None
    for line in table.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 6 and cells[0] in ("forward", "backward", "update", "other"):
            phase, cells = cells[0], cells[1:]
        if phase and len(cells) >= 6:
            listed.add((phase, cells[0], cells[1]))
    assert ("update", "wall", "ms") in listed and ("update", "H2D", "MB") not in listed
    n = int(re.search(r"^(\d+) rows showing 0 on both sides not listed", out, re.M).group(1))
    want = sum(1 for r in res["per_phase"] for m, d in r["metrics"].items()
               if (d["a"] or d["b"]) and all(abs((d[k] or 0) / C_DIV[m]) < C_HALF[m] for k in "ab"))
    want += sum(1 for r in res["per_sub_phase"] if abs(r["metrics"]["wall_ns"]["a"] or 0) < 50_000
                and abs(r["metrics"]["wall_ns"]["b"] or 0) < 50_000)
    assert n == want > 0


#: display unit (divisor) and half of the last digit shown, per metric (ms 0.1, MB 0.1, GB 0.01, count 1, % 0.1)
C_DIV = {"wall_ns": 1e6, "gpu_idle_ns": 1e6, "h2d_bytes": 1e6, "d2h_bytes": 1e6, "h2d_exposed_ns": 1e6,
         "d2h_exposed_ns": 1e6, "overlap_ratio": 0.01, "pageable_count": 1, "pageable_bytes": 1e6, "peak_bytes": 1e9}
C_HALF = {m: 0.05 for m in C_DIV} | {"peak_bytes": 0.005, "pageable_count": 1e-9}


# ---------------------------------------------------------------- 3. --iteration N and the advice
WARM = FIXTURES / "ds_zero3_offload_iter0-3.sqlite"  # iteration 0 is the warm-up (3,159 ms vs 628-674)


@pytest.mark.parametrize("extra", [[], ["--wide"], ["--explain"]])
@pytest.mark.parametrize("n", [0, 2])
def test_iteration_says_the_advice_is_over_the_steady_iterations(n, extra):
    """The tables narrow to iteration N; the advice stays over the steady iterations 1-3 (the
    what-if model needs two or more for its interval), and one line says so."""
    rc, out, err = run_cli("analyze", WARM, "--no-cache", "--iteration", str(n), *extra)
    assert rc == 0, err
    note = f"note: the advice is over steady iterations 1-3, not --iteration {n} alone"
    assert out.splitlines().count(note) == 1
    if not extra:  # the per-iteration table holds iteration N only
        rows = out.split("per iteration (--wide: phases)")[1].split("findings")[0].splitlines()[3:]
        assert [r.split()[0] for r in rows if r.strip()] == [str(n)]


def test_iteration_advice_basis_in_json_and_no_note_without_it():
    con = sqlite3.connect(f"file:{WARM}?mode=ro", uri=True)
    try:  # four optimizer steps: DeepSpeed's step ranges, one per iteration 0-3
        steps = con.execute("select count(*) from NVTX_EVENTS n join StringIds s on s.id = n.textId "
                            "where s.value = 'DeepSpeedZeroOptimizer_Stage3.step'").fetchone()[0]
    finally:
        con.close()
    assert steps == 4
    rc, out, err = run_cli("analyze", WARM, "--no-cache", "--iteration", "2", "--json")
    res = json.loads(out)
    assert [it["index"] for it in res["ranks"][0]["iterations"]] == [2]
    assert {tuple(p["iterations"]) for p in res["predictions"]} == {(1, 2, 3)}  # warm-up 0 left out
    rc, out, err = run_cli("analyze", WARM, "--no-cache")
    assert rc == 0 and "note: the advice is over" not in out


# ---------------------------------------------------------------- 5. report on several ranks
@pytest.mark.usefixtures("cheap_figures")
def test_report_of_two_ranks_says_which_rank_it_shows(tmp_path):
    """No fixture holds two GPUs (tests/fixtures/README.md): the two-process trace of
    test_report.py (rank 1, pid 20, 10 % slower). Both report.md and report.html name the rank
    shown in the headline and say what is only that rank's; figure 6 compares both."""
    from test_report import two_rank_trace

    path = two_rank_trace(tmp_path / "two.sqlite", iteration_s=0.5)
    note = ("the advice, key numbers, findings and every figure but the per-rank summary (all 2 ranks) are "
            "this rank's")
    for rank, pid, wall in ((0, 10, "500.0"), (1, 20, "550.0")):
        out_dir = tmp_path / f"r{rank}"
        rc, out, err = run_cli("report", path, "-o", out_dir, "--rank", str(rank), "--no-cache")
        assert rc == 0, err
        md = (out_dir / "report.md").read_text()
        lines = md.splitlines()
        assert lines[2].startswith(rf"**two.sqlite · rank {rank} of 2 (pid {pid}) · GPU 0 · ")
        assert (f"- ranks: 0: pid 10 GPU 0, 1: pid 20 GPU 0; shown: rank {rank} (pid {pid} GPU 0): {note}; "
                "`--rank N` for another") in lines
        # the key numbers are the shown rank's: its iteration (3 x 0.5 s, x 1.1 for pid 20)
        assert f"| **iteration** | **{wall}** | 100% |" in md
        html = (out_dir / "report.html").read_text()
        assert f'id="headline"><b>two.sqlite · rank {rank} of 2 (pid {pid}) · GPU 0 · ' in html
        assert (f"<th class='l'>shown</th><td>rank {rank} (pid {pid} GPU 0): "
                + note.replace("'", "&#x27;") + "; --rank N for another; iteration ") in html
        assert (out_dir / "6_ranks.png").exists()


@pytest.mark.usefixtures("cheap_figures")
def test_report_of_one_rank_names_no_rank(tmp_path):
    rc, out, err = run_cli("report", ZERO2, "-o", tmp_path / "r", "--no-cache")
    assert rc == 0, err
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.splitlines()[2].startswith(r"**zero2\_offload\_gas2\_cut.sqlite · GPU 0")
    assert "- ranks: 0: pid 999 GPU 0; shown: rank 0 (pid 999 GPU 0)" in md.splitlines()
    assert "of 1 (pid" not in md and "every figure but" not in md


def test_default_screen_marks_savings_within_noise():
    """The default advice table marks (``*`` after the saving %) exactly the items whose saving
    interval in ``--json`` holds 0, and says what the mark means once."""
    rc, out, _ = run_cli("analyze", DS, "--json")
    assert rc == 0
    items = json.loads(out)["advice"]
    noisy = [a["saving_interval_ms"] is not None and a["saving_interval_ms"][0] <= 0 <= a["saving_interval_ms"][1]
             for a in items]
    assert items and any(noisy)
    # a width of its own, and the session's cache folder (conftest): never a cache beside the fixture
    rc, screen, _ = run_cli("analyze", DS,
                            env={"COLUMNS": "80", "TRACEKIT_CACHE_DIR": os.environ["TRACEKIT_CACHE_DIR"]})
    assert rc == 0
    rows = [ln for ln in screen.splitlines() if re.match(r"^\d+\s", ln) and "%" in ln][: len(items)]
    assert len(rows) == len(items)
    for row, a, n in zip(rows, items, noisy):
        assert f"{a['saving_pct']:.1f}%{'*' if n else ''} " in row + " ", row
    assert screen.count("* within noise: the saving's 95 % interval holds 0") == 1


def test_across_ranks_table_says_its_totals():
    """The several-trace screen's across-ranks table is in total ms (each rank's phase summed
    over its iterations): its forward row equals the sum of the forward phase walls of every
    closed iteration in ``--json``, and its title says so; counts are singular for one."""
    rc, js, _ = run_cli("analyze", ZERO3, "--json")
    total = sum(ph["wall_ns"] for it in json.loads(js)["ranks"][0]["iterations"] if not it.get("unclosed")
                for ph in it["phases"] if ph["phase"] == "forward")
    rc, out, _ = run_cli("analyze", ZERO3, ZERO3,
                         env={"COLUMNS": "200", "TRACEKIT_CACHE_DIR": os.environ["TRACEKIT_CACHE_DIR"]})
    assert rc == 0
    fwd = next(ln for ln in out.splitlines() if ln.split()[:1] == ["forward"])
    assert f"{total / 1e6:,.1f}" in fwd.split(), (fwd, total)
    assert "Across ranks (ms in all: each rank's phase time summed over its iterations)" in out
    assert "1 rank in 1 trace (" in out
