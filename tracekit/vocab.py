"""tracekit's vocabulary: phases and their order, phase labels, units and their formatting,
rank and pid helpers. Every module that names a phase, prints a number or turns an nsys
``globalPid`` into an OS pid uses these (issue 10); none imports polars at module level, so
the command line can answer from the result cache without the analysis stack.

Units: times in ns, sizes in bytes, rates in GB/s = 1e9 B/s (bytes per ns). On screen: ms
(1e6 ns), MB (1e6 B), GB (1e9 B), GB/s, % (of a share 0..1).
"""

from __future__ import annotations

from collections.abc import Mapping

#: The phases of an iteration, in display order. ``other`` is time in no phase window
#: (gaps inside an iteration, start-up and tail outside iterations).
PHASES: tuple[str, ...] = ("forward", "backward", "update", "other")
#: phase -> position in :data:`PHASES` (sort key); unknown phases sort last (:func:`phase_rank`).
PHASE_ORDER: dict[str, int] = {p: i for i, p in enumerate(PHASES)}
#: Phases split into micro-steps under gradient accumulation (labelled ``forward 0``, ...).
MICRO_STEP_PHASES: tuple[str, ...] = ("forward", "backward")
#: Sub-phase of time in a phase window with no NVTX range of its own open.
NO_SUB_PHASE = "(none)"

#: Phase source of a process in a trace without NVTX ranges, and the note printed for it: the
#: whole trace is reported, all of its GPU work as ``other``.
NO_NVTX = "no NVTX"
#: The note of a trace whose kernel table is empty or missing although it has copies
#: (``transfer_notes``; the short screen prints it): its GPU busy time is the copies' only.
NO_KERNELS_NOTE = ("no CUDA kernels in this trace (CUPTI_ACTIVITY_KIND_KERNEL empty or missing): GPU busy and "
                   "idle count copies only, compute-based numbers are 0 and the advice rests on the copies; "
                   "record with `nsys profile -t cuda` over a window where the GPU computes")
NO_NVTX_NOTE = ("no NVTX ranges in this trace: phases cannot be told apart, so the report covers the whole "
                "trace and all its GPU work is 'other'; record with `nsys profile -t cuda,nvtx` and "
                "`tracekit capture` for forward, backward and update")



def no_iteration_reason(no_nvtx: bool) -> str:
    """Why a rank has no iteration, for ``report`` and ``compare``'s one-line error: the trace
    has no NVTX at all (``no_nvtx``), or no phase ranges among its NVTX ranges."""
    if no_nvtx:
        return ("(no NVTX ranges in this trace: phases cannot be told apart; record with `nsys profile -t "
                "cuda,nvtx` and `tracekit capture`; `tracekit analyze` reports the whole trace)")
    return "(no forward/backward/update NVTX ranges; see --phase-map)"


#: ns per ms, bytes per MB / GB (decimal units, as nsys reports them).
NS_PER_MS = 1e6
B_PER_MB = 1e6
B_PER_GB = 1e9

#: nsys globalTid / globalPid layout: OS pid in bits 24..47, thread id in bits 0..23.
PID_SHIFT = 24
TID_MASK = (1 << PID_SHIFT) - 1


def phase_rank(phase: str | None) -> int:
    """Position of ``phase`` in :data:`PHASES` (9 for anything else, so it sorts last)."""
    return PHASE_ORDER.get(phase, 9)  # type: ignore[arg-type]


def phase_label(row: Mapping, inferred: bool = True) -> str:
    """How a phase row is named on screen: ``forward 1`` (micro-step of forward/backward),
    ``backward 1 *`` (the gradient-accumulation boundary backward), ``update (inferred)``
    (an update inferred from gaps; left out with ``inferred=False``). ``row`` has ``phase`` and
    optionally ``micro_step``, ``boundary``, ``inferred``."""
    label = row.get("phase") or ""
    if row.get("micro_step") is not None and label in MICRO_STEP_PHASES:
        label += f" {row['micro_step']}"
    if row.get("boundary"):
        label += " *"
    if inferred and row.get("inferred"):
        label += " (inferred)"
    return label


