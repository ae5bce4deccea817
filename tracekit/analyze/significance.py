"""The one rule for a comparative claim ("slower copies", "the slowest rank", "B got slower"):
tracekit says that one side differs from the other only when the difference is real
(issue 25; docs/transfers.md, "When tracekit says one side differs").

:func:`differs` compares a value ``a`` with a reference ``b`` (the other ranks' mean, copies
alone, run A) and returns a :class:`Verdict`. The claim is made only when all of these hold:

1. **Size.** For an amount (``unit`` ``"ns"`` or ``"bytes"``: a time, a byte count) the
   difference is at least :data:`MIN_NS` (1 ms) or :data:`MIN_BYTES` (1 MiB): a 0 on one side is
   a measurement, a 40 us difference is not worth a sentence. For a rate (``"GB/s"``: copy
   bandwidth) each side's sample (``samples``: (bytes, ns) per side) holds at least
   :data:`MIN_BYTES` moved in at least :data:`MIN_RATE_NS` (0.1 ms, ten times the ~10 us fixed
   cost of one copy) of copy time: 16 copies of 8 B say nothing about bandwidth; for a ratio of
   times (``"x"``: a slowdown against 1) each side rests on at least :data:`MIN_RATE_NS`
   (``samples``: (ns_a, ns_b)). A rate or ratio without its samples is never compared.
2. **Relative difference.** ``|a - b| / |b|`` is at least :data:`MIN_REL` (5 %; a reference of 0
   counts as an infinite relative difference).
3. **Spread.** ``|a - b|`` exceeds ``spread``, the measured iteration-to-iteration spread of the
   quantity (max - min over the steady iterations: :func:`spread`), where the caller can measure
   it (None: not measurable, the rule is 1 and 2). Which side's spread each caller passes is in
   docs/transfers.md.

Plain Python, no polars: the renderers of stored results use it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: the smallest time difference that a claim rests on (ns)
MIN_NS = 1_000_000
#: the least copy time behind a rate or a ratio of times, on each side (ns): 0.1 ms
MIN_RATE_NS = 100_000
#: the smallest byte difference, and the least bytes behind a rate, that a claim rests on (1 MiB)
MIN_BYTES = 1 << 20
#: the smallest relative difference |a - b| / |b| that a claim rests on (5 %)
MIN_REL = 0.05

UNITS = ("ns", "bytes", "GB/s", "x")


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`differs`: ``significant``, and ``why`` not (empty when it is):
    ``"too small"``, ``"too few bytes or too little copy time"``, ``"too little time"``, ``"under 5 %"``,
    ``"within the spread"``, ``"not comparable"``."""

    significant: bool
    why: str = ""

    def __bool__(self) -> bool:
        return self.significant


def _num(v) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def differs(a, b, unit: str, samples=None, spread=None, min_rel: float = MIN_REL) -> Verdict:
    """Whether ``a`` differs from the reference ``b`` enough for a comparative claim (the rule
    of the module doc).

    ``unit``: ``"ns"`` or ``"bytes"`` (amounts); ``"GB/s"`` (a rate, which needs ``samples`` =
    ((bytes_a, ns_a), (bytes_b, ns_b)): what each side's rate was measured on) or ``"x"`` (a
    ratio of times, ``samples`` = (ns_a, ns_b)). ``spread``: the quantity's
    iteration-to-iteration spread in ``unit`` (None when not measurable). ``min_rel``: the
    relative minimum (:data:`MIN_REL`; ``compare --fail-above`` passes its own). Returns a
    :class:`Verdict` (true when significant). Raises ValueError for an unknown ``unit``.
    """
    if unit not in UNITS:
        raise ValueError(f"unit {unit!r}: one of {', '.join(UNITS)}")
    a, b = _num(a), _num(b)
    if a is None or b is None:
        return Verdict(False, "not comparable")
    diff = abs(a - b)
    if unit in ("ns", "bytes"):
        if diff < (MIN_NS if unit == "ns" else MIN_BYTES):
            return Verdict(False, "too small")
    elif unit == "x":
        try:
            na, nb = (_num(x) for x in samples)
        except (TypeError, ValueError):
            return Verdict(False, "not comparable")
        if na is None or nb is None or min(na, nb) < MIN_RATE_NS:
            return Verdict(False, "too little time")
    else:
        try:
            (ba, na), (bb, nb) = samples
        except (TypeError, ValueError):
            return Verdict(False, "not comparable")
        for nbytes, ns in ((ba, na), (bb, nb)):
            nbytes, ns = _num(nbytes), _num(ns)
            if nbytes is None or ns is None or nbytes < MIN_BYTES or ns < MIN_RATE_NS:
                return Verdict(False, "too few bytes or too little copy time")
    rel = diff / abs(b) if b else (math.inf if diff else 0.0)
    if rel < min_rel:
        return Verdict(False, f"under {100 * min_rel:g} %")
    s = _num(spread)
    if s is not None and diff <= s:
        return Verdict(False, "within the spread")
    return Verdict(True)


def spread(values) -> float | None:
    """The iteration-to-iteration spread of ``values`` (one per steady iteration): max - min;
    None with fewer than two values (not measurable). Nones are left out."""
    xs = [x for x in (_num(v) for v in values) if x is not None]
    return max(xs) - min(xs) if len(xs) >= 2 else None


def slowest(items, unit: str = "ns", spreads=None):
    """The key of the largest value of ``items`` (``[(value, key)]``, ties: the later key, as
    ``max`` picks) when it differs from the runner-up by :func:`differs`; None when it does not
    (no rank is "the slowest"). With one item, its key (nothing is compared). ``spreads``: the
    iteration-to-iteration spread of each key's value (``{key: spread}``; the larger of the two
    compared counts), None when not measurable."""
    items = [(v, k) for v, k in items if _num(v) is not None]
    if not items:
        return None
    ranked = sorted(range(len(items)), key=lambda i: (items[i][0], i))
    top = items[ranked[-1]]
    if len(items) == 1:
        return top[1]
    second = items[ranked[-2]]
    s = None
    if spreads:
        known = [x for x in (_num(spreads.get(top[1])), _num(spreads.get(second[1]))) if x is not None]
        s = max(known) if known else None
    return top[1] if differs(top[0], second[0], unit, spread=s) else None
