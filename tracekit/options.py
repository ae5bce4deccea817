"""Every option of an analysis and its default, in one frozen dataclass (issue 10).

``tracekit analyze``, ``--out``, ``report``, ``compare``, many traces and Dask all build one
:class:`Options` and hand it to :func:`tracekit.analyze`; nothing else holds a default. No
polars here: the command line checks options and answers from the result cache without the
analysis stack.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from tracekit.analyze.sections import SECTIONS  # no polars
from tracekit.errors import TracekitError
from tracekit.vocab import PHASES


@dataclass(frozen=True)
class Options:
    """What to analyze and how. Units: ``pcie_threshold`` % of the link, ``bin_ms`` ms.

    Attributes:
        phase: narrow the tables and JSON to one phase (of :data:`tracekit.vocab.PHASES`) and add
            its sub-phase breakdown; None = all phases.
        iteration: narrow to one iteration index (the findings too); None = all.
        phase_map: ``PHASE=REGEX`` items on NVTX range names (:func:`tracekit.analyze.model.phases.build`).
        gas: gradient accumulation steps, used only when updates must be inferred.
        sections: transfer sections shown in detail (:data:`SECTIONS`); the findings are
            computed whatever is selected.
        pcie_threshold: PCIe saturation threshold, % of the link (``pcie`` section), in (0, 100].
        bin_ms: bin width of the copy throughput timeline (``timeline`` section), ms, > 0.
        ds_config: the run's DeepSpeed config as :func:`tracekit.analyze.trace.dsconfig.load` returns
            it; None = the capture manifest beside the trace, if any.
        cache: keep and use the Parquet/result cache beside the trace (not part of the result).

    Raises :class:`TracekitError` (one line) for a value out of range.
    """

    phase: str | None = None
    iteration: int | None = None
    phase_map: tuple[str, ...] | None = None
    gas: int | None = None
    sections: tuple[str, ...] = ()
    pcie_threshold: float = 80.0
    bin_ms: float = 1.0
    ds_config: dict | None = None
    cache: bool = True

    def __post_init__(self) -> None:
        if self.phase_map is not None and not isinstance(self.phase_map, tuple):
            object.__setattr__(self, "phase_map", tuple(self.phase_map) or None)
        if not isinstance(self.sections, tuple):
            object.__setattr__(self, "sections", tuple(self.sections or ()))
        if self.phase is not None and self.phase not in PHASES:
            raise TracekitError(f"--phase {self.phase!r}: choose one of {', '.join(PHASES)}")
        if self.gas is not None and (isinstance(self.gas, bool) or int(self.gas) != self.gas or self.gas < 1):
            raise TracekitError("--gas must be a positive integer")
        unknown = [s for s in self.sections if s not in SECTIONS]
        if unknown:
            raise TracekitError(f"--section {unknown[0]!r}: choose from {', '.join(SECTIONS)} (or all)")
        if not (isinstance(self.pcie_threshold, (int, float)) and 0 < self.pcie_threshold <= 100):
            raise TracekitError("--pcie-threshold must be in (0, 100]")
        if not (isinstance(self.bin_ms, (int, float)) and math.isfinite(self.bin_ms) and self.bin_ms > 0):
            raise TracekitError(f"--bin-ms {self.bin_ms}: must be a positive finite number of ms")

    @property
    def bin_ns(self) -> int:
        """:attr:`bin_ms` in ns (at least 1)."""
        return max(1, int(round(self.bin_ms * 1e6)))

    def replace(self, **changes) -> "Options":
        """A copy with ``changes`` (checked like a new one)."""
        return dataclasses.replace(self, **changes)

    def key(self) -> dict:
        """The fields that change a result, as a JSON-ready dict (the result cache's key;
        :attr:`cache` is left out)."""
        d = dataclasses.asdict(self)
        d.pop("cache")
        d["phase_map"] = list(d["phase_map"]) if d["phase_map"] else None
        d["sections"] = list(d["sections"])
        return d

    @classmethod
    def of(cls, options: "Options | dict | None" = None, **overrides) -> "Options":
        """``options`` (an :class:`Options`, a dict of its fields, or None = the defaults) with
        ``overrides``. Raises :class:`TracekitError` for an unknown field."""
        if options is None:
            base: dict = {}
        elif isinstance(options, Options):
            base = {f.name: getattr(options, f.name) for f in dataclasses.fields(cls)}
        else:
            base = dict(options)
        base.update(overrides)
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(base) - names)
        if bad:
            raise TracekitError(f"unknown analysis option {bad[0]!r}: choose from {', '.join(sorted(names))}")
        return cls(**base)


def load_ds_config(trace: str | Path, ds_config: str | Path | None) -> dict | None:
    """The ``ds_config`` option for ``trace``: :func:`tracekit.analyze.trace.dsconfig.load` of the
    given file, else of the manifest beside a trace file (None for a directory or glob)."""
    from tracekit.analyze.trace import dsconfig  # no polars

    if ds_config is not None or Path(trace).is_file():
        return dsconfig.load(Path(trace), Path(ds_config) if ds_config is not None else None)
    return None
