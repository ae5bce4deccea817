"""Many traces with a flat client (issue 13, item 6): the workers send back only the per-rank
phase times the table and the summary read; ``--json`` and ``--out`` are written trace by trace
as the parts arrive, the same text and files as when every whole result was held."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from tracekit.analyze import multi
from tracekit.analyze.multi import analyze_many, analyze_one, analyze_part
from tracekit.analyze.trace.cache import format_json
from tracekit.analyze.trim import trim
from tracekit.cli import main
from tracekit.options import Options

#: the keys a compact part may hold, level by level
PART_KEYS = {"trace", "ranks"}
RANK_KEYS = {"pid", "device", "iterations"}
ITER_KEYS = {"index", "complete", "unclosed", "phases"}


@pytest.fixture
def runs(tmp_path, zero3_cut, monkeypatch):
    """rank0, rank1: copies of the fixture; rank3: its first iteration only (rank 2 missing)."""
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "caches"))
    d = tmp_path / "runs"
    d.mkdir()
    shutil.copy(zero3_cut, d / "rank0.sqlite")
    shutil.copy(zero3_cut, d / "rank1.sqlite")
    trim(zero3_cut, d / "rank3.sqlite", "1-1")
    return d


def _phase_sums(result: dict) -> list[dict]:
    """Independent computation, per rank of a whole result: wall time per phase summed over
    the iterations whose phase ranges closed."""
    out = []
    for rank in result["ranks"]:
        sums: dict[str, int] = {}
        for it in rank["iterations"]:
            if it.get("unclosed"):
                continue
            for p in it["phases"]:
                sums[p["phase"]] = sums.get(p["phase"], 0) + p["wall_ns"]
        out.append(sums)
    return out


def _assert_compact(part: dict) -> None:
    assert set(part) == PART_KEYS
    for r in part["ranks"]:
        assert set(r) == RANK_KEYS
        for it in r["iterations"]:
            assert set(it) <= ITER_KEYS and "index" in it
            assert all(set(ph) == {"phase", "wall_ns"} for ph in it["phases"])


def test_worker_part_is_compact_and_small(runs):
    """What a worker sends back for the table: the per-rank phase times only, a small fraction
    of the whole result (pickled, as it travels), with the same numbers."""
    path = runs / "rank0.sqlite"
    opts = Options.of(None, sections=("overlap", "pcie", "timeline"))  # a large result (--all-like)
    whole = analyze_one(path, opts, cache=False)
    part = analyze_part(str(path), opts, False, "compact")
    _assert_compact(part)
    assert part["trace"] == str(path)
    assert len(pickle.dumps(part)) * 20 < len(pickle.dumps(whole))
    # the numbers it carries: each rank's phase sums, as summed here from the whole result
    got = [{p: sum(ph["wall_ns"] for it in r["iterations"] for ph in it["phases"] if ph["phase"] == p)
            for p in {ph["phase"] for it in r["iterations"] for ph in it["phases"]}} for r in part["ranks"]]
    assert got == _phase_sums(whole)
    assert [(r["pid"], r["device"]) for r in part["ranks"]] == [(r["pid"], r["device"]) for r in whole["ranks"]]
    json_part = analyze_part(str(path), opts, False, "json")
    assert set(json_part) == PART_KEYS | {"json"}
    assert json.loads(json_part["json"]) == json.loads(json.dumps(whole))


@pytest.mark.parametrize("jobs", [1, 2])
def test_client_keeps_only_compact_parts(runs, jobs):
    """want="compact": every trace kept is a compact part; the summary's phase times equal the
    sums over each trace's whole result, computed here."""
    out = analyze_many([runs], jobs=jobs, cache=False, want="compact")
    for part in out["traces"]:
        _assert_compact(part)
    names = ["rank0.sqlite", "rank1.sqlite", "rank3.sqlite"]
    assert [Path(t["trace"]).name for t in out["traces"]] == names
    rows = out["summary"]["rank_rows"]
    for row, name in zip(rows, names):
        [sums] = _phase_sums(analyze_one(runs / name, cache=False))
        assert {p: v for p, v in row["phase_ns"].items() if v} == {p: v for p, v in sums.items() if v}
    assert out["summary"]["missing_ranks"] == [2]


def test_each_gets_parts_in_input_order_and_they_are_let_go(runs):
    """want="json": each() sees every trace in input order with its text; the dict returned
    keeps the compact part only."""
    seen = []
    out = analyze_many([runs], jobs=2, cache=False, want="json",
                       each=lambda i, p, part: seen.append((i, p.name, set(part))))
    assert seen == [(i, n, PART_KEYS | {"json"}) for i, n in
                    enumerate(["rank0.sqlite", "rank1.sqlite", "rank3.sqlite"])]
    assert all(set(t) == PART_KEYS for t in out["traces"])


def test_in_order_window():
    """At most `window` traces are submitted and not yet handed on; outcomes come in input order."""
    outstanding, most = [], [0]

    def submit(p):
        outstanding.append(p)
        most[0] = max(most[0], len(outstanding))
        return p * 10

    def fetch(p, handle):
        outstanding.remove(p)
        return handle

    assert list(multi._in_order(list(range(9)), submit, fetch, 3)) == [i * 10 for i in range(9)]
    assert most[0] == 3


