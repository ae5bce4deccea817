"""One clock for the exports of one run (issue 24): how far to shift each export's timestamps.

Each nsys export has its own clock: its timestamps count ns from its capture's start. To
compare the ranks of several exports (who waited for whom in a collective, which GPUs of a
host copied at once), every export's times are shifted onto a common axis, in two steps:

1. **Capture start.** ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` is the UTC time (ns) of
   the capture's start on the clock of the export's host; an event at trace time ``t`` is at
   ``utc_start + t`` UTC. The common axis is the clock of the **reference** export, the one
   holding the lowest rank (its times are left as they are, so a time of the run can be found
   in its timeline): export ``f`` is shifted by ``start_offset_ns = utc_start(f) -
   utc_start(reference)``. Exports that share their
   host and capture start (the processes of one export, or the splits of one) are one **clock
   group**: their timestamps are already on one clock. An export without the table keeps its
   own times (offset 0).
2. **Collective end times.** The hosts' clocks differ by their NTP error (often 0.1-10 ms, as
   long as a whole collective), so, when the exports are in two or more clock groups, the
   groups are aligned on their collectives: an all-reduce, all-gather, reduce-scatter or
   all-to-all (:data:`ALIGN_KINDS`) cannot end on one rank before its last rank has sent its
   data, so the instances of one collective end (nearly) together on every rank. Instances
   are matched across ranks by their order on each rank
   (:func:`tracekit.analyze.sections.waiting_ranks.instance_keys`, which does not depend on the
   clocks). Starting from the clock group of the lowest rank (``reference``), in rounds, each
   group that shares instances with the groups aligned so far gets ``correction_ns`` = the
   median, over those instances, of (the aligned groups' median end - its own median end),
   rounded to the ns (one round when the collectives span every group, as a data-parallel
   all-reduce does).

``residual_skew_ns``: over the instances held by two or more clock groups, after alignment,
the median of (latest - earliest) of the groups' median end times: how far apart the clocks
still put one collective's end (0 when they agree exactly; ``max_end_spread_ns`` is the
largest). With one clock group (``method`` ``one clock``: the exports share one clock, nothing
is shifted) it is 0; it is None when it cannot be measured: no collective shared by two groups
(``capture start``: the hosts' clock error stays, typically under a few ms with NTP). A group
that shares no collective with the aligned ones keeps its capture-start offset (``aligned_by``
says so per export).
"""

from __future__ import annotations

import numpy as np
import polars as pl

#: Collective kinds whose instances end together on every rank (used to align clocks).
ALIGN_KINDS = ("AllReduce", "AllGather", "ReduceScatter", "AllToAll")

METHODS = {
    "one clock": "the exports share their host and capture start: one clock, nothing shifted",
    "capture start": "each export shifted by its capture start (TARGET_INFO_SESSION_START_TIME.utcEpochNs, "
                     "UTC ns of its host's clock); no collective spans two clocks, so the hosts' clock error "
                     "is not measured",
    "collective end times": "each export shifted by its capture start (TARGET_INFO_SESSION_START_TIME.utcEpochNs), "
                            "then each clock group by the median difference of the end times of the collectives "
                            "(AllReduce, AllGather, ReduceScatter, AllToAll) it shares with the groups aligned "
                            "before it",
}


def clock_groups(clocks: list[dict]) -> list[int]:
    """Clock group of each export (numbered by first appearance): exports with equal host and
    capture start. ``clocks``: ``{"utc_start_ns", "host"}`` per export
    (:func:`tracekit.analyze.run_parts.clock_info`)."""
    seen: dict = {}
    out = []
    for c in clocks:
        key = (c.get("host"), c.get("utc_start_ns"))
        out.append(seen.setdefault(key, len(seen)))
    return out


def start_offsets(clocks: list[dict], reference: int = 0) -> list[int]:
    """Step 1 of the module doc: ns to add to each export's times to put them on the clock of
    export ``reference`` (0 for an export without a capture start, and for all when the
    reference has none)."""
    starts = [c.get("utc_start_ns") for c in clocks]
    ref = starts[reference] if 0 <= reference < len(starts) else None
    return [s - ref if s is not None and ref is not None else 0 for s in starts]


