"""The terminal table of the ``idle`` section (issue 22, docs/idle.md): per phase window, the
wall time split into GPU busy, waiting, in CUDA API calls and between them, with the launch
statistics beside it.

Reads only the analysis dict (``rank["transfers"]["idle"]``). Units on screen: ms (1e6 ns) for
times, us (1e3 ns) for launch and queue times; every figure is per phase window (not a mean).
"""

from __future__ import annotations

from rich.console import Console

from tracekit.vocab import fmt_ms, fmt_number

_KEY = ("iteration", "phase", "micro_step")


def _us(ns) -> str:
    return "" if ns is None else f"{ns / 1e3:,.1f}"


def _count(v) -> str:
    return fmt_number(v)


def idle_rows(section: dict) -> list[dict]:
    """The ``idle`` rows of the section with the ``launch_stats`` of the same window merged in."""
    stats = {tuple(r.get(k) for k in _KEY): r for r in section.get("launch_stats", [])}
    return [{**stats.get(tuple(r.get(k) for k in _KEY), {}), **r} for r in section.get("idle", [])]


def render_idle(console: Console, head: str, section: dict, wide: bool = True) -> None:
    """The one table of the section: ``head`` names the rank; ``wide`` False leaves out the
    columns of :data:`tracekit.render.section_table.NARROW_DROP`."""
    from tracekit.render.section_table import cell_text as _txt
    from tracekit.render.section_table import iteration_cell as _it
    from tracekit.render.section_table import phase_cell as _phase
    from tracekit.render.section_table import section_table as _table

    cols = [
        ("iter", _it, _txt), ("phase", _phase, _txt), ("wall ms", "wall_ns", fmt_ms),
        ("busy ms", "gpu_busy_ns", fmt_ms), ("waiting ms", "waiting_ns", fmt_ms),
        ("in API ms", "in_api_ns", fmt_ms), ("between API ms", "between_api_ns", fmt_ms),
        ("kernels", "kernel_count", _count), ("launch us", "launch_mean_ns", _us),
        ("launch p99 us", "launch_p99_ns", _us), ("queue p50 us", "queue_p50_ns", _us),
        ("kernel p50 us", "kernel_p50_ns", _us), ("shorter than launch", "short_kernels", _count),
    ]
    _table(console, f"{head}: where GPU idle time goes, per phase window (launch us: mean cudaLaunchKernel "
                    "and friends)", idle_rows(section), cols, wide=wide)
