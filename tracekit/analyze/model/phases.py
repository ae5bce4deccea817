"""Training phases and iterations, and the attribution of GPU work to them.

The rule (see docs/attribution.md for the full text and its reasons):

1. **Phase windows** come from NVTX ranges, per process, from the first source that has any:
   a user mapping ``--phase-map PHASE=REGEX`` when given; else tracekit's own capture ranges
   (domain ``tracekit``: ``forward``, ``backward``, ``backward boundary``, ``update``); else
   DeepSpeed's own ranges (domain ``DeepSpeed``: ``DeepSpeedEngine.forward``,
   ``DeepSpeedEngine.backward``, ``DeepSpeedZeroOptimizer_Stage3.step``). Only the outermost
   matching ranges count. Windows are process-wide: a range pushed on the main thread covers
   GPU work launched by any thread of the process inside it.
2. An **iteration** is one optimizer step (``update``) with the micro-steps (forward +
   backward) since the previous one; the gap between two iterations (data loading) belongs to
   the next one, as phase ``other``. The last backward before an update is the gradient
   accumulation **boundary**. Without update ranges (ZeRO-1/2 without tracekit capture) the
   update is **inferred** as the span from the end of each boundary backward to the next
   forward (or the process's last GPU activity). Boundaries are then recognised from
   ``--gas N`` when given, else from the gaps after backwards: the gap that holds an optimizer
   step is much longer than the data-loading gap between micro-steps (:func:`infer_boundaries`).
3. A GPU operation belongs to the window that contains the **start of the CUDA API call that
   launched it** (joined on ``correlationId`` within the process), not its GPU time; without a
   runtime record its GPU start is used. Its **sub-phase** is the innermost NVTX push/pop range
   open on the launching thread at that moment that opened inside the phase window.
4. A range that was **never popped** is not trusted (:func:`set_aside_unclosed`). nsys writes
   it in one of three forms: ``end = ANALYSIS_DETAILS.duration`` (seen on an H200 with nsys
   2025.3: the session length, not a timestamp), ``end`` NULL, or ``end`` at/after the capture's
   ``stopTime``. Its end is replaced by the process's **last recorded activity** (the latest
   end of a GPU operation, of the CUDA call that launched one, or of a closed NVTX range of
   the process), and a phase window from it also stops where the next phase window starts.
   Such a window has ``unclosed = true``; its iteration is **incomplete**
   (``complete = false``), left out of steady-state figures, and listed in
   :attr:`PhaseModel.unclosed` with the reason (:mod:`tracekit.analyze.model.unclosed`).

Over 500 lines because :func:`build` and its steps (candidates, windows, iterations, tiling,
attribution) are one pass over one set of frames and names; the unclosed ranges, a rule of
their own, are unclosed.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from tracekit.analyze.model import nvtx
from tracekit.analyze.model.gpu_ops import load_gpu_ops
from tracekit.analyze.model.unclosed import (  # noqa: F401  (the unclosed names, importable from here too)
    _UNCLOSED_SCHEMA,
    UNCLOSED_COLUMNS,
    UNCLOSED_REASONS,
    _cut_unclosed_at_next,
    _unclosed_table,
    set_aside_unclosed,
)
from tracekit.analyze.trace import enums, heap
from tracekit.analyze.trace.export import Export
from tracekit.userfiles import shown
from tracekit.vocab import NO_NVTX

PHASES = ("forward", "backward", "update", "other")

TRACEKIT_DOMAIN = "tracekit"
TRACEKIT_PHASES = {
    "forward": r"^forward$",
    "backward": r"^backward( boundary)?$",
    "update": r"^update$",
}
TRACEKIT_ITERATION = r"^iteration (\d+)$"
DEEPSPEED_DOMAIN = "DeepSpeed"
DEEPSPEED_PHASES = {
    "forward": r"^DeepSpeedEngine\.forward$",
    "backward": r"^DeepSpeedEngine\.backward$",
    "update": r"^(DeepSpeedZeroOptimizer(_Stage3)?|DeepSpeedZeroOptimizer_Stage1|"
    r"FP16_Optimizer|BF16_Optimizer)\.step$",
}

#: Columns of :attr:`PhaseModel.windows`.
WINDOW_COLUMNS = [
    "window_id",  # int, unique
    "global_pid",
    "iteration",  # Int64, null outside iterations (start-up, tail)
    "phase",  # forward | backward | update | other
    "micro_step",  # Int64: index of the forward/backward within its iteration, else null
    "boundary",  # bool: the backward at the gradient accumulation boundary
    "inferred",  # bool: update window inferred (no update range)
    "complete",  # bool: the iteration has an update and no unclosed window (false for trailing micro-steps)
    "unclosed",  # bool: the window's NVTX range never closed; its end is the process's last activity
    "start",  # ns
    "end",  # ns
    "range_index",  # Int64: the NVTX range's range_id (NVTX_EVENTS rowid; PhaseModel.ranges' range_index), or null
]



@dataclass
class PhaseModel:
    """Phase windows of every process and the GPU operations attributed to them.

    Attributes:
        windows: frame with :data:`WINDOW_COLUMNS`; per process the windows tile the span from
            its first to its last activity (phase ``other`` fills gaps).
        ops: the frame of :func:`tracekit.analyze.model.gpu_ops.load_gpu_ops` plus ``window_id``,
            ``iteration``, ``phase``, ``micro_step``, ``boundary``, ``inferred``,
            ``sub_phase`` (name of the innermost NVTX range, null when none). Read a few columns
            through :meth:`scan_ops`: in a model built with ``spill`` (:func:`build`, ``tracekit
            analyze``) the ops live in a file (:attr:`ops_store`) and ``ops`` reads all of them
            back, held in :attr:`cache` under ``"ops_frame"`` until
            :func:`tracekit.analyze.sections.run` lets it go after the section that asked.
        ranges: NVTX push/pop ranges with ``parent``/``depth`` (:func:`tracekit.analyze.model.nvtx.nest`).
        source: per globalPid, where phases came from: ``phase-map``, ``tracekit``,
            ``DeepSpeed``, ``inferred`` suffix when updates were inferred, or ``none``.
        anomalies: counts of NVTX records set aside (:func:`tracekit.analyze.model.nvtx.anomalies`);
            ``unclosed_ranges`` counts all three forms of :func:`set_aside_unclosed`.
        unclosed: phase windows cut because their range never closed, one row each, with
            :data:`UNCLOSED_COLUMNS`; their iterations are incomplete.
    """

    windows: pl.DataFrame
    ops: pl.DataFrame
    ranges: pl.DataFrame
    source: dict[int, str]
    anomalies: dict[str, int]
    unclosed: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=_UNCLOSED_SCHEMA))
    #: results derived from this model by other modules (e.g. per-window metrics), computed once
    cache: dict = field(default_factory=dict, repr=False)
    #: None: :attr:`ranges` holds every nested range. Else the model was built with a
    #: :class:`RangeKeep` (issue 24): :attr:`ranges` holds only the ranges of its ``phases``'
    #: windows, the phase ranges and the ranges named by its pattern (``parent`` -1 where the
    #: parent is not kept);
    #: :func:`ranges_for` reloads the rest from :attr:`path` when a reader needs them.
    ranges_scope: frozenset | None = None
    #: with a :class:`RangeKeep`: the what-if model's NVTX ranges (``global_pid, name, start, end``
    #: of the push/pop ranges popped on their own thread, as :func:`tracekit.analyze.model.nvtx.load_ranges`
    #: gives them, in the kept windows or named by the pattern) and ``step_range_names``, the
    #: distinct names of all such ranges; None without one (the what-if model reads the export)
    step_ranges: pl.DataFrame | None = None
    step_range_names: frozenset | None = None
    #: the distinct range names of the nested ranges (all of them, also with a :class:`RangeKeep`)
    range_names: list | None = None
    #: the trace the model was built from (what :func:`ranges_for` reloads)
    path: str | None = None

    #: where :attr:`ops` lives in a model built with ``spill`` (:func:`build`; None: in memory)
    ops_store: object | None = field(default=None, init=False, repr=False)

    def scan_ops(self) -> pl.LazyFrame:
        """:attr:`ops` as a ``LazyFrame``: the way to read a few of its columns or rows. When the
        ops are in a store (:attr:`ops_store`) only what the query selects and keeps is read back;
        in memory it is ``ops.lazy()``."""
        store = self.ops_store
        return self._ops.lazy() if store is None else store.scan()

    @property
    def ops_schema(self) -> pl.Schema:
        """The schema of :attr:`ops` (read nothing)."""
        store = self.ops_store
        return self._ops.schema if store is None else store.schema

    @property
    def ops_height(self) -> int:
        """The number of rows of :attr:`ops` (read nothing)."""
        store = self.ops_store
        return self._ops.height if store is None else store.height

    def derived(self, key, compute):
        """``compute()``, computed once per model: the value kept in :attr:`cache` under ``key``
        (any hashable) is returned to every later call with that key. Errors of ``compute``
        propagate and nothing is kept."""
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]



def _get_ops(model: PhaseModel) -> pl.DataFrame:
    if model.ops_store is None:
        return model._ops
    return model.derived("ops_frame", model.ops_store.read)


def _set_ops(model: PhaseModel, frame: pl.DataFrame) -> None:
    model._ops = frame
    if model.__dict__.pop("ops_store", None) is not None:  # (a frame set later replaces a spilled one)
        model.cache.pop("ops_frame", None)


#: :attr:`PhaseModel.ops` (a dataclass field whose reads go through this property): the frame
#: itself, or, once spilled, the whole frame read back from its store (:attr:`PhaseModel.ops_store`;
#: a reader of a few columns uses :meth:`PhaseModel.scan_ops`)
PhaseModel.ops = property(_get_ops, _set_ops, doc="The GPU operations (see the class doc).")


@dataclass(frozen=True)
class RangeKeep:
    """What of the NVTX ranges a model built by :func:`build` keeps for the whole run (issue 24:
    the ranges are the largest frame of the model, ~1.2 M rows in a 10 GB trace, and most lie in
    forward and backward, where no section of ``tracekit analyze`` reads them).

    ``phases``: the phases whose windows' nested ranges are kept (the sub-phases of ``update``,
    and of ``--phase``); ``names``: a regex of range names kept wherever they are (the what-if
    model's steps, :data:`tracekit.analyze.sections.whatif_pieces.RANGE_NAMES`, and the CPU
    update's). The phase ranges themselves are always kept. With ``phases`` = ``{"update"}`` the
    build reads the ranges thin (:class:`tracekit.analyze.model.nvtx.Thin`): the ranges no reader
    of the model can look at are not even held while it is built."""

    phases: frozenset
    names: str


def _match(names: pl.Expr, patterns: dict[str, str]) -> pl.Expr:
    expr = pl.lit(None, pl.String)
    for phase, pattern in reversed(list(patterns.items())):
        expr = pl.when(names.str.contains(pattern)).then(pl.lit(phase)).otherwise(expr)
    return expr


def parse_phase_map(items: list[str] | None) -> dict[str, str] | None:
    """Turn ``["update=^my_step$", ...]`` into {phase: regex}; several regexes per phase are OR-ed.

    Raises :class:`~tracekit.errors.TracekitError` for an unknown phase or a bad regex.
    """
    from tracekit.errors import TracekitError

    if not items:
        return None
    out: dict[str, list[str]] = {}
    for item in items:
        phase, sep, pattern = item.partition("=")
        phase = phase.strip()
        if not sep or phase not in ("forward", "backward", "update") or not pattern:
            raise TracekitError(
                f"--phase-map {item!r}: expected PHASE=REGEX with PHASE one of forward, backward, update"
            )
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TracekitError(f"--phase-map {item!r}: bad regular expression ({exc})") from None
        out.setdefault(phase, []).append(f"(?:{pattern})")
    return {p: "|".join(v) for p, v in out.items()}


def _candidates(ranges: pl.DataFrame, phase_map: dict[str, str] | None) -> tuple[pl.DataFrame, dict, set]:
    """Phase-matching ranges of each process from its preferred source, the source of each
    process, and the phases that ``phase_map`` matched in some process. With a ``phase_map``
    the phases it does not name keep the built-in names (tracekit's ranges, else DeepSpeed's)."""
    # the matching rows are picked from narrow masks and only they are gathered (a DeepSpeed
    # trace has ~75k ranges per 4 iterations, a few dozen of them phases)
    indexed = ranges.with_columns(range_index=pl.col("range_id"))

    def pick(cond: pl.Expr, patterns: dict[str, str]) -> pl.DataFrame:
        hit = ~pl.col("cross_thread") & cond & _match(pl.col("name"), patterns).is_not_null()
        return indexed.filter(hit).with_columns(
            pl.col("range_index").cast(pl.Int64), phase=_match(pl.col("name"), patterns)
        )

    def built_in(phases) -> list[tuple[str, pl.DataFrame]]:
        return [(label, pick(pl.col("domain") == domain, {p: r for p, r in names.items() if p in phases}))
                for label, domain, names in (("tracekit", TRACEKIT_DOMAIN, TRACEKIT_PHASES),
                                             ("DeepSpeed", DEEPSPEED_DOMAIN, DEEPSPEED_PHASES))]

    def first_source(sources, source: dict[int, str]) -> list[pl.DataFrame]:
        """Per process, the rows of the first of ``sources`` that has any; ``source`` gets its label."""
        chosen = []
        for label, frame in sources:
            frame = frame.filter(pl.col("phase").is_not_null())
            frame = frame.filter(~pl.col("global_pid").is_in(list(source)))
            for pid in frame["global_pid"].unique().to_list():
                source[int(pid)] = label
            chosen.append(frame)
        return chosen

    source: dict[int, str] = {}
    if phase_map:
        chosen = first_source([("phase-map", pick(pl.lit(True), phase_map))], source)
        mapped = set(chosen[0]["phase"].unique().to_list())
        rest = [p for p in ("forward", "backward", "update") if p not in phase_map]
        if rest:  # the phases the map does not name keep the built-in names
            filled: dict[int, str] = {}
            chosen += first_source(built_in(rest), filled)
            for pid, label in filled.items():
                source[pid] = f"phase-map+{label}" if pid in source else label
    else:
        chosen, mapped = first_source(built_in(("forward", "backward", "update")), source), set()
    cand = pl.concat(chosen)
    cand = _cut_unclosed_at_next(cand)
    # outermost only: drop ranges inside an earlier one of the same process; clip partial overlaps
    cand = cand.sort(["global_pid", "start", "end"], descending=[False, False, True])
    cand = cand.with_columns(prev_end=pl.col("end").cum_max().shift(1).over("global_pid"))
    cand = cand.filter(pl.col("prev_end").is_null() | (pl.col("end") > pl.col("prev_end")))
    cand = cand.with_columns(start=pl.max_horizontal("start", pl.col("prev_end").fill_null(pl.col("start"))))
    return cand.drop("prev_end"), source, mapped



def infer_boundaries(gaps_ns: np.ndarray, gas: int | None = None) -> np.ndarray:
    """Which backwards end a gradient accumulation cycle, when no update range says so.

    ``gaps_ns[i]`` is the time from the end of backward i to the next forward (or to the last
    GPU activity for the last backward). With ``gas`` given, every gas-th backward is a
    boundary. Otherwise the gaps are sorted and split at their largest ratio jump: when the
    largest gap is more than 3x the one below the jump, the gaps above the jump hold optimizer
    steps; when no such jump exists all gaps look alike and every backward is a boundary
    (gradient accumulation 1). Returns a bool array.
    """
    n = len(gaps_ns)
    if n == 0:
        return np.zeros(0, dtype=bool)
    if gas:
        return (np.arange(n) % gas) == gas - 1
    g = np.maximum(np.asarray(gaps_ns, dtype=np.float64), 1.0)
    order = np.sort(g)
    if n == 1:
        return np.ones(1, dtype=bool)
    ratios = order[1:] / order[:-1]
    k = int(np.argmax(ratios))
    if ratios[k] <= 3.0:
        return np.ones(n, dtype=bool)
    return g >= order[k + 1]


def build(
    export: Export,
    phase_map: list[str] | None = None,
    gas: int | None = None,
    keep: RangeKeep | None = None,
    spill: bool = False,
    _thin: bool = True,
) -> PhaseModel:
    """Find phase windows and iterations in ``export`` and attribute its GPU operations.

    ``phase_map``: ``["PHASE=REGEX", ...]`` (see :func:`parse_phase_map`); ``gas``: gradient
    accumulation steps, used only when updates must be inferred; ``keep``: hold only part of the
    NVTX ranges (:class:`RangeKeep`; None: all of them, in :attr:`PhaseModel.ranges`); ``spill``:
    the GPU operations are attributed a block at a time into an
    :class:`tracekit.analyze.model.op_store.OpStore` (:attr:`PhaseModel.ops_store`: never held
    whole in memory; in memory as before where the store cannot be made).

    A trace without NVTX ranges gets the whole-trace model: every process's source is
    :data:`NO_NVTX` and all its GPU work is 'other'.

    Raises :class:`~tracekit.errors.MissingDataError` when the trace has no CUDA kernels/copies.
    """
    if not (export.has("CUPTI_ACTIVITY_KIND_KERNEL", 1) or export.has("CUPTI_ACTIVITY_KIND_MEMCPY", 1)):
        export.require("CUPTI_ACTIVITY_KIND_KERNEL", "phase attribution")
    # no NVTX at all: the whole-trace report, every process's work 'other' (source NO_NVTX)
    no_nvtx = not export.has("NVTX_EVENTS", 1)
    # the two large scans in background threads (SQLite releases the GIL) while the GPU tables load
    nvtx.prefetch_ranges(export)
    from tracekit.analyze.model.gpu_ops import prefetch_runtime

    prefetch_runtime(export)
    ops = load_gpu_ops(export)
    heap.release()  # (the reads' C buffers: see tracekit.analyze.trace.heap)
    pmap = parse_phase_map(phase_map)
    thin = _thin_read(ops, keep, pmap) if _thin else None
    loaded = nvtx.load_ranges(export) if thin is None else nvtx.load_thin_ranges(export, thin)
    if thin is not None and not thin.ordered:  # (rowid order is not start order: read them all)
        thin, loaded = None, nvtx.load_ranges(export)
    heap.release()
    dropped = thin.span if thin is not None else None
    ranges = set_aside_unclosed(export, loaded, ops, others=dropped)
    anomalies = nvtx.anomalies(export, ranges)
    cand, source, mapped = _candidates(ranges, pmap)
    if pmap and not mapped:
        from tracekit.errors import TracekitError

        if no_nvtx:
            raise TracekitError(
                f"--phase-map {' '.join(phase_map)}: {export.path} has no NVTX ranges to match; record "
                "with `nsys profile -t cuda,nvtx` (or `tracekit capture`), or drop --phase-map"
            )
        raise TracekitError(
            f"--phase-map {' '.join(phase_map)}: matched no NVTX range in "
            f"{shown(export.path)}; check the names with `nsys stats -r nvtx_sum` or drop --phase-map"
        )
    if pmap and set(pmap) - mapped:  # a named phase that matched nothing would be dropped silently
        from tracekit.errors import TracekitError

        missing = [i for i in phase_map if i.partition("=")[0].strip() in set(pmap) - mapped]
        raise TracekitError(
            f"--phase-map {' '.join(missing)}: matched no NVTX range in {shown(export.path)} (the other "
            "items did); fix the name (`nsys stats -r nvtx_sum` lists them) or leave the item out to keep "
            "the built-in names for that phase"
        )

    # span of each process with GPU work
    span = ops.group_by("global_pid").agg(
        span_start=pl.min_horizontal(pl.col("launch").min(), pl.col("start").min()),
        span_end=pl.col("end").max(),
    )
    rng_span = ranges.select("global_pid", "start", "end")
    if dropped is not None and dropped.height:  # (the ranges a thin read left out count in the span)
        rng_span = pl.concat([rng_span, dropped.cast(rng_span.schema)])
    rng_span = rng_span.group_by("global_pid").agg(r_start=pl.col("start").min(), r_end=pl.col("end").max())
    span = span.join(rng_span, on="global_pid", how="left").select(
        "global_pid",
        span_start=pl.min_horizontal("span_start", "r_start"),
        span_end=pl.max_horizontal("span_end", "r_end"),
    )
    pids = span["global_pid"].to_list()
    cand = cand.filter(pl.col("global_pid").is_in(pids))

    parts = []
    for pid in pids:
        c = cand.filter(pl.col("global_pid") == pid)
        last_gpu = int(ops.select(pl.col("end").filter(pl.col("global_pid") == pid).max()).item())
        w, inferred = _phase_windows(c, last_gpu, gas)
        if inferred:
            source[pid] = source.get(pid, "none") + "+inferred-update"
        parts.append(_iterations(w, ranges, pid, export.first_iteration))
    if thin is not None and any(src.endswith("+inferred-update") for src in source.values()):
        # an inferred update window has no range to keep what starts inside it: read them all
        return build(export, phase_map=phase_map, gas=gas, keep=keep, spill=spill, _thin=False)
    phase_windows = pl.concat(parts) if parts else pl.DataFrame()
    windows = _tile(phase_windows, span)
    nested = _nested(ranges, source)
    store = _attributed_store(ops, windows, nested) if spill else None
    if store is not None:
        ops = None  # (the attributed ops are in the store; the rest of the build runs without them)
    else:
        ops = _attribute(ops, windows, nested)
    nested_source = dict(source)  # (what _nested read: a reload nests the same way)
    for pid in pids:
        source.setdefault(int(pid), NO_NVTX if no_nvtx else "none")
    model = PhaseModel(
        windows=windows,
        ops=ops,
        ranges=nested,
        source=source,
        anomalies=anomalies,
        unclosed=_unclosed_table(windows, ranges),
        path=str(export.path),
    )
    if store is not None:
        model.ops_store = store
    if keep is not None:
        model.cache["nested_source"] = nested_source
        model.cache["trace_stat"] = _stat(export.path)  # (what ranges_for checks before a reload)
        _keep_ranges(model, loaded, keep, None if thin is None else thin.names)
        del loaded, ranges, nested
        # (the load is not kept with the export either: the what-if model reads model.step_ranges)
        export._memo.pop(("nvtx.load_ranges", None), None)
    return model


def _in_windows(frame: pl.DataFrame, spans: pl.DataFrame) -> pl.Series:
    """Whether each row of ``frame`` (``global_pid, start``) starts inside one of ``spans``
    (``global_pid, start, end``: ns, closed at both ends, may overlap) of its process."""
    out = np.zeros(frame.height, dtype=bool)
    if not frame.height or not spans.height:
        return pl.Series(out)
    gp = frame["global_pid"].to_numpy()
    st = frame["start"].to_numpy()
    for (pid,), sp in spans.group_by(["global_pid"]):
        sp = sp.sort("start")
        a, b = sp["start"].to_numpy(), sp["end"].to_numpy()
        b = np.maximum.accumulate(b)  # (sorted by start: the furthest end so far covers)
        mine = np.flatnonzero(gp == pid)
        j = np.searchsorted(a, st[mine], side="right") - 1
        out[mine] = (j >= 0) & (st[mine] <= b[np.maximum(j, 0)])
    return pl.Series(out)


def _thin_read(ops: pl.DataFrame, keep: RangeKeep | None, pmap: dict | None):
    """The :class:`tracekit.analyze.model.nvtx.Thin` of a build with ``keep`` (None without
    one, or when ``keep`` asks for the ranges of other phases than ``update``, which lie
    everywhere): the ops' launches per thread, the names every reader looks for."""
    if keep is None or set(keep.phases) != {"update"}:
        return None
    la = ops.select("launch_tid", "launch").drop_nulls().sort("launch_tid", "launch")
    tid, t = la["launch_tid"].to_numpy(), la["launch"].to_numpy()
    cut = np.flatnonzero(np.diff(tid)) + 1
    launches = {int(g[0]): ts for g, ts in zip(np.split(tid, cut), np.split(t, cut)) if g.size}
    names = [keep.names, TRACEKIT_ITERATION, *TRACEKIT_PHASES.values(), *DEEPSPEED_PHASES.values(),
             *(pmap or {}).values()]
    updates = [TRACEKIT_PHASES["update"], DEEPSPEED_PHASES["update"], *([pmap["update"]] if pmap and "update" in pmap
                                                                         else [])]
    return nvtx.Thin(launches, "|".join(f"(?:{p})" for p in names), "|".join(f"(?:{p})" for p in updates))


def _keep_ranges(model: PhaseModel, loaded: pl.DataFrame, keep: RangeKeep, names: pl.DataFrame | None) -> None:
    """Narrow ``model.ranges`` to what ``keep`` says (:class:`RangeKeep`) and set
    ``step_ranges`` / ``step_range_names`` from ``loaded`` (:func:`tracekit.analyze.model.nvtx.load_ranges`);
    ``names``: the distinct names of a thin read (:class:`tracekit.analyze.model.nvtx.Thin`), when
    ``loaded`` is one."""
    w = model.windows
    nested = model.ranges
    if names is None:
        model.range_names = nested["name"].drop_nulls().unique().to_list()
    else:  # the names the nested ranges would have (_nested's filter, on the distinct names)
        tk = [p for p, src in model.cache["nested_source"].items() if src.startswith("tracekit")]
        pp = names.filter((pl.col("event_type") == enums.NVTX_PUSH_POP) & ~pl.col("cross_thread"))
        model.range_names = pp.filter(~pl.col("global_pid").is_in(tk) | (pl.col("domain") == TRACEKIT_DOMAIN))[
            "name"].drop_nulls().unique().to_list()
    spans = w.filter(pl.col("phase").is_in(list(keep.phases))).select("global_pid", "start", "end", "range_index")
    # the phase ranges' own spans too: their nested ranges are what self_segments reads
    own = spans.filter(pl.col("range_index").is_not_null()).select("range_index").join(
        nested.select("range_index", "global_pid", "start", "end"), on="range_index")
    spans = pl.concat([spans.drop("range_index"), own.drop("range_index")])
    named = pl.col("name").fill_null("").str.contains(keep.names)
    flags = nested.select(
        "global_pid", "start", k=named | pl.col("range_index").is_in(w["range_index"].drop_nulls().implode()))
    mask = (flags["k"] | _in_windows(flags, spans)).to_numpy()
    # ``parent`` is a row of the frame (nvtx.nest): renumbered to the kept rows; a parent left
    # out (an outer range begun before the kept windows) becomes -1, as a root's
    par = nested["parent"].to_numpy()
    pos = np.cumsum(mask) - 1
    has = par >= 0
    has[has] = mask[par[has]]
    new_parent = np.where(has, pos[np.maximum(par, 0)], -1).astype(par.dtype)[mask]
    model.ranges = nested.filter(pl.Series(mask)).with_columns(parent=pl.Series(new_parent))
    model.ranges_scope = frozenset(keep.phases)
    # the what-if model's ranges: as it read them from load_ranges (the ends as recorded)
    upd = w.filter(pl.col("phase") == "update").select("global_pid", "start", "end")
    st = loaded.select("global_pid", "name", "start", "end",
                       _keep=~pl.col("cross_thread") & (pl.col("event_type") == enums.NVTX_PUSH_POP))
    st = st.filter(pl.col("_keep")).drop("_keep")
    every = st if names is None else names.filter((pl.col("event_type") == enums.NVTX_PUSH_POP)
                                                  & ~pl.col("cross_thread"))
    model.step_range_names = frozenset(every["name"].drop_nulls().unique().to_list())
    mask = st.select(named)["name"] | _in_windows(st, upd)
    model.step_ranges = st.filter(mask)


def _stat(path) -> tuple | None:
    """``(size, modification time ns)`` of ``path``, None when it cannot be read."""
    import os

    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def ranges_for(model: PhaseModel, phases: set | frozenset | None = None) -> pl.DataFrame:
    """The nested NVTX ranges (:attr:`PhaseModel.ranges`' columns) a reader of the windows of
    ``phases`` (None: of any phase) needs: :attr:`PhaseModel.ranges` when it holds them, else all
    of them, reloaded once from :attr:`PhaseModel.path` (a model built with a :class:`RangeKeep`
    asked for another phase: the same frame the build nested). Raises :class:`TracekitError` when
    the trace can no longer be read, or was changed since the model was built (its size or
    modification time differ: the ranges would not be those of the model)."""
    scope = model.ranges_scope
    if scope is None or (phases is not None and set(phases) <= scope):
        return model.ranges

    def reload() -> pl.DataFrame:
        with reopen(model, "its NVTX ranges") as export:
            ops = model.scan_ops().select("global_pid", "end", "api_end").collect()  # (what it reads)
            loaded = set_aside_unclosed(export, nvtx.load_ranges(export), ops)
            return _nested(loaded, model.cache.get("nested_source", model.source))

    return model.derived("all_nested_ranges", reload)


def reopen(model: PhaseModel, what: str) -> Export:
    """The trace of ``model`` (:attr:`PhaseModel.path`) opened again, for a reader that reads
    ``what`` (words for the error) of it after the analysis closed it. Raises
    :class:`TracekitError` when it was changed since the model was built (its size or
    modification time differ from those the build saw) or can no longer be read."""
    was = model.cache.get("trace_stat")
    if was is not None and _stat(model.path) != was:
        from tracekit.errors import TracekitError

        raise TracekitError(f"{shown(model.path)} changed since it was analyzed ({what} are read again for this); "
                            "analyze it again")
    return Export.open(model.path)



def steady_model(model: PhaseModel) -> PhaseModel:
    """``model`` without the iterations that hold an unclosed window (:attr:`PhaseModel.unclosed`):
    their windows and the GPU operations attributed to them are dropped. Returns ``model``
    itself when there is none (the common case: no copy, no extra work)."""
    u = model.unclosed
    if u is None or u.height == 0 or "unclosed" not in model.windows.columns:
        return model
    return drop_iterations(model, u.select("global_pid", "iteration").unique(), unclosed=u.head(0))


def drop_iterations(model: PhaseModel, drop: pl.DataFrame, unclosed: pl.DataFrame | None = None) -> PhaseModel:
    """``model`` without the iterations in ``drop`` (a frame ``global_pid, iteration``): their
    windows and the GPU operations attributed to them; ``unclosed`` replaces the model's table of
    unclosed windows (default: kept). Returns ``model`` itself when ``drop`` is empty."""
    if drop.height == 0:
        return model
    keys = ["global_pid", "iteration"]
    return PhaseModel(windows=model.windows.join(drop, on=keys, how="anti"),
                      ops=model.ops.join(drop, on=keys, how="anti"), ranges=model.ranges, source=model.source,
                      anomalies=model.anomalies,
                      unclosed=model.unclosed if unclosed is None else unclosed,
                      ranges_scope=model.ranges_scope, step_ranges=model.step_ranges,
                      step_range_names=model.step_range_names, range_names=model.range_names, path=model.path,
                      cache={k: v for k, v in model.cache.items()
                             if k in ("nested_source", "trace_stat", "all_nested_ranges")})


def _phase_windows(c: pl.DataFrame, last_gpu: int, gas: int | None) -> tuple[pl.DataFrame, bool]:
    w = c.select(
        "global_pid",
        "phase",
        "start",
        "end",
        "range_index",
        boundary=pl.col("name") == "backward boundary",
        inferred=pl.lit(False),
        unclosed=pl.col("unclosed") if "unclosed" in c.columns else pl.lit(False),
    ).sort("start")
    has_update = (w["phase"] == "update").any()
    has_backward = (w["phase"] == "backward").any()
    if has_update or not has_backward:
        return w, False
    # infer updates after boundary backwards
    nxt_fwd = w.filter(pl.col("phase") == "forward")["start"].to_numpy()
    bwd = w.filter(pl.col("phase") == "backward")
    b_end = bwd["end"].to_numpy()
    idx = np.searchsorted(nxt_fwd, b_end, side="left")
    nxt = np.where(idx < len(nxt_fwd), nxt_fwd[np.minimum(idx, len(nxt_fwd) - 1)], max(last_gpu, int(b_end.max())))
    marked = bwd["boundary"].to_numpy()
    is_b = marked if marked.any() else infer_boundaries(nxt - b_end, gas)
    upd = pl.DataFrame(
        {
            "global_pid": bwd["global_pid"].filter(pl.Series(is_b)),
            "phase": "update",
            "start": b_end[is_b],
            "end": nxt[is_b],
            "range_index": pl.Series([None] * int(is_b.sum()), dtype=pl.Int64),
            "boundary": False,
            "inferred": True,
            "unclosed": False,
        }
    ).filter(pl.col("end") > pl.col("start"))
    return pl.concat([w, upd.cast(w.schema)]).sort("start"), True


def _iterations(w: pl.DataFrame, ranges: pl.DataFrame, pid: int, first: int = 0) -> pl.DataFrame:
    """Iteration index, micro-step, boundary and completeness for one process's windows.

    Iterations are counted from ``first`` (non-zero for a cut made by ``tracekit trim``), or
    numbered after tracekit's ``iteration N`` ranges when the trace has them."""
    w = w.sort("start").with_columns(is_update=pl.col("phase") == "update")
    w = w.with_columns(
        iteration=(pl.col("is_update").cum_sum() - pl.col("is_update") + first).cast(pl.Int64)
    )
    # number iterations after tracekit's `iteration N` ranges when present
    it = ranges.filter(
        (pl.col("global_pid") == pid)
        & (pl.col("domain") == TRACEKIT_DOMAIN)
        & pl.col("name").str.contains(TRACEKIT_ITERATION)
    )
    for first in it.sort("start").iter_rows(named=True) if w.height else []:
        # the first iteration range holding a phase window (a cut may keep a sliver of the one before)
        inside = w.filter((pl.col("start") >= first["start"]) & (pl.col("start") < first["end"]))
        if inside.height:
            n0 = int(re.match(TRACEKIT_ITERATION, first["name"]).group(1))
            w = w.with_columns(iteration=pl.col("iteration") + (n0 - inside["iteration"][0]))
            break
    w = w.with_columns(
        fwd=(pl.col("phase") == "forward").cast(pl.Int64).cum_sum().over("iteration"),
        bwd=(pl.col("phase") == "backward").cast(pl.Int64).cum_sum().over("iteration"),
        next_phase=pl.col("phase").shift(-1),
        complete=(pl.col("is_update").any() & ~pl.col("unclosed").any()).over("iteration"),
    )
    w = w.with_columns(
        micro_step=pl.when(pl.col("phase").is_in(["forward", "backward"]))
        .then(pl.max_horizontal("fwd", "bwd") - 1)
        .otherwise(None)
        .cast(pl.Int64),
        boundary=pl.col("boundary")
        | ((pl.col("phase") == "backward") & (pl.col("next_phase") == "update")),
    )
    return w.select(
        "global_pid", "iteration", "phase", "micro_step", "boundary", "inferred", "complete",
        "unclosed", "start", "end", "range_index",
    )


def _tile(phase_windows: pl.DataFrame, span: pl.DataFrame) -> pl.DataFrame:
    """Add ``other`` windows so that each process's windows tile its whole span."""
    schema = {
        "global_pid": pl.Int64, "iteration": pl.Int64, "phase": pl.String, "micro_step": pl.Int64,
        "boundary": pl.Boolean, "inferred": pl.Boolean, "complete": pl.Boolean, "unclosed": pl.Boolean,
        "start": pl.Int64, "end": pl.Int64, "range_index": pl.Int64,
    }
    pw = phase_windows.cast(schema) if phase_windows.height else pl.DataFrame(schema=schema)
    pw = pw.lazy().sort(["global_pid", "start"])  # the rest as one polars query
    span = span.lazy()
    gaps = pw.with_columns(
        g_start=pl.col("end").shift(1).over("global_pid"),
        prev_it=pl.col("iteration").shift(1).over("global_pid"),
    ).filter(pl.col("g_start").is_not_null() & (pl.col("g_start") < pl.col("start")))
    # the gap before a window belongs to that window's iteration (data loading precedes forward)
    gaps = gaps.select(
        "global_pid",
        "iteration",
        phase=pl.lit("other"),
        micro_step=pl.lit(None, pl.Int64),
        boundary=pl.lit(False),
        inferred=pl.lit(False),
        complete="complete",
        unclosed=pl.lit(False),
        start="g_start",
        end="start",
        range_index=pl.lit(None, pl.Int64),
    )
    firsts = pw.group_by("global_pid").agg(first=pl.col("start").min(), last=pl.col("end").max())
    edges = span.join(firsts, on="global_pid", how="left")
    outside = pl.concat(
        [
            edges.select("global_pid", start="span_start", end=pl.coalesce("first", "span_end")),
            edges.filter(pl.col("last").is_not_null()).select("global_pid", start="last", end="span_end"),
        ]
    ).filter(pl.col("end") > pl.col("start"))
    outside = outside.select(
        "global_pid",
        iteration=pl.lit(None, pl.Int64),
        phase=pl.lit("other"),
        micro_step=pl.lit(None, pl.Int64),
        boundary=pl.lit(False),
        inferred=pl.lit(False),
        complete=pl.lit(False),
        unclosed=pl.lit(False),
        start="start",
        end="end",
        range_index=pl.lit(None, pl.Int64),
    )
    windows = pl.concat([pw, gaps.cast(schema), outside.cast(schema)]).sort(["global_pid", "start"])
    return windows.with_row_index("window_id").with_columns(pl.col("window_id").cast(pl.Int64)).select(
        WINDOW_COLUMNS
    ).collect()


def _nested(ranges: pl.DataFrame, source: dict[int, str]) -> pl.DataFrame:
    """Push/pop ranges that can be sub-phases, nested. In processes whose phases come from
    tracekit's capture ranges, only the ``tracekit`` domain counts: its sub-step ranges
    (``cpu_optimizer_step``, ``param_copy_back``, ...) would otherwise be hidden by
    DeepSpeed's finer ranges nested inside them."""
    tk_pids = [pid for pid, src in source.items() if src.startswith("tracekit")]
    keep = (pl.col("event_type") == enums.NVTX_PUSH_POP) & ~pl.col("cross_thread") & (
        ~pl.col("global_pid").is_in(tk_pids) | (pl.col("domain") == TRACEKIT_DOMAIN)
    )
    mask = ranges.select(keep=keep)["keep"]
    pp = ranges.with_columns(range_index=pl.col("range_id").cast(pl.Int64))
    if mask.null_count() or not mask.all():  # often every range nests: then no copy is made
        pp = pp.filter(mask)
    return nvtx.nest(pp)


#: ops searched at a time for their sub-phase (:func:`_attribute`)
_ATTRIBUTE_BLOCK = 32_768


def _window_rows(ops: pl.DataFrame, w: pl.DataFrame) -> pl.Series:
    """Per op of ``ops`` (``global_pid, launch``), the row of ``w`` (``global_pid, w_start``,
    sorted by ``w_start``) of its process with the greatest ``w_start`` <= its launch, the last
    such row where starts repeat; null for none (a launch before its process's first window, a
    process without windows). The rows ``ops.join_asof(w, left_on="launch", right_on="w_start",
    by="global_pid", strategy="backward")`` pairs, found by a binary search per process."""
    pid = ops["global_pid"]
    ok = pid.is_not_null().to_numpy()
    pid = pid.fill_null(0).to_numpy()
    launch = ops["launch"]
    ok &= launch.is_not_null().to_numpy()
    launch = launch.fill_null(0).to_numpy()
    w_pid, w_start = w["global_pid"].to_numpy(), w["w_start"].to_numpy()
    row = np.full(ops.height, -1, dtype=np.int64)
    for p in np.unique(w_pid):
        mine_w = np.flatnonzero(w_pid == p)  # (in w's order: by start)
        mine = np.flatnonzero((pid == p) & ok)
        at = np.searchsorted(w_start[mine_w], launch[mine], side="right") - 1
        row[mine[at >= 0]] = mine_w[at[at >= 0]]
    out = pl.Series("w_row", row)
    return out.set(out < 0, None)


def _attributed_store(ops: pl.DataFrame, windows: pl.DataFrame, nested: pl.DataFrame):
    """:func:`_attribute` of ``ops`` a block of :data:`tracekit.analyze.model.op_store.BLOCK_ROWS`
    ops at a time (each op's window and sub-phase depend on it alone), each block written to an
    :class:`tracekit.analyze.model.op_store.OpStore` as it is made: the attributed ops (25
    columns, 46 MiB at 16x the shared trace) are never held whole (issue 24). None when the store
    cannot be made."""
    from tracekit.analyze.model.op_store import frame_blocks, spill_blocks

    return spill_blocks(_attribute(block, windows, nested) for block in frame_blocks(ops))


def _attribute(ops: pl.DataFrame, windows: pl.DataFrame, nested: pl.DataFrame) -> pl.DataFrame:
    """Join each op to the window containing its launch, and find its sub-phase among the
    ``nested`` push/pop ranges (from :func:`_nested`).

    Returns ``ops`` (n rows, in their order) with ``window_id, iteration, phase, micro_step,
    boundary, inferred, sub_phase`` added; the as-of join and the sub-phase search run on the
    three key columns only, and the results are put beside the ops' own columns (no copy)."""
    w = windows.select(
        "window_id", "global_pid", "iteration", "phase", "micro_step", "boundary", "inferred",
        w_start="start",
    ).sort("w_start")
    # each op's window row: per process, the last window starting at or before its launch (what
    # an as-of join "backward" by process finds; a search per process over the windows' starts
    # holds two arrays of the ops, not sorted copies of their key columns: issue 24)
    w_row = _window_rows(ops, w)
    k = w.drop("global_pid").select(pl.all().gather(w_row))
    del w_row
    phase_ranges = windows["range_index"].drop_nulls().to_numpy()
    iter_mask = nested["domain"].eq(TRACEKIT_DOMAIN) & nested["name"].str.contains(TRACEKIT_ITERATION)
    exclude = np.isin(nested["range_index"].to_numpy(), phase_ranges) | iter_mask.to_numpy()
    sub = np.full(ops.height, -1, dtype=np.int64)
    if nested.height:
        # a block of ops at a time: the search holds a dozen arrays of its queries (+26 MiB for
        # 320k ops at 16x the shared trace; issue 24)
        for lo in range(0, ops.height, _ATTRIBUTE_BLOCK):
            block = ops.select("launch_tid", "launch").slice(lo, _ATTRIBUTE_BLOCK).drop_nulls("launch_tid")
            if not block.height:
                continue
            at = ops["launch_tid"].slice(lo, _ATTRIBUTE_BLOCK).is_not_null().to_numpy()
            sub[lo:lo + len(at)][at] = nvtx.innermost_at(
                nested, block["launch_tid"].to_numpy(), block["launch"].to_numpy(), exclude=exclude)
    starts = nested["start"].to_numpy()
    ok = sub >= 0
    if nested.height == 0:
        starts = np.zeros(1, dtype=np.int64)
    # only ranges opened inside the phase window count as its sub-phase
    w_start = k["w_start"].fill_null(np.iinfo(np.int64).max).to_numpy()
    ok &= np.where(ok, starts[np.maximum(sub, 0)] >= w_start, False)
    sub_idx = pl.Series(np.where(ok, sub, 0)).set(pl.Series(~ok), None) if nested.height else None
    sub_name = (
        nested["name"].gather(sub_idx) if sub_idx is not None else pl.Series([None] * ops.height, dtype=pl.String)
    )
    return ops.with_columns(
        k["window_id"], k["iteration"],
        k["phase"].fill_null("other"),
        k["micro_step"],
        k["boundary"].fill_null(False),
        k["inferred"].fill_null(False),
        sub_name.alias("sub_phase"),
    )
