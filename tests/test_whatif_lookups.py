"""``whatif_pieces._near``, ``_busy_in``; ``whatif._pinned_lookup``, ``_pin_sums``: against brute force."""

import numpy as np
import polars as pl

from tracekit.analyze.model.intervals import union
from tracekit.analyze.sections.whatif_pieces import _busy_in, _near


def _covered(s, e, qs, qe):
    """Per query, the ns of [qs, qe) inside some [s, e): one nanosecond at a time."""
    out = []
    for a, b in zip(qs, qe):
        out.append(sum(1 for t in range(a, b) if any(x <= t < y for x, y in zip(s, e))))
    return out


def test_near_marks_exactly_the_pieces_that_meet_a_query():
    rng = np.random.default_rng(7)
    for _ in range(200):
        cs, ce = union(*(lambda s: (s, s + rng.integers(1, 6, s.size)))(rng.integers(0, 60, rng.integers(0, 12))))
        qs = rng.integers(0, 60, rng.integers(0, 6))
        qe = qs + rng.integers(0, 8, qs.size)
        want = [any(c < b and a < d for a, b in zip(qs, qe)) for c, d in zip(cs, ce)]
        assert _near(cs, ce, qs, qe).tolist() == want


def test_busy_in_covers_the_windows_like_every_op():
    rng = np.random.default_rng(11)
    for _ in range(100):
        n = int(rng.integers(1, 15))
        start = rng.integers(0, 80, n)
        ops = pl.DataFrame({"kind": rng.choice(["kernel", "memcpy", "memset"], n).tolist(),
                            "start": start, "end": start + rng.integers(0, 9, n)})
        k = ops.filter(pl.col("kind") == "kernel")
        ks, ke = union(k["start"].to_numpy(), k["end"].to_numpy())
        ws = np.sort(rng.choice(np.arange(0, 90, 10), int(rng.integers(1, 4)), replace=False))
        we = ws + rng.integers(1, 10, ws.size)
        bs, be = _busy_in(ops, ks, ke, ws, we)
        # inside the windows: the ns some op covers, whatever its kind
        qs, qe = [a + i for a, b in zip(ws, we) for i in range(b - a)], [a + i + 1 for a, b in zip(ws, we)
                                                                      for i in range(b - a)]
        assert _covered(bs, be, qs, qe) == _covered(ops["start"].to_list(), ops["end"].to_list(), qs, qe)


def test_pinned_lookup_answers_as_pinned_bandwidth():
    from tracekit.analyze.sections.whatif import _pinned_lookup, pinned_bandwidth

    bw = pl.DataFrame({"direction": ["H2D", "H2D", "D2H", "H2D"],
                       "host_kind": ["pinned", "pinned", "pinned", "pageable"],
                       "bucket": [12, 22, 25, 22], "bytes": [4096 * 3, 5 << 22, 3 << 25, 1 << 22],
                       "gbps": [0.5, 20.0, 25.0, 8.0]})
    pieces = {"bandwidth": bw}
    look = _pinned_lookup(pieces)
    rng = np.random.default_rng(3)
    sizes = [0, 1, 2, 4095, 4096, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 1 << 26, 2.5e6, 1048575.5]
    sizes += rng.integers(0, 1 << 28, 200).tolist()
    for d in ("H2D", "D2H"):
        for nb in sizes * 2:  # (the second pass: answered from the memo)
            assert look(d, nb) == pinned_bandwidth(pieces, d, nb)


def test_pin_sums_group_the_per_copy_savings_in_order():
    from tracekit.analyze.sections.whatif import _pin_sums, pinned_bandwidth

    rng = np.random.default_rng(5)
    n = 300
    bw = pl.DataFrame({"direction": ["H2D", "D2H"], "host_kind": ["pinned", "pinned"], "bucket": [20, 22],
                       "bytes": [3 << 20, 5 << 22], "gbps": [21.5, 23.25]})
    dur = rng.integers(0, 5000, n).astype(float)
    copies = pl.DataFrame({
        "host_kind": rng.choice(["pageable", "pinned"], n).tolist(),
        "direction": rng.choice(["H2D", "D2H"], n).tolist(),
        "bytes": rng.integers(0, 1 << 24, n), "duration_ns": dur, "exposed_ns": dur * rng.random(n),
        "host_ns": [None if x < 0.2 else float(x * 9000) for x in rng.random(n)],
        "iteration": rng.integers(0, 4, n), "phase": rng.choice(["forward", "backward", "update"], n).tolist()})
    pieces = {"bandwidth": bw, "iterations": [0, 1, 2, 3]}
    for by in ("iteration", "phase"):
        want: dict = {}
        for r in copies.iter_rows(named=True):  # the rule of _pin_saving, copy by copy, in order
            if r["host_kind"] != "pageable":
                continue
            g = pinned_bandwidth(pieces, r["direction"], r["bytes"])[0]
            v = 0.0 if r["duration_ns"] <= 0 else max(
                max(r["host_ns"] or 0.0, r["exposed_ns"]) - r["bytes"] / g * (r["exposed_ns"] / r["duration_ns"]), 0.0)
            want[r[by]] = want.get(r[by], 0.0) + v
        assert _pin_sums(pieces, copies, by) == want
