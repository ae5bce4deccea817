"""Many traces: per-trace results in parallel processes and the summary across ranks."""

from __future__ import annotations

import json
import shutil

import pytest

from tracekit.analyze.multi import analyze_many, expand_inputs, rank_numbers, summarize_ranks, write_json
from tracekit.analyze.result import analyze_path
from tracekit.analyze.trim import trim
from tracekit.cli import main
from tracekit.errors import TracekitError


@pytest.fixture
def runs(tmp_path, zero3_cut, monkeypatch):
    """rank0/rank1: copies of the fixture; rank2: its first iteration only (trimmed)."""
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "caches"))
    d = tmp_path / "runs"
    d.mkdir()
    shutil.copy(zero3_cut, d / "rank0.sqlite")
    shutil.copy(zero3_cut, d / "rank1.sqlite")
    trim(zero3_cut, d / "rank2.sqlite", "1-1")
    return d


def _phase_sums(result: dict) -> dict:
    """Independent computation: wall time per phase summed over the iterations of the one rank."""
    (rank,) = result["ranks"]
    out: dict[str, int] = {}
    for it in rank["iterations"]:
        for p in it["phases"]:
            out[p["phase"]] = out.get(p["phase"], 0) + p["wall_ns"]
    return out


def test_two_copies_identical_spread_zero(runs):
    out = analyze_many([runs / "rank0.sqlite", runs / "rank1.sqlite"], jobs=1, cache=False)
    s = out["summary"]
    assert s["traces"] == 2 and s["ranks"] == 2
    assert s["missing_ranks"] == []
    single = analyze_path(runs / "rank0.sqlite")
    sums = _phase_sums(single)
    assert set(s["per_phase"]) == {p for p, v in sums.items() if v}
    for phase, v in s["per_phase"].items():
        assert v["spread_ns"] == 0 and v["spread_share"] == 0
        assert v["min_ns"] == v["max_ns"] == sums[phase] and v["mean_ns"] == sums[phase]
    a, b = s["rank_rows"]
    assert a["phase_ns"] == b["phase_ns"] and a["iterations"] == b["iterations"] == 2
    assert all(it["spread_ns"] == 0 and it["ranks"] == 2 for it in s["per_iteration"])
    assert [r["ranks"] for r in out["traces"]] == [single["ranks"], single["ranks"]]


def test_trimmed_rank_known_differences(runs):
    out = analyze_many([runs], jobs=1, cache=False)
    s = out["summary"]
    assert [r["rank"] for r in s["rank_rows"]] == [0, 1, 2]
    full = _phase_sums(analyze_path(runs / "rank0.sqlite"))
    cut_result = analyze_path(runs / "rank2.sqlite")
    cut = _phase_sums(cut_result)
    assert [it["index"] for it in cut_result["ranks"][0]["iterations"]] == [1]
    for phase, v in s["per_phase"].items():
        lo, hi = sorted((full.get(phase, 0), cut.get(phase, 0)))
        assert (v["min_ns"], v["max_ns"]) == (lo, hi)
        assert v["spread_ns"] == hi - lo
        assert v["mean_ns"] == pytest.approx((2 * full.get(phase, 0) + cut.get(phase, 0)) / 3)
    # iteration 1 is in all three ranks, iteration 2 only in the two full copies
    per_it = {it["index"]: it for it in s["per_iteration"]}
    assert per_it[1]["ranks"] == 3 and per_it[2]["ranks"] == 2 and per_it[2]["spread_ns"] == 0
    assert s["iterations"] == {"min": 1, "max": 2}
    walls = {r["rank"]: r["mean_iteration_ns"] for r in s["rank_rows"]}
    # ranks 0 and 1 are copies: the two longest mean iterations are equal, so no rank is "the
    # slowest" (issue 25: a comparative claim needs a significant lead over the runner-up)
    top, second = sorted(walls.values())[-2:]
    assert top == second == walls[0] == walls[1] > walls[2]
    assert s["slowest_rank"] is None
    # with the copy left out, the full rank's 650.3 ms mean over iterations 626.9 and 673.6 ms
    # (spread 46.6 ms) leads the cut's 626.9 ms by 23.3 ms (3.7 %): under 5 %, still no claim
    two = summarize_ranks([r for r in out["traces"] if not r["trace"].endswith("rank1.sqlite")])
    assert two["slowest_rank"] is None


