"""The summary across ranks of a many-trace run (:func:`summarize_ranks`): one row per rank
(:func:`rank_rows`), the slowest rank, the spread of phase and iteration times, the rank numbers
read from the file names (:func:`rank_numbers`) and those missing, and the one-run rule
(:mod:`tracekit.analyze.run_groups`: different runs are not compared). Times in ns.

:mod:`tracekit.analyze.multi` runs the traces and calls this on their (compact) results; its
names are importable from there too.
"""

from __future__ import annotations

import re
from pathlib import Path

from tracekit.analyze.model.steady import split_warmup
from tracekit.errors import TracekitError
from tracekit.vocab import PHASES

_RANK_WORD = re.compile(r"(?i)(?:^|[^a-z])(?:rank|node|proc|process|worker|host)[-_.]?(\d+)")


def rank_numbers(paths: list[Path]) -> list[int | None]:
    """Rank (or node) number of each trace read from its file name, or None.

    A number after ``rank``, ``node``, ``proc``, ``process``, ``worker`` or ``host`` counts
    (``rank3.sqlite``, ``node_12.sqlite``); failing that, when two or more names differ only
    in their last number (``report_0``, ``report_1``, ``report_3``), that number.
    """
    stems = [p.name.split(".")[0] for p in paths]
    words = [_RANK_WORD.findall(s) for s in stems]
    if all(words):
        return [int(w[-1]) for w in words]
    if len(stems) >= 2:
        shapes = {re.sub(r"\d+(?=\D*$)", "#", s) for s in stems}
        nums = [re.findall(r"\d+", s) for s in stems]
        if len(shapes) == 1 and "#" in next(iter(shapes)) and all(nums):
            return [int(n[-1]) for n in nums]
    return [None] * len(paths)



# ---------------------------------------------------------------------- summary
def rank_rows(results: list[dict], paths: list[Path] | None = None) -> list[dict]:
    """One row per rank of every result: ``{"trace", "rank" (from the file name or None),
    "pid", "device", "iterations" (count), "complete_iterations", "iteration_ns" (sum of the
    iterations' phase wall times), "mean_iteration_ns", "phase_ns": {phase: sum over the
    iterations of that phase's wall time}, "per_iteration": [{"index", "wall_ns"}],
    "unclosed_iterations": [index]}`` (ns). Iterations with a phase range that never closed
    (``unclosed`` in the result; their wall time stops at the capture's last activity) are
    listed in ``unclosed_iterations`` and left out of every other field. ``steady_iterations``
    (complete iterations, the warm-up apart: :func:`tracekit.analyze.model.steady.split_warmup`;
    all closed ones when none is complete), ``steady_mean_iteration_ns`` and
    ``steady_phase_ns`` ``{phase: ns}``: means per steady iteration."""
    paths = paths or [Path(r["trace"]) for r in results]
    numbers = rank_numbers(list(paths))
    rows = []
    for result, number in zip(results, numbers):
        ranks = result.get("ranks", [])
        for r in ranks:
            per_phase: dict[int, dict[str, int]] = {}  # closed iterations: {index: {phase: wall ns}}
            forwards, full, unclosed = {}, [], []
            for it in r.get("iterations", []):
                i = int(it["index"])
                forwards[i] = sum(1 for ph in it["phases"] if ph["phase"] == "forward")
                if it.get("unclosed"):
                    unclosed.append(i)
                    continue
                ph_ns = per_phase.setdefault(i, {})
                for ph in it["phases"]:
                    ph_ns[ph["phase"]] = ph_ns.get(ph["phase"], 0) + int(ph["wall_ns"])
                if it.get("complete"):
                    full.append(i)
            per_it = {i: sum(v.values()) for i, v in per_phase.items()}
            total = sum(per_it.values())
            complete = len(full)

            def phase_sums(its):
                out = {p: 0 for p in PHASES}
                for i in its:
                    for p, v in per_phase[i].items():
                        out[p] = out.get(p, 0) + v
                return out

            phase_ns = phase_sums(per_phase)
            # per steady iteration (the one warm-up rule): what the terminal table shows
            st = split_warmup(full, forwards)[0] if full else sorted(per_phase)
            st_phase = phase_sums(st)
            rows.append(
                {
                    "trace": result.get("trace"),
                    "rank": number if len(ranks) == 1 else None,
                    "node": number if len(ranks) > 1 else None,
                    "pid": r["pid"],
                    "device": r["device"],
                    "iterations": len(per_it),
                    "complete_iterations": complete,
                    "iteration_ns": total,
                    "mean_iteration_ns": total / len(per_it) if per_it else None,
                    "phase_ns": phase_ns,
                    "per_iteration": [{"index": i, "wall_ns": w} for i, w in sorted(per_it.items())],
                    "unclosed_iterations": unclosed,
                    "steady_iterations": st,
                    "steady_mean_iteration_ns": sum(st_phase.values()) / len(st) if st else None,
                    "steady_phase_ns": {p: v / len(st) for p, v in st_phase.items()} if st else {},
                }
            )
    return rows