def _whole_json(runs: Path, names: list[str]) -> dict:
    """--json of several traces built here from each trace's whole result (single-trace
    analysis), the summary across them and the run joined from each trace's run part (issue
    24): the dict the streamed text must equal."""
    from tracekit.analysis import analyze
    from tracekit.analyze import run_join, run_parts

    opts = Options.of(None, sections=tuple(s for s in multi_sections() if s != "timeline"), cache=False)
    analyses = [analyze(runs / n, opts) for n in names]
    results = [a.to_json() for a in analyses]
    paths = [runs / n for n in names]
    summary = multi.summarize_ranks(results, paths)
    run = run_join.run_json([run_parts.run_part(a) for a in analyses], [str(p) for p in paths],
                            multi.rank_numbers(paths), summary["note"], summary["run_groups"])
    return {"traces": results, "failed": [], "summary": summary, "run": run}


def multi_sections():
    from tracekit.analyze.sections import SECTIONS

    return SECTIONS


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_cli_json_streamed_is_the_whole_text(runs, capsys, jobs):
    """`--json` written trace by trace is byte for byte the layout of the whole dict."""
    assert main(["analyze", str(runs), "--json", "--jobs", jobs, "--no-cache"]) == 0
    text = capsys.readouterr().out
    whole = _whole_json(runs, ["rank0.sqlite", "rank1.sqlite", "rank3.sqlite"])
    assert json.loads(text) == json.loads(json.dumps(whole))
    assert text == format_json(whole)
    s = json.loads(text)["summary"]
    assert s["missing_ranks"] == [2] and s["traces"] == 3


def test_cli_json_with_a_bad_trace(runs, capsys):
    """A trace that fails is listed in "failed" at the end of the streamed text, one line on stderr."""
    (runs / "rank1.sqlite").write_bytes(b"not sqlite at all")
    rc = main(["analyze", str(runs), "--json", "--jobs", "2", "--no-cache"])
    cap = capsys.readouterr()
    assert rc == 2
    out = json.loads(cap.out)
    assert [Path(t["trace"]).name for t in out["traces"]] == ["rank0.sqlite", "rank3.sqlite"]
    assert [Path(f["trace"]).name for f in out["failed"]] == ["rank1.sqlite"]
    assert cap.out == format_json(out)
    assert "1 of 3 traces could not be analyzed" in cap.err.strip().splitlines()[-1]


def test_cli_json_no_good_trace(tmp_path, capsys):
    """No trace analyzed: the text is the whole dict's, with an empty "traces" list."""
    for i in (0, 1):
        (tmp_path / f"rank{i}.sqlite").write_bytes(b"junk")
    rc = main(["analyze", str(tmp_path), "--json", "--jobs", "1", "--no-cache"])
    cap = capsys.readouterr()
    assert rc == 2
    out = json.loads(cap.out)
    assert out["traces"] == [] and len(out["failed"]) == 2 and cap.out == format_json(out)


def test_cli_out_written_per_trace(runs, tmp_path, capsys):
    """--out of several traces: each trace's files equal those of --out on that trace alone."""
    dest = tmp_path / "many"
    assert main(["analyze", str(runs), "--out", str(dest), "--jobs", "2", "--no-cache"]) == 0
    for name in ("rank0", "rank1", "rank3"):
        alone = tmp_path / f"alone-{name}"
        assert main(["analyze", str(runs / f"{name}.sqlite"), "--out", str(alone), "--no-cache"]) == 0
        files = sorted(p.name for p in alone.iterdir())
        assert files and sorted(p.name for p in (dest / name).iterdir()) == files
        for f in files:
            assert (dest / name / f).read_bytes() == (alone / f).read_bytes(), (name, f)
    err = capsys.readouterr().err
    assert err.count(f"files to {dest / 'rank0'}") == 1


def test_cli_table_client_sees_compact(runs, capsys, monkeypatch):
    """The table and csv outputs ask the workers for compact parts only."""
    wants = []
    real = multi.analyze_many

    def spy(*a, **kw):
        out = real(*a, **kw)
        wants.append(kw.get("want"))
        assert all(set(t) == PART_KEYS for t in out["traces"])
        return out

    monkeypatch.setattr(multi, "analyze_many", spy)
    assert main(["analyze", str(runs), "--jobs", "1", "--no-cache"]) == 0
    assert main(["analyze", str(runs), "--jobs", "1", "--no-cache", "--format", "csv"]) == 0
    assert main(["analyze", str(runs), "--jobs", "1", "--no-cache", "--json"]) == 0
    assert wants == ["compact", "compact", "json"]
    capsys.readouterr()


# ---------------------------------------------------------------------- Dask
def test_dask_parts_compact_and_json_equal(runs, capsys):
    """On a LocalCluster: the client gathers compact parts (want="compact") named as the client
    spells the paths, and --json streamed from Dask is the text of --jobs 1."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=":0") as c:
        parts = list(multi._iter_dask(c.scheduler_address, sorted(runs.glob("*.sqlite")), Options.of(None),
                                      False, "compact"))
        assert main(["analyze", str(runs), "--json", "--dask", c.scheduler_address, "--no-cache"]) == 0
        remote = capsys.readouterr().out
    for p, part in zip(sorted(runs.glob("*.sqlite")), parts):
        _assert_compact(part)
        assert part["trace"] == str(p)
        assert [s for s in _phase_sums(analyze_one(p, cache=False))] == [
            {ph: v for ph, v in d.items()} for d in _phase_sums(part)]
    assert main(["analyze", str(runs), "--json", "--jobs", "1", "--no-cache"]) == 0
    assert remote == capsys.readouterr().out


def test_each_raising_stops_the_run(runs):
    """An error in each() (a full disk under --out, a closed stdout) ends the run with that
    error; the worker processes are shut down, nothing hangs."""
    def boom(i, p, part):
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        analyze_many([runs], jobs=2, cache=False, want="json", each=boom)
