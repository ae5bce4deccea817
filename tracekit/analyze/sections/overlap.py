"""Copy/compute overlap per copy direction (issue 4).

Definitions, per rank (process, device) and group of attributed copies (``by``, see
:mod:`tracekit.analyze.sections.transfer_common`):

- busy time of a set of GPU operations: length of the union of their [start, end) intervals;
- ``{d}_overlap_ratio`` for d in H2D, D2H: |U(copies_d) n U(kernels)| / |U(copies_d)|, the
  share of copy time hidden behind compute. ``copies_d`` are the group's copies of direction
  d; ``kernels`` are *all* kernels of the rank's device, whatever launched them (a copy is
  hidden by any kernel running at the same time);
- ``{d}_exposed_ns``: |U(copies_d) - U(kernels)|, copy time with no kernel running;
- ``bidir_ns``: |U(H2D) n U(D2H)| of the group's copies, time both directions are in flight.
- kernels above are *compute* kernels; communication kernels (NCCL and the like,
  :mod:`tracekit.analyze.model.communication`) neither hide nor expose a copy, and get their own
  ``{d}_comm_overlap_ns`` = |U(copies_d) n U(communication kernels)| (``copy_`` for both
  directions together).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.model.intervals import covered_length, grouped_at_least, grouped_union
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.transfer_common import (
    BY_COLUMNS,
    PHASE_KEYS,
    RANK,
    check_by,
    group_codes,
    host_copies,
    kernel_unions,
    ratio,
    sort_groups,
)

COLUMNS = [
    "h2d_count", "h2d_bytes", "h2d_busy_ns", "h2d_overlap_ns", "h2d_exposed_ns", "h2d_overlap_ratio",
    "d2h_count", "d2h_bytes", "d2h_busy_ns", "d2h_overlap_ns", "d2h_exposed_ns", "d2h_overlap_ratio",
    "bidir_ns", "copy_busy_ns", "copy_overlap_ns", "copy_exposed_ns", "overlap_ratio",
    "h2d_comm_overlap_ns", "d2h_comm_overlap_ns", "copy_comm_overlap_ns",
]


def _kernel_unions(model: PhaseModel, comm: bool = False) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """Per rank, the union of its device's compute kernels (``comm``: communication kernels);
    computed once per model and kept on it (every grouping of :func:`overlap_levels` reads them):
    :func:`tracekit.analyze.sections.transfer_common.kernel_unions`."""
    return kernel_unions(model, comm)


def _covers(pieces: pl.DataFrame, rank_of: np.ndarray, ranks: list, kernels: dict, comm_kernels: dict) -> pl.DataFrame:
    """``pieces`` (``_g``: group id, ..., start, end; ns) with ``covered`` and ``comm_covered``:
    the length of each piece under its rank's compute kernels and communication kernels (Int64
    ns), both in one pass over the ranks (``rank_of[_g]`` indexes ``ranks``, the
    ``(global_pid, device)`` pairs); rows keep their order."""
    none = (np.empty(0, np.int64), np.empty(0, np.int64))
    r = rank_of[pieces["_g"].to_numpy()]
    s, e = pieces["start"].to_numpy(), pieces["end"].to_numpy()
    cov, comm = np.zeros(len(s), np.int64), np.zeros(len(s), np.int64)
    for i, rank in enumerate(ranks):
        mine = r == i
        if len(ranks) == 1 and mine.all():
            cov, comm = covered_length(*kernels.get(rank, none), s, e), covered_length(*comm_kernels.get(rank, none), s, e)
            break
        cov[mine] = covered_length(*kernels.get(rank, none), s[mine], e[mine])
        comm[mine] = covered_length(*comm_kernels.get(rank, none), s[mine], e[mine])
    return pieces.with_columns(covered=pl.Series(cov, dtype=pl.Int64), comm_covered=pl.Series(comm, dtype=pl.Int64))


def overlap(model: PhaseModel, by=PHASE_KEYS) -> pl.DataFrame:
    """Overlap of host<->device copies with kernels, per rank and group ``by``.

    Columns: ``global_pid, device``, the ``by`` columns, then for ``h2d`` and ``d2h``:
    ``_count``, ``_bytes``, ``_busy_ns`` (union length), ``_overlap_ns`` (part under kernels),
    ``_exposed_ns`` (busy - overlap), ``_overlap_ratio`` (overlap / busy, null without
    copies); ``bidir_ns`` (both directions in flight); ``copy_busy_ns``,
    ``copy_overlap_ns``, ``copy_exposed_ns``, ``overlap_ratio`` for the union of both
    directions. Groups without H2D/D2H copies are absent. Times ns, sizes bytes.

    Raises :class:`~tracekit.errors.TracekitError` for an unknown ``by`` column.
    """
    by = check_by(by)
    return _finish(_sums(model, by)[0], by)


#: the columns of :func:`_sums` that add up over groups whose copy unions are disjoint
_ADDITIVE = [
    *(f"{d}_{m}" for d in ("h2d", "d2h") for m in ("count", "bytes")),
    *(f"{d}_{m}" for d in ("h2d", "d2h", "copy") for m in ("busy_ns", "overlap_ns", "comm_overlap_ns")),
    "bidir_ns",
]


def overlap_levels(model: PhaseModel, levels: dict[str, tuple]) -> dict[str, pl.DataFrame]:
    """:func:`overlap` for several groupings at once: ``{name: by}`` -> ``{name: frame}``, each
    frame exactly what ``overlap(model, by)`` returns, in the order of ``levels``.

    Computed once (issue 13): the interval unions are built per group of the finest grouping
    (all the ``by`` columns together), and a coarser grouping is the sum of its finer groups
    whenever the copy unions (both directions) of the finer groups inside each coarser group
    are disjoint, which is what phase windows that tile time give: then every busy, overlap,
    bidirectional and communication length adds up exactly (integer ns), as do counts and
    bytes. A coarser group where they are not disjoint (a copy attributed to one group still
    running while another group's copy runs) is computed directly instead. Raises
    :class:`~tracekit.errors.TracekitError` for an unknown ``by`` column.
    """
    want = {name: check_by(by) for name, by in levels.items()}
    cols = {b for by in want.values() for b in by}
    base = [b for b in BY_COLUMNS if b in cols]
    done = {tuple(base): _sums(model, base)}  # by -> (sums, copy union pieces)
    out: dict[str, pl.DataFrame] = {}
    for name, by in sorted(want.items(), key=lambda kv: -len(kv[1])):  # finest first
        sums = None
        for fine in sorted((k for k in done if set(by) <= set(k)), key=len):  # the coarsest finer one first
            if list(fine) == by:
                sums = done[fine][0]
                break
            if _disjoint_within(*done[fine], [*RANK, *by]):
                sums = _rollup(done[fine][0], by)
                break
        if sums is None:
            done[tuple(by)] = _sums(model, by)
            sums = done[tuple(by)][0]
        out[name] = _finish(sums, by)
    return {name: out[name] for name in levels}


def _disjoint_within(sums: pl.DataFrame, pieces: pl.DataFrame, keys: list[str]) -> bool:
    """Whether the intervals of ``pieces`` (``_g``, start, end: disjoint within each group
    ``_g`` of ``sums``, :func:`_sums`) are also disjoint within each group of ``keys``
    (touching allowed)."""
    if pieces.height == 0:
        return True
    _, code = group_codes(sums, keys)  # the group of ``keys`` of each fine group
    f = pieces.join(pl.DataFrame({"_g": sums["_g"], "_c": code}), on="_g").select("_c", "start", "end")
    f = f.sort("_c", "start")
    prev = pl.col("end").cum_max().shift(1).over("_c")
    return not f.select((pl.col("start") < prev).any()).item()


def _rollup(sums: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Sums of a finer grouping summed to the groups ``by`` (the copy unions being disjoint)."""
    return sums.group_by([*RANK, *by]).agg(pl.col(_ADDITIVE).sum())


def _sums(model: PhaseModel, by: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The additive columns of :func:`overlap` per rank and group ``by`` (unsorted; with
    ``_g``, the group's id), and the union pieces of each group's copies of both directions
    (``_g, start, end``).

    The unions of the three copy sets of a group (its H2D copies, its D2H copies, all of them)
    are built together, as groups of one frame that carries the set as an extra key, and their
    kernel and communication cover is measured piece by piece in one pass per kind: one
    :func:`grouped_union`, two cover passes and one aggregation instead of three of each
    (issue 13). Every length is a sum of integer ns over the same pieces, so the sums are
    exactly those of one union per set. The groups are numbered first and the intervals carry
    only that number (``_g``), not the key columns (strings among them), through the sorts
    (issue 24)."""
    keys = [*RANK, *by]
    c = host_copies(model)
    groups, gid = group_codes(c, keys)
    groups = groups.with_columns(_g=pl.int_range(pl.len(), dtype=pl.Int64))
    ranks, rank_of = group_codes(groups, RANK)
    kernels, comm_kernels = _kernel_unions(model), _kernel_unions(model, comm=True)
    f = pl.DataFrame([pl.Series("_g", gid), c.get_column("direction"), c.get_column("bytes"),
                      c.get_column("start"), c.get_column("end")])
    out = f.group_by("_g").agg(
        **{f"{d.lower()}_count": (pl.col("direction") == d).sum().cast(pl.Int64) for d in ("H2D", "D2H")},
        **{f"{d.lower()}_bytes": pl.col("bytes").filter(pl.col("direction") == d).sum() for d in ("H2D", "D2H")},
    )
    # the copies of each set, stacked: 0 = h2d, 1 = d2h (host_copies holds only these directions), 2 = copy (all)
    sets = pl.concat([
        f.select("_g", "start", "end", _set=pl.when(pl.col("direction") == "H2D").then(0).otherwise(1).cast(pl.Int8)),
        f.select("_g", "start", "end", _set=pl.lit(2, pl.Int8)),
    ])
    del f
    p = grouped_union(sets, ["_g", "_set"])
    del sets
    p = _covers(p, rank_of, list(ranks.iter_rows()), kernels, comm_kernels)  # _g, _set, start, end, covered, comm_covered
    length = pl.col("end") - pl.col("start")
    agg = p.group_by("_g").agg(**{
        f"{d}_{m}": v.filter(pl.col("_set") == i).sum()
        for i, d in enumerate(("h2d", "d2h", "copy"))
        for m, v in (("busy_ns", length), ("overlap_ns", pl.col("covered")),
                     ("comm_overlap_ns", pl.col("comm_covered")))
    })
    out = out.join(agg, on="_g", how="left")
    both = grouped_at_least(p.filter(pl.col("_set") < 2).select("_g", "start", "end"), ["_g"], 2)
    out = out.join(both.group_by("_g").agg(bidir_ns=(pl.col("end") - pl.col("start")).sum()), on="_g", how="left")
    fill = [f"{d}_{m}" for d in ("h2d", "d2h", "copy") for m in ("busy_ns", "overlap_ns", "comm_overlap_ns")] + ["bidir_ns"]
    out = out.with_columns(**{f: pl.col(f).fill_null(0).cast(pl.Int64) for f in fill})
    out = groups.join(out, on="_g", how="left")
    return out, p.filter(pl.col("_set") == 2).select("_g", "start", "end")


def _finish(out: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The frame of :func:`overlap` from the additive sums: exposed times, ratios, sorted."""
    keys = [*RANK, *by]
    out = out.with_columns(
        **{f"{d}_exposed_ns": pl.col(f"{d}_busy_ns") - pl.col(f"{d}_overlap_ns") for d in ("h2d", "d2h", "copy")},
        h2d_overlap_ratio=ratio("h2d_overlap_ns", "h2d_busy_ns"),
        d2h_overlap_ratio=ratio("d2h_overlap_ns", "d2h_busy_ns"),
        overlap_ratio=ratio("copy_overlap_ns", "copy_busy_ns"),
    )
    return sort_groups(out, by).select(*keys, *COLUMNS)
