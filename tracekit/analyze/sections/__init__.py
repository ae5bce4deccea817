"""The sections of an analysis: pure functions of the model (:mod:`tracekit.analyze.model`) that
return polars frames, one module each, and the registry that says what each section is.

:data:`REGISTRY` holds one :class:`Section` per ``--section`` name: the frames it adds (the first
is its main table), the columns that identify each frame's rows (as :attr:`tracekit.analysis.Analysis.frames` shows them: ``pid`` is the OS pid), the nsys tables it reads beyond
the CUDA kernels and copies every section needs, the nsys option that records them, and the topics
of the findings it feeds (:func:`tracekit.analyze.sections.findings.build_findings`). The command
line's ``--section`` choices and help, ``--out``'s frame list, the JSON's section frames and the
"the trace lacks ..." notes all read it.

This module imports no polars (the command line parses ``--section`` and answers from the result
cache without loading the analysis stack); the section modules beside it do.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.errors import TracekitError

#: the tables every section reads (recorded by ``nsys profile -t cuda``)
BASE_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY")
#: the keys of a per-window frame (one row per rank, iteration, phase and micro-step)
WINDOW_KEYS = ("pid", "device", "iteration", "phase", "micro_step")
PHASE_KEYS = ("pid", "device", "phase")


@dataclass(frozen=True)
class Section:
    """One ``--section``: see the module doc."""

    name: str
    module: str  #: the module under tracekit.analyze.sections that computes it
    doc: str  #: one line for ``--section``'s help and docs/transfers.md
    frames: tuple[str, ...]  #: frames it adds, main table first
    keys: dict[str, tuple[str, ...]]  #: per frame, the columns that identify a row
    tables: tuple[str, ...] = ()  #: nsys tables read beyond :data:`BASE_TABLES`
    findings: tuple[str, ...] = ()  #: topics of the findings its frames feed
    file_only: tuple[str, ...] = ()  #: frames too long for ``--json`` (one row per event/sample): ``--out`` only

    @property
    def nsys_option(self) -> str:
        """The ``nsys profile`` option that records :attr:`tables` (``-t cuda`` for the base)."""
        from tracekit.analyze.trace.enums import RECORDED_BY  # plain constants, no polars

        opts = [RECORDED_BY.get(t, "-t cuda") for t in self.tables] or ["-t cuda"]
        return " ".join(dict.fromkeys(opts))

    def missing_note(self, table: str) -> str:
        """The note printed when the trace lacks ``table``: what is unknown, and how to record it."""
        return (f"{self.name}: skipped, {table} is missing; record it with "
                f"`nsys profile {self.nsys_option}`")


REGISTRY: dict[str, Section] = {s.name: s for s in (
    Section("overlap", "overlap", "copy time hidden under kernels, per window, phase, sub-phase and rank",
            ("overlap", "overlap_phase", "overlap_sub_phase", "overlap_total"),
            {"overlap": WINDOW_KEYS, "overlap_phase": PHASE_KEYS,
             "overlap_sub_phase": ("pid", "device", "iteration", "phase", "sub_phase"),
             "overlap_total": ("pid", "device")},
            findings=("exposed-copies",)),
    Section("contention", "contention", "H2D and D2H in flight at once: windows, summaries, uncontended GB/s",
            ("contention", "contention_phase", "contention_sub_phase", "contention_windows", "uncontended_bandwidth"),
            {"contention": WINDOW_KEYS, "contention_phase": PHASE_KEYS,
             "contention_sub_phase": ("pid", "device", "iteration", "phase", "sub_phase"),
             "contention_windows": ("pid", "device", "start"),
             "uncontended_bandwidth": ("direction", "host_kind")},
            findings=("contention",)),
    Section("sizes", "copy_sizes", "copies by size bucket and phase",
            ("copy_sizes",), {"copy_sizes": ("pid", "device", "phase", "direction", "host_kind", "bucket")}),
    Section("pageable", "pageable", "pageable (unpinned) host copies and what pinning would save",
            ("pageable", "pageable_phase", "pageable_copies", "pinned_bandwidth"),
            {"pageable": WINDOW_KEYS, "pageable_phase": ("pid", "device", "phase", "sub_phase"),
             "pageable_copies": ("pid", "device", "start"),
             "pinned_bandwidth": ("direction", "bucket")},
            findings=("pageable",)),
    Section("memory", "memory", "GPU memory peaks per window and phase (the event timeline goes to --out)",
            ("memory_peaks", "memory_phase", "memory_timeline"),
            {"memory_peaks": WINDOW_KEYS, "memory_phase": PHASE_KEYS,
             "memory_timeline": ("pid", "device", "time")},
            tables=("CUDA_GPU_MEMORY_USAGE_EVENTS",), findings=("update",), file_only=("memory_timeline",)),
    Section("timeline", "throughput", "copy throughput in time bins (--bin-ms)",
            ("throughput_timeline",), {"throughput_timeline": ("pid", "device", "direction", "bin_start")}),
    Section("pcie", "pcie_metrics", "PCIe RX/TX of GPU_METRICS per window and phase, saturation (slower)",
            ("pcie", "pcie_phase", "pcie_saturation", "pcie_series"),
            {"pcie": WINDOW_KEYS, "pcie_phase": PHASE_KEYS, "pcie_saturation": ("pid", "device", "direction", "start"),
             "pcie_series": ("pid", "device", "direction", "time")},
            tables=("GPU_METRICS", "TARGET_INFO_GPU_METRICS"), findings=("pcie", "pcie-cross-check"),
            file_only=("pcie_series",)),
    Section("opportunities", "opportunities", "gradient round trips and the overlap the CPU update leaves",
            ("round_trips", "round_trip_summary", "update_opportunity"),
            {"round_trips": ("pid", "device", "iteration", "micro_step"), "round_trip_summary": ("pid", "device"),
             "update_opportunity": ("pid", "device", "iteration")},
            tables=("NVTX_EVENTS",), findings=("gradient-round-trip", "update")),
    Section("idle", "idle", "where GPU idle time goes (busy, waiting, in CUDA API calls, between them) and launch cost",
            ("idle", "idle_by_api", "idle_sub_phase", "launch_stats"),
            {"idle": WINDOW_KEYS, "idle_by_api": (*WINDOW_KEYS, "name"),
             "idle_sub_phase": ("pid", "device", "iteration", "phase", "sub_phase"),
             "launch_stats": WINDOW_KEYS},
            tables=("CUPTI_ACTIVITY_KIND_RUNTIME",), findings=("idle",)),
)}

SECTIONS: tuple[str, ...] = tuple(REGISTRY)
#: frames shown/serialized per section (the first is the main table)
SECTION_FRAMES: dict[str, list[str]] = {s.name: list(s.frames) for s in REGISTRY.values()}
#: frames too long for --json (one row per event/sample); written with --out only
FILE_ONLY: frozenset[str] = frozenset(f for s in REGISTRY.values() for f in s.file_only)


def section_of(frame: str) -> Section | None:
    """The section that adds ``frame`` (None for the phase frames every analysis has)."""
    for s in REGISTRY.values():
        if frame in s.frames:
            return s
    return None


def choices_help() -> str:
    """``--section``'s choices, for its help text."""
    return ", ".join(SECTIONS)


def parse_sections(text: list[str] | str | None, all_: bool = False) -> tuple[str, ...]:
    """``"overlap,pageable"`` (or a list of such) -> sections; raises TracekitError for unknown."""
    if all_:
        return SECTIONS
    if not text:
        return ()
    items = [text] if isinstance(text, str) else list(text)
    out = []
    for item in items:
        for s in str(item).split(","):
            s = s.strip()
            if not s:
                continue
            if s == "all":
                return SECTIONS
            if s not in REGISTRY:
                raise TracekitError(f"--section {s!r}: choose from {', '.join(SECTIONS)} (or all)")
            if s not in out:
                out.append(s)
    return tuple(out)
