"""Terminal output that fits (issue 10): the default tables at 80 columns cut no number, --wide
shows every column, COLUMNS and NO_COLOR are honoured, also for output served from the cache."""

import json
import os
import re
import shutil

import pytest
from conftest import ZERO3_CUT
from conftest import run_cli as run

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")}
    return {**env, **kw}


def _check_fits(out: str, width: int) -> None:
    lines = [ANSI.sub("", line) for line in out.splitlines()]
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, too_long[:3]
    assert not re.search(r"\d…", out), re.findall(r".{10}\d….{5}", out)[:3]  # no number cut with an ellipsis


@pytest.mark.parametrize("extra", [(), ("--phase", "update"), ("--phase", "backward", "--iteration", "2")])
def test_80_columns_no_long_line_no_cut_number(extra):
    rc, out, err = run("analyze", ZERO3_CUT, "--no-cache", *extra, env=_env(COLUMNS="80"))
    assert rc == 0, err
    _check_fits(out, 80)
    # the numbers shown are whole: each iteration's update wall time in ms (1 decimal) is in the table
    rc, js, err = run("analyze", ZERO3_CUT, "--no-cache", "--json", *extra)
    j = json.loads(js)
    if not extra:  # the one-screen default (issue 23): one row per iteration, whole numbers
        for it in j["ranks"][0]["iterations"]:
            wall = sum(p["wall_ns"] for p in it["phases"])
            upd = sum(p["wall_ns"] for p in it["phases"] if p["phase"] == "update")
            row = next(x for x in out.splitlines() if x.split()[:1] == [str(it["index"])] and "@" in x)
            assert f"{wall / 1e6:,.1f}" in row.split() and f"{upd / 1e6:,.1f}" in row.split()
        return
    for it in j["ranks"][0]["iterations"]:
        for p in it["phases"]:
            assert f"{p['wall_ns'] / 1e6:,.1f}" in out
            if p["h2d_bytes"]:
                assert f"{p['h2d_bytes'] / 1e6:,.1f} @ {p['h2d_gbps']:,.1f}" in out


def test_many_traces_fit_80_columns(tmp_path):
    for i in (0, 1):
        shutil.copy(ZERO3_CUT, tmp_path / f"rank{i}.sqlite")
    rc, out, err = run("analyze", tmp_path, "--no-cache", "--jobs", "1", env=_env(COLUMNS="80"))
    assert rc == 0, err
    _check_fits(out, 80)


def test_compare_fits_80_columns():
    rc, out, err = run("compare", ZERO3_CUT, ZERO3_CUT, env=_env(COLUMNS="80"))
    assert rc == 0, err
    _check_fits(out, 80)


def test_wide_shows_every_column():
    rc, out, err = run("analyze", ZERO3_CUT, "--no-cache", "--wide", env=_env(COLUMNS="200"))
    assert rc == 0, err
    head = next(line for line in out.splitlines() if "iter" in line and "wall ms" in line)
    for col in ("wall ms", "GPU idle", "kernel ms", "comm ms", "H2D MB", "H2D ms", "H2D GB/s", "D2H MB", "D2H ms",
                "D2H GB/s", "memset MB"):
        assert col in head, col
    rc, narrow, err = run("analyze", ZERO3_CUT, "--no-cache", env=_env(COLUMNS="200"))
    head = next(line for line in narrow.splitlines() if "iter" in line and "wall ms" in line)
    assert "kernel ms" not in head and "H2D MB @ GB/s" in head


def test_cached_output_follows_columns_and_no_color(tmp_path):
    trace = tmp_path / "run.sqlite"
    shutil.copy(ZERO3_CUT, trace)
    colour = _env(COLUMNS="100", FORCE_COLOR="1")
    rc, first, err = run("analyze", trace, env=colour)
    assert rc == 0, err
    assert ANSI.search(first)  # a colour terminal: styles
    rc, again, err = run("analyze", trace, env=colour)  # served from the cache
    assert again == first
    rc, narrow, err = run("analyze", trace, env=_env(COLUMNS="80", FORCE_COLOR="1"))
    assert narrow != first
    _check_fits(narrow, 80)
    rc, plain, err = run("analyze", trace, env=_env(COLUMNS="100", FORCE_COLOR="1", NO_COLOR="1"))
    assert not re.search(r"\x1b\[[0-9;]*3[0-9](;|m)", plain)  # no colour codes (bold may stay)
    assert ANSI.sub("", plain) == ANSI.sub("", first)


def test_format_csv_and_md():
    rc, out, err = run("analyze", ZERO3_CUT, "--no-cache", "--format", "csv")
    assert rc == 0, err
    rows = out.strip().splitlines()
    assert rows[0].startswith("pid,device,rank,iteration") and len(rows) == 13
    rc, md, err = run("analyze", ZERO3_CUT, "--no-cache", "--format", "md")
    assert rc == 0, err
    assert "| iter | phase | wall ms |" in md and "|---|---|---:|" in md
    rc, out, err = run("analyze", ZERO3_CUT, "--format", "parquet")
    assert rc == 2 and "--format" in err


def test_many_traces_with_long_names_keep_numbers_whole(tmp_path):
    """A long trace name folds; the phase times of each rank stay whole numbers on one line."""
    names = ["rank0 of a run with a rather long name [v1].sqlite", "rank1.sqlite"]
    for n in names:
        shutil.copy(ZERO3_CUT, tmp_path / n)
    rc, out, err = run("analyze", tmp_path, "--no-cache", "--jobs", "1", env=_env(COLUMNS="80"))
    assert rc == 0, err
    _check_fits(out, 80)
    rc, js, err = run("analyze", ZERO3_CUT, "--no-cache", "--json")
    phases = {}
    its = [it for it in json.loads(js)["ranks"][0]["iterations"] if it["complete"]]
    assert [it["index"] for it in its] == [1, 2]  # a cut from iteration 1: no warm-up, both steady
    for it in its:
        for p in it["phases"]:
            phases[p["phase"]] = phases.get(p["phase"], 0) + p["wall_ns"]
    # the table is per steady iteration (the mean over the two)
    row = f"{phases['forward'] / 2 / 1e6:,.1f}   {phases['backward'] / 2 / 1e6:,.1f}"
    assert sum(row in line for line in out.splitlines()) == 2, out
