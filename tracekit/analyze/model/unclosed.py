"""Ranges that were never popped (rule 4 of :mod:`tracekit.analyze.model.phases`): which ones, in
which of nsys's three forms (``end = ANALYSIS_DETAILS.duration``, ``end`` NULL, ``end`` at or after
the capture's ``stopTime``), their end moved to the process's last recorded activity
(:func:`set_aside_unclosed`), a phase window from one cut where the next phase window starts, and
the table of them (:attr:`tracekit.analyze.model.phases.PhaseModel.unclosed`: :data:`UNCLOSED_COLUMNS`).
"""

from __future__ import annotations

import polars as pl

from tracekit.analyze.trace import enums
from tracekit.analyze.trace.export import Export

#: Columns of :attr:`PhaseModel.unclosed`.
UNCLOSED_COLUMNS = [
    "global_pid",
    "iteration",  # Int64
    "phase",  # forward | backward | update
    "micro_step",  # Int64, null for update
    "name",  # the NVTX range's name
    "form",  # "duration" (end = ANALYSIS_DETAILS.duration) | "null" (no end) | "stop" (end >= stopTime)
    "reason",  # one sentence: why the range counts as never closed
    "start",  # ns, the range's start
    "end",  # ns, where its window was cut (the process's last activity or the next phase window)
]

#: Why a range counts as never closed, per form (see :func:`set_aside_unclosed`).
UNCLOSED_REASONS = {
    "duration": "never closed (its end is ANALYSIS_DETAILS.duration, which nsys writes for a range that "
                "was never popped)",
    "null": "never closed (no end recorded)",
    "stop": "never closed (it ends at the capture's stop time)",
}


_UNCLOSED_SCHEMA = {
    "global_pid": pl.Int64, "iteration": pl.Int64, "phase": pl.String, "micro_step": pl.Int64,
    "name": pl.String, "form": pl.String, "reason": pl.String, "start": pl.Int64, "end": pl.Int64,
}


def _cut_unclosed_at_next(cand: pl.DataFrame) -> pl.DataFrame:
    """An unclosed phase range (already ending at the process's last activity) also ends where
    the next phase range of its process starts: it cannot hold later phases."""
    if "unclosed" not in cand.columns or not cand["unclosed"].any():
        return cand
    starts = cand.select("global_pid", next_start="start").unique().sort("next_start")
    probe = cand.with_columns(_probe=pl.col("start") + 1).sort("_probe")
    probe = probe.join_asof(starts, left_on="_probe", right_on="next_start", by="global_pid",
                            strategy="forward", check_sortedness=False)
    return probe.with_columns(
        end=pl.when(pl.col("unclosed") & pl.col("next_start").is_not_null())
        .then(pl.min_horizontal("end", "next_start"))
        .otherwise(pl.col("end"))
    ).drop("_probe", "next_start")


def _unclosed_forms(export: Export, ranges: pl.DataFrame) -> pl.Series:
    """Per range of ``ranges`` (from :func:`tracekit.analyze.model.nvtx.load_ranges`): ``"null"`` when
    ``NVTX_EVENTS.end`` is NULL, ``"duration"`` when it equals ``ANALYSIS_DETAILS.duration``,
    ``"stop"`` when it is at or after ``ANALYSIS_DETAILS.stopTime``, else null (closed)."""
    details = export.tables.get("ANALYSIS_DETAILS", {})

    def one(column: str) -> int | None:
        if column not in details:
            return None
        try:
            row = export.conn.execute(f'SELECT max("{column}") FROM ANALYSIS_DETAILS').fetchone()
            return int(row[0]) if row and row[0] is not None else None
        except (TypeError, ValueError, OverflowError):
            return None

    duration, stop = one("duration"), one("stopTime")
    null_ids: list[int] = []
    if ranges.height and "end" in export.tables.get("NVTX_EVENTS", {}):
        null_ids = [r[0] for r in export.conn.execute(
            'SELECT rowid FROM NVTX_EVENTS WHERE "end" IS NULL AND eventType IN (?, ?)',
            (enums.NVTX_PUSH_POP, enums.NVTX_START_END),
        ).fetchall()]
    end = pl.col("end")
    is_null = pl.col("range_id").is_in(null_ids) if null_ids else pl.lit(False)
    expr = pl.when(is_null).then(pl.lit("null"))
    if duration is not None:
        expr = expr.when(end == duration).then(pl.lit("duration"))
    if stop is not None:
        expr = expr.when(end >= stop).then(pl.lit("stop"))
    return ranges.with_columns(unclosed_form=expr.otherwise(pl.lit(None, pl.String)))["unclosed_form"]


