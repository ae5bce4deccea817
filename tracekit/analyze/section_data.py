"""What the render layer reads of the sections, behind one door (issue 20: one-way layers).

``tracekit report`` and ``tracekit compare`` keep the export open for their figures and draw
whole-trace frames that the JSON result does not hold (the memory timeline, every PCIe sample,
overlap per sub-phase, the idle time of the timeline's bins, the what-if pieces). The render
layer gets them from here, never from :mod:`tracekit.analyze.sections` itself, so the sections
can change shape behind this module.

- :class:`SectionData` (from :meth:`tracekit.analysis.Analysis.section_data`): the frames of one
  open export and its phase model, each the section function's own (same columns, units, errors);
- :func:`update_roles`, :func:`run_settings`, :func:`what_if`, :func:`advice_items`,
  :func:`gpu_optimizer`: the what-if model of :mod:`tracekit.analyze.sections.whatif` and the
  advice of :mod:`tracekit.analyze.sections.advice`, as ``compare`` replays them.

Every frame is a polars DataFrame; units: ns, bytes, GB/s = 1e9 B/s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

    from tracekit.analyze.model.phases import PhaseModel
    from tracekit.analyze.trace.export import Export

# the sections are imported where used: a stored report or comparison needs none of them


class SectionData:
    """The section frames of one trace for its figures: ``export`` (open, read-only) and its
    phase ``model``. Nothing is kept: the figures' own memo (:meth:`tracekit.render.data.ReportData.cached`)
    decides what is computed once."""

    def __init__(self, path: Path, export: "Export", model: "PhaseModel") -> None:
        self.path = Path(path)
        self.export = export
        self.model = model

    # ------------------------------------------------------------------ breakdown
    def ranks(self) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.breakdown.ranks`: ``global_pid, pid, device`` by pid, device."""
        from tracekit.analyze.sections import breakdown

        return breakdown.ranks(self.model)

    def rank_windows(self) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.breakdown.rank_windows`: the phase windows once per rank
        (their columns plus ``device``)."""
        from tracekit.analyze.sections import breakdown

        return breakdown.rank_windows(self.model)

    def self_segments(self, windows: "pl.DataFrame") -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.breakdown.self_segments` of rows of :meth:`rank_windows`:
        ``global_pid, device, iteration, sub_phase, s, e`` (ns)."""
        from tracekit.analyze.sections import breakdown

        return breakdown.self_segments(self.model, windows)

    def sub_phase_table(self, phase: str) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.breakdown.sub_phase_table`: ``phase`` by sub-phase, per
        rank (``global_pid``) and iteration."""
        from tracekit.analyze.sections import breakdown

        return breakdown.sub_phase_table(self.model, phase)

    # ------------------------------------------------------------------ transfers
    def memory_timeline(self) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.memory.memory_timeline`: ``global_pid, device, time,
        bytes_in_use`` (device memory kinds). Raises :class:`tracekit.errors.MissingDataError`
        without memory events."""
        from tracekit.analyze.sections import memory

        return memory.memory_timeline(self.export)

    def memory_peaks(self, by: tuple[str, ...]) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.memory.memory_peaks` per rank and group ``by``
        (``peak_bytes``). Raises :class:`tracekit.errors.MissingDataError` without memory events."""
        from tracekit.analyze.sections import memory

        return memory.memory_peaks(self.export, self.model, by=by)

    def pcie_series(self) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.pcie_metrics.pcie_series`: one row per PCIe sample
        (``device, type_id, direction, start, time, value_pct``). Raises
        :class:`tracekit.errors.MissingDataError` without GPU metrics."""
        from tracekit.analyze.sections import pcie_metrics

        return pcie_metrics.pcie_series(self.export)

    def overlap(self, by: tuple[str, ...]) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.overlap.overlap` per rank and group ``by``
        (``h2d_/d2h_`` ``count, busy_ns, overlap_ns``, ...)."""
        from tracekit.analyze.sections import overlap

        return overlap.overlap(self.model, by=by)

    def contention_windows(self) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.contention.contention_windows`: one row per window."""
        from tracekit.analyze.sections import contention

        return contention.contention_windows(self.model)

    def copy_sizes(self, by: tuple[str, ...], directions: tuple[str, ...]) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.copy_sizes.copy_sizes` per rank, group ``by``, direction,
        host memory kind and power-of-two bucket."""
        from tracekit.analyze.sections import copy_sizes

        return copy_sizes.copy_sizes(self.model, by=by, directions=directions)

    def pageable_summary(self, by: tuple[str, ...]) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.pageable.pageable_summary` per rank, group ``by`` and
        direction (``count, bytes, copy_ns, saving_ns``)."""
        from tracekit.analyze.sections import pageable

        return pageable.pageable_summary(self.model, by=by, export=self.export)

    # ------------------------------------------------------------------ idle time, advice
    def idle_windows(self) -> "tuple[pl.DataFrame, pl.DataFrame]":
        """:func:`tracekit.analyze.sections.idle.idle_windows`: the idle breakdown per phase row,
        and the CUDA API calls it read."""
        from tracekit.analyze.sections import idle

        return idle.idle_windows(self.model, self.export)

    def idle_breakdown_of(self, intervals: "pl.DataFrame", keys: tuple[str, ...]) -> "pl.DataFrame":
        """:func:`tracekit.analyze.sections.idle.breakdown_of`: the idle categories (ns) of
        ``intervals`` (``global_pid, device, start, end`` and ``keys``)."""
        from tracekit.analyze.sections import idle

        return idle.breakdown_of(self.model, self.export, intervals, keys)

    def advise(self, loaded: dict) -> dict:
        """:func:`tracekit.analyze.sections.advice.advise` with ``loaded``
        (:func:`tracekit.analyze.trace.dsconfig.load`): ``config, advice, one_time_costs,
        predictions``."""
        from tracekit.analyze.sections import advice

        return advice.advise(self.export, self.model, loaded)

    def update_pieces(self) -> list[dict]:
        """:func:`tracekit.analyze.sections.whatif.measure`: the what-if model's measured pieces,
        one dict per rank (``global_pid, pid, device, roles, iteration_ns, ...``)."""
        from tracekit.analyze.sections import whatif

        return whatif.measure(self.export, self.model)


def run_settings(path: Path, pieces: dict | None, ds_config=None) -> tuple[list[dict], dict]:
    """The DeepSpeed settings of the run of trace ``path``: the rows of
    :func:`tracekit.analyze.trace.dsconfig.settings` (``key, value, source, how``; from
    ``ds_config``, else the manifest beside the trace) plus what the trace shows of the keys
    the config leaves unknown (``source: "trace"``, from one rank's ``pieces``), and their
    ``{key: value}`` map as the what-if model reads it. Raises :class:`tracekit.errors.TracekitError`
    for a bad ``ds_config`` file."""
    from tracekit.analyze.sections import advice, whatif
    from tracekit.analyze.trace import dsconfig

    loaded = dsconfig.load(path, ds_config)
    inferred = dsconfig.infer_settings(whatif.trace_facts(pieces)) if pieces else {}
    rows = dsconfig.settings(loaded, inferred)
    have = {r["key"] for r in rows if r["value"] is not None}
    for k, (v, how) in inferred.items():  # what the config leaves unknown but the trace shows
        if k not in have and loaded.get("deepspeed_config") is not None:
            rows.append({"key": k, "value": v, "source": "trace", "how": how})
    return rows, advice.settings_map(rows)


def update_roles() -> tuple[str, ...]:
    """The update's DeepSpeed steps the what-if model times, in order
    (:data:`tracekit.analyze.sections.whatif.ROLES`: overflow check, unscale, copy-back, ...)."""
    from tracekit.analyze.sections import whatif

    return tuple(whatif.ROLES)


def gpu_optimizer(settings: dict) -> str:
    """The GPU optimizer implementation of a run with ``settings`` (``{key: value}``), as the
    no_offload scenario's ``gpu_optimizer`` change names it
    (:func:`tracekit.analyze.sections.whatif.gpu_step_bytes`)."""
    from tracekit.analyze.sections import whatif

    return whatif.gpu_step_bytes(settings)[0]


def what_if(pieces: dict, settings: dict, changes: dict) -> list[dict]:
    """Every scenario of :func:`tracekit.analyze.sections.whatif.predict` for one rank's
    ``pieces`` (:meth:`SectionData.update_pieces`) with ``settings`` and ``changes``: predicted
    and baseline ns per steady iteration, saving, basis, confidence."""
    from tracekit.analyze.sections import whatif

    return whatif.predict(pieces, settings, changes)


def advice_items(pieces: dict, scenarios: list[dict], settings: dict) -> list[dict]:
    """:func:`tracekit.analyze.sections.advice.build_advice`: the advice items of one rank from its
    ``pieces``, the ``scenarios`` of :func:`what_if` and ``settings``; largest saving first."""
    from tracekit.analyze.sections import advice

    return advice.build_advice(pieces, scenarios, settings)
