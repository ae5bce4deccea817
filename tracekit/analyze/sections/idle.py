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
classified once). The API calls are read once per breakdown in rowid chunks and classified a
time span at a time (:func:`_stream_spans`), so that what is held does not grow with the trace;
an export whose calls are not in start order by rowid has them read whole (:func:`api_call_codes`).

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
from tracekit.analyze.trace.heap import release

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


#: the columns of the API calls the breakdowns classify (times in ns; ``code`` 1-based into the names)
_CALLS_SCHEMA = {"launch_tid": pl.Int64, "start": pl.Int64, "end": pl.Int64, "code": pl.Int32}


def _calls_query(export: Export, model: PhaseModel) -> tuple[str, dict, pl.Series] | None:
    """``(sql, schema, tids)``: the query of the CUDA API calls :func:`api_call_codes` and
    :func:`_stream_spans` read (``launch_tid, start, end, name_id``, Int64) and the launching
    threads (``model.ops``' ``launch_tid``); None when the table lacks the columns or no thread
    launched GPU work."""
    cols = set(export.columns(TABLE))
    tids = model.scan_ops().select(pl.col("launch_tid").drop_nulls().unique()).collect().to_series()
    if not {"globalTid", "start", "end"} <= cols or tids.len() == 0:
        return None
    name = "CASE WHEN typeof(nameId) = 'integer' THEN nameId END" if "nameId" in cols else "NULL"
    # rows whose times or thread are not integers (a damaged or edited export) are left out
    sql = f"""SELECT globalTid, start, "end", {name} FROM {TABLE}
              WHERE typeof(globalTid) = 'integer' AND typeof(start) = 'integer'
                AND typeof("end") = 'integer' AND "end" > start"""
    return sql, {"launch_tid": pl.Int64, "start": pl.Int64, "end": pl.Int64, "name_id": pl.Int64}, tids


def _of_threads(rt: pl.DataFrame, tids: pl.Series) -> pl.DataFrame:
    """The rows of ``rt`` whose ``launch_tid`` is one of ``tids``."""
    mine = rt.select(pl.col("launch_tid").is_in(tids.implode()))["launch_tid"]
    # (most often every call is of such a thread: no copy)
    return rt if not mine.null_count() and mine.all() else rt.filter(mine)


def api_call_codes(export: Export, model: PhaseModel) -> tuple[pl.DataFrame, list[str], list[str]]:
    """Every CUDA API call of the threads that launched GPU work, with its name as a code:
    ``(calls, names, groups)``, ``calls`` with ``launch_tid, start, end`` (ns) and ``code``
    (Int32, 1-based into ``names``,
    the distinct short names, sorted; ``groups[k]`` is the group of ``names[k]``), in rowid
    order. The whole table at once (a 10 GB trace has ~1.2 M calls): what the breakdowns fall
    back to when the calls are not in start order by rowid (:func:`_stream_spans`); not kept."""
    q = _calls_query(export, model)
    if q is None:
        return pl.DataFrame(schema=_CALLS_SCHEMA), [], []
    sql, schema, tids = q
    rt = _of_threads(export.query(sql, schema=schema, memo=False), tids)
    ids = rt["name_id"].drop_nulls().unique().to_list()
    by_id = {i: short_name(s) for i, s in export.strings(ids).items()}
    names = sorted(set(by_id.values()) | {"?"})  # "?": a call with no name
    code = {n: k for k, n in enumerate(names, 1)}
    rt = rt.with_columns(code=pl.col("name_id").replace_strict({i: code[n] for i, n in by_id.items()},
                                                               default=code["?"], return_dtype=pl.Int32))
    return rt.drop("name_id"), names, [api_group(n) for n in names]


class _Unordered(Exception):
    """The API calls of the launching threads are not in ``start`` order by rowid."""


#: rowids of the runtime table per chunk read by :func:`_stream_spans` (about 0.5 MiB of calls;
#: the reader holds a few chunks ahead)
_CALL_CHUNK = 1 << 14