def short_name(name: str | None, width: int = 38) -> str:
    """A short label for an NVTX range name (a sub-phase), as the figures draw it: the part after
    the last ``.`` (the method of ``Class.method``), cut to ``width`` characters with ``…``.
    ``None`` is :data:`NO_SUB_PHASE`."""
    if name is None:
        return NO_SUB_PHASE
    short = name.rsplit(".", 1)[-1] if "." in name and not name.startswith("(") else name
    if len(short) > width:
        short = short[: max(width - 1, 1)] + "…"
    return short


# ---------------------------------------------------------------------- pids
def os_pid(global_pid: int) -> int:
    """Operating-system pid of an nsys ``globalPid`` / ``globalTid`` (bits 24..47)."""
    return (int(global_pid) >> PID_SHIFT) & TID_MASK


def global_pid_of(global_tid: int) -> int:
    """The ``globalPid`` of an nsys ``globalTid`` (the thread id's low bits cleared)."""
    return int(global_tid) & ~TID_MASK


def global_pid_expr(expr):
    """:func:`global_pid_of` of a polars expression (a ``globalTid`` column)."""
    return (expr // (TID_MASK + 1)) * (TID_MASK + 1)


def os_pid_expr(expr):
    """:func:`os_pid` of a polars expression (``globalPid`` or ``globalTid`` column)."""
    return (expr // (TID_MASK + 1)) % (TID_MASK + 1)


def rank_label(rank: Mapping) -> str:
    """``pid P device D`` of a rank dict (``pid`` = OS pid), with ``rank R`` first when the
    rank carries a distributed rank number."""
    base = f"pid {rank['pid']} device {rank['device']}"
    return f"rank {rank['rank']} ({base})" if rank.get("rank") is not None else base


# ---------------------------------------------------------------------- numbers on screen
def _num(x: float, digits: int) -> str:
    s = f"{x:,.{digits}f}"
    return s[1:] if s.startswith("-") and s.strip("-0.,") == "" else s  # no "-0.0"


def fmt_ms(ns, digits: int = 2, missing: str = "") -> str:
    """ns as ms with ``digits`` decimals and thousands separators (``1,234.57``)."""
    return missing if ns is None else _num(ns / NS_PER_MS, digits)


def fmt_mb(nbytes, digits: int = 1, missing: str = "", zero: str | None = None) -> str:
    """bytes as MB (1e6 B); ``zero`` replaces an exact 0 when given (tables leave it blank)."""
    if nbytes is None:
        return missing
    if zero is not None and not nbytes:
        return zero
    return _num(nbytes / B_PER_MB, digits)


def fmt_gb(nbytes, digits: int = 2, missing: str = "") -> str:
    """bytes as GB (1e9 B)."""
    return missing if nbytes is None else _num(nbytes / B_PER_GB, digits)


def fmt_gbps(gbps, digits: int = 1, missing: str = "") -> str:
    """A rate already in GB/s (1e9 B/s = bytes per ns)."""
    return missing if gbps is None else _num(gbps, digits)


def fmt_pct(share, digits: int = 0, missing: str = "") -> str:
    """A share 0..1 as a percentage (``0.287`` -> ``29%``)."""
    return missing if share is None else f"{100 * share:.{digits}f}%"


def fmt_count(v, missing: str = "") -> str:
    """A count (or mean count): integral values without decimals (``1,024``), others with one."""
    if v is None:
        return missing
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.1f}"


def fmt_number(v, missing: str = "") -> str:
    """Any number: an int with separators, a float with two decimals."""
    if v is None:
        return missing
    return f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"


def fmt_size(nbytes, missing: str = "") -> str:
    """A copy size in binary units (``64 KiB``, ``2 MiB``), as the size buckets are."""
    if nbytes is None:
        return missing
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= f:
            return f"{nbytes / f:g} {unit}"
    return f"{nbytes} B"


def fmt_mb_at(nbytes, gbps) -> str:
    """``MB @ GB/s`` in one cell (``268.4 @ 6.6``); the rate left out when unknown, blank
    without bytes. A size that would show as 0.0 MB (< 50 kB) says its unit instead
    (``512 B``, ``12.3 kB``), and so does a rate under 0.05 GB/s (``3.2 MB/s``): never
    ``0.0 @ 0.0``."""
    if not nbytes:
        return ""
    if nbytes < 1000:
        mb = f"{nbytes:,.0f} B"
    elif nbytes < 50_000:
        mb = f"{nbytes / 1000:,.1f} kB"
    else:
        mb = fmt_mb(nbytes)
    if gbps is None:
        return mb
    rate = f"{gbps * 1000:,.1f} MB/s" if gbps < 0.05 else fmt_gbps(gbps)
    return f"{mb} @ {rate}"


#: The units line printed under tables (what each abbreviation means).
UNITS_LINE = "ms = 1e6 ns, MB = 1e6 B, GB = 1e9 B, GB/s = 1e9 B/s"


# ---------------------------------------------------------------------- JSON numbers
#: Key suffixes of quantities that are integral by nature (ns, bytes, counts): a float of
#: such a key that holds an integral value (a mean over 2 iterations, say) is written as an int.
INTEGRAL_SUFFIXES = ("_ns", "_bytes", "count", "_pid", "samples", "windows")


def json_number(key: str, v):
    """``v`` as the JSON holds it: floats rounded to 6 decimals, NaN and inf as None (JSON has
    neither), an integral float of an ns/bytes/count key (:data:`INTEGRAL_SUFFIXES`) as an int."""
    if not isinstance(v, float):
        return v
    if v != v or v in (float("inf"), float("-inf")):
        return None
    if v.is_integer() and key.endswith(INTEGRAL_SUFFIXES) and abs(v) < 2**53:
        return int(v)
    return round(v, 6)


# ---------------------------------------------------------------------- report tables (issue 23)
#: Divisor of :data:`COLUMNS` for a share 0..1 shown as a percentage (``71%``).
PERCENT = 0.01

#: Column key -> (name, unit, divisor from the key's unit to the shown one): the one mapping the
#: report tables (``report.md``, ``report.html``) label columns by and ``compare`` names its
#: metrics by. Keys are the frame columns and JSON keys (ns, bytes, shares 0..1, GB/s, counts);
#: the label is ``name unit`` (:func:`column_label`: ``H2D GB/s``; a share, unit ``%``, is the
#: name alone, its cells say ``71%``); a key not here is shown with ``_`` as spaces.
COLUMNS: dict[str, tuple[str, str, float]] = {
    "iteration": ("iteration", "", 1), "phase": ("phase", "", 1), "note": ("note", "", 1),
    "sub_phase": ("sub-phase", "", 1),
    "wall_ns": ("wall", "ms", NS_PER_MS), "share": ("share", "%", PERCENT),
    "gpu_busy_ns": ("GPU busy", "ms", NS_PER_MS), "gpu_idle_ns": ("GPU idle", "ms", NS_PER_MS),
    "gpu_idle_share": ("GPU idle", "%", PERCENT), "cpu_only_ns": ("CPU only", "ms", NS_PER_MS),
    "waiting_ns": ("waiting on collectives", "ms", NS_PER_MS), "in_api_ns": ("in CUDA API calls", "ms", NS_PER_MS),
    "between_api_ns": ("between CUDA API calls", "ms", NS_PER_MS),
    "h2d_bytes": ("H2D", "MB", B_PER_MB), "d2h_bytes": ("D2H", "MB", B_PER_MB),
    "h2d_gbps": ("H2D", "GB/s", 1), "d2h_gbps": ("D2H", "GB/s", 1),
    "h2d_exposed_ns": ("H2D exposed", "ms", NS_PER_MS), "d2h_exposed_ns": ("D2H exposed", "ms", NS_PER_MS),
    "overlap_ratio": ("copy time hidden", "%", PERCENT), "pageable_count": ("pageable copies", "", 1),
    "pageable_bytes": ("pageable", "MB", B_PER_MB), "peak_bytes": ("GPU memory peak", "GB", B_PER_GB),
}

#: The idle categories of :mod:`tracekit.analyze.sections.idle` (docs/idle.md) as the report
#: names them, in stacking order (busy at the bottom): key -> short name.
IDLE_CATEGORIES: dict[str, str] = {
    "gpu_busy_ns": "GPU busy",
    "in_api_ns": "in CUDA API calls",
    "between_api_ns": "between CUDA API calls",
    "waiting_ns": "waiting on collectives",
}

#: Knob names of the advice as written by the analysis -> as the report shows them: one wording
#: for advice that no DeepSpeed key sets (the JSON keeps the analysis' text).
_KNOB_WORDS = (("(no config key)", "(not a config key)"),)


def column_label(key: str) -> str:
    """The on-screen label of a column key (:data:`COLUMNS`): ``h2d_gbps`` -> ``H2D GB/s``,
    ``wall_ns`` -> ``wall ms``; an unknown key with its underscores as spaces."""
    if key not in COLUMNS:
        return key.replace("_", " ")
    name, unit, _div = COLUMNS[key]
    return name if unit in ("", "%") else f"{name} {unit}"


def knob_label(knob: str | None) -> str:
    """An advice knob as the report shows it (:data:`_KNOB_WORDS`)."""
    text = knob or ""
    for old, new in _KNOB_WORDS:
        text = text.replace(old, new)
    return text


def fmt_plain(v, missing: str = "–") -> str:
    """A number in fixed notation with a sensible precision, never e-notation: one decimal from
    10 up (thousands separated), two from 1 up, three significant digits below (``0.0160``),
    ``0`` for zero, ``<0.000001`` / ``>-0.000001`` for what rounds away; ``true`` / ``false``
    for a bool, ``missing`` for None or NaN, other values as ``str``."""
    if v is None:
        return missing
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v:,}"
    if not isinstance(v, float):
        return str(v)
    if v != v:
        return missing
    if v in (float("inf"), float("-inf")):
        return "∞" if v > 0 else "-∞"
    a = abs(v)
    if a >= 10:
        return _num(v, 1)
    if a >= 1:
        return _num(v, 2)
    if a == 0:
        return "0"
    if a < 1e-6:
        return "<0.000001" if v > 0 else ">-0.000001"
    import math

    digits = min(6, 2 - math.floor(math.log10(a)))
    return f"{v:.{digits}f}"


