"""Several traces through the one pipeline: ``tracekit.analyze_many(paths, **options) -> ManyAnalysis``.

Each trace is analyzed by :func:`tracekit.analyze.multi.analyze_many` (worker processes, Dask),
whose per-trace work is :func:`tracekit.analysis.analyze`; the results come back as one
:class:`~tracekit.analysis.Analysis` per trace. Kept apart from :mod:`tracekit.analysis` so that
imports go one way: this module imports multi.py, multi.py imports analysis.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.analysis import Analysis
from tracekit.options import Options

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

__all__ = ["ManyAnalysis", "analyze_many"]


class ManyAnalysis:
    """Several traces analyzed with the same options (:func:`analyze_many`).

    Attributes:
        traces: one :class:`Analysis` per trace that could be analyzed, in input order.
        failed: ``[{"trace", "error" (one line), "exit_code"}]`` for the others.
        summary: the comparison across ranks (:func:`tracekit.analyze.multi.summarize_ranks`, ns).
        run: the traces as one job (:func:`tracekit.analyze.run_join.run_json`: hosts, clock
            alignment, host contention and waiting ranks across the files), None for one trace.
    """

    def __init__(self, traces: list[Analysis], failed: list[dict], summary: dict, run: dict | None = None) -> None:
        self.traces, self.failed, self.summary, self.run = traces, failed, summary, run

    def to_json(self) -> dict:
        """What ``tracekit analyze A B ... --json`` prints: ``{"traces": [the single-trace shape
        of each, as :meth:`Analysis.to_json`], "failed": [...], "summary": {...}, "run": {...}}``
        (``run`` only when there is one)."""
        out = {"traces": [a.to_json() for a in self.traces], "failed": self.failed, "summary": self.summary}
        return out | ({"run": self.run} if self.run is not None else {})

    @property
    def phases(self) -> "pl.DataFrame":
        """:attr:`Analysis.phases` of every trace, with a ``trace`` column first."""
        import polars as pl

        parts = [a.phases.with_columns(trace=pl.lit(str(a.path))) for a in self.traces]
        if not parts:
            return pl.DataFrame()
        return pl.concat(parts, how="diagonal_relaxed").select("trace", pl.exclude("trace"))


def analyze_many(items, options: Options | dict | None = None, jobs: int | None = 1, dask: str | None = None,
                 expected_ranks: int | None = None, **kwargs) -> ManyAnalysis:
    """Analyze several traces (files, directories of ``*.sqlite``, glob patterns) with the same
    options, one after another in this process (``jobs=1``, the default), in ``jobs`` worker
    processes (``jobs=None``: as many as the CPU count and the traces allow; what ``tracekit
    analyze`` does) or on a running Dask scheduler (``dask="tcp://host:8786"``), and compare their
    ranks. Worker processes are spawned and re-import the calling script: with ``jobs`` other
    than 1, call this under ``if __name__ == "__main__":``. A trace that cannot be analyzed does
    not stop the others: it is listed in ``failed``. Raises :class:`TracekitError` for a missing
    input or an unreachable scheduler. See :func:`tracekit.analyze.multi.analyze_many`."""
    from tracekit.analyze import multi

    if options is None and "sections" not in kwargs:  # as tracekit.analyze(path): the --json sections
        from tracekit.analyze.sections import SECTIONS

        kwargs["sections"] = tuple(s for s in SECTIONS if s != "timeline")
    opts = Options.of(options, **kwargs)
    out = multi.analyze_many(items, opts, jobs=jobs, dask=dask, cache=opts.cache, expected_ranks=expected_ranks)
    return ManyAnalysis([Analysis(Path(r["trace"]), opts, r) for r in out["traces"]], out["failed"], out["summary"],
                        out.get("run"))
