"""The union lengths of the phase breakdown (:func:`tracekit.analyze.sections.breakdown._union_lengths`,
one aggregation per group) against a brute-force count of covered nanoseconds."""

from __future__ import annotations

import random

import polars as pl

from tracekit.analyze.sections import breakdown


def _brute(rows, by_count: int) -> dict:
    """{group key: number of integer ns t with some interval of the group covering [t, t+1)}."""
    cover: dict = {}
    for r in rows:
        key, s, e = r[:by_count], r[by_count], r[by_count + 1]
        cover.setdefault(key, set()).update(range(s, e))
    return {k: len(v) for k, v in cover.items() if v}


def _lengths(rows, by: list[str]) -> dict:
    f = pl.DataFrame(rows, schema={**{b: pl.Int64 for b in by}, "start": pl.Int64, "end": pl.Int64}, orient="row")
    out = breakdown._union_lengths(f.lazy(), by).collect()
    assert out.schema["busy_ns"] == pl.Int64
    return {tuple(r[:-1]): r[-1] for r in out.select(*by, "busy_ns").iter_rows()}


def test_hand_made_union():
    """Overlap, containment, touching intervals, an empty and a reversed one, equal starts, a
    null key of its own."""
    rows = [
        (1, 0, 10), (1, 5, 12), (1, 12, 15),  # overlap, then touching: one piece [0, 15) = 15
        (1, 20, 30), (1, 22, 25),             # containment: 10
        (1, 40, 40), (1, 50, 45),             # empty and reversed: nothing
        (2, 7, 9), (2, 7, 20), (2, 7, 8),     # equal starts: [7, 20) = 13
        (None, 3, 4), (None, 100, 103),       # null key: its own group, 1 + 3
    ]
    assert _lengths(rows, ["g"]) == {(1,): 25, (2,): 13, (None,): 4}
    assert _lengths(rows, ["g"]) == _brute(rows, 1)


def test_random_unions_match_brute_force():
    rng = random.Random(13)
    for trial in range(40):
        rows = []
        for _ in range(rng.randint(1, 60)):
            s = rng.randint(0, 200)
            rows.append((rng.randint(0, 3), rng.choice([None, 0, 1]), s, s + rng.randint(-5, 40)))
        assert _lengths(rows, ["a", "b"]) == _brute(rows, 2), trial


def test_empty_input_after_a_filter():
    """No interval left once the frame is filtered (a trace without backward copies): no
    group, typed columns (polars would type a gather of the empty groups as null)."""
    f = pl.DataFrame({"g": [1, 2], "phase": ["forward", "update"], "x": [None, None], "start": [0, 5], "end": [3, 9]})
    out = breakdown._union_lengths(f.lazy().filter(pl.col("phase") == "backward"), ["g"]).collect()
    assert out.height == 0 and out.schema == pl.Schema({"g": pl.Int64, "busy_ns": pl.Int64})


def test_phase_table_and_totals_busy_times_match_a_loop_over_ops():
    """Busy times of the phase table (one row per window, ``other`` merged per iteration) and of
    the whole-trace totals against a plain loop: per row, the union length of the ops of its
    windows (by the model's attribution: window id and device) of each busy category. Issue 13:
    a row of one window keeps that window's own unions, rows of several are computed again."""
    from collections import defaultdict

    from conftest import FIXTURES
    from conftest import union_length_loop as loop_union

    from tracekit.analyze.model import phases
    from tracekit.analyze.sections import breakdown
    from tracekit.analyze.trace.export import Export

    with Export.open(FIXTURES / "zero3_offload_gas2_cut.sqlite") as e:
        m = phases.build(e)
    ops = m.ops.filter(pl.col("window_id").is_not_null() & pl.col("device").is_not_null()).to_dicts()
    comm = "comm" in m.ops.columns

    def category(o):
        if o["kind"] == "kernel":
            return "comm_busy_ns" if comm and o.get("comm") else "kernel_busy_ns"
        if o["kind"] == "memcpy" and o["direction"] in ("H2D", "D2H"):
            return f"{o['direction'].lower()}_busy_ns"
        return None

    by_window = defaultdict(list)  # (window_id, device) -> ops
    for o in ops:
        by_window[(o["window_id"], o["device"])].append(o)
    win = m.windows.to_dicts()
    for frame, keys in ((breakdown.phase_table(m), breakdown.KEYS), (breakdown.totals(m), ["global_pid", "device", "phase"])):
        sizes = set()
        for r in frame.iter_rows(named=True):
            ws = [w for w in win if all(w[k] == r[k] for k in keys if k != "device")]
            sizes.add(len(ws))
            mine = [o for w in ws for o in by_window[(w["window_id"], r["device"])]]
            for cat in ("kernel_busy_ns", "comm_busy_ns", "h2d_busy_ns", "d2h_busy_ns"):
                want = loop_union([(o["start"], o["end"]) for o in mine if category(o) == cat])
                assert r[cat] == want, (keys, r["phase"], r.get("iteration"), cat)
        assert max(sizes) > 1 and (1 in sizes or keys != breakdown.KEYS)  # the table: rows of one window and of several
