"""Interval algebra on half-open [start, end) intervals, vectorized with numpy.

Definitions used across tracekit (from the transfer-analysis issue):

- *busy time* of a set of GPU operations: the length of the union of their intervals;
- *overlap* of two sets: the length of the intersection of their unions.

All functions take integer nanosecond arrays and never loop in Python over intervals:
union is a sort plus a running maximum; intersections are merges of sorted disjoint lists.
Empty intervals (end <= start) are ignored.
"""

from __future__ import annotations

import numpy as np


def _as_arrays(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(starts, dtype=np.int64).ravel()
    e = np.asarray(ends, dtype=np.int64).ravel()
    if s.shape != e.shape:
        raise ValueError("starts and ends must have the same length")
    keep = e > s
    if keep.all():  # (no empty interval: no copy)
        return s, e
    return s[keep], e[keep]


def union(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into their sorted, disjoint union.

    Returns ``(starts, ends)`` int64 arrays of the union's maximal intervals, sorted by start.
    Touching intervals ([0,5) and [5,9)) merge into one.
    """
    s, e = _as_arrays(starts, ends)
    if s.size == 0:
        return s.copy(), e.copy()
    if not (s[1:] >= s[:-1]).all():  # (already in start order, as kernels mostly are: no sort, no copy)
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # a new merged interval starts where the start is past every earlier end
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.greater(s[1:], run_end[:-1], out=new[1:])
    if new.all():  # disjoint already: every interval is a piece, and its end the running maximum
        return np.array(s, dtype=np.int64, copy=True), run_end
    idx = np.flatnonzero(new)
    out_s = s[idx]
    idx[:-1] = idx[1:] - 1  # the last interval of each piece
    idx[-1] = s.size - 1
    out_e = run_end[idx]
    return out_s, out_e


def union_length(starts, ends) -> int:
    """Length in ns of the union of the intervals (the *busy time*)."""
    s, e = union(starts, ends)
    return int((e - s).sum())


def intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]):
    """Intersection of two interval sets, each given as ``(starts, ends)``.

    The inputs need not be disjoint; they are unioned first. Returns the sorted disjoint
    ``(starts, ends)`` of the points that lie in both unions.
    """
    a_s, a_e = union(*a)
    b_s, b_e = union(*b)
    if a_s.size == 0 or b_s.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    # inside both <=> running sum == 2
    return _sweep(a_s, a_e, b_s, b_e, b_weight=1, target=2)


def _sweep(a_s, a_e, b_s, b_e, b_weight: int, target: int):
    """Points where the running sum of +1/-1 at a's starts/ends and +b_weight/-b_weight at
    b's starts/ends equals ``target``, as sorted disjoint ``(starts, ends)``. At equal times
    the smaller step comes first, so touching intervals neither intersect nor leave slivers."""
    pts = np.concatenate([a_s, a_e, b_s, b_e])
    delta = np.concatenate(
        [np.ones(a_s.size), -np.ones(a_e.size), b_weight * np.ones(b_s.size), -b_weight * np.ones(b_e.size)]
    ).astype(np.int64)
    order = np.lexsort((delta, pts))
    pts, delta = pts[order], delta[order]
    depth = np.cumsum(delta)
    inside = depth[:-1] == target
    s = pts[:-1][inside]
    e = pts[1:][inside]
    keep = e > s
    return union(s[keep], e[keep])


def intersection_length(a, b) -> int:
    """Length in ns of ``union(a) n union(b)``; ``a`` and ``b`` are ``(starts, ends)`` pairs."""
    s, e = intersect(a, b)
    return int((e - s).sum())


def busy_in_windows(op_starts, op_ends, win_starts, win_ends) -> np.ndarray:
    """For each window [win_start, win_end), the length of ``union(ops)`` inside it.

    Windows must be disjoint. Vectorized: the union's cumulative length is evaluated at the
    window edges by binary search. Returns an int64 array aligned with the windows.
    """
    u_s, u_e = _as_arrays(op_starts, op_ends)
    if u_s.size and not (u_s.size == 1 or (u_s[1:] > u_e[:-1]).all()):  # (a union already, as the kept
        u_s, u_e = union(u_s, u_e)                                        # kernel unions are: no copy)
    ws = np.asarray(win_starts, dtype=np.int64)
    we = np.asarray(win_ends, dtype=np.int64)
    if u_s.size == 0:
        return np.zeros(ws.size, dtype=np.int64)
    cum = np.empty(u_s.size + 1, dtype=np.int64)
    cum[0] = 0
    np.cumsum(u_e - u_s, out=cum[1:])

    def covered_before(t: np.ndarray) -> np.ndarray:
        # union length in (-inf, t)
        i = np.searchsorted(u_s, t, side="right")  # intervals starting at or before t
        full = cum[np.maximum(i - 1, 0)]
        last_s = u_s[np.maximum(i - 1, 0)]
        last_e = u_e[np.maximum(i - 1, 0)]
        part = np.clip(np.minimum(t, last_e) - last_s, 0, None)
        return np.where(i > 0, full + part, 0)

    return (covered_before(we) - covered_before(ws)).astype(np.int64)


def grouped_union_length(frame, by: list[str], start: str = "start", end: str = "end"):
    """Union length per group of a polars frame of intervals.

    Returns a polars frame with the ``by`` columns and ``busy_ns`` (Int64): the length of the
    union of the [start, end) intervals in each group. One aggregation per group: in start
    order, the running maximum of the ends; a merged interval opens where a start is past it.
    """
    import polars as pl

    if frame.height == 0:
        return frame.select(by).head(0).with_columns(busy_ns=pl.lit(0, pl.Int64))
    f = frame.lazy().select([*by, start, end]).filter(pl.col(end) > pl.col(start))
    # one aggregation per group (the pieces of grouped_union, summed)
    st = pl.col(start).sort()
    run_end = pl.col(end).sort_by(start).cum_max()
    first = (st > run_end.shift(1)).fill_null(True)
    last = first.shift(-1).fill_null(True)
    return f.group_by(by).agg(busy_ns=(run_end.filter(last) - st.filter(first)).sum().cast(pl.Int64)).collect()


def grouped_union_lengths(codes, starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Union length per group of intervals given as numpy arrays: ``codes`` (integer group of
    each interval), ``starts``, ``ends`` (ns). Returns ``(groups, lengths)``: the distinct codes
    that have a non-empty interval, ascending, and the length in ns of the union of each one's
    [start, end) intervals (int64; touching intervals merge, empty ones are ignored).

    One sort by group and start (none but a stable one by group when the starts are already in
    order), then a sweep: the running maximum of the ends restarts at each group (the groups
    are laid end to end on one time axis, so one ``maximum.accumulate`` serves them all), a
    piece opens where a group opens or a start is past the running end before it. About 50
    bytes a row of transient memory, where a polars aggregation of the same took ~120."""
    c = np.asarray(codes, dtype=np.int64).ravel()
    s = np.asarray(starts, dtype=np.int64).ravel()
    e = np.asarray(ends, dtype=np.int64).ravel()
    keep = e > s
    if not keep.all():
        c, s, e = c[keep], s[keep], e[keep]
    del keep
    if c.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    if not (c[1:] >= c[:-1]).all():
        order = np.argsort(c, kind="stable") if (s[1:] >= s[:-1]).all() else np.lexsort((s, c))
        c, s, e = c[order], s[order], e[order]
        del order
    elif not (s[1:] >= s[:-1]).all():
        order = np.lexsort((s, c))
        c, s, e = c[order], s[order], e[order]
        del order
    n = c.size
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(c[1:], c[:-1], out=first[1:])
    gi = np.cumsum(first)  # 1-based group index of each row
    lo, span = int(s.min()), int(e.max()) - int(s.min()) + 1
    if int(gi[-1]) * span < 2**62:
        off = gi * span
        run = e - lo
        run += off
        np.maximum.accumulate(run, out=run)
        run -= off
        run += lo
        del off
    else:  # (too many groups for one axis: group by group)
        run = np.empty(n, dtype=np.int64)
        bounds = np.append(np.flatnonzero(first), n)
        for a, b in zip(bounds[:-1], bounds[1:]):
            np.maximum.accumulate(e[a:b], out=run[a:b])
    del gi
    new = first.copy()
    new[1:] |= s[1:] > run[:-1]
    last = np.empty(n, dtype=bool)
    last[:-1] = new[1:]
    last[-1] = True
    lengths = run[last] - s[new]  # one per piece, in order
    pfirst = first[new]  # the pieces that open a group
    return c[first], np.add.reduceat(lengths, np.flatnonzero(pfirst))


# ---------------------------------------------------------------------- sweeps (transfer analyses)

_EMPTY = np.empty(0, dtype=np.int64)


def subtract(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]):
    """``union(a) - union(b)`` as sorted disjoint ``(starts, ends)``.

    Used for *exposed* copy time: copy time during which no kernel runs.
    """
    a_s, a_e = union(*a)
    b_s, b_e = union(*b)
    if a_s.size == 0 or b_s.size == 0:
        return a_s, a_e
    # a counts +1, b counts -2: inside a and not b <=> running sum == 1
    return _sweep(a_s, a_e, b_s, b_e, b_weight=-2, target=1)


def depth_segments(starts, ends) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Piecewise-constant *in-flight count* of a set of intervals.

    Returns ``(seg_starts, seg_ends, depth)``: consecutive non-empty segments between
    boundary points, each with the number of intervals covering it (segments of depth 0
    between intervals included). At equal times ends are processed before starts, so
    touching intervals ([0,5) and [5,9)) are never counted as concurrent.
    """
    s, e = _as_arrays(starts, ends)
    if s.size == 0:
        return _EMPTY, _EMPTY, _EMPTY
    pts = np.concatenate([s, e])
    delta = np.concatenate([np.ones(s.size, np.int64), -np.ones(e.size, np.int64)])
    order = np.lexsort((delta, pts))
    pts, delta = pts[order], delta[order]
    depth = np.cumsum(delta)
    seg_s, seg_e, d = pts[:-1], pts[1:], depth[:-1]
    keep = seg_e > seg_s
    return seg_s[keep], seg_e[keep], d[keep]


def at_least(starts, ends, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Maximal intervals where ``k`` or more of the intervals are in flight at once.

    ``at_least(s, e, 1)`` is ``union(s, e)``; ``k=2`` gives the *contention windows* of one copy
    direction. Returns sorted disjoint ``(starts, ends)``.
    """
    seg_s, seg_e, d = depth_segments(starts, ends)
    keep = d >= k
    return union(seg_s[keep], seg_e[keep])


def covered_length(cover_starts, cover_ends, starts, ends) -> np.ndarray:
    """For each interval [starts[i], ends[i]), the length of it covered by ``union(cover)``.

    The query intervals may overlap each other. O((n + m) log n) by cumulative coverage at
    the query edges (see :func:`busy_in_windows`). Returns int64 aligned with ``starts``.
    """
    s = np.asarray(starts, dtype=np.int64).ravel()
    e = np.asarray(ends, dtype=np.int64).ravel()
    if s.size == 0:
        return _EMPTY.copy()
    return np.maximum(busy_in_windows(cover_starts, cover_ends, s, np.maximum(e, s)), 0)


def spread_cumulative(starts, ends, amounts, at) -> np.ndarray:
    """Amount delivered before each time in ``at``, each interval's amount spread evenly.

    Interval i delivers ``amounts[i]`` at the constant rate ``amounts[i] / (ends[i] -
    starts[i])`` over [starts[i], ends[i]) (an empty interval is treated as 1 ns long). The
    total is the piecewise-linear ``A(t) = sum_i amounts[i] * clip((t - s_i) / (e_i - s_i), 0, 1)``,
    evaluated by a sweep over the sorted rate changes and a binary search per query:
    ``A(t1) - A(t0)`` is what was delivered in [t0, t1). Used for bytes per bin and bytes per
    contention window (amounts = bytes) and for in-flight copy time (amounts = durations).
    Returns float64 aligned with ``at``.
    """
    return SpreadCumulative(starts, ends, amounts)(at)


class SpreadCumulative:
    """:func:`spread_cumulative` of fixed intervals, prepared once (the sweep) and evaluated at
    any times (a binary search per query), for callers that query the same intervals often."""

    def __init__(self, starts, ends, amounts) -> None:
        s = np.asarray(starts, dtype=np.int64).ravel()
        e = np.asarray(ends, dtype=np.int64).ravel()
        a = np.asarray(amounts, dtype=np.float64).ravel()
        self.empty = s.size == 0
        if self.empty:
            return
        e = np.maximum(e, s + 1)
        rate = a / (e - s)
        pts = np.concatenate([s, e])
        dr = np.concatenate([rate, -rate])
        dn = np.concatenate([np.ones(s.size, np.int64), -np.ones(e.size, np.int64)])
        order = np.argsort(pts, kind="stable")
        pts, dr, dn = pts[order], dr[order], dn[order]
        r_after = np.cumsum(dr)  # rate on [pts[j], pts[j+1])
        r_after[np.cumsum(dn) == 0] = 0.0  # no interval open: drop float residue of the sum
        self.area = np.concatenate([[0.0], np.cumsum(r_after[:-1] * np.diff(pts).astype(np.float64))])
        self.pts, self.r_after = pts, r_after

    def __call__(self, at) -> np.ndarray:
        t = np.asarray(at, dtype=np.int64).ravel()
        if self.empty:
            return np.zeros(t.size)
        j = np.searchsorted(self.pts, t, side="right") - 1
        jj = np.maximum(j, 0)
        out = self.area[jj] + self.r_after[jj] * (t - self.pts[jj]).astype(np.float64)
        return np.where(j >= 0, out, 0.0)


def _grouped_pieces(f, by: list[str], start: str = "start", end: str = "end"):
    """The merged pieces of the intervals of each group of ``by`` (a non-empty list) of the lazy
    frame ``f``, as a lazy frame: the ``by`` columns, ``start`` and ``end`` (touching intervals
    merge, empty ones count as intervals: filter them first), sorted by group and start; null
    keys form their own group.

    One sort of the rows by group and start, then a sweep over all of them: a group opens where
    a key differs from the row before (nulls equal), a piece where the group opens or the start
    is past the running maximum of the group's ends. Per-group aggregations (a sort and a running
    maximum in each group's list) cost about 1 KB a row of transient memory in polars 2.1 when
    the groups are small (89 MiB for the 80k copy intervals of the overlap section on a 10 GB
    trace), this sweep a few columns: 17 MiB, 4x faster (issue 24)."""
    import polars as pl

    g, r, new = "__pieces_group", "__pieces_run_end", "__pieces_new"
    f = f.select([*by, start, end]).sort([*by, start])
    opens = pl.any_horizontal([pl.col(b).ne_missing(pl.col(b).shift(1)) for b in by]).fill_null(True)
    f = f.with_columns(opens.alias(new)).with_columns(pl.col(new).cum_sum().alias(g))
    f = f.with_columns(pl.col(end).cum_max().over(g).alias(r))
    f = f.with_columns((pl.col(new) | (pl.col(start) > pl.col(r).shift(1)).fill_null(True)).alias(new))
    last = pl.col(new).shift(-1).fill_null(True)
    return f.select(*[pl.col(b).filter(pl.col(new)) for b in by], pl.col(start).filter(pl.col(new)).alias("start"),
                    pl.col(r).filter(last).alias("end"))


def grouped_union(frame, by: list[str], start: str = "start", end: str = "end"):
    """Union of the [start, end) intervals of each group of a polars frame.

    Returns a frame with the ``by`` columns and ``start``, ``end`` (Int64) of the maximal
    merged intervals of each group (touching intervals merge), sorted by group and start.
    Null keys form their own group.
    """
    import polars as pl

    f = frame.select([*by, start, end]).filter(pl.col(end) > pl.col(start))
    if f.height == 0:
        return f.rename({start: "start", end: "end"}) if start != "start" or end != "end" else f
    f = f.lazy()  # the rest as one query
    if by:
        return _grouped_pieces(f, by, start, end).collect()
    else:
        f = f.sort(start)
        f = f.with_columns(run_end=pl.col(end).cum_max())
        f = f.with_columns(new=(pl.col(start) > pl.col("run_end").shift(1)).fill_null(True))
        f = f.with_columns(piece=pl.col("new").cast(pl.Int64).cum_sum())
    pieces = f.group_by([*by, "piece"]).agg(start=pl.col(start).min(), end=pl.col("run_end").max())
    return pieces.sort([*by, "start"]).select([*by, "start", "end"]).collect()


def grouped_at_least(frame, by: list[str], k: int, start: str = "start", end: str = "end"):
    """Per group, the maximal intervals where ``k`` or more of its intervals are in flight.

    ``frame`` holds intervals with the ``by`` columns; returns ``by`` + ``start``, ``end``
    (sorted disjoint per group). A sweep: +1 at starts, -1 at ends (ends first at equal
    times), cumulative sum per group, runs of depth >= k merged. Intersection of two unions
    per group is ``grouped_at_least`` of their concatenated pieces with ``k=2``.
    """
    import polars as pl

    f = frame.select([*by, start, end]).filter(pl.col(end) > pl.col(start))
    ev = pl.concat(
        [
            f.select(*by, t=pl.col(start), d=pl.lit(1, pl.Int64)),
            f.select(*by, t=pl.col(end), d=pl.lit(-1, pl.Int64)),
        ]
    ).sort([*by, "t", "d"])
    if by:
        ev = ev.with_columns(depth=pl.col("d").cum_sum().over(by), t_next=pl.col("t").shift(-1).over(by))
    else:
        ev = ev.with_columns(depth=pl.col("d").cum_sum(), t_next=pl.col("t").shift(-1))
    seg = ev.filter((pl.col("depth") >= k) & (pl.col("t_next") > pl.col("t")))
    seg = seg.select(*by, start="t", end="t_next")
    return grouped_union(seg, by)
