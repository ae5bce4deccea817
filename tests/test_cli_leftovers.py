"""What a new user found trying tracekit from its README: a partial ``--phase-map``, ``compare A A``,
``--iteration N`` and the advice, compressed or report inputs, and ``report`` on several ranks.

Expectations come from plain SQL on the fixtures (tests/fixtures/README.md) or hand-made files."""

from __future__ import annotations

import gzip
import json
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
