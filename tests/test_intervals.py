"""Interval algebra against an integer-grid brute force (hypothesis property tests)."""

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analyze.model import intervals as I

T = 40  # times on the grid 0..T


@st.composite
def ivals(draw, max_n=8):
    n = draw(st.integers(0, max_n))
    s = [draw(st.integers(0, T)) for _ in range(n)]
    e = [draw(st.integers(0, T)) for _ in range(n)]  # may be empty or reversed: ignored
    return np.array(s, dtype=np.int64), np.array(e, dtype=np.int64)


def grid(s, e):
    """Depth of coverage of each unit cell [t, t+1)."""
    d = np.zeros(T + 1, dtype=np.int64)
    for a, b in zip(s, e):
        if b > a:
            d[a:b] += 1
    return d


def cells_to_len(mask) -> int:
    return int(np.sum(mask))


@settings(max_examples=300, deadline=None)
@given(ivals())
def test_union_matches_grid(a):
    s, e = I.union(*a)
    assert np.all(np.diff(s) > 0) and np.all(e > s)
    assert np.all(s[1:] > e[:-1])  # disjoint and not touching
    assert np.array_equal(grid(s, e) > 0, grid(*a) > 0)
    assert I.union_length(*a) == cells_to_len(grid(*a) > 0)


@settings(max_examples=300, deadline=None)
@given(ivals(), ivals())
def test_intersect_and_subtract_match_grid(a, b):
    ga, gb = grid(*a) > 0, grid(*b) > 0
    assert I.intersection_length(a, b) == cells_to_len(ga & gb)
    s, e = I.subtract(a, b)
    assert np.array_equal(grid(s, e) > 0, ga & ~gb)


@settings(max_examples=300, deadline=None)
@given(ivals(10), st.integers(1, 4))
def test_at_least_k_matches_grid(a, k):
    s, e = I.at_least(*a, k)
    assert np.array_equal(grid(s, e) > 0, grid(*a) >= k)
    if s.size:
        assert np.all(s[1:] > e[:-1])  # maximal: runs are merged


@settings(max_examples=200, deadline=None)
@given(ivals(10))
def test_depth_segments_match_grid(a):
    s, e, d = I.depth_segments(*a)
    g = grid(*a)
    for a_, b_, k in zip(s, e, d):
        assert np.all(g[a_:b_] == k)
    if s.size:
        assert np.all(s[1:] == e[:-1])  # contiguous


@settings(max_examples=200, deadline=None)
@given(ivals(), ivals())
def test_covered_length_matches_grid(cover, q):
    gc = grid(*cover) > 0
    qs, qe = q
    got = I.covered_length(*cover, qs, qe)
    want = [cells_to_len(gc[a:b]) if b > a else 0 for a, b in zip(qs, qe)]
    assert list(got) == want


@settings(max_examples=200, deadline=None)
@given(ivals(), st.lists(st.integers(1, 10_000), min_size=8, max_size=8), st.lists(st.integers(-5, T + 5), max_size=10))
def test_spread_cumulative_matches_direct_sum(a, amounts, at):
    s, e = a
    amt = np.array(amounts[: s.size], dtype=np.float64)
    got = I.spread_cumulative(s, e, amt, at)
    for t, g in zip(at, got):
        want = 0.0
        for a_, b_, m in zip(s, e, amt):
            b_ = max(b_, a_ + 1)
            want += m * min(max((t - a_) / (b_ - a_), 0.0), 1.0)
        assert abs(g - want) <= 1e-6 * max(1.0, want)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, T), st.integers(0, T)), max_size=20), st.integers(1, 3))