def set_aside_unclosed(export: Export, ranges: pl.DataFrame, ops: pl.DataFrame,
                       others: pl.DataFrame | None = None) -> pl.DataFrame:
    """Find the NVTX ranges that were never popped and end them at their process's last activity.

    ``ranges``: frame of :func:`tracekit.analyze.model.nvtx.load_ranges`; ``ops``: frame of
    :func:`tracekit.analyze.model.gpu_ops.load_gpu_ops`. A range is unclosed in one of the three forms
    nsys writes (:data:`UNCLOSED_REASONS`): ``end`` NULL, ``end = ANALYSIS_DETAILS.duration``
    (the session length in ns; an H200 probe with nsys 2025.3 showed never-popped ranges ending
    there), or ``end >= ANALYSIS_DETAILS.stopTime``. Without ``ANALYSIS_DETAILS`` only the NULL
    form can be told apart.

    Returns ``ranges`` with ``unclosed`` recomputed from these forms, a column
    ``unclosed_form`` (``"null" | "duration" | "stop"``, null for closed ranges), and the
    ``end`` of unclosed ranges replaced by the last activity of the process: the latest end of
    its GPU operations, of the CUDA calls that launched them, or of its closed NVTX ranges (at
    least the range's own start). Sorted by (global_tid, start, -end) like ``load_ranges``.
    ``others``: ``global_pid, end`` of closed ranges not in ``ranges`` (a thin read,
    :class:`tracekit.analyze.model.nvtx.Thin`), counted in the last activity.
    """
    ranges = ranges.with_columns(unclosed_form=_unclosed_forms(export, ranges))
    ranges = ranges.with_columns(unclosed=pl.col("unclosed_form").is_not_null())
    if not ranges["unclosed"].any():
        return ranges
    acts = [
        ops.group_by("global_pid").agg(last=pl.max_horizontal("end", "api_end").max()),
        ranges.filter(~pl.col("unclosed")).group_by("global_pid").agg(last=pl.col("end").max()),
        ranges.filter(pl.col("unclosed")).group_by("global_pid").agg(last=pl.col("start").max()),
    ]
    if others is not None and others.height:
        acts.append(others.group_by("global_pid").agg(last=pl.col("end").max()))
    last = pl.concat([a.cast({"global_pid": pl.Int64, "last": pl.Int64}) for a in acts])
    last = last.group_by("global_pid").agg(pl.col("last").max())
    # the process's last activity per row from a join of the key column only (the ranges' other
    # columns are not copied); re-sorted only when a new end moved a range out of order
    per_row = ranges.select("global_pid").join(last, on="global_pid", how="left", maintain_order="left")
    end = pl.when(pl.col("unclosed")).then(pl.max_horizontal(pl.lit(per_row["last"]), "start")).otherwise(pl.col("end"))
    ranges = ranges.with_columns(end=end)
    order = ranges.select(
        ok=(pl.col("global_tid").shift(-1) != pl.col("global_tid"))
        | (pl.col("start").shift(-1) > pl.col("start"))
        | ((pl.col("start").shift(-1) == pl.col("start")) & (pl.col("end").shift(-1) <= pl.col("end")))
    )["ok"].head(max(ranges.height - 1, 0))
    if order.null_count() == 0 and order.all():
        return ranges
    return ranges.sort(["global_tid", "start", "end"], descending=[False, False, True], maintain_order=True)


def _unclosed_table(windows: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Rows of :data:`UNCLOSED_COLUMNS` for the windows cut because their range never closed."""
    w = windows.filter(pl.col("unclosed"))
    if w.height == 0:
        return pl.DataFrame(schema=_UNCLOSED_SCHEMA)
    r = ranges.select(pl.col("range_id").cast(pl.Int64).alias("range_index"), "name", form="unclosed_form")
    w = w.join(r, on="range_index", how="left").with_columns(
        reason=pl.col("form").replace_strict(UNCLOSED_REASONS, default=None, return_dtype=pl.String)
    )
    return w.select(UNCLOSED_COLUMNS).cast(_UNCLOSED_SCHEMA).sort("global_pid", "start")
