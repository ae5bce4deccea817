"""The what-if benchmark's committed table (benchmarks/whatif/results.md) against its data.

The measured side is recomputed independently: per steady iteration, the ``update`` phase is
the sum of the ``update`` NVTX ranges inside the ``iteration N`` range and the iteration's wall
time is the ``iteration N`` range's duration (plain SQL on the committed cut traces); the
summaries (benchmarks/whatif/summaries.json, from the full traces) must agree with them for
every iteration the cut holds, and results.md's measured columns must be the summaries' means.
"""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
from pathlib import Path

import pytest
from conftest import bench_cut

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "whatif"
SUMMARIES = json.loads((BENCH / "summaries.json").read_text())
RESULTS = (BENCH / "results.md").read_text()
RUNS = sorted(p.name[: -len(".sqlite.xz")] for p in (BENCH / "traces").glob("*.sqlite.xz"))
#: the iterations each cut was trimmed to (README.md): baselines 1-4, every other run 1-1 (a cut
#: also holds the start of the next iteration's range, without its phases)
CUT_LAST = {"z3s_base": 4, "z3s_sg1e8": 4, "z3s_base3": 4, "z2s_base": 4, "so_base": 4, "zf_base": 4,
            "z3l_base": 4, "z3s_base4": 4, "z2s_base3": 4, "so_base2": 4, "zf_base2": 4,
            "z3s_base6": 4, "z3s_sg2e7b": 4, "z3x_base": 4, "z3l_base3": 4,
            "z3s_base8": 4, "z3s_base9": 4, "z3s_base10": 4, "z3l_base5": 4, "z3l_base6": 4, "z2s_base4": 4,
            "z2s_base5": 4, "z3s_base11": 4, "z3s_base12": 4, "z3s_base13": 4, "z3s_base14": 4, "z2s_base6": 4,
            "z2s_base7": 4, "so_base3": 4, "so_base4": 4, "z3s_base15": 4, "z3s_base16": 4, "z3s_base17": 4,
            "z3s_base18": 4, "z3s_base19": 4, "z3s_base20": 4, "z3s_base21": 4, "z3s_base22": 4, "z3s_base23": 4,
            "z3s_base24": 4, "z3s_base25": 4, "z3s_base26": 4, "z3s_base27": 4, "z3s_base28": 4, "z3s_base29": 4,
            "z3l_base7": 4, "z3l_base8": 4, "z3l_base9": 4, "so_base5": 4, "so_base6": 4, "so_base7": 4, "so_base8": 4,
            # the baselines of the reverse repeated pair (z3s_base@sg1e8 x3)
            "z3s_sg1e8_r5": 4, "z3s_sg1e8_r6": 4, "z3s_sg1e8_r7": 4}

#: results.md's heading of the repeated-pairs table
REPEATED = "Repeated pairs (each side recorded 1-4 times in one call, interleaved; means)"


def _p90(v: list[float]) -> float:
    """The 0.9 quantile of ``v``, linear between order statistics (as run.py's ``percentile``)."""
    s = sorted(v)
    k = (len(s) - 1) * 0.9
    return s[int(k)] + (s[min(int(k) + 1, len(s) - 1)] - s[int(k)]) * (k - int(k))


def _table(title: str) -> list[list[str]]:
    """Data rows of the Markdown table under ``## title`` in results.md (cells stripped)."""
    part = RESULTS.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in part.splitlines() if ln.startswith("|")][2:]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def _num(cell: str) -> float:
    return float(re.match(r"[+-]?[\d,]+\.?\d*", cell).group(0).replace(",", ""))


def _each(cell: str) -> list[float]:
    """The per-run values of a repeated-table cell ``"MEAN (A, B, ...)"``."""
    return [_num(x) for x in cell.split("(")[1].rstrip(")").split(", ")]


def _baselines(cell: str) -> list[tuple[str, str]]:
    """``(run, ms)`` of each baseline of a repeated-table baselines cell ``"RUN: MS / BASIS, ..."``."""
    return re.findall(r"(\w+): ([\d,.]+) / [\d,.]+", cell)