def fmt_column(key: str, v, missing: str = "–") -> str:
    """``v`` of column ``key`` (in the key's unit: ns, bytes, share 0..1, GB/s) in the unit of
    :func:`column_label` (ms, MB, GB; a share as ``71%``), formatted by :func:`fmt_plain`; a count without
    decimals; a bool as ``true`` / ``false``."""
    if v is None or isinstance(v, (bool, str)):
        return fmt_plain(v, missing)
    div = COLUMNS[key][2] if key in COLUMNS else 1
    if div == PERCENT:
        if isinstance(v, float) and v != v:
            return missing
        return "<1%" if 0 < v < 0.005 else fmt_pct(v, 0)
    if key.endswith("count"):
        return fmt_count(v, missing)
    return fmt_plain(v / div if div != 1 else v, missing)


def fmt_change(base, new, digits: int = 0) -> str:
    """The relative change from ``base`` to ``new`` as ``+12%``; never a percentage of zero:
    ``new`` when ``base`` is 0 and ``new`` is not, ``–`` when both are 0 or either is missing,
    ``±0%`` below half a unit of the last digit."""
    if base is None or new is None:
        return "–"
    if not base:
        return "new" if new else "–"
    pct = 100.0 * (new - base) / abs(base)
    if abs(pct) < 0.5 * 10 ** -digits:
        return "±0%"
    return f"{pct:+.{digits}f}%"


def rank_title(rank: dict, n_ranks: int = 1) -> str:
    """``rank pid P device D`` (one rank) or ``rank R (pid P device D)`` (several, distributed rank known)."""
    if n_ranks > 1 and rank.get("rank") is not None:
        return f"rank {rank['rank']} (pid {rank['pid']} device {rank['device']})"
    return f"rank pid {rank['pid']} device {rank['device']}"


def fmt_range(v: list) -> str:
    """An interval ``[low, high]`` in ms: ``1,170.0-1,310.0``, ``-58.5 to 1,148.5`` when the low
    end is negative."""
    return f"{v[0]:,.1f}{' to ' if v[0] < 0 else '-'}{v[1]:,.1f}"
