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

#: Finest ``--bin-ms``: 1 us. The shortest host<->device copy in a real trace takes about 0.7 us
#: and a copy's bytes are spread evenly over its duration, so a finer bin only slices single
#: copies (more rows, no more detail); below 1 ns it would also round to a zero-length bin.
MIN_BIN_MS = 0.001
#: Widest ``--bin-ms``: 1e9 ms (11.6 days), longer than any capture (one bin already), and its
#: width in ns (1e15) far inside int64, which the timeline's bin edges are (issue 25: 1e15 ms overflowed).
MAX_BIN_MS = 1e9


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
        bin_ms: bin width of the copy throughput timeline (``timeline`` section), ms, at least
            :data:`MIN_BIN_MS` and at most :data:`MAX_BIN_MS`; the number of bins is bounded per trace too
            (:data:`tracekit.analyze.sections.throughput.MAX_BINS`).
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
        if self.phase_map:
            check_phase_map(self.phase_map)
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
        if not (isinstance(self.bin_ms, (int, float)) and not isinstance(self.bin_ms, bool)
                and math.isfinite(self.bin_ms) and self.bin_ms > 0):
            raise TracekitError(f"--bin-ms {self.bin_ms}: must be a positive finite number of ms")
        if self.bin_ms > MAX_BIN_MS:
            raise TracekitError(
                f"--bin-ms {self.bin_ms:g}: above the {MAX_BIN_MS:g} ms (11.6 days) ceiling, longer than any capture; "
                f"a bin as long as the capture is one bin: use --bin-ms {MAX_BIN_MS:g} or less"
            )
        if self.bin_ms < MIN_BIN_MS:
            raise TracekitError(
                f"--bin-ms {self.bin_ms:g}: below the {MIN_BIN_MS:g} ms (1 us) floor; a host<->device copy "
                f"takes about 1 us, so finer bins only slice single copies; use --bin-ms {MIN_BIN_MS:g} or more"
            )

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


def check_phase_map(items) -> None:
    """Raise :class:`TracekitError`, one line naming the item and the problem, for a
    ``--phase-map`` item that is not ``PHASE=REGEX`` (PHASE forward, backward or update) or
    whose REGEX the matcher rejects. The matcher is polars (Rust's ``regex`` crate,
    https://docs.rs/regex/latest/regex/#syntax: no look-around, no backreferences), so the
    pattern is checked by it: ``update=(`` -> ``--phase-map 'update=(': invalid regular
    expression: unclosed group``. Imports polars only when called."""
    from tracekit.textsafe import clean

    for item in items:
        phase, sep, pattern = str(item).partition("=")
        shown = f"--phase-map '{clean(item)}'"
        if not sep or phase.strip() not in ("forward", "backward", "update") or not pattern:
            raise TracekitError(f"{shown}: expected PHASE=REGEX with PHASE one of forward, backward, update")
        problem = _regex_problem(pattern)
        if problem:
            raise TracekitError(f"{shown}: invalid regular expression: {problem}")


def _regex_problem(pattern: str) -> str | None:
    """What the matcher (polars) says is wrong with ``pattern``: the ``error:`` line of its
    message (``unclosed group``), with a note on the syntax when Python's ``re`` would accept the
    pattern; None when it compiles."""
    import re

    import polars as pl

    try:
        pl.Series([""], dtype=pl.String).str.contains(f"(?:{pattern})")
        return None
    except Exception as exc:  # polars' ComputeError, its message a multi-line regex-crate report
        text = str(exc)
    lines = [ln.strip() for ln in text.splitlines()]
    problem = next((ln[len("error:"):].strip() for ln in lines if ln.startswith("error:")), None)
    problem = problem or " ".join(lines[0].split())[:160]
    try:
        re.compile(pattern)
    except re.error:
        return problem
    return f"{problem} (the matcher takes Rust regex syntax)"


def load_ds_config(trace: str | Path, ds_config: str | Path | None) -> dict | None:
    """The ``ds_config`` option for ``trace``: :func:`tracekit.analyze.trace.dsconfig.load` of the
    given file, else of the manifest beside a trace file (None for a directory or glob)."""
    from tracekit.analyze.trace import dsconfig  # no polars

    if ds_config is not None or Path(trace).is_file():
        return dsconfig.load(Path(trace), Path(ds_config) if ds_config is not None else None)
    return None
