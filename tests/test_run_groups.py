"""The one-run rule (tracekit.analyze.run_groups) and what analyze prints for a folder of
unrelated runs."""

import os
import shutil
import sqlite3
from pathlib import Path

from conftest import run_cli

from tracekit.analyze import run_groups

FIX = Path(__file__).parent / "fixtures"


def _start_ns(path):
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]


def test_identity_reads_start_time_and_host():
    p = FIX / "zero2_offload_gas2_cut.sqlite"
    d = run_groups.identity(p)
    assert d["start_ns"] == _start_ns(p) == 1795993555478075673
    assert d["host"] == "vm"
    assert d["launch"] is not None  # zero2_offload_gas2_capture.json


def test_unrelated_folder_gets_note_and_no_slowest_rank(tmp_path):
    names = ["zero2_offload_gas2_cut.sqlite", "zenflow_cut.sqlite"]
    for n in names:
        shutil.copy(FIX / n, tmp_path / n)
    # the two were captured more than an hour apart (plain SQL on the fixtures)
    assert abs(_start_ns(FIX / names[0]) - _start_ns(FIX / names[1])) > run_groups.MAX_START_GAP_NS
    env = {**{k: v for k, v in os.environ.items() if k != "LINES"}, "COLUMNS": "200"}  # whole file names
    code, out, err = run_cli("analyze", str(tmp_path), env=env)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "are 2 different runs" in flat
    assert "slowest rank" not in flat
    assert "Across ranks" not in flat
    assert flat.count("zenflow_cut.sqlite") >= 1 and flat.count("zero2_offload_gas2_cut.sqlite") >= 1


def test_group_synthetic_chain_and_launch():
    s = run_groups.MAX_START_GAP_NS
    ids = [{"start_ns": 0, "launch": "a"}, {"start_ns": s, "launch": "a"},  # chained: one run
           {"start_ns": 2 * s, "launch": None},  # no manifest: joins by time
           {"start_ns": 2 * s + 1, "launch": "b"},  # another command at the same time
           {"start_ns": 10 * s, "launch": "a"},  # much later
           {"start_ns": None, "launch": "b"}]  # unreadable start: joins by launch only
    assert run_groups.group(ids) == [[0, 1, 2], [3, 5], [4]]
    assert run_groups.note([[0, 1]], ["x", "y"]) is None


def test_one_run_folder_has_hosts_and_clock(tmp_path):
    # one export copied as two ranks: same capture start, no manifest beside -> one run
    src = FIX / "zero2_offload_gas2_cut.sqlite"
    for n in ("rank0.sqlite", "rank1.sqlite"):
        shutil.copy(src, tmp_path / n)
    import tracekit

    many = tracekit.analyze_many([tmp_path], cache=False)
    s = many.summary
    assert s["one_run"] is True and s["note"] is None
    with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as con:
        host = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchone()[0]
    hosts = s["run"]["hosts"]
    assert list(hosts) == [host]
    assert sorted(Path(r["trace"]).name for r in hosts[host]) == ["rank0.sqlite", "rank1.sqlite"]
    assert sorted(s["run"]["clock"]["start_offset_ns"].values()) == [0, 0]