def test_grouped_union_and_at_least_match_per_group(rows, k):
    f = pl.DataFrame(rows, schema={"g": pl.Int64, "start": pl.Int64, "end": pl.Int64}, orient="row")
    gu = I.grouped_union(f, ["g"])
    ga = I.grouped_at_least(f, ["g"], k)
    gl = I.grouped_union_length(f, ["g"])
    for g in range(3):
        sub = f.filter(pl.col("g") == g)
        s, e = sub["start"].to_numpy(), sub["end"].to_numpy()
        u = gu.filter(pl.col("g") == g)
        assert np.array_equal(grid(u["start"].to_numpy(), u["end"].to_numpy()) > 0, grid(s, e) > 0)
        w = ga.filter(pl.col("g") == g)
        assert np.array_equal(grid(w["start"].to_numpy(), w["end"].to_numpy()) > 0, grid(s, e) >= k)
        length = gl.filter(pl.col("g") == g)["busy_ns"]
        assert (int(length[0]) if length.len() else 0) == cells_to_len(grid(s, e) > 0)


def test_touching_intervals_are_not_concurrent():
    s, e = I.at_least([0, 5], [5, 9], 2)
    assert s.size == 0
    assert I.intersection_length(([0], [5]), ([5], [9])) == 0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, 1, 2]), st.sampled_from([None, "a", "b"]), st.integers(0, T),
                          st.integers(0, T)), max_size=25))
def test_grouped_union_of_two_keys_with_nulls_matches_union_per_group(rows):
    """grouped_union (one sort and a sweep, issue 24) against :func:`union` of each group's own
    rows, found by a plain loop: the same pieces (touching ones merged), null keys a group of
    their own, rows sorted by the keys (nulls first) and start, the keys' types kept."""
    f = pl.DataFrame(rows, schema={"a": pl.Int64, "b": pl.String, "start": pl.Int64, "end": pl.Int64}, orient="row")
    got = I.grouped_union(f, ["a", "b"])
    assert got.schema == pl.Schema({"a": pl.Int64, "b": pl.String, "start": pl.Int64, "end": pl.Int64})
    want = []
    for key in sorted({(a, b) for a, b, s, e in rows if e > s}, key=lambda k: [(v is not None, v) for v in k]):
        s = np.array([r[2] for r in rows if (r[0], r[1]) == key and r[3] > r[2]], dtype=np.int64)
        e = np.array([r[3] for r in rows if (r[0], r[1]) == key and r[3] > r[2]], dtype=np.int64)
        us, ue = I.union(s, e)
        want += [(*key, int(x), int(y)) for x, y in zip(us, ue)]
    assert got.rows() == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 3), st.integers(0, T), st.integers(0, T)), max_size=30), st.booleans(),
       st.sampled_from([0, 2**61]))
def test_grouped_union_lengths_match_grid_per_group(rows, in_start_order, shift):
    """grouped_union_lengths (numpy, one sort and a sweep) against the grid of each group's own
    rows: the groups with a non-empty interval, ascending, each with its covered length; rows in
    start order or not, times near 0 or far from it (the groups share one shifted time axis)."""
    if in_start_order:
        rows = sorted(rows, key=lambda r: r[1])
    g = np.array([r[0] for r in rows], dtype=np.int64)
    s = np.array([r[1] for r in rows], dtype=np.int64) + shift
    e = np.array([r[2] for r in rows], dtype=np.int64) + shift
    got_g, got_len = I.grouped_union_lengths(g, s, e)
    want = {k: cells_to_len(grid([r[1] for r in rows if r[0] == k], [r[2] for r in rows if r[0] == k]) > 0)
            for k in sorted({r[0] for r in rows if r[2] > r[1]})}
    assert got_g.tolist() == list(want) and got_len.tolist() == list(want.values())


def test_grouped_union_lengths_of_many_groups_on_a_long_axis():
    """Groups times the span past 2**62 (the shared axis would overflow): group by group, the
    same lengths as :func:`union_length` of each group."""
    rng = np.random.default_rng(7)
    g = rng.integers(0, 9, 200)
    s = rng.integers(0, 2**60, 200)
    e = s + rng.integers(-5, 2**58, 200)
    s[0], e[0] = 0, 2**61
    got_g, got_len = I.grouped_union_lengths(g, s, e)
    want = {k: I.union_length(s[g == k], e[g == k]) for k in sorted(set(g[e > s].tolist()))}
    assert got_g.tolist() == list(want) and got_len.tolist() == list(want.values())