def _stream_spans(export: Export, model: PhaseModel):
    """The API calls of :func:`api_call_codes` a time span at a time, read once in rowid order
    in chunks of :data:`_CALL_CHUNK` rowids. Yields ``(lo, hi, calls, names, groups)``: spans
    [lo, hi) (ns) that follow each other and cover all time (the first ``lo`` and the last ``hi``
    are the Int64 limits), ``calls`` the calls that can overlap the span (``launch_tid, start,
    end``, Int64, and ``code``, Int32, 1-based into ``names``; in rowid order), ``names`` and
    ``groups`` the call names and groups of the codes so far (they grow from span to span).
    Every call in flight at an instant of [lo, hi) is in ``calls``: a call that began before
    the span and ends inside or after it (a long synchronize) is carried from span to span.

    Needs the calls of the launching threads in ``start`` order by rowid (true of nearly every
    export): each span ends at the last start read so far. Raises :class:`_Unordered`, at the
    first chunk where the order does not hold, after spans were yielded perhaps."""
    lo_, hi_ = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    q = _calls_query(export, model)
    if q is None:
        yield lo_, hi_, pl.DataFrame(schema=_CALLS_SCHEMA), [], []
        return
    sql, schema, tids = q
    names: list[str] = []
    groups: list[str] = []
    by_name: dict[str, int] = {}
    code_of: dict[int, int] = {}  # name id -> code

    def code(n: str) -> int:
        if n not in by_name:
            names.append(n)
            groups.append(api_group(n))
            by_name[n] = len(names)
        return by_name[n]

    held = None  # the calls read that may overlap the next span
    lo = last = lo_
    chunks = export.query_chunks(sql, (), schema, table=TABLE, chunk_rows=_CALL_CHUNK)
    try:
        for rt in chunks:
            rt = _of_threads(rt, tids)
            if rt.height == 0:
                continue
            s = rt["start"].to_numpy()
            if s[0] < last or (s[1:] < s[:-1]).any():
                raise _Unordered
            last = int(s[-1])
            new = [i for i in rt["name_id"].drop_nulls().unique().to_list() if i not in code_of]
            got = export.strings(new)
            code_of.update({i: code(short_name(got.get(i))) for i in new})  # (no name, or none in StringIds: "?")
            rt = rt.with_columns(code=pl.col("name_id").replace_strict(code_of, default=code("?"),
                                                                       return_dtype=pl.Int32)).drop("name_id")
            held = rt if held is None else pl.concat([held, rt])
            if last > lo:  # every call that began before ``last`` is read: [lo, last) is complete
                yield lo, last, held, names, groups
                lo = last
                held = held.filter(pl.col("end") > lo)
    finally:
        chunks.close()
    yield lo, hi_, pl.DataFrame(schema=_CALLS_SCHEMA) if held is None else held, names, groups


def _inside(u: tuple[np.ndarray, np.ndarray], p: np.ndarray) -> np.ndarray:
    """Whether each time of ``p`` lies in the sorted disjoint union ``u``."""
    if u[0].size == 0:
        return np.zeros(p.size, dtype=bool)
    i = np.searchsorted(u[0], p, side="right") - 1
    return (i >= 0) & (p < u[1][np.maximum(i, 0)])


