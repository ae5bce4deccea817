"""Where the idle GPU time goes (issue 22): each window's wall time split into GPU busy time and
three kinds of idle time, and launch statistics per window.

Per rank (``global_pid``, ``device``) and interval [start, end) (a phase window, or the self
time of a sub-phase), every nanosecond lands in exactly one category, tested in this order:

1. ``gpu_busy_ns``: a kernel, memcpy or memset of the device (not a communication kernel) is
   executing, whatever window launched it: the union of their GPU intervals (the busy time of
   :mod:`tracekit.analyze.sections.breakdown`, so ``wall_ns - gpu_busy_ns`` is its ``gpu_idle_ns``).
2. ``waiting_ns``: no such work, but a communication kernel (NCCL and the like,
   :mod:`tracekit.analyze.model.communication`) of the device is executing: the rank waits on a
   collective (an NCCL kernel spins until its peers arrive). Waiting on another stream through
   ``cudaStreamWaitEvent`` is *not* counted here: the tables record when the wait was enqueued,
   not when the event it waits on completed, so it cannot be told apart from launch latency.
3. ``in_api_ns``: idle, and a *launching thread* of the device is inside a CUDA API call
   (``CUPTI_ACTIVITY_KIND_RUNTIME``, names from ``StringIds`` via ``nameId``). The launching
   threads of a device are the threads that launched at least one of its kernels, copies or
   memsets (``correlationId`` join). ``by_api`` splits this time by call name (the ``_vNNNN``
   suffix dropped: ``cudaLaunchKernel``); where calls overlap (several threads at once) an
   instant belongs to the call that began first, so ``by_api`` sums to ``in_api_ns`` exactly.
   :func:`api_group` groups the names (:data:`API_GROUPS`).
4. ``between_api_ns``: idle, no collective running, no API call in flight on the launching
   threads: the host runs Python / framework code (or waits on something outside CUDA).

The four sum to ``wall_ns`` exactly (elementary segments between all interval edges, each
classified once).

Launch statistics (:func:`launch_stats`) per window count the kernels *attributed* to it (their
launching call began inside it, :mod:`tracekit.analyze.model.phases`): ``kernel_count`` (all
kernels, communication included), ``launch_count`` (kernels whose launching call is of the
``launch`` group: ``cudaLaunchKernel``, ``cuLaunchKernelEx``, ...), ``launch_mean_ns`` /
``launch_p50_ns`` / ``launch_p99_ns`` (duration of those calls; percentiles are the nearest
rank), ``queue_mean_ns`` / ``queue_p50_ns`` (kernel GPU start minus the end of its launching
call), ``kernel_p50_ns`` (median kernel duration), ``short_kernels`` (kernels that ran shorter
than their launching call took), ``kernels_per_ms`` and ``launches_per_ms`` (per ms of wall time).

On top of these, in :mod:`tracekit.analyze.sections.idle_findings`: ``idle_findings`` (one finding
per host-bound, API-bound or waiting phase, the rule in docs/idle.md) and ``microbatch_advice``
(the ``larger_micro_batch`` what-if).
Every function here only computes; :mod:`tracekit.render.idle_tables` draws the table.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from tracekit.analyze.model.intervals import union
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.trace.export import Export

TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
CATEGORIES = ("gpu_busy_ns", "waiting_ns", "in_api_ns", "between_api_ns")
#: call name (without the ``_vNNNN`` suffix) -> group, the first matching pattern wins
API_GROUPS = (
    ("launch", r"Launch"),
    ("synchronize", r"Synchronize"),
    ("memcpy", r"Memcpy|Memset"),
    ("allocator", r"Malloc|Free|Alloc|MemPool|HostRegister|HostUnregister|"
                  r"^cuMem(Create|Map|Unmap|Release|Address|SetAccess)"),
    ("event", r"Event"),
)
GROUPS = (*(g for g, _ in API_GROUPS), "other")
_SUFFIX = re.compile(r"_v\d+$")


def short_name(name: str | None) -> str:
    """A runtime call's name without nsys' ``_vNNNN`` version suffix (``"?"`` for none)."""
    return _SUFFIX.sub("", name) if name else "?"


def api_group(name: str) -> str:
    """The group of a call name (:data:`API_GROUPS`): launch, synchronize, memcpy (copies and
    memsets, which block the thread for pageable memory), allocator, event, else other."""
    for g, pat in API_GROUPS:
        if re.search(pat, name):
            return g
    return "other"


def api_call_codes(export: Export, model: PhaseModel) -> tuple[pl.DataFrame, list[str], list[str]]:
    """Every CUDA API call of the threads that launched GPU work, with its name as a code:
    ``(calls, names, groups)``, ``calls`` with ``launch_tid, start, end`` (ns) and ``code``
    (Int32, 1-based into ``names``,
    the distinct short names, sorted; ``groups[k]`` is the group of ``names[k]``). Computed once
    per model; the strings are not repeated per call (a 10 GB trace has ~1.2 M calls), and the
    rows read are not kept beside them (the query is not memoized: a 1x trace held both)."""
    def compute() -> tuple[pl.DataFrame, list[str], list[str]]:
        schema = {"launch_tid": pl.Int64, "start": pl.Int64, "end": pl.Int64, "name_id": pl.Int64}
        cols = set(export.columns(TABLE))
        tids = model.ops["launch_tid"].drop_nulls().unique()
        if not {"globalTid", "start", "end"} <= cols or tids.len() == 0:
            return pl.DataFrame(schema={**schema, "code": pl.Int32}).drop("name_id"), [], []
        name = "CASE WHEN typeof(nameId) = 'integer' THEN nameId END" if "nameId" in cols else "NULL"
        # rows whose times or thread are not integers (a damaged or edited export) are left out
        rt = export.query(f"""SELECT globalTid, start, "end", {name} FROM {TABLE}
                              WHERE typeof(globalTid) = 'integer' AND typeof(start) = 'integer'
                                AND typeof("end") = 'integer' AND "end" > start""", schema=schema, memo=False)
        mine = rt.select(pl.col("launch_tid").is_in(tids.implode()))["launch_tid"]
        if mine.null_count() or not mine.all():  # (most often every call is of such a thread: no copy)
            rt = rt.filter(mine)
        ids = rt["name_id"].drop_nulls().unique().to_list()
        by_id = {i: short_name(s) for i, s in export.strings(ids).items()}
        names = sorted(set(by_id.values()) | {"?"})  # "?": a call with no name
        code = {n: k for k, n in enumerate(names, 1)}
        rt = rt.with_columns(code=pl.col("name_id").replace_strict({i: code[n] for i, n in by_id.items()},
                                                                   default=code["?"], return_dtype=pl.Int32))
        return rt.drop("name_id"), names, [api_group(n) for n in names]

    return model.derived("idle_api_call_codes", compute)


def _inside(u: tuple[np.ndarray, np.ndarray], p: np.ndarray) -> np.ndarray:
    """Whether each time of ``p`` lies in the sorted disjoint union ``u``."""
    if u[0].size == 0:
        return np.zeros(p.size, dtype=bool)
    i = np.searchsorted(u[0], p, side="right") - 1
    return (i >= 0) & (p < u[1][np.maximum(i, 0)])


#: edges per run of intervals that :func:`classify` splits into segments at a time
_SEGMENT_BATCH = 1 << 16

_SEG_SCHEMA = {"iid": pl.Int64, "cat": pl.String, "name": pl.String, "group": pl.String, "ns": pl.Int64}


def classify(intervals: pl.DataFrame, busy: pl.DataFrame, comm: pl.DataFrame,
             calls: pl.DataFrame, codes_of: tuple[list[str], list[str]]) -> pl.DataFrame:
    """Split disjoint ``intervals`` (columns ``iid``, ``start``, ``end``) of one rank into the
    categories of the module doc. ``busy`` and ``comm`` hold the rank's compute ops and
    communication kernels (``start``, ``end``), ``calls`` the API calls of its launching threads
    (``start``, ``end``, ``code``: :func:`api_call_codes`, whose ``names, groups`` are
    ``codes_of``). Returns one row per interval, category and call:
    ``iid``, ``cat`` (one of :data:`CATEGORIES`), ``name`` (the call for ``in_api_ns``, else
    null), ``group``, ``ns`` (Int64); categories with no time have no row."""
    iv = intervals.sort("start")
    ws, we = iv["start"].to_numpy(), iv["end"].to_numpy()
    out_schema = _SEG_SCHEMA
    if ws.size == 0:
        return pl.DataFrame(schema=out_schema)
    lo, hi = int(ws.min()), int(we.max())

    def clipped(f: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        f = f.filter((pl.col("end") > lo) & (pl.col("start") < hi))  # (clipped: no edge far outside)
        return union(np.clip(f["start"].to_numpy(), lo, hi), np.clip(f["end"].to_numpy(), lo, hi))

    b, c = clipped(busy), clipped(comm)
    cs_all, ce_all = calls["start"].to_numpy(), calls["end"].to_numpy()
    inside = (ce_all > lo) & (cs_all < hi)
    every = bool(inside.all())
    # the calls made disjoint (where calls overlap, the one that began first keeps the overlap):
    # sorted by (clipped) start, a call keeps what lies past every earlier call's end (``run``);
    # each run of intervals below makes its own pieces from its slice of these arrays. (The calls
    # inside taken as arrays and clipped in place: no copy of the calls' frame, one array a column;
    # a 10 GB trace has ~1.2 M calls)
    ss = cs_all.copy() if every else cs_all[inside]
    se = ce_all.copy() if every else ce_all[inside]
    del cs_all, ce_all
    np.clip(ss, lo, hi, out=ss)
    np.clip(se, lo, hi, out=se)
    order = np.argsort(ss, kind="stable") if ss.size and (ss[1:] < ss[:-1]).any() else None
    if order is not None:
        ss, se = ss[order], se[order]
    run = np.maximum.accumulate(se) if se.size else se
    has_calls = ss.size > 0
    # the call name of each in-API segment, as a code into the distinct names (0: no call); the
    # sums per (interval, category, name) are taken on one Int64 key
    name_of, group_of = [None, *codes_of[0]], [None, *codes_of[1]]
    codes = (calls["code"].to_numpy() if every else calls["code"].to_numpy()[inside]) if has_calls \
        else np.zeros(0, np.int64)
    del inside
    nn = len(name_of)
    # the elementary segments are made and summed for a run of neighbouring intervals at a time
    # (about _SEGMENT_BATCH edges each), so that their arrays do not grow with the trace: b, c and
    # the calls are sorted and disjoint, and each run sees exactly the edges inside its span
    inner = sum(np.searchsorted(x[0], we, side="left") - np.searchsorted(x[0], ws, side="left")
                for x in (b, c, (ss, se)))
    batch = np.cumsum(inner + 2) // _SEGMENT_BATCH
    cuts = np.flatnonzero(np.diff(batch)) + 1
    keys, sums = [], []
    for i0, i1 in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [ws.size]]).tolist()):
        blo, bhi = int(ws[i0]), int(we[i0:i1].max())

        def part(s_: np.ndarray, e_: np.ndarray) -> tuple[slice, np.ndarray, np.ndarray]:
            j = slice(int(np.searchsorted(e_, blo, side="right")), int(np.searchsorted(s_, bhi, side="left")))
            return j, np.clip(s_[j], blo, bhi), np.clip(e_[j], blo, bhi)

        _, b0, b1 = part(*b)
        _, c0, c1 = part(*c)
        a, z = int(np.searchsorted(run, blo, side="right")), int(np.searchsorted(ss, bhi, side="left"))
        if z > a:
            first = np.array([run[a - 1] if a > 0 else np.iinfo(np.int64).min], dtype=run.dtype)
            s2, e2 = np.maximum(ss[a:z], np.concatenate([first, run[a:z - 1]])), se[a:z]
            keep = (e2 > s2) & (e2 > blo) & (s2 < bhi)
            cs_, ce_ = np.clip(s2[keep], blo, bhi), np.clip(e2[keep], blo, bhi)
            ci_ = np.arange(a, z)[keep]
            ci_ = order[ci_] if order is not None else ci_
        else:
            cs_ = ce_ = ci_ = np.zeros(0, np.int64)
        bws, bwe = ws[i0:i1], we[i0:i1]
        pts = np.sort(np.concatenate([bws, bwe, b0, b1, c0, c1, cs_, ce_]))
        pts = pts[np.concatenate([[True], pts[1:] != pts[:-1]])]  # (np.unique's hash path is slower)
        seg_s, seg_e = pts[:-1], pts[1:]
        w = np.searchsorted(bws, seg_s, side="right") - 1
        keep = (w >= 0) & (seg_s < bwe[np.maximum(w, 0)])
        seg_s, seg_e, w = seg_s[keep], seg_e[keep], w[keep] + i0
        in_b = _inside((b0, b1), seg_s)
        in_c = _inside((c0, c1), seg_s) & ~in_b
        k = np.searchsorted(cs_, seg_s, side="right") - 1
        in_a = (k >= 0) & (seg_s < ce_[np.maximum(k, 0)]) & ~in_b & ~in_c if cs_.size \
            else np.zeros(seg_s.size, bool)
        cat = np.where(in_b, 0, np.where(in_c, 1, np.where(in_a, 2, 3)))
        code = np.where(in_a, codes[ci_[np.maximum(k, 0)]] if cs_.size else 0, 0).astype(np.int64)
        g = pl.DataFrame({"key": (w.astype(np.int64) * 4 + cat) * nn + code,
                          "ns": (seg_e - seg_s).astype(np.int64)}).group_by("key").agg(pl.col("ns").sum())
        keys.append(g["key"])
        sums.append(g["ns"])
    seg = pl.DataFrame({"key": pl.concat(keys), "ns": pl.concat(sums)})
    uk = seg["key"].to_numpy()
    ucode, rest = uk % nn, uk // nn
    return pl.DataFrame({"iid": iv["iid"].to_numpy()[rest // 4], "cat": [CATEGORIES[c] for c in (rest % 4).tolist()],
                         "name": [name_of[c] for c in ucode.tolist()], "group": [group_of[c] for c in ucode.tolist()],
                         "ns": seg["ns"]}, schema=out_schema)


def _rank_parts(model: PhaseModel, export: Export):
    """Per rank: ``(global_pid, device, compute ops, communication kernels, API calls)``."""
    from tracekit.analyze.sections.transfer_common import model_compute_ops, model_kernel_frames

    active = model_compute_ops(model)
    _k, comm = model_kernel_frames(model)
    calls = api_call_codes(export, model)[0]
    threads = model.ops.select("global_pid", "device", "launch_tid").drop_nulls().unique()
    from tracekit.analyze.sections.breakdown import ranks

    for gpid, dev in ranks(model).select("global_pid", "device").iter_rows():
        def of(f):  # (the four columns picked before the filter: the ops are not copied whole)
            return f.select("global_pid", "device", "start", "end").filter(
                (pl.col("global_pid") == gpid) & (pl.col("device") == dev)).select("start", "end")

        tids = threads.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev))["launch_tid"]
        mine = calls.select(pl.col("launch_tid").is_in(tids.implode()))["launch_tid"]
        # (one rank's threads made every call, most often: the calls are not copied then)
        yield gpid, dev, of(active), of(comm), calls if mine.all() else calls.filter(mine)


def _breakdown(model: PhaseModel, export: Export, intervals: pl.DataFrame,
               keys: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``intervals``: rows with ``global_pid, device, start, end`` and ``keys`` (disjoint per
    rank). Returns ``(per key: keys + CATEGORIES + wall_ns, per key and call: keys + name, group,
    ns)``."""
    by = ["global_pid", "device", *keys]
    iv = intervals.with_row_index("iid").with_columns(pl.col("iid").cast(pl.Int64))
    parts = []
    codes_of = api_call_codes(export, model)[1:]
    for gpid, dev, busy, comm, calls in _rank_parts(model, export):
        mine = iv.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev))
        if mine.height:
            parts.append(classify(mine.select("iid", "start", "end"), busy, comm, calls, codes_of))
    seg = pl.concat(parts) if parts else pl.DataFrame(schema=_SEG_SCHEMA)
    seg = seg.join(iv.select("iid", *by), on="iid")
    wide = seg.group_by(by).agg(**{c: pl.col("ns").filter(pl.col("cat") == c).sum() for c in CATEGORIES})
    wall = iv.group_by(by).agg(wall_ns=(pl.col("end") - pl.col("start")).sum())
    wide = wall.join(wide, on=by, how="left", nulls_equal=True).with_columns(
        **{c: pl.col(c).fill_null(0).cast(pl.Int64) for c in CATEGORIES})
    by_api = seg.filter(pl.col("cat") == "in_api_ns").group_by(*by, "name", "group").agg(pl.col("ns").sum())
    return (wide.select(*by, "wall_ns", *CATEGORIES).sort(by, nulls_last=False),
            by_api.sort([*by, "ns", "name"], descending=[False] * len(by) + [True, False], nulls_last=False))