def _who(row: dict) -> dict:
    return {k: row[k] for k in ("trace", "rank", "pid", "device")}


def _slowest(vals: list[tuple], spreads: dict | None = None) -> int | None:
    """Index of the largest of ``vals`` ([(ns, index)], the first of equal values, as ``max``
    picks) when it differs from the runner-up (:func:`tracekit.analyze.significance.slowest`)."""
    from tracekit.analyze.significance import slowest

    order = {k: n for n, (_, k) in enumerate(vals)}
    # significance.slowest breaks ties towards the later item: list them last-first
    return slowest(sorted(vals, key=lambda t: -order[t[1]]), spreads=spreads)


#: at most this many missing rank numbers are listed one by one (``missing_ranks`` of
#: :func:`summarize_ranks`); ``missing_rank_ranges`` holds them all
MAX_LISTED_MISSING = 10_000


def check_expected_ranks(expected_ranks: int | None) -> None:
    """Raise :class:`~tracekit.errors.TracekitError` (one line, exit 2) unless ``expected_ranks``
    (``--ranks N``: the run's ranks are 0..N-1) is None or a positive integer."""
    if expected_ranks is None:
        return
    if isinstance(expected_ranks, bool) or not isinstance(expected_ranks, int) or expected_ranks < 1:
        raise TracekitError(f"--ranks {expected_ranks!r}: give the number of ranks in the run, a positive "
                            "integer N (ranks 0..N-1)")


def missing_ranges(present, upto: int) -> list[tuple[int, int]]:
    """The numbers of 0..upto-1 absent from ``present`` (ints; those outside the span are
    ignored) as sorted inclusive ``(first, last)`` ranges; time and memory grow with
    ``len(present)``, not with ``upto``."""
    out = []
    nxt = 0
    for n in sorted(n for n in set(present) if 0 <= n < upto):
        if n > nxt:
            out.append((nxt, n - 1))
        nxt = n + 1
    if nxt < upto:
        out.append((nxt, upto - 1))
    return out


def listed_ranks(ranges, limit: int) -> list[int]:
    """The first ``limit`` numbers of inclusive ``(first, last)`` ``ranges``."""
    out: list[int] = []
    for a, b in ranges:
        take = min(b - a + 1, limit - len(out))
        if take <= 0:
            break
        out.extend(range(a, a + take))
    return out