#: edges per run of intervals that :func:`classify` splits into segments at a time
_SEGMENT_BATCH = 1 << 14

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
    if ws.size == 0:
        return pl.DataFrame(schema=_SEG_SCHEMA)
    lo, hi = int(ws.min()), int(we.max())

    def clipped(f: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        f = f.filter((pl.col("end") > lo) & (pl.col("start") < hi))  # (clipped: no edge far outside)
        return union(np.clip(f["start"].to_numpy(), lo, hi), np.clip(f["end"].to_numpy(), lo, hi))

    return _classify(iv["iid"].to_numpy(), ws, we, clipped(busy), clipped(comm), calls["start"].to_numpy(),
                     calls["end"].to_numpy(), calls["code"].to_numpy(), codes_of)


def _classify(iids: np.ndarray, ws: np.ndarray, we: np.ndarray, b: tuple[np.ndarray, np.ndarray],
              c: tuple[np.ndarray, np.ndarray], cs_all: np.ndarray, ce_all: np.ndarray, code_all: np.ndarray,
              codes_of: tuple[list[str], list[str]]) -> pl.DataFrame:
    """:func:`classify` on arrays: the intervals ``iids, ws, we`` (disjoint, sorted by start, not
    empty), the sorted disjoint unions ``b`` and ``c`` of the busy and communication times (they
    may reach outside the intervals), the calls ``cs_all, ce_all, code_all`` (in rowid order)."""
    out_schema = _SEG_SCHEMA
    lo, hi = int(ws.min()), int(we.max())
    inside = (ce_all > lo) & (cs_all < hi)
    every = bool(inside.all())
    # the calls made disjoint (where calls overlap, the one that began first keeps the overlap):
    # sorted by (clipped) start, a call keeps what lies past every earlier call's end (``run``);
    # each run of intervals below makes its own pieces from its slice of these arrays. (The calls
    # inside taken as arrays and clipped in place: no copy of the calls' frame, one array a column;
    # read whole, a 10 GB trace has ~1.2 M calls)
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
    codes = (code_all if every else code_all[inside]) if has_calls else np.zeros(0, np.int64)
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
        key = (w.astype(np.int64) * 4 + cat) * nn + code
        if key.size:  # the segments' ns summed per key (sorted, then summed per run of one key)
            by_key = np.argsort(key, kind="stable")
            key, ns = key[by_key], (seg_e - seg_s).astype(np.int64)[by_key]
            first = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
            keys.append(key[first])
            sums.append(np.add.reduceat(ns, first))
    uk = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    ucode, rest = uk % nn, uk // nn
    return pl.DataFrame({"iid": iids[rest // 4], "cat": [CATEGORIES[c] for c in (rest % 4).tolist()],
                         "name": [name_of[c] for c in ucode.tolist()], "group": [group_of[c] for c in ucode.tolist()],
                         "ns": np.concatenate(sums) if sums else np.zeros(0, np.int64)}, schema=out_schema)


def _rank_ops(f: pl.DataFrame | pl.LazyFrame, gpid: int, dev: int) -> tuple[np.ndarray, np.ndarray]:
    """The [start, end) of the rows of ``f`` (a frame, or a query of the ops) of the rank
    ``gpid, dev`` (empty intervals left out) in start order: the two time columns themselves (no
    copy where every row of a frame is of the rank, as with one rank a process; else those of its
    rows), or, where they are not in start order, their union
    (:func:`tracekit.analyze.model.intervals.union`). What :class:`_Sweep` makes the union of, a
    span at a time."""
    mine = (pl.col("global_pid") == gpid) & (pl.col("device") == dev) & (pl.col("end") > pl.col("start"))
    if isinstance(f, pl.DataFrame) and f.height and f.select(mine.fill_null(False).all()).item():
        t = f.select("start", "end")
    else:
        t = f.lazy().filter(mine).select("start", "end").collect()
    s, e = t["start"].to_numpy(), t["end"].to_numpy()
    del t
    return (s, e) if s.size == 0 or not (s[1:] < s[:-1]).any() else union(s, e)


class _Sweep:
    """The union of intervals in start order (:func:`_rank_ops`), made a time span at a time:
    :meth:`upto` gives the pieces of the union that the intervals starting before a time make,
    those not given before and the last one given (which may reach on), so that the spans of
    :func:`_stream_spans` see the union about them without the whole union of a rank held."""

    def __init__(self, ops: tuple[np.ndarray, np.ndarray]) -> None:
        self.s, self.e = ops
        self.next = 0  # the first interval not swept yet
        self.last: tuple[int, int] | None = None  # the last piece made

    def upto(self, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)``: sorted disjoint pieces of the union, the last piece made so far
        and those of the intervals that start before ``hi`` (not swept yet); every point before
        ``hi`` and at or after the previous call's ``hi`` that the union holds lies in them,
        each piece whole."""
        q = int(np.searchsorted(self.s, hi, side="left")) if hi < np.iinfo(np.int64).max else self.s.size
        s, e = self.s[self.next:q], self.e[self.next:q]
        self.next = max(self.next, q)
        if self.last is not None:
            s, e = np.concatenate([[self.last[0]], s]), np.concatenate([[self.last[1]], e])
        if s.size == 0:
            return s.astype(np.int64), e.astype(np.int64)
        u = union(s, e)
        self.last = (int(u[0][-1]), int(u[1][-1]))
        return u


def _rank_parts(model: PhaseModel):
    """Per rank: ``(global_pid, device, busy, comm, threads)``: the intervals (:func:`_rank_ops`)
    of its compute ops and of its communication kernels, and its launching threads
    (``launch_tid``). (Each rank's times are read from the ops for it: no frame of every op's
    columns is held while the calls are classified.)"""
    from tracekit.analyze.sections.breakdown import ranks
    from tracekit.analyze.sections.transfer_common import compute_ops_query, model_comm_kernels

    active = compute_ops_query(model)
    comm = model_comm_kernels(model)
    # (distinct first, then the nulls dropped: no copy of the three columns of every op)
    threads = model.scan_ops().select("global_pid", "device", "launch_tid").unique().collect().drop_nulls()
    for gpid, dev in ranks(model).select("global_pid", "device").iter_rows():
        tids = threads.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev))["launch_tid"]
        busy, com = _rank_ops(active, gpid, dev), _rank_ops(comm, gpid, dev)
        release()  # (the C heap's pages numpy freed meanwhile: tracekit.analyze.trace.heap)
        yield gpid, dev, busy, com, tids


#: ``model.cache`` key set when the API calls of the model's launching threads are not in start
#: order by rowid: later breakdowns of the model read them whole at once (:func:`api_call_codes`)
_UNORDERED = "idle_calls_unordered"


def _whole_spans(export: Export, model: PhaseModel):
    """One span of all time with every call (:func:`api_call_codes`), as :func:`_stream_spans` yields."""
    calls, names, groups = api_call_codes(export, model)
    yield np.iinfo(np.int64).min, np.iinfo(np.int64).max, calls, names, groups


def _breakdowns(model: PhaseModel, export: Export,
                sets: list[tuple[pl.DataFrame, list[str]]]) -> list[tuple[pl.DataFrame, pl.DataFrame]]:
    """The breakdown of several sets of intervals from one read of the API calls. Each set is
    ``(intervals, keys)``: rows with ``global_pid, device, start, end`` and ``keys`` (disjoint per
    rank). Returns per set ``(per key: keys + CATEGORIES + wall_ns, per key and call: keys + name,
    group, ns)``.

    The calls are read and classified a time span at a time (:func:`_stream_spans`), each
    interval cut at the span edges (its sums are those of the whole interval), so that what is
    held does not grow with the trace; where the calls are not in start order by rowid, they are
    read whole instead (:func:`api_call_codes`, one span), and the model remembers it
    (:data:`_UNORDERED`)."""
    ivs = [iv.with_row_index("iid").with_columns(pl.col("iid").cast(pl.Int64)) for iv, _ in sets]
    rank_parts = list(_rank_parts(model))
    # per set and rank, the intervals with time as arrays sorted by start, and the running
    # maximum of their ends (a span finds its intervals by bisection)
    arrays = []
    for iv in ivs:
        per = []
        for gpid, dev, *_ in rank_parts:
            mine = iv.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev)
                             & (pl.col("end") > pl.col("start"))).select("iid", "start", "end")
            ws = mine["start"].to_numpy()
            order = np.argsort(ws, kind="stable")
            ws, we, ii = ws[order], mine["end"].to_numpy()[order], mine["iid"].to_numpy()[order]
            per.append((ii, ws, we, np.maximum.accumulate(we) if we.size else we))
        arrays.append(per)

    def run(spans) -> list[list[pl.DataFrame]]:
        parts: list[list[pl.DataFrame]] = [[] for _ in sets]
        # the busy and communication unions of each rank, made a span at a time
        sweeps = [(_Sweep(b), _Sweep(c)) for _g, _d, b, c, _t in rank_parts]
        for lo, hi, calls, names, groups in spans:
            for (_g, _d, _b, _c, tids), (bs, cs_), *per_set in zip(rank_parts, sweeps, *arrays):
                if not any(ws.size for _i, ws, _e, _m in per_set):
                    continue
                b, c = bs.upto(hi), cs_.upto(hi)
                mine = _of_threads(calls, tids)
                cs, ce, cc = mine["start"].to_numpy(), mine["end"].to_numpy(), mine["code"].to_numpy()
                for k, (ii, ws, we, wmax) in enumerate(per_set):
                    i0, i1 = int(np.searchsorted(wmax, lo, side="right")), int(np.searchsorted(ws, hi, side="left"))
                    if i1 <= i0:
                        continue
                    s_, e_ = np.clip(ws[i0:i1], lo, hi), np.clip(we[i0:i1], lo, hi)
                    keep = e_ > s_  # (an interval inside the bisected run may end before the span)
                    if not keep.all():
                        s_, e_, i_ = s_[keep], e_[keep], ii[i0:i1][keep]
                    else:
                        i_ = ii[i0:i1]
                    if s_.size:
                        parts[k].append(_classify(i_, s_, e_, b, c, cs, ce, cc, (names, groups)))
            release()
        return parts

    if model.cache.get(_UNORDERED):
        parts = run(_whole_spans(export, model))
    else:
        try:
            parts = run(_stream_spans(export, model))
        except _Unordered:
            model.cache[_UNORDERED] = True
            parts = run(_whole_spans(export, model))
    return [_sums(iv, p, ["global_pid", "device", *keys]) for iv, p, (_, keys) in zip(ivs, parts, sets)]


def _sums(iv: pl.DataFrame, parts: list[pl.DataFrame], by: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The frames of :func:`_breakdowns` for the intervals ``iv`` (with ``iid``) from the rows
    of :func:`classify` of their pieces (several rows of an interval, category and call summed)."""
    seg = pl.concat(parts) if parts else pl.DataFrame(schema=_SEG_SCHEMA)
    seg = seg.join(iv.select("iid", *by), on="iid")
    wide = seg.group_by(by).agg(**{c: pl.col("ns").filter(pl.col("cat") == c).sum() for c in CATEGORIES})
    wall = iv.group_by(by).agg(wall_ns=(pl.col("end") - pl.col("start")).sum())
    wide = wall.join(wide, on=by, how="left", nulls_equal=True).with_columns(
        **{c: pl.col(c).fill_null(0).cast(pl.Int64) for c in CATEGORIES})
    by_api = seg.filter(pl.col("cat") == "in_api_ns").group_by(*by, "name", "group").agg(pl.col("ns").sum())
    return (wide.select(*by, "wall_ns", *CATEGORIES).sort(by, nulls_last=False),
            by_api.sort([*by, "ns", "name"], descending=[False] * len(by) + [True, False], nulls_last=False))


def _window_set(model: PhaseModel) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The phase windows of every rank (``ROW_KEYS``, ``boundary``, ``start``, ``end``) and their
    set of intervals for :func:`_breakdowns`."""
    from tracekit.analyze.sections.breakdown import rank_windows

    w = rank_windows(model).select(*ROW_KEYS, "boundary", "start", "end")
    return w, w.drop("boundary")


def _windows_frames(w: pl.DataFrame, got: tuple[pl.DataFrame, pl.DataFrame]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`idle_windows`' frames from the breakdown ``got`` of the windows ``w``."""
    wide, by_api = got
    b = w.group_by(ROW_KEYS).agg(pl.col("boundary").any())  # (the accumulation boundary, for the tables)
    wide = wide.join(b, on=list(ROW_KEYS), how="left", nulls_equal=True, maintain_order="left")
    return wide.select(*ROW_KEYS, "boundary", "wall_ns", *CATEGORIES), by_api


def idle_windows(model: PhaseModel, export: Export) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The idle breakdown of every phase window of every rank, summed per phase row
    (``global_pid, device, iteration, phase, micro_step``: ``other`` inside an iteration sums its
    gaps, as :func:`tracekit.analyze.sections.breakdown.phase_table` does). Returns
    ``(idle, idle_by_api)``: ``idle`` with those keys plus ``boundary`` (the gradient accumulation
    boundary backward), ``wall_ns`` and :data:`CATEGORIES`
    (ns, the four summing to ``wall_ns``); ``idle_by_api`` with the keys plus ``name``, ``group``
    and ``ns`` (the ``in_api_ns`` of each call name, largest first). Computed once per model
    (:func:`idle_frames` computes it with the sub-phases, from one read of the API calls)."""
    def compute():
        w, iv = _window_set(model)
        return _windows_frames(w, _breakdowns(model, export, [(iv, ["iteration", "phase", "micro_step"])])[0])

    return model.derived("idle_windows", compute)


_SUB_KEYS = ["iteration", "sub_phase"]


def _sub_phase_set(model: PhaseModel, phase: str) -> pl.DataFrame | None:
    """The self-time segments of ``phase`` (intervals with ``global_pid, device, iteration,
    sub_phase, start, end``; in no particular order); None when the phase has no windows. The
    windows of :data:`_ITERATIONS_AT_ONCE` iterations at a time (each window's segments are its
    own: the nested ranges of a few windows are gathered at a time, not those of all; issue 24)."""
    from tracekit.analyze.sections.breakdown import rank_windows, self_segments

    wm = rank_windows(model).filter(pl.col("phase") == phase)
    if wm.height == 0:
        return None
    its = wm["iteration"].drop_nulls().unique().sort().to_list()
    parts = [wm.filter(pl.col("iteration").is_null())]
    parts += [wm.filter(pl.col("iteration").is_in(its[i:i + _ITERATIONS_AT_ONCE]))
              for i in range(0, len(its), _ITERATIONS_AT_ONCE)]
    segs = [self_segments(model, w) for w in parts if w.height]
    return pl.concat(segs).rename({"s": "start", "e": "end"})


def _sub_phase_frame(phase: str, wide: pl.DataFrame | None) -> pl.DataFrame:
    """:func:`idle_sub_phases`' frame from the breakdown ``wide`` of the segments (None: no windows)."""
    if wide is None:
        return pl.DataFrame(schema={"global_pid": pl.Int64, "device": pl.Int64, "iteration": pl.Int64,
                                    "phase": pl.String, "sub_phase": pl.String, "wall_ns": pl.Int64,
                                    **{c: pl.Int64 for c in CATEGORIES}})
    return wide.with_columns(phase=pl.lit(phase)).select(
        "global_pid", "device", "iteration", "phase", "sub_phase", "wall_ns", *CATEGORIES)


def idle_sub_phases(model: PhaseModel, export: Export, phase: str = "update") -> pl.DataFrame:
    """The idle breakdown of ``phase`` per iteration and sub-phase (the self time of each NVTX
    range nested in the phase window, :func:`tracekit.analyze.sections.breakdown.self_segments`;
    ``(none)`` for time directly in the phase range): ``global_pid, device, iteration, phase,
    sub_phase, wall_ns`` and :data:`CATEGORIES` (ns). Empty when the phase has no windows.
    Computed once per model and phase."""
    def compute() -> pl.DataFrame:
        segs = _sub_phase_set(model, phase)
        return _sub_phase_frame(phase, None if segs is None else _breakdowns(model, export, [(segs, _SUB_KEYS)])[0][0])

    return model.derived(("idle_sub_phases", phase), compute)


def idle_frames(model: PhaseModel, export: Export, phase: str = "update") \
        -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """``(*idle_windows(model, export), idle_sub_phases(model, export, phase))``, both computed
    from one read of the API calls when neither is computed yet (each is kept on the model as
    those functions keep it)."""
    key = ("idle_sub_phases", phase)
    if "idle_windows" not in model.cache and key not in model.cache:
        w, iv = _window_set(model)
        segs = _sub_phase_set(model, phase)
        got = _breakdowns(model, export, [(iv, ["iteration", "phase", "micro_step"])]
                          + ([] if segs is None else [(segs, _SUB_KEYS)]))
        del iv, segs
        frames = _windows_frames(w, got[0])
        model.derived("idle_windows", lambda: frames)
        sub = _sub_phase_frame(phase, got[1][0] if len(got) > 1 else None)
        model.derived(key, lambda: sub)
    return (*idle_windows(model, export), idle_sub_phases(model, export, phase))


LAUNCH_COLUMNS = ("kernel_count", "launch_count", "kernels_per_ms", "launches_per_ms", "launch_mean_ns",
                  "launch_p50_ns", "launch_p99_ns", "queue_mean_ns", "queue_p50_ns", "kernel_p50_ns",
                  "short_kernels")


#: iterations whose kernels :func:`launch_stats` groups at a time (the shared trace has 4)
_ITERATIONS_AT_ONCE = 8


def launch_stats(model: PhaseModel, export: Export, by: tuple[str, ...] = ("iteration", "phase", "micro_step"),
                 idle: pl.DataFrame | None = None, rows: pl.Expr | None = None) -> pl.DataFrame:
    """Launch statistics (module doc) per rank and ``by`` of the kernels attributed to each
    window: ``global_pid, device``, ``by``, ``wall_ns`` and :data:`LAUNCH_COLUMNS` (counts,
    ns, per ms of wall time; null means where there is no launch). ``idle`` (the first frame of
    :func:`idle_windows`) gives the wall time of each row; every row of it gets a row here.
    ``rows``: a further condition on the rows of ``model.ops`` (such as the warm-up's kernels
    left out); only the kernels it holds for count. (Issue 24: the kernels are grouped a few
    iterations at a time, or one value of ``by``'s first column at a time, and only the columns
    the statistics need are gathered, so that no copy of every kernel is held.)"""
    keys = ["global_pid", "device", *by]
    idle = idle_windows(model, export)[0] if idle is None else idle
    names = export.strings(model.scan_ops().select(pl.col("api_name_id").drop_nulls().unique()).collect()
                           .to_series().to_list())
    launch_ids = [i for i, n in names.items() if api_group(short_name(n)) == "launch"]
    kernels = (pl.col("kind") == "kernel") & pl.col("device").is_not_null()
    if rows is not None:
        kernels = kernels & rows
    api = pl.when(pl.col("api_name_id").is_in(launch_ids)).then(pl.col("api_end") - pl.col("launch"))
    lq = pl.col("api").drop_nulls()
    stats_of = {
        "kernel_count": pl.len().cast(pl.Int64),
        "launch_count": lq.len().cast(pl.Int64),
        "launch_mean_ns": lq.mean(),
        "launch_p50_ns": lq.quantile(0.5, "nearest"),
        "launch_p99_ns": lq.quantile(0.99, "nearest"),
        "queue_mean_ns": pl.col("queue").drop_nulls().mean(),
        "queue_p50_ns": pl.col("queue").drop_nulls().quantile(0.5, "nearest"),
        "kernel_p50_ns": pl.col("dur").quantile(0.5, "nearest"),
        "short_kernels": (pl.col("api").is_not_null() & (pl.col("dur") < pl.col("api"))).sum().cast(pl.Int64),
    }

    def stats_where(where: pl.Expr, key: tuple | None = None) -> pl.DataFrame:
        """The statistics of the kernels of ``where`` per group of ``keys``; ``key``: the one
        group they all are of (its key columns are then not gathered)."""
        # the rows picked first, then only the four time columns (and keys) gathered (issue 24)
        by_ = keys if key is None else []
        k = model.scan_ops().filter(kernels & where).select(*by_, "start", "end", "launch", "api_end",
                                                             "api_name_id").collect()
        k = k.select(*by_, dur=pl.col("end") - pl.col("start"), api=api,
                     queue=pl.when(api.is_not_null()).then(pl.col("start") - pl.col("api_end")))
        if key is None:
            return k.group_by(keys).agg(**stats_of)
        lits = {c: pl.lit(v, model.ops_schema[c]) for c, v in zip(keys, key)}
        if k.height == 0:  # (no group)
            return k.select(**lits, **stats_of).head(0)
        # (a group_by over one group: the same statistics, computed as for several)
        st = k.group_by(pl.lit(0, pl.Int8).alias("_group")).agg(**stats_of).drop("_group")
        return st.select(**lits, **{c: pl.col(c) for c in st.columns})

    if "iteration" in by:  # per iteration: a few iterations' kernels at a time (issue 24), the same groups
        its = model.scan_ops().select(pl.col("iteration").drop_nulls().unique().sort()).collect().to_series().to_list()
        parts = [stats_where(pl.col("iteration").is_null())]
        parts += [stats_where(pl.col("iteration").is_in(its[i:i + _ITERATIONS_AT_ONCE]))
                  for i in range(0, len(its), _ITERATIONS_AT_ONCE)]
        stats = pl.concat(parts)
    elif by:  # one group at a time (a rank's phase, say: few groups, each its own kernels)
        groups = model.scan_ops().select(keys).unique().collect()
        stats = pl.concat([stats_where(pl.all_horizontal(pl.col(c).is_null() if v is None else pl.col(c) == v
                                                         for c, v in zip(keys, g)), g)
                           for g in groups.iter_rows()])
    else:
        stats = stats_where(pl.lit(True))
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


def phase_json(model: PhaseModel, export: Export, launch: pl.DataFrame | None = None) -> dict[tuple, dict]:
    """Per phase row key (:data:`ROW_KEYS`): ``{"idle_breakdown": {...}, "launch_stats": {...}}``,
    the JSON of :func:`breakdown_json` and of :func:`launch_stats` (:data:`LAUNCH_COLUMNS`;
    floats rounded to 6 decimals, NaN as null). ``launch``: the frame of :func:`launch_stats`
    (default by row) when computed already."""
    from tracekit.vocab import json_number

    w, api = idle_windows(model, export)
    bd = breakdown_json(w, api)
    out = {k: {"idle_breakdown": v} for k, v in bd.items()}
    for r in (launch_stats(model, export, idle=w) if launch is None else launch).iter_rows(named=True):
        key = tuple(r[k] for k in ROW_KEYS)
        vals = {c: json_number(c, r[c]) for c in LAUNCH_COLUMNS}
        out.setdefault(key, {})["launch_stats"] = vals
    return out



def breakdown_of(model: PhaseModel, export: Export, intervals: pl.DataFrame, keys: tuple[str, ...]) -> pl.DataFrame:
    """The :data:`CATEGORIES` of any windows, such as the time bins of the report's timeline:
    ``intervals`` has ``global_pid, device, start, end`` (ns; disjoint per rank) and ``keys``;
    returns ``global_pid, device``, ``keys``, ``wall_ns`` and :data:`CATEGORIES` (ns, summing to
    ``wall_ns``), one row per key. The same classification as :func:`idle_windows`."""
    return _breakdowns(model, export, [(intervals, list(keys))])[0][0]