def test_every_run_has_a_cut_trace_and_eight_steady_iterations():
    assert set(RUNS) == set(SUMMARIES)
    for run, s in SUMMARIES.items():
        assert len(s["steady"]) >= 8, run
        assert sorted(int(i) for i in s["iterations"]) == s["steady"]
        assert 0 not in s["steady"]


@pytest.mark.parametrize("run", RUNS)
def test_summary_matches_plain_sql_on_the_cut_trace(run, tmp_path):
    db = bench_cut(run, tmp_path)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    its = con.execute("SELECT s.value, e.start, e.end FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                      "WHERE s.value LIKE 'iteration %' AND e.end IS NOT NULL").fetchall()
    upd = con.execute("SELECT e.start, e.end FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                      "WHERE s.value = 'update' AND e.end IS NOT NULL").fetchall()
    con.close()
    summ = {**SUMMARIES[run]["iterations"], **SUMMARIES[run].get("warmup_iterations", {})}
    checked = 0
    for name, a, b in its:
        i = name.split()[1]
        if not 1 <= int(i) <= CUT_LAST.get(run, 1):
            continue
        checked += 1
        u = sum(e - s for s, e in upd if a <= s < b)
        assert summ[i]["phases"]["update"] == u, (run, i)
        # the phase windows tile the process's span: the iteration ends where the next one's first
        # window starts, a little after the NVTX range closes (at most 1.34 % on these runs)
        assert abs(summ[i]["wall_ns"] - (b - a)) <= 0.015 * (b - a), (run, i, summ[i]["wall_ns"], b - a)
        assert summ[i]["wall_ns"] == sum(summ[i]["phases"].values())
    assert checked == CUT_LAST.get(run, 1), run


def test_results_measured_columns_are_the_summaries_means():
    rows = _table("Pairs")
    assert len(rows) >= 10
    for r in rows:
        pair = r[0]
        run = pair.split("@")[0]
        s = SUMMARIES[run]
        walls = [v["wall_ns"] for v in s["iterations"].values()]
        mean_ms = statistics.fmean(walls) / 1e6
        m = re.match(r"([\d,.]+) \(([\d,.]+)-([\d,.]+), (\d+)\)", r[4])
        assert m, r[4]
        assert _num(m.group(1)) == pytest.approx(mean_ms, abs=0.051)
        assert _num(m.group(2)) == pytest.approx(min(walls) / 1e6, abs=0.051)
        assert _num(m.group(3)) == pytest.approx(max(walls) / 1e6, abs=0.051)
        assert int(m.group(4)) == len(walls)
        # error % from the table's own predicted and measured columns
        pred = _num(r[3])
        assert _num(r[5]) == pytest.approx(100 * (pred - _num(m.group(1))) / _num(m.group(1)), abs=0.11)
    phases = {r[0]: r[1:] for r in _table("Per phase (predicted / measured ms per steady iteration)")}
    for pair, cells in phases.items():
        s = SUMMARIES[pair.split("@")[0]]
        for k, phase in enumerate(("forward", "backward", "update", "other")):
            meas = _num(cells[k].split("/")[1].strip())
            want = statistics.fmean(v["phases"][phase] for v in s["iterations"].values()) / 1e6
            assert meas == pytest.approx(want, abs=0.051), (pair, phase)


def test_results_statistics_recomputed_from_the_table():
    rows = [r for r in _table("Pairs") if "(no scenario)" not in r[3]]
    errs = sorted(abs(_num(r[5])) for r in rows)
    p90 = _p90(errs)
    m = re.search(r"modelled pairs: (\d+); median \|error\| ([\d.]+) %, p90 \|error\| ([\d.]+) %", RESULTS)
    assert m
    assert int(m.group(1)) == len(rows)
    assert float(m.group(2)) == pytest.approx(statistics.median(errs), abs=0.051)
    assert float(m.group(3)) == pytest.approx(p90, abs=0.051)


def test_noise_rows_are_the_two_baselines_means():
    for r in _table("Noise floor (same config recorded twice; 'predicted' = the first run)"):
        pair = r[0]
        first = {"z3s_base2": "z3s_base", "z2s_base2": "z2s_base", "z3s_base3": "z3s_base",
                 "z3l_base2": "z3l_base", "z3s_base5": "z3s_base4", "z3s_base4": "z3s_base",
                 "z2s_base3": "z2s_base", "so_base2": "so_base", "zf_base2": "zf_base",
                 "z3s_base7": "z3s_base6", "z3s_base6": "z3s_base", "z3x_base2": "z3x_base",
                 "z3l_base3": "z3l_base", "z3l_base4": "z3l_base3", "z3s_base9": "z3s_base8",
                 "z3l_base6": "z3l_base5", "z2s_base5": "z2s_base4", "z3s_base10": "z3s_base8",
                 "z3s_base12": "z3s_base11", "z2s_base7": "z2s_base6", "so_base4": "so_base3",
                 "z3s_base14": "z3s_base13", "z3s_base16": "z3s_base15", "z3s_base18": "z3s_base17",
                 "z3s_base20": "z3s_base19", "z3s_base22": "z3s_base21", "z3s_base24": "z3s_base23",
                 "z3s_base27": "z3s_base26", "z3s_base29": "z3s_base28", "z3l_base8": "z3l_base7",
                 "so_base6": "so_base5", "so_base8": "so_base7"}[pair]
        a = statistics.fmean(v["wall_ns"] for v in SUMMARIES[first]["iterations"].values()) / 1e6
        b = statistics.fmean(v["wall_ns"] for v in SUMMARIES[pair]["iterations"].values()) / 1e6
        assert _num(r[2]) == pytest.approx(a, abs=0.051)
        assert _num(r[3]) == pytest.approx(b, abs=0.051)


def test_best_change_line_is_the_minimum_of_the_pairs_table():
    """Per baseline with >= 2 modelled changes, the summary's best-change line names the pair of
    lowest predicted and of lowest measured ms in the Pairs table; a baseline's pairs are the
    rows that share its baseline-ms cell."""
    rows = [r for r in _table("Pairs") if "(no scenario)" not in r[3]]
    line = next(x for x in RESULTS.splitlines() if x.startswith("- the best recorded change per baseline"))
    named = dict(re.findall(r"(\w+): predicted (\w+), measured", line))
    meas_named = dict(re.findall(r"(\w+): predicted \w+, measured (\w+)", line))
    assert named, line
    for base, pred in named.items():
        base_ms = next(r[2] for r in rows if r[0] == pred)
        group = [r for r in rows if r[2] == base_ms]
        assert len(group) >= 2
        assert pred == min(group, key=lambda r: _num(r[3]))[0]
        assert meas_named[base] == min(group, key=lambda r: _num(r[4].split(" (")[0]))[0]


def test_between_run_constant_is_the_same_call_noise_pairs_spread():
    """The model's between-run term (whatif.BETWEEN_RUN_REL_SD) recomputed from the summaries of
    its same-call noise pairs: per pair the squared relative difference of the two means less the
    squared standard error of that difference from the runs' own iteration spreads, pooled."""
    import math

    from tracekit.analyze.sections import whatif

    acc = []
    for a, b in whatif.BETWEEN_RUN_PAIRS:
        wa = [v["wall_ns"] for v in SUMMARIES[a]["iterations"].values()]
        wb = [v["wall_ns"] for v in SUMMARIES[b]["iterations"].values()]
        ma, mb = sum(wa) / len(wa), sum(wb) / len(wb)
        va = sum((x - ma) ** 2 for x in wa) / (len(wa) - 1)
        vb = sum((x - mb) ** 2 for x in wb) / (len(wb) - 1)
        acc.append(((mb - ma) / ma) ** 2 - (va / len(wa) + vb / len(wb)) / ma ** 2)
    assert len(acc) >= 4
    assert whatif.BETWEEN_RUN_REL_SD == pytest.approx(math.sqrt(sum(acc) / len(acc)), abs=5e-5)
    # the pairs are results.md's same-call noise rows (the cross-call ones are not in it)
    line = next(x for x in RESULTS.splitlines() if x.startswith("- between-run spread from the same-call"))
    assert sorted(re.findall(r"(\w+)/(\w+)", line)) == sorted(map(tuple, whatif.BETWEEN_RUN_PAIRS))
    m = re.search(r"inside the prediction's interval: (\d+) of (\d+)", RESULTS)
    rows = [r for r in _table("Pairs") if "(no scenario)" not in r[3]]
    assert int(m.group(1)) == sum(1 for r in rows if r[7] == "yes")
    assert int(m.group(2)) == len(rows)
    m = re.search(r"without the between-run term .*?: (\d+) of (\d+)", RESULTS)
    assert int(m.group(1)) == sum(1 for r in rows if r[10] == "yes")
    for r in rows:  # the wider interval holds the narrower one
        lo, hi = (_num(x) for x in r[6].split("-", 1))
        lo2, hi2 = (_num(x) for x in r[9].split("-", 1))
        assert lo <= lo2 and hi2 <= hi, r[0]


def test_repeated_pairs_are_the_means_of_their_runs():
    """Each row of the repeated-pairs table: every run's cell is that run's mean over its steady
    iterations (summaries.json), the measured column their mean, the error % from the row's own
    predicted and measured columns, the predicted column the mean of the per-baseline
    predictions; the summary line's median / p90 / inside are recomputed from the rows."""
    rows = _table(REPEATED)
    assert len(rows) >= 5
    errs, inside = [], 0
    for r in rows:
        bases = _baselines(r[2])
        assert bases, r[2]
        for b, ms in bases:
            want = statistics.fmean(v["wall_ns"] for v in SUMMARIES[b]["iterations"].values()) / 1e6
            assert _num(ms) == pytest.approx(want, abs=0.051), (r[0], b)
        each_pred = _each(r[3])
        assert len(each_pred) == len(bases)
        # each cell and the mean are rounded to 0.1 ms apart: they may differ by 0.05 + 0.05
        assert _num(r[3]) == pytest.approx(statistics.fmean(each_pred), abs=0.1)
        each_meas = _each(r[4])
        assert _num(r[4]) == pytest.approx(statistics.fmean(each_meas), abs=0.1)
        # "z3s_mb2 x2": runs z3s_mb2_rK, K from the recording; "z3s_base@sg1e8 x3": runs z3s_baseK
        name = r[0].split(" ")[0].split("@")[0]
        own = re.compile(re.escape(name) + (r"\d+" if name.endswith("_base") else r"_r\d+"))
        runs = sorted(k for k in SUMMARIES if own.fullmatch(k))
        got = sorted(round(SUMMARIES[k]["iteration_ns"] / 1e6, 1) for k in runs)
        for m in each_meas:  # each measured cell is one of that config's repeated runs
            assert any(abs(m - g) <= 0.051 for g in got), (r[0], m, got)
        meas = _num(r[4])
        assert _num(r[5]) == pytest.approx(100 * (_num(r[3]) - meas) / meas, abs=0.11)
        errs.append(abs(_num(r[5])))
        lo, hi = (_num(x) for x in r[6].split("-", 1))
        assert (r[7] == "yes") == (lo <= meas <= hi)
        inside += r[7] == "yes"
    p90 = _p90(errs)
    m = re.search(r"repeated pairs: (\d+); median \|error\| ([\d.]+) %, p90 \|error\| ([\d.]+) %; measured inside "
                  r"the interval in (\d+) of (\d+)", RESULTS)
    assert m
    assert int(m.group(1)) == len(rows) == int(m.group(5))
    assert float(m.group(2)) == pytest.approx(statistics.median(errs), abs=0.051)
    assert float(m.group(3)) == pytest.approx(p90, abs=0.051)
    assert int(m.group(4)) == inside


def test_best_repeated_change_is_recomputed_from_the_rows():
    """The summary's best repeated change per set of baseline runs: recomputed from the repeated
    table (rows grouped by their baseline runs; lowest predicted and lowest measured ms)."""
    rows = _table(REPEATED)
    groups: dict[str, list] = {}
    for r in rows:
        key = "/".join(b for b, _ in _baselines(r[2]))
        groups.setdefault(key, []).append((r[0], _num(r[3]), _num(r[4])))
    line = next(ln for ln in RESULTS.splitlines() if ln.startswith("- the best repeated change"))
    want = {k: (min(v, key=lambda x: x[1])[0], min(v, key=lambda x: x[2])[0]) for k, v in groups.items() if len(v) >= 2}
    assert len(want) >= 3
    for key, (pred, meas) in want.items():
        assert f"{key}: predicted {pred}, measured {meas} ({'same' if pred == meas else 'different'})" in line


def test_error_by_number_of_changed_runs_is_recomputed_from_the_tables():
    """The summary's |error| by the number of changed runs a measured time is the mean of: the
    modelled single pairs (one run) and each repeated row by the count of its per-run measured
    cells, from the two tables' own error columns."""
    groups: dict[str, list[float]] = {"1": [abs(_num(r[5])) for r in _table("Pairs") if "(no scenario)" not in r[3]]}
    for r in _table(REPEATED):
        n = len(_each(r[4]))
        groups.setdefault("1" if n == 1 else "2" if n == 2 else "3-4", []).append(abs(_num(r[5])))
    line = next(ln for ln in RESULTS.splitlines() if ln.startswith("- |error| by the number of changed runs"))
    got = re.findall(r"(1|2|3-4) runs?: (\d+) pairs, median ([\d.]+) %, p90 ([\d.]+) %, max ([\d.]+) %", line)
    assert sorted(k for k, *_ in got) == sorted(groups) and len(groups) == 3
    for k, n, med, p90, mx in got:
        v = groups[k]
        assert int(n) == len(v)
        assert float(med) == pytest.approx(statistics.median(v), abs=0.051)
        assert float(p90) == pytest.approx(_p90(v), abs=0.051)
        assert float(mx) == pytest.approx(max(v), abs=0.051)


def test_per_change_table_pools_every_recording_of_a_change():
    """The per-change table from the Pairs and the Repeated tables alone: every modelled pair of
    either table is pooled in exactly one change; the pairs of one change are those whose change
    text is the same once the notes on how it was recorded (call, reverse, baseline from) are
    dropped; each pair's weight is 1 / (1 / baseline runs + 1 / changed runs) (one run per side in
    the Pairs table), the change's error the weighted mean of the pairs' errors; the summary's
    median / p90 / max are recomputed from the change rows."""
    rows = {}
    for r in _table("Pairs"):
        if "(no scenario)" not in r[3]:
            rows[r[0]] = (r[1], _num(r[5]), 0.5, 1)
    for r in _table(REPEATED):
        nb, nc = len(_baselines(r[2])), len(_each(r[4]))
        rows[r[0]] = (r[1], _num(r[5]), 1 / (1 / nb + 1 / nc), nc)

    def what(text: str) -> str:
        return re.sub(r" \((call|reverse|baseline from|same global)[^()]*\)", "", text)

    pooled, errs, texts = set(), [], {}
    for key, parts, runs, err in _table("Per change (every recording of a change pooled)"):
        got = re.findall(r"([\w@]+(?: x\d+b?)?) \(([+-][\d.]+), ([\d.]+)\)", parts)
        assert got, parts
        names = [n for n, _, _ in got]
        assert not pooled & set(names), names
        pooled |= set(names)
        for n, e, w in got:
            assert float(e) == rows[n][1], n
            assert float(w) == pytest.approx(rows[n][2], abs=0.006), n
        ws = [rows[n][2] for n in names]
        assert _num(err) == pytest.approx(sum(rows[n][1] * w for n, w in zip(names, ws)) / sum(ws), abs=0.051), key
        assert len({what(rows[n][0]) for n in names}) == 1, names
        texts.setdefault(what(rows[names[0]][0]), []).append(key)
        assert int(runs) == sum(rows[n][3] for n in names), key
        errs.append(abs(_num(err)))
    assert pooled == set(rows)
    assert all(len(v) == 1 for v in texts.values()), texts  # one change, one row
    m = re.search(r"per change, every recording pooled: (\d+) changes; median \|error\| ([\d.]+) %, p90 \|error\| "
                  r"([\d.]+) %, max ([\d.]+) %", RESULTS)
    assert m
    assert int(m.group(1)) == len(errs) >= 15
    assert float(m.group(2)) == pytest.approx(statistics.median(errs), abs=0.051)
    assert float(m.group(3)) == pytest.approx(_p90(errs), abs=0.051)
    assert float(m.group(4)) == pytest.approx(max(errs), abs=0.051)