def _group_ends(keyed: pl.DataFrame) -> pl.DataFrame:
    """Median end per (instance, clock group) of the alignable collectives of ``keyed``
    (columns ``group, comm_stream, collective, seq, end``), for instances of two or more groups."""
    k = keyed.filter(pl.col("collective").is_in(ALIGN_KINDS))
    inst = ["comm_stream", "collective", "seq"]
    g = k.group_by(*inst, "group").agg(end=pl.col("end").median())
    multi = g.group_by(inst).agg(groups=pl.col("group").n_unique()).filter(pl.col("groups") >= 2)
    return g.join(multi.select(inst), on=inst, how="semi")


def align(clocks: list[dict], keyed: pl.DataFrame, lowest_rank_part: int = 0) -> dict:
    """Shifts onto one clock (module doc).

    ``clocks``: ``{"utc_start_ns", "host"}`` per export; ``keyed``: the communication kernels
    of every export with their instance keys and the export's index ``part``, times on each
    export's own clock (columns ``part, comm_stream, collective, seq, end``, ns);
    ``lowest_rank_part``: the export holding the lowest rank (the reference: the run's times
    are on its clock, and its group's correction is 0).

    Returns ``{"method": str, "basis": str (how, in words), "shift_ns": [ns to add to each
    export's times], "start_offset_ns": [step 1], "correction_ns": [step 2, per export],
    "clock_group": [per export], "aligned_by": [per export: "one clock", "capture start" or
    "collective end times"], "groups": int, "collectives_used": int (instances held by two
    or more groups), "residual_skew_ns": int | None, "max_end_spread_ns": int | None}``.
    """
    n = len(clocks)
    groups = clock_groups(clocks)
    offsets = start_offsets(clocks, lowest_rank_part)
    ngroups = len(set(groups))
    corr_g: dict[int, int] = {}
    used = 0
    residual = spread_max = None
    if ngroups <= 1:
        method = "one clock"
        residual = spread_max = 0
    else:
        k = keyed.with_columns(
            end=pl.col("end") + pl.col("part").replace_strict(dict(enumerate(offsets)), return_dtype=pl.Int64),
            group=pl.col("part").replace_strict(dict(enumerate(groups)), return_dtype=pl.Int64))
        ends = _group_ends(k)
        inst = ["comm_stream", "collective", "seq"]
        wide = ends.pivot(on="group", index=inst, values="end") if ends.height else None
        used = 0 if wide is None else wide.height
        ref = groups[lowest_rank_part] if 0 <= lowest_rank_part < n else 0
        if wide is None or str(ref) not in wide.columns:
            method = "capture start"
        else:
            method = "collective end times"
            corr_g[ref] = 0
            cols = {int(c): wide[c].to_numpy().astype(float) for c in wide.columns if c not in inst}
            while True:  # in rounds: one for collectives that span every group
                aligned = np.column_stack([cols[g] + c for g, c in corr_g.items()])
                has = ~np.all(np.isnan(aligned), axis=1)
                ref_end = np.full(aligned.shape[0], np.nan)
                ref_end[has] = np.nanmedian(aligned[has], axis=1)
                new = {}
                for g, e in cols.items():
                    ok = has & ~np.isnan(e)
                    if g not in corr_g and ok.any():
                        new[g] = int(np.rint(np.median(ref_end[ok] - e[ok])))
                if not new:
                    break
                corr_g.update(new)
            fixed = np.column_stack([cols[g] + corr_g[g] for g in corr_g])
            counts = (~np.isnan(fixed)).sum(axis=1)
            both = counts >= 2
            if both.any():
                spread = np.nanmax(fixed[both], axis=1) - np.nanmin(fixed[both], axis=1)
                residual = int(np.rint(np.median(spread)))
                spread_max = int(np.rint(spread.max()))
    correction = [corr_g.get(g, 0) for g in groups]
    by = ["one clock" if method == "one clock" else "collective end times" if g in corr_g else "capture start"
          for g in groups]
    return {
        "method": method, "basis": METHODS[method],
        "shift_ns": [o + c for o, c in zip(offsets, correction)],
        "start_offset_ns": offsets, "correction_ns": correction, "clock_group": groups, "aligned_by": by,
        "groups": ngroups,
        "collectives_used": used, "residual_skew_ns": residual, "max_end_spread_ns": spread_max,
    }