def test_processes_equal_in_process(runs):
    seq = analyze_many([runs], jobs=1, cache=False)
    par = analyze_many([runs], jobs=2, cache=False)
    assert _strip(par) == _strip(seq)


def _strip(out: dict) -> dict:
    """The phase breakdown and summary (transfer tables may order ties differently run to run)."""
    return {
        "summary": out["summary"],
        "ranks": [[{k: r[k] for k in ("pid", "device", "iterations", "totals")} for r in t["ranks"]] for t in out["traces"]],
    }


def test_missing_ranks_from_names_and_expected(runs):
    (runs / "rank1.sqlite").rename(runs / "rank3.sqlite")
    out = analyze_many([runs], jobs=1, cache=False)
    assert out["summary"]["missing_ranks"] == [1]
    out = analyze_many([runs], jobs=1, cache=False, expected_ranks=6)
    assert out["summary"]["missing_ranks"] == [1, 4, 5]


def test_rank_numbers():
    from pathlib import Path

    assert rank_numbers([Path("a/rank3.sqlite"), Path("node_12.sqlite")]) == [3, 12]
    assert rank_numbers([Path("report_0.sqlite"), Path("report_1.sqlite"), Path("report_7.sqlite")]) == [0, 1, 7]
    assert rank_numbers([Path("ds3.sqlite")]) == [None]
    assert rank_numbers([Path("a.sqlite"), Path("b2.sqlite")]) == [None, None]


def test_expand_inputs(runs):
    assert [p.name for p in expand_inputs([runs])] == ["rank0.sqlite", "rank1.sqlite", "rank2.sqlite"]
    assert [p.name for p in expand_inputs([str(runs / "rank[01].sqlite")])] == ["rank0.sqlite", "rank1.sqlite"]
    # duplicates collapse
    assert len(expand_inputs([runs / "rank0.sqlite", runs / "rank0.sqlite", runs])) == 3
    with pytest.raises(TracekitError, match="rank9.sqlite"):
        expand_inputs([runs / "rank0.sqlite", runs / "rank9.sqlite"])
    with pytest.raises(TracekitError, match="no file matches"):
        expand_inputs([str(runs / "nope*.sqlite")])


def test_cli_many_json(runs, capsys):
    assert main(["analyze", str(runs / "rank0.sqlite"), str(runs / "rank1.sqlite"), "--json", "--jobs", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["traces"]) == 2 and out["summary"]["ranks"] == 2
    assert all(v["spread_ns"] == 0 for v in out["summary"]["per_phase"].values())


def test_cli_directory_table(runs, capsys):
    assert main(["analyze", str(runs), "--jobs", "1", "--ranks", "4"]) == 0
    text = capsys.readouterr().out
    assert "3 ranks in 3 traces" in text and "Across ranks" in text
    assert "missing ranks: 3" in text


def test_cli_one_missing_trace(runs, capsys):
    rc = main(["analyze", str(runs / "rank0.sqlite"), str(runs / "rank7.sqlite")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "rank7.sqlite" in err and "Traceback" not in err


def test_cli_bad_trace_among_several(runs, capsys):
    (runs / "rank1.sqlite").write_bytes(b"not sqlite at all")
    rc = main(["analyze", str(runs), "--jobs", "2"])
    cap = capsys.readouterr()
    # issue 9 (d13): the good ranks are reported, the bad one is listed, exit 2 at the end
    assert rc == 2 and "2 ranks in 2 traces" in cap.out
    lines = cap.err.strip().splitlines()
    assert len(lines) == 2 and "rank1.sqlite" in lines[0] and "1 of 3 traces could not be analyzed" in lines[1]


def test_summarize_empty():
    s = summarize_ranks([], [])
    assert s["ranks"] == 0 and s["slowest_rank"] is None and s["per_phase"] == {}


def test_write_json_roundtrip(tmp_path):
    import io

    value = {"a": [{"x": 1, "y": [1, 2]}, {"x": None}], "b": {"c": "é\"", "d": []}, "e": 1.5, "f": {}}
    buf = io.StringIO()
    write_json(value, buf)
    assert json.loads(buf.getvalue()) == value