def idle_windows(model: PhaseModel, export: Export) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The idle breakdown of every phase window of every rank, summed per phase row
    (``global_pid, device, iteration, phase, micro_step``: ``other`` inside an iteration sums its
    gaps, as :func:`tracekit.analyze.sections.breakdown.phase_table` does). Returns
    ``(idle, idle_by_api)``: ``idle`` with those keys plus ``boundary`` (the gradient accumulation
    boundary backward), ``wall_ns`` and :data:`CATEGORIES`
    (ns, the four summing to ``wall_ns``); ``idle_by_api`` with the keys plus ``name``, ``group``
    and ``ns`` (the ``in_api_ns`` of each call name, largest first). Computed once per model."""
    from tracekit.analyze.sections.breakdown import rank_windows

    def compute():
        w = rank_windows(model).select(*ROW_KEYS, "boundary", "start", "end")
        wide, by_api = _breakdown(model, export, w.drop("boundary"), ["iteration", "phase", "micro_step"])
        b = w.group_by(ROW_KEYS).agg(pl.col("boundary").any())  # (the accumulation boundary, for the tables)
        wide = wide.join(b, on=list(ROW_KEYS), how="left", nulls_equal=True, maintain_order="left")
        return wide.select(*ROW_KEYS, "boundary", "wall_ns", *CATEGORIES), by_api

    return model.derived("idle_windows", compute)


def idle_sub_phases(model: PhaseModel, export: Export, phase: str = "update") -> pl.DataFrame:
    """The idle breakdown of ``phase`` per iteration and sub-phase (the self time of each NVTX
    range nested in the phase window, :func:`tracekit.analyze.sections.breakdown.self_segments`;
    ``(none)`` for time directly in the phase range): ``global_pid, device, iteration, phase,
    sub_phase, wall_ns`` and :data:`CATEGORIES` (ns). Empty when the phase has no windows."""
    from tracekit.analyze.sections.breakdown import rank_windows, self_segments

    wm = rank_windows(model).filter(pl.col("phase") == phase)
    if wm.height == 0:
        return pl.DataFrame(schema={"global_pid": pl.Int64, "device": pl.Int64, "iteration": pl.Int64,
                                    "phase": pl.String, "sub_phase": pl.String, "wall_ns": pl.Int64,
                                    **{c: pl.Int64 for c in CATEGORIES}})
    segs = self_segments(model, wm).rename({"s": "start", "e": "end"})
    wide, _ = _breakdown(model, export, segs, ["iteration", "sub_phase"])
    return wide.with_columns(phase=pl.lit(phase)).select(
        "global_pid", "device", "iteration", "phase", "sub_phase", "wall_ns", *CATEGORIES)


LAUNCH_COLUMNS = ("kernel_count", "launch_count", "kernels_per_ms", "launches_per_ms", "launch_mean_ns",
                  "launch_p50_ns", "launch_p99_ns", "queue_mean_ns", "queue_p50_ns", "kernel_p50_ns",
                  "short_kernels")


def launch_stats(model: PhaseModel, export: Export, by: tuple[str, ...] = ("iteration", "phase", "micro_step"),
                 idle: pl.DataFrame | None = None) -> pl.DataFrame:
    """Launch statistics (module doc) per rank and ``by`` of the kernels attributed to each
    window: ``global_pid, device``, ``by``, ``wall_ns`` and :data:`LAUNCH_COLUMNS` (counts,
    ns, per ms of wall time; null means where there is no launch). ``idle`` (the first frame of
    :func:`idle_windows`) gives the wall time of each row; every row of it gets a row here."""
    keys = ["global_pid", "device", *by]
    idle = idle_windows(model, export)[0] if idle is None else idle
    names = export.strings(model.ops["api_name_id"].drop_nulls().unique().to_list())
    launch_ids = [i for i, n in names.items() if api_group(short_name(n)) == "launch"]
    # (the columns read, picked before the filter: the kernel rows are not copied whole)
    cols = dict.fromkeys([*keys, "kind", "start", "end", "launch", "api_end", "api_name_id"])
    k = model.ops.select(list(cols)).filter((pl.col("kind") == "kernel") & pl.col("device").is_not_null()).with_columns(
        dur=pl.col("end") - pl.col("start"),
        api=pl.when(pl.col("api_name_id").is_in(launch_ids)).then(pl.col("api_end") - pl.col("launch")),
    ).with_columns(queue=pl.when(pl.col("api").is_not_null()).then(pl.col("start") - pl.col("api_end")))
    lq = pl.col("api").drop_nulls()
    stats = k.group_by(keys).agg(
        kernel_count=pl.len().cast(pl.Int64),
        launch_count=lq.len().cast(pl.Int64),
        launch_mean_ns=lq.mean(),
        launch_p50_ns=lq.quantile(0.5, "nearest"),
        launch_p99_ns=lq.quantile(0.99, "nearest"),
        queue_mean_ns=pl.col("queue").drop_nulls().mean(),
        queue_p50_ns=pl.col("queue").drop_nulls().quantile(0.5, "nearest"),
        kernel_p50_ns=pl.col("dur").quantile(0.5, "nearest"),
        short_kernels=(pl.col("api").is_not_null() & (pl.col("dur") < pl.col("api"))).sum().cast(pl.Int64),
    )
    base = idle.group_by(keys).agg(pl.col("wall_ns").sum()) if by != ("iteration", "phase", "micro_step") \
        else idle.select(*keys, "wall_ns")
    out = base.join(stats, on=keys, how="left", nulls_equal=True).with_columns(
        pl.col("kernel_count", "launch_count", "short_kernels").fill_null(0))
    ms = pl.col("wall_ns").cast(pl.Float64) / 1e6
    out = out.with_columns(kernels_per_ms=pl.when(ms > 0).then(pl.col("kernel_count") / ms),
                           launches_per_ms=pl.when(ms > 0).then(pl.col("launch_count") / ms))
    return out.select(*keys, "wall_ns", *LAUNCH_COLUMNS).sort(keys, nulls_last=False)


def idle_phase(idle: pl.DataFrame) -> pl.DataFrame:
    """Whole-trace sums per rank and phase of the first frame of :func:`idle_windows`:
    ``global_pid, device, phase, wall_ns`` and :data:`CATEGORIES` (ns)."""
    return idle.group_by("global_pid", "device", "phase").agg(
        pl.col("wall_ns", *CATEGORIES).sum()).sort("global_pid", "device", "phase")


def breakdown_json(idle: pl.DataFrame, by_api: pl.DataFrame) -> dict[tuple, dict]:
    """``{(global_pid, device, iteration, phase, micro_step): {"gpu_busy_ns", "in_api_ns",
    "between_api_ns", "waiting_ns", "by_api": {call: ns}, "by_api_group": {group: ns}}}``
    from the frames of :func:`idle_windows` (``by_api`` largest first)."""
    keys = ("global_pid", "device", "iteration", "phase", "micro_step")
    calls: dict[tuple, dict] = {}
    groups: dict[tuple, dict] = {}
    for r in by_api.iter_rows(named=True):
        key = tuple(r[k] for k in keys)
        calls.setdefault(key, {})[r["name"]] = int(r["ns"])
        g = groups.setdefault(key, {})
        g[r["group"]] = g.get(r["group"], 0) + int(r["ns"])
    out = {}
    for r in idle.iter_rows(named=True):
        key = tuple(r[k] for k in keys)
        out[key] = {"gpu_busy_ns": int(r["gpu_busy_ns"]), "in_api_ns": int(r["in_api_ns"]),
                    "between_api_ns": int(r["between_api_ns"]), "waiting_ns": int(r["waiting_ns"]),
                    "by_api": calls.get(key, {}),
                    "by_api_group": dict(sorted(groups.get(key, {}).items(), key=lambda kv: (-kv[1], kv[0])))}
    return out


ROW_KEYS = ("global_pid", "device", "iteration", "phase", "micro_step")


def phase_json(model: PhaseModel, export: Export) -> dict[tuple, dict]:
    """Per phase row key (:data:`ROW_KEYS`): ``{"idle_breakdown": {...}, "launch_stats": {...}}``,
    the JSON of :func:`breakdown_json` and of :func:`launch_stats` (:data:`LAUNCH_COLUMNS`;
    floats rounded to 6 decimals, NaN as null)."""
    from tracekit.vocab import json_number

    w, api = idle_windows(model, export)
    bd = breakdown_json(w, api)
    out = {k: {"idle_breakdown": v} for k, v in bd.items()}
    for r in launch_stats(model, export, idle=w).iter_rows(named=True):
        key = tuple(r[k] for k in ROW_KEYS)
        vals = {c: json_number(c, r[c]) for c in LAUNCH_COLUMNS}
        out.setdefault(key, {})["launch_stats"] = vals
    return out



def breakdown_of(model: PhaseModel, export: Export, intervals: pl.DataFrame, keys: tuple[str, ...]) -> pl.DataFrame:
    """The :data:`CATEGORIES` of any windows, such as the time bins of the report's timeline:
    ``intervals`` has ``global_pid, device, start, end`` (ns; disjoint per rank) and ``keys``;
    returns ``global_pid, device``, ``keys``, ``wall_ns`` and :data:`CATEGORIES` (ns, summing to
    ``wall_ns``), one row per key. The same classification as :func:`idle_windows`."""
    return _breakdown(model, export, intervals, list(keys))[0]
