"""The study's figures, one function each; every function returns ``(figure, frame)``.

The frame is exactly what was drawn (in ns, bytes and GB/s; the axes show ms/s, GB, GB/s),
so a test or a notebook can check or re-plot the numbers. Figures use the phase colours of
:data:`tracekit.render.style.PHASE_COLORS` everywhere.

1. :func:`iteration_breakdown` - per iteration, stacked phase wall time with the GPU-busy part;
2. :func:`iteration_timeline` - one iteration: GPU memory, H2D and D2H throughput, PCIe metrics,
   phase and update sub-phase bands;
3. :func:`copy_size_distribution` - copies per power-of-two size bucket, pinned vs pageable;
4. :func:`sub_phase_breakdown` - update sub-phases: time (GPU busy vs CPU only) and throughput;
5. :func:`overlap_contention` - hidden vs exposed copy time per phase, contention windows;
6. :func:`rank_summary` - per rank, mean phase time and copy volume per iteration;
7. :func:`idle_breakdown` - per phase, wall time split into GPU busy and the three kinds of
   GPU idle time of :mod:`tracekit.analyze.sections.idle` (docs/idle.md).

Errors: :class:`~tracekit.errors.TracekitError` for a rank or iteration the trace lacks.

This package is their index (:data:`FIGURES`); each family is a module of its own:
:mod:`~tracekit.render.figures.breakdowns` (1, 6, 7: stacked bars), :mod:`~tracekit.render.figures.timeline`
(2), :mod:`~tracekit.render.figures.copies` (3, 5), :mod:`~tracekit.render.figures.sub_phases` (4), and
:mod:`~tracekit.render.figures.common`, what they share (labels, titles, text safe for matplotlib).
"""

from tracekit.render.figures.breakdowns import idle_breakdown, iteration_breakdown, rank_summary
from tracekit.render.figures.common import iterations_note
from tracekit.render.figures.copies import copy_size_distribution, overlap_contention
from tracekit.render.figures.sub_phases import sub_phase_breakdown
from tracekit.render.figures.timeline import iteration_timeline

__all__ = ["FIGURES", "copy_size_distribution", "idle_breakdown", "iteration_breakdown", "iteration_timeline",
           "iterations_note", "overlap_contention", "rank_summary", "sub_phase_breakdown"]


#: Figure name (file stem) -> (function, title), in report order.
FIGURES = {
    "1_iteration_breakdown": (iteration_breakdown, "Iteration breakdown"),
    "2_iteration_timeline": (iteration_timeline, "One iteration in time"),
    "3_copy_sizes": (copy_size_distribution, "Copy-size distributions"),
    "4_update_sub_phases": (sub_phase_breakdown, "Update sub-phases"),
    "5_overlap_contention": (overlap_contention, "Overlap and contention"),
    "6_ranks": (rank_summary, "Per-rank summary"),
    "7_idle_breakdown": (idle_breakdown, "Where the GPU idle time goes"),
}
