"""Helpers shared by the transfer analyses (overlap, contention, sizes, pageable, ...).

Conventions of every transfer analysis (see docs/transfers.md):

- a **rank** is one (``global_pid``, ``device``) pair; every output frame carries both;
- ``by`` selects the grouping below the rank, any of :data:`BY_COLUMNS`, from the phase model's
  attribution of each copy (by the launching API call, see :mod:`tracekit.analyze.phases`):
  ``("iteration", "phase", "micro_step")`` per phase window (the default), ``("phase",)`` for
  whole-trace totals per phase, ``()`` for one whole-trace row per rank, or with
  ``"sub_phase"`` added for the innermost NVTX range;
- times are ns, sizes bytes, rates GB/s = 1e9 B/s (bytes per ns).
"""

from __future__ import annotations

import polars as pl

from tracekit.analyze.phases import PhaseModel
from tracekit.errors import TracekitError

RANK = ["global_pid", "device"]
PHASE_KEYS: tuple[str, ...] = ("iteration", "phase", "micro_step")
BY_COLUMNS = ("iteration", "phase", "micro_step", "boundary", "sub_phase")
HOST_DIRECTIONS = ("H2D", "D2H")


def check_by(by) -> list[str]:
    """``by`` as a list; raises :class:`TracekitError` for a column outside :data:`BY_COLUMNS`."""
    by = list(by or [])
    bad = [b for b in by if b not in BY_COLUMNS]
    if bad:
        raise TracekitError(f"cannot group transfers by {bad}; choose from {', '.join(BY_COLUMNS)}")
    return by


def host_copies(model: PhaseModel) -> pl.DataFrame:
    """Host<->device memcpys (H2D, D2H) of the model with ``host_kind`` (pageable, pinned, ...:
    the source kind of an H2D, the destination kind of a D2H), ``duration_ns`` and ``gbps``
    (bytes / duration; null for a 0 ns copy), plus the attribution columns of ``model.ops``.
    Copies with a null device are dropped."""
    c = model.ops.filter((pl.col("kind") == "memcpy") & pl.col("direction").is_in(HOST_DIRECTIONS))
    c = c.filter(pl.col("device").is_not_null())
    return c.with_columns(
        host_kind=pl.when(pl.col("direction") == "H2D").then(pl.col("src_kind")).otherwise(pl.col("dst_kind")),
        duration_ns=pl.col("end") - pl.col("start"),
    ).with_columns(
        gbps=pl.when(pl.col("duration_ns") > 0).then(pl.col("bytes") / pl.col("duration_ns")).otherwise(None),
        sub_phase=pl.col("sub_phase").fill_null("(none)"),
    )


def ranks_of(model: PhaseModel) -> pl.DataFrame:
    """(global_pid, device) pairs with GPU work, sorted."""
    return model.ops.select(RANK).unique().drop_nulls().sort(RANK)


def attach_window(model: PhaseModel, frame: pl.DataFrame, time_col: str = "start") -> pl.DataFrame:
    """Add ``window_id, iteration, phase, micro_step, boundary`` of the phase window (of the
    frame row's ``global_pid``) that contains ``frame[time_col]``: attribution by time, for
    things that have no launching call (memory events, bins, metric samples)."""
    w = model.windows.select(
        "global_pid", "window_id", "iteration", "phase", "micro_step", "boundary", w_start="start", w_end="end"
    ).sort("w_start")
    drop = [c for c in ("window_id", "iteration", "phase", "micro_step", "boundary") if c in frame.columns]
    f = frame.drop(drop).with_row_index("_row").sort(time_col)
    f = f.join_asof(w, left_on=time_col, right_on="w_start", by="global_pid", strategy="backward",
                    check_sortedness=False)
    outside = pl.col("w_end").is_null() | (pl.col(time_col) >= pl.col("w_end"))
    f = f.with_columns(
        **{c: pl.when(outside).then(None).otherwise(pl.col(c)) for c in ("window_id", "iteration", "micro_step")},
        phase=pl.when(outside).then(pl.lit("other")).otherwise(pl.col("phase")),
        boundary=pl.when(outside).then(False).otherwise(pl.col("boundary")),
    )
    return f.sort("_row").drop("_row", "w_start", "w_end")


def gbps(num: str, den: str) -> pl.Expr:
    """``num / den`` when ``den > 0`` else null (bytes / ns = GB/s)."""
    return pl.when(pl.col(den) > 0).then(pl.col(num) / pl.col(den)).otherwise(None)


def ratio(num: str, den: str) -> pl.Expr:
    """``num / den`` when ``den > 0`` else null."""
    return pl.when(pl.col(den) > 0).then(pl.col(num) / pl.col(den)).otherwise(None)


PHASE_ORDER = {"forward": 0, "backward": 1, "update": 2, "other": 3}


def sort_groups(frame: pl.DataFrame, by: list[str], extra: list[str] | None = None) -> pl.DataFrame:
    """Sort a per-group frame by rank, then in time order within an iteration: iteration
    (nulls first: start-up), micro-step (nulls last), phase (forward, backward, update, other),
    then the other ``by`` columns and ``extra``."""
    keys = [pl.col("global_pid"), pl.col("device")]
    if "iteration" in by:
        keys.append(pl.col("iteration").fill_null(-(2**62)))
    if "micro_step" in by:
        keys.append(pl.col("micro_step").fill_null(2**62))
    if "phase" in by:
        keys.append(pl.col("phase").replace_strict(PHASE_ORDER, default=9, return_dtype=pl.Int64))
    for b in [*by, *(extra or [])]:
        if b not in ("iteration", "micro_step", "phase"):
            keys.append(pl.col(b))
    return frame.sort(keys)