def summarize_ranks(
    results: list[dict], paths: list[Path] | None = None, expected_ranks: int | None = None,
    failed: list[Path] | None = None,
) -> dict:
    """Compare the ranks of several results (times in ns). ``failed``: traces that could not be
    analyzed; their rank numbers do not count as missing.

    Returns::

        {"traces": int, "ranks": int, "rank_rows": rank_rows(...),
         "iterations": {"min": int, "max": int},
         "slowest_rank": {"trace", "rank", "pid", "device", "mean_iteration_ns"} | None,
         "per_phase": {PHASE: {"min_ns", "max_ns", "mean_ns", "spread_ns", "spread_share",
                               "slowest": {"trace", "rank", "pid", "device"}}},
         "per_iteration": [{"index", "ranks", "min_ns", "max_ns", "spread_ns", "slowest"}],
         "missing_ranks": [int], "missing_ranks_count": int, "missing_rank_ranges": [[first, last]],
         "ranks_without_iterations": [{"trace", "rank", "pid", "device"}],
         "one_run": bool, "run_groups": [[trace path]], "note": str | None,
         "run": run_groups.run_view(...) | None (None for different runs)}

    ``one_run`` is False when the traces are exports of different runs
    (:mod:`tracekit.analyze.run_groups`, the one-run rule); then ``note`` says so in one line,
    ``per_phase`` and ``per_iteration`` are empty and ``slowest_rank`` is None (the per-trace
    ``rank_rows`` stay); ``run_groups`` lists the traces of each run.

    ``per_phase`` compares each rank's phase time summed over its iterations; ``spread_ns`` is
    max - min and ``spread_share`` spread / mean (None when the mean is 0). The slowest rank
    has the longest mean iteration. A ``slowest`` (and ``slowest_rank``) is named only when it
    differs from the runner-up by the one rule of a comparative claim
    (:func:`tracekit.analyze.significance.slowest`: >= 1 ms, >= 5 %, and for the mean
    iteration beyond either rank's iteration-to-iteration spread); else it is None.
    ``per_iteration`` compares ranks at equal iteration indices. ``missing_ranks``: numbers
    absent from 0..max of the ranks read from file names
    (:func:`rank_numbers`), or from 0..expected_ranks-1 when given, the first
    :data:`MAX_LISTED_MISSING` of them; ``missing_ranks_count`` how many there are and
    ``missing_rank_ranges`` all of them as inclusive ranges (:func:`missing_ranges`: the work
    grows with the ranks present, not with ``expected_ranks``). Raises
    :class:`~tracekit.errors.TracekitError` for an ``expected_ranks`` below 1.
    """
    from tracekit.analyze.significance import spread as spread_of

    rows = rank_rows(results, paths)
    timed = [r for r in rows if r["iterations"]]
    per_phase = {}
    for phase in PHASES:
        vals = [(r["phase_ns"].get(phase, 0), i) for i, r in enumerate(timed)]
        if not vals or not any(v for v, _ in vals):
            continue
        walls = [v for v, _ in vals]
        mx = max(vals, key=lambda t: t[0])
        mean = sum(walls) / len(walls)
        spread = max(walls) - min(walls)
        slow = _slowest(vals)
        per_phase[phase] = {
            "min_ns": min(walls),
            "max_ns": mx[0],
            "mean_ns": mean,
            "spread_ns": spread,
            "spread_share": spread / mean if mean else None,
            "slowest": None if slow is None else _who(timed[slow]),
        }
    per_iteration = []
    walls_of = [{d["index"]: d["wall_ns"] for d in r["per_iteration"]} for r in timed]
    indices = sorted({i for w in walls_of for i in w})
    for idx in indices:
        vals = [(w[idx], k) for k, w in enumerate(walls_of) if idx in w]
        mx = max(vals, key=lambda t: t[0])
        slow = _slowest(vals)
        per_iteration.append(
            {
                "index": idx,
                "ranks": len(vals),
                "min_ns": min(v for v, _ in vals),
                "max_ns": mx[0],
                "spread_ns": mx[0] - min(v for v, _ in vals),
                "slowest": None if slow is None else _who(timed[slow]),
            }
        )
    from tracekit.analyze import run_groups

    trace_paths = list(paths or [Path(r["trace"]) for r in results])
    idents = [run_groups.identity(p) for p in trace_paths]
    groups = run_groups.group(idents) if len(trace_paths) > 1 else [list(range(len(trace_paths)))]
    run_note = run_groups.note(groups, trace_paths)
    run = None if run_note else run_groups.run_view(idents, rows)
    if run_note:  # different runs: per-trace rows only, no comparison across them
        per_phase, per_iteration, timed = {}, [], []
    slowest = None
    if timed:
        # the rank with the longest mean iteration, when it stands out from the next beyond
        # either's iteration-to-iteration spread
        k = _slowest([(r["mean_iteration_ns"], i) for i, r in enumerate(timed)],
                     {i: spread_of(w.values()) for i, w in enumerate(walls_of)})
        if k is not None:
            s = timed[k]
            slowest = _who(s) | {"mean_iteration_ns": s["mean_iteration_ns"]}
    numbers = {r["rank"] if r["rank"] is not None else r["node"] for r in rows} - {None}
    if failed:
        all_paths = list(paths or [Path(r["trace"]) for r in results]) + list(failed)
        numbers |= set(rank_numbers(all_paths)[-len(failed):]) - {None}
    check_expected_ranks(expected_ranks)
    upto = expected_ranks if expected_ranks else (max(numbers) + 1 if numbers else 0)
    gaps = missing_ranges(numbers, upto)
    count = sum(b - a + 1 for a, b in gaps)
    counts = [r["iterations"] for r in rows]
    return {
        "traces": len(results),
        "ranks": len(rows),
        "rank_rows": rows,
        "iterations": {"min": min(counts, default=0), "max": max(counts, default=0)},
        "slowest_rank": slowest,
        "per_phase": per_phase,
        "per_iteration": per_iteration,
        "missing_ranks": listed_ranks(gaps, MAX_LISTED_MISSING),
        "missing_ranks_count": count,
        "missing_rank_ranges": [[a, b] for a, b in gaps],
        "ranks_without_iterations": [_who(r) for r in rows if not r["iterations"]],
        "one_run": run_note is None,
        "run_groups": [[str(trace_paths[i]) for i in g] for g in groups],
        "note": run_note,
        "run": run,
    }

