"""NVTX ranges of an export: names, domains, nesting, and what does not fit the push/pop model.

A range's name is ``NVTX_EVENTS.text`` when set, else ``StringIds[textId]`` (both occur in
one file, depending on the NVTX API and domain). Domain names come from the
``NvtxDomainCreate`` rows (eventType 75, ``text`` = name, ``domainId``); domain 0 is the
default domain and is called ``""``. Domain ids are numbered per process (the NCCL, DeepSpeed
and tracekit domains of a training process are 1, 2, 3; a second process's first domain is 1
again), so a range's domain is looked up by its process (the ``globalPid`` part of its
``globalTid``) and ``domainId``: :class:`Domains`.

Anomalies that are counted and set aside rather than trusted (:func:`anomalies`):
ranges that never closed (``end`` NULL or equal to the end of the capture), ranges without a
``start`` or ending before their start (left out entirely), start/end ranges
(eventType 60, they may overlap arbitrarily and are not used for nesting), marks (eventType 34,
instants), and push/pop ranges whose pop happened on another thread (``endGlobalTid`` differs).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.trace import enums
from tracekit.analyze.trace.export import Export
from tracekit.vocab import global_pid_expr as global_pid
from tracekit.vocab import global_pid_of


class Domains:
    """The names of the NVTX domains of an export, per process (see module doc).

    Built from the domain-create rows as ``(global_tid, domain_id, name)``. :meth:`name` of a
    (process, id): the name that process created the id with; else the name of a create row
    without a thread; else, when every process that created this id gave it the same name, that
    name (a forked process uses its parent's domain without a create row of its own); else
    ``""``, as for domain 0 and an id nobody created. Within one process a later create row of
    the same id wins.
    """

    def __init__(self, rows=()) -> None:
        self._own: dict[tuple[int | None, int], str] = {}
        for tid, did, name in rows:
            self.add(tid, did, name)

    def add(self, global_tid: int | None, domain_id: int | None, name: str | None) -> None:
        """One domain-create row (a NULL id is ignored; a NULL name is ``""``)."""
        if domain_id is None:
            return
        pid = None if global_tid is None else global_pid_of(global_tid)
        self._own[(pid, int(domain_id))] = name or ""

    def by_id(self) -> dict[int, str] | None:
        """``{domain_id: name}`` when every id has one name throughout the export (then the
        process does not matter), else None."""
        out: dict[int, str] = {}
        for (_pid, did), name in self._own.items():
            if out.setdefault(did, name) != name:
                return None
        return out

    def name(self, global_pid: int | None, domain_id: int | None) -> str:
        """The name of domain ``domain_id`` in the process ``global_pid`` (see class doc)."""
        did = int(domain_id or 0)
        own = self._own.get((global_pid, did))
        if own is None:
            own = self._own.get((None, did))
        if own is not None:
            return own
        names = {n for (_p, d), n in self._own.items() if d == did}
        return names.pop() if len(names) == 1 else ""

    def column(self, global_pid: pl.Series, domain_id: pl.Series) -> pl.Series:
        """The ``domain`` names (String) of rows with these ``global_pid`` and ``domain_id``
        (Int64; a NULL id is domain 0), in their order."""
        by_id = self.by_id()
        if by_id is not None:  # one name per id: a lookup by id alone
            values = pl.Series([*by_id.values(), ""], dtype=pl.String)
            code = {d: k for k, d in enumerate(by_id)}
            idx = domain_id.fill_null(0).replace_strict(code, default=len(by_id), return_dtype=pl.UInt32)
            return values.gather(idx).alias("domain")
        keys = pl.DataFrame({"p": global_pid.cast(pl.Int64), "d": domain_id.cast(pl.Int64).fill_null(0)})
        pairs = keys.unique()
        pairs = pairs.with_columns(domain=pl.Series(
            [self.name(p, d) for p, d in pairs.iter_rows()], dtype=pl.String))
        return keys.join(pairs, on=["p", "d"], how="left", nulls_equal=True, maintain_order="left")["domain"]


def domains(export: Export) -> Domains:
    """The :class:`Domains` of ``export``'s domain-create rows (empty without NVTX_EVENTS)."""
    cols = set(export.columns("NVTX_EVENTS"))
    if not {"eventType", "text"} <= cols:
        return Domains()
    tid = "globalTid" if "globalTid" in cols else "NULL"
    did = "domainId" if "domainId" in cols else "0"
    rows = export.query(f"SELECT {tid}, {did}, text FROM NVTX_EVENTS WHERE eventType = ?",
                        (enums.NVTX_DOMAIN_CREATE,),
                        schema={"global_tid": pl.Int64, "domain_id": pl.Int64, "text": pl.String})
    return Domains(rows.iter_rows())


#: Columns of :func:`load_ranges`.
RANGE_COLUMNS = [
    "range_id",  # row number in NVTX_EVENTS order (int)
    "start",  # ns
    "end",  # ns; unclosed ranges are extended to the capture end
    "event_type",  # Int8: 59 push/pop, 60 start/end
    "global_tid",
    "global_pid",
    "domain",  # domain name ("" = default), Categorical
    "name",  # range name
    "unclosed",  # bool
    "cross_thread",  # bool: popped on another thread
]


def load_ranges(export: Export, capture_end: int | None = None) -> pl.DataFrame:
    """All NVTX push/pop and start/end ranges with resolved names and domains.

    Returns a frame with :data:`RANGE_COLUMNS`, sorted by (global_tid, start, -end) so that a
    parent range precedes its children. ``capture_end`` (ns) closes unclosed ranges; by default
    the capture's stop time (``ANALYSIS_DETAILS.stopTime``), else the latest NVTX timestamp.
    The frame is kept with the export for the next call, whatever its size (the phase model
    and the what-if model both read it: a second read would cost a scan and, while the first
    frame's memory is still held by the allocator, as much memory again; issue 13).
    """
    key = ("nvtx.load_ranges", capture_end)
    if key in export._memo:
        return export._memo[key]
    out = _load_ranges(export, capture_end)
    export._memo[key] = out
    return out


def _ranges_query(export: Export) -> tuple[str, tuple, dict] | None:
    """``(sql, params, schema)`` of the NVTX rows :func:`load_ranges` reads; None without the table."""
    cols = set(export.columns("NVTX_EVENTS"))
    if not cols:
        return None
    text_id = "textId" if "textId" in cols else "NULL"
    end_tid = "endGlobalTid" if "endGlobalTid" in cols else "NULL"
    domain_id = "domainId" if "domainId" in cols else "0"
    return (
        f"""SELECT rowid AS range_id, start, "end", eventType AS event_type, globalTid AS global_tid,
                   {end_tid} AS end_tid, {domain_id} AS domain_id, text, {text_id} AS text_id
            FROM NVTX_EVENTS WHERE eventType IN (?, ?, ?)""",
        (enums.NVTX_PUSH_POP, enums.NVTX_START_END, enums.NVTX_DOMAIN_CREATE),
        {
            "range_id": pl.Int64, "start": pl.Int64, "end": pl.Int64, "event_type": pl.Int64,
            "global_tid": pl.Int64, "end_tid": pl.Int64, "domain_id": pl.Int64,
            "text": pl.String, "text_id": pl.Int64,
        },
    )


#: NVTX_EVENTS rowids per chunk of :func:`load_ranges`' read (at most
#: ``_CHUNK_WORKERS + 2`` chunks are held at a time: the read's memory does not grow with the trace).
_CHUNK_ROWS = 32_768
_CHUNK_WORKERS = 1
#: chunks whose kept rows are copied into one frame of polars' own: a column taken from a chunk
#: as ADBC returned it keeps that chunk's whole Arrow batch alive (its text and every column it
#: dropped; :func:`tracekit.analyze.trace.fetch.query_adbc`), ~3x the rows kept (issue 24)
_COMPACT_EVERY = 8


def _chunk_args(q: tuple[str, tuple, dict]) -> dict:
    sql, params, schema = q
    return {"sql": sql, "params": params, "schema": schema, "table": "NVTX_EVENTS",
            "chunk_rows": _CHUNK_ROWS, "workers": _CHUNK_WORKERS}


def prefetch_ranges(export: Export) -> bool:
    """Start reading the first chunks of the NVTX rows of :func:`load_ranges` in a background
    thread (:meth:`tracekit.analyze.trace.export.Export.prefetch_chunks`), so that the scan
    overlaps other reads; False when there is nothing to start."""
    q = _ranges_query(export)
    return (q is not None and ("nvtx.load_ranges", None) not in export._memo
            and export.prefetch_chunks(**_chunk_args(q)))


class Thin:
    """What a read of the NVTX ranges for the phase model alone keeps (:func:`load_thin_ranges`,
    issue 24): of a DeepSpeed trace's ranges ~97 % hold no launch of GPU work and lie outside
    the update (``get_all_parameters`` alone is 56 k of 74 k per 4 iterations), and no reader of
    the model looks at those. A range is kept when it holds a launch of its own thread (it can be
    the innermost range of an op, :func:`innermost_at`), its name matches ``keep_names`` (phases,
    iterations, the steps read by name), it starts inside a range named by ``update_names`` of
    its process (the update's sub-phases and steps), it was never popped, it is a start/end or
    a cross-thread range (the anomaly counts). The rest is counted into :attr:`span` (per
    process, the first start and last end: the process's span and last activity) and
    :attr:`names` (the distinct names: ``global_pid, domain_id, name, event_type, cross_thread``).

    ``launches``: per ``global_tid``, the sorted launch times (ns) of its GPU work. Built for
    rowid order = start order (nearly every export); :attr:`ordered` is False when a chunk went
    back in time, and then the caller reads the whole table instead."""

    def __init__(self, launches: dict, keep_names: str, update_names: str) -> None:
        self.launches = launches
        self.keep_names, self.update_names = keep_names, update_names
        self.ordered = True
        self.dropped = 0
        self.span = pl.DataFrame(schema={"global_pid": pl.Int64, "start": pl.Int64, "end": pl.Int64})
        self.names: pl.DataFrame | None = None
        self._names: list[pl.DataFrame] = []
        self._last_start: int | None = None
        self._update_end: dict[int, int] = {}  # per process, the furthest end of an update range so far
        self._matches: tuple[np.ndarray, np.ndarray] = (np.zeros(0, bool), np.zeros(0, bool))

    def _match(self, values: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per name code, whether the name matches ``keep_names`` / ``update_names`` (polars'
        regexes, as every later filter of the model; computed once per new name)."""
        known = len(self._matches[0])
        if known < len(values):
            new = pl.Series(values[known:], dtype=pl.String)
            self._matches = tuple(np.concatenate([old, new.str.contains(pat).fill_null(False).to_numpy()])
                                  for old, pat in zip(self._matches, (self.keep_names, self.update_names)))
        return self._matches

    def mask(self, c: pl.DataFrame, values: list[str], forms: pl.Expr) -> np.ndarray:
        """Which rows of the chunk ``c`` (usable ranges with ``name_code`` and ``cross_thread``)
        to keep; the others are counted. ``forms``: true for a range never popped."""
        st = c["start"].to_numpy()
        if st.size:
            if (self._last_start is not None and st[0] < self._last_start) or (np.diff(st) < 0).any():
                self.ordered = False
            self._last_start = int(st[-1]) if self._last_start is None else max(self._last_start, int(st[-1]))
        keep_n, upd_n = self._match(values)
        code = c["name_code"].to_numpy()
        flags = c.select(k=forms | (pl.col("event_type") == enums.NVTX_START_END) | pl.col("cross_thread"),
                         pid=global_pid(pl.col("global_tid")))
        keep = flags["k"].fill_null(True).to_numpy() | keep_n[code]
        is_upd = upd_n[code]
        tid = c["global_tid"].fill_null(-1).to_numpy()
        pid = flags["pid"].fill_null(-1).to_numpy()
        en = c["end"].fill_null(np.iinfo(np.int64).max).to_numpy()
        for t in np.unique(tid):  # holds a launch of its own thread: start <= launch < end
            la = self.launches.get(int(t))
            if la is None or not la.size:
                continue
            m = np.flatnonzero(tid == t)
            keep[m] |= np.searchsorted(la, st[m], side="left") < np.searchsorted(la, en[m], side="left")
        for p in np.unique(pid):  # starts inside an update range of its process seen so far
            m = np.flatnonzero(pid == p)
            m = m[np.lexsort((~is_upd[m], st[m]))]  # (an update range before a range starting with it)
            ends = np.where(is_upd[m], en[m], np.iinfo(np.int64).min)
            reach = np.maximum.accumulate(np.maximum(ends, self._update_end.get(int(p), np.iinfo(np.int64).min)))
            keep[m] |= st[m] <= reach
            self._update_end[int(p)] = int(reach[-1])
        nest = c.select("global_tid", "domain_id", "name_code", "event_type", "cross_thread").unique()
        self._names.append(nest)
        drop = ~keep
        if drop.any():
            self.dropped += int(drop.sum())
            gone = c.filter(pl.Series(drop)).group_by(global_pid(pl.col("global_tid")).alias("global_pid")).agg(
                pl.col("start").min(), pl.col("end").max())
            self.span = pl.concat([self.span, gone.cast(self.span.schema)]).group_by("global_pid").agg(
                pl.col("start").min(), pl.col("end").max())
        return keep

    def finish(self, names_of: "Domains", values: list[str]) -> None:
        """:attr:`names` from the distinct rows seen, with the domain and name strings."""
        raw = pl.concat(self._names).unique() if self._names else pl.DataFrame(
            schema={"global_tid": pl.Int64, "domain_id": pl.Int64, "name_code": pl.UInt32,
                    "event_type": pl.Int8, "cross_thread": pl.Boolean})
        self._names.clear()
        pid = raw.select(global_pid(pl.col("global_tid")))["global_tid"]
        self.names = raw.select(
            global_pid=pid, domain=names_of.column(pid, raw["domain_id"]),
            name=pl.Series(values, dtype=pl.String).gather(raw["name_code"]),
            event_type="event_type", cross_thread="cross_thread").unique()


def load_thin_ranges(export: Export, thin: Thin) -> pl.DataFrame:
    """:func:`load_ranges` keeping only what ``thin`` says (:class:`Thin`; its ``span``,
    ``names`` and ``dropped`` are filled). Not kept with the export. When the table's rowid
    order is not its start order (``thin.ordered`` False) every range is returned."""
    return _load_ranges(export, None, thin)


def _load_ranges(export: Export, capture_end: int | None, thin: Thin | None = None) -> pl.DataFrame:
    q = _ranges_query(export)
    if q is None:
        return pl.DataFrame(
            schema={
                "range_id": pl.Int64, "start": pl.Int64, "end": pl.Int64, "event_type": pl.Int8,
                "global_tid": pl.Int64, "global_pid": pl.Int64, "domain": pl.Categorical,
                "name": pl.String, "unclosed": pl.Boolean, "cross_thread": pl.Boolean,
            }
        )
    et = pl.col("event_type")
    # a range without a start, or ending before it starts, cannot be placed: set aside, counted.
    # An end at ANALYSIS_DETAILS.duration is nsys's mark of a range never popped, not an end (it
    # lies before the start for a range opened within startTime of the stop): kept, for
    # tracekit.analyze.model.phases.set_aside_unclosed to recognise
    unusable = pl.col("start").is_null() | (pl.col("end").is_not_null() & (pl.col("end") < pl.col("start")))
    never_popped = None
    if "duration" in export.tables.get("ANALYSIS_DETAILS", {}):
        try:
            never_popped = export.conn.execute("SELECT max(duration) FROM ANALYSIS_DETAILS").fetchone()[0]
        except Exception:  # a damaged small table: no exception for this rule
            never_popped = None
        if isinstance(never_popped, int):
            unusable = unusable & ~(pl.col("start").is_not_null() & (pl.col("end") == never_popped))
    is_range = et != enums.NVTX_DOMAIN_CREATE
    never = pl.col("end").is_null()  # the forms of a range never popped (unclosed.py), for Thin
    if isinstance(never_popped, int):
        never = never | (pl.col("end") == never_popped)
    stop = export.capture_end()
    if stop is not None:
        never = never | (pl.col("end") >= stop)
    # read in rowid chunks, each cut at once to its usable ranges (NVTX_EVENTS order kept)
    names_of = Domains()
    pieces, bad, top = [], 0, [None, None]
    # each range's name as a code into ``values`` (the text, or the string of its textId; "" for
    # neither), made chunk by chunk: the rows held until the sort carry 4 bytes of name, not a
    # 16-byte view of the text beside the id, and the end thread only as ``cross_thread`` (issue 24)
    values: list[str] = [""]
    pending: list[pl.DataFrame] = []  # the last chunks' kept rows, still in the reader's buffers
    by_text: dict[str, int] = {}
    by_id: dict[int, int] = {}
    for chunk in export.query_chunks(**_chunk_args(q)):
        for row in chunk.filter(et == enums.NVTX_DOMAIN_CREATE).select("global_tid", "domain_id", "text").iter_rows():
            names_of.add(*row)
        flags = chunk.select(keep=is_range & ~unusable, bad=is_range & unusable)
        bad += int(flags["bad"].sum())
        for k, col in enumerate(("start", "end")):
            m = chunk[col].max()
            if m is not None:
                top[k] = m if top[k] is None else max(top[k], m)
        keep = flags["keep"].fill_null(False)
        # the event type (59, 60: the query reads no other range type) kept as Int8: the frame
        # is held for the whole run (issue 24)
        c = chunk if keep.all() else chunk.filter(keep)
        del chunk, flags
        for t in c["text"].drop_nulls().unique().to_list():
            if t not in by_text:
                by_text[t] = len(values)
                values.append(t)
        new_ids = [i for i in c.filter(pl.col("text").is_null())["text_id"].drop_nulls().unique().to_list()
                   if i not in by_id]
        found = export.strings(new_ids) if new_ids else {}
        for i in new_ids:
            if i in found:
                by_id[i] = len(values)
                values.append(found[i])
            else:
                by_id[i] = 0  # an id StringIds lacks: "" as before
        code = (pl.when(pl.col("text").is_not_null())
                .then(pl.col("text").replace_strict(by_text, default=0, return_dtype=pl.UInt32))
                .otherwise(pl.col("text_id").replace_strict(by_id, default=0, return_dtype=pl.UInt32))
                .fill_null(0))
        c = c.select(
            "range_id", "start", "end", pl.col("event_type").cast(pl.Int8), "global_tid", "domain_id",
            name_code=code,
            cross_thread=pl.col("end_tid").is_not_null() & (pl.col("end_tid") != pl.col("global_tid")))
        if thin is not None:
            m = thin.mask(c, values, never)
            if not m.all():
                c = c.filter(pl.Series(m))
        pending.append(c)
        del c
        if len(pending) == _COMPACT_EVERY:
            pieces.append(pl.concat(pending, rechunk=True))  # (fetch.py: a kept column holds its batch)
            pending.clear()
    if pending:
        pieces.append(pl.concat(pending, rechunk=True))
        pending.clear()
    export.set_aside["nvtx_unusable_ranges"] = bad
    if thin is not None:
        thin.finish(names_of, values)
    if capture_end is None:
        capture_end = export.capture_end()
    if capture_end is None:
        capture_end = int(max(top[0] or 0, top[1] or 0))
    raw = pl.concat(pieces, rechunk=False)
    del pieces
    # the order (global_tid, start, -end; a null thread first, ties in NVTX_EVENTS order) as one
    # permutation, so that the kept rows are gathered once, already sorted
    tid = raw["global_tid"]
    keys = [~raw["end"].fill_null(capture_end).to_numpy(), raw["start"].to_numpy(), tid.fill_null(0).to_numpy()]
    if tid.null_count():
        keys.append(tid.is_not_null().to_numpy())
    rows = np.lexsort(keys)
    del tid, keys
    # gathered a column at a time, each source column dropped once gathered: the rows are held
    # once and one column more, not twice (a 10 GB trace has ~1.2 M ranges; issue 24)
    idx = pl.Series(rows)
    del rows
    g = pl.DataFrame([raw.drop_in_place(c).gather(idx) for c in list(raw.columns)])
    del raw, idx
    # names and domains gathered from small tables of the distinct values: the rows share the
    # text of one value (no string is copied per range)
    name = pl.Series(values, dtype=pl.String).gather(g.drop_in_place("name_code"))
    ranges = g.with_columns(
        name=name,
        # (a few distinct names: Categorical, 4 bytes a range, not a 16-byte string view; held for
        # the whole run, issue 24)
        domain=names_of.column(g.select(global_pid(pl.col("global_tid")))["global_tid"], g["domain_id"])
        .cast(pl.Categorical),
        unclosed=pl.col("end").is_null() | (pl.col("end") >= capture_end),
        global_pid=global_pid(pl.col("global_tid")),
    ).with_columns(end=pl.col("end").fill_null(capture_end))
    return ranges.select(RANGE_COLUMNS)


def anomalies(export: Export, ranges: pl.DataFrame) -> dict[str, int]:
    """Counts of NVTX records set aside: unclosed ranges, start/end ranges, marks, cross-thread
    pops, and ``unusable_ranges`` (NULL start, or end before start: left out by :func:`load_ranges`)."""
    marks = 0
    if export.has("NVTX_EVENTS"):
        marks = export.conn.execute(
            "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = ?", (enums.NVTX_MARK,)
        ).fetchone()[0]
    return {
        "unclosed_ranges": int(ranges["unclosed"].sum()),
        "start_end_ranges": int((ranges["event_type"] == enums.NVTX_START_END).sum()),
        "marks": int(marks),
        "cross_thread_ranges": int(ranges["cross_thread"].sum()),
        "unusable_ranges": int(export.set_aside.get("nvtx_unusable_ranges", 0)),
    }


def nest(ranges: pl.DataFrame) -> pl.DataFrame:
    """Add ``parent`` (row index into the returned frame, -1 for a root; Int32, Int64 for
    2**31 ranges or more) and ``depth`` (Int32, 0 for a root).

    Only push/pop ranges popped on their own thread nest; pass them already filtered.
    The frame must be sorted by (global_tid, start, -end) as :func:`load_ranges` returns it.
    The parent of range i is the innermost earlier range on the same thread that contains it,
    found by pointer jumping over candidates (a candidate that does not contain i hands over
    its own candidate), which needs as many vectorized passes as the nesting is deep.
    """
    n = ranges.height
    tid = ranges["global_tid"].to_numpy()
    s = ranges["start"].to_numpy()
    e = ranges["end"].to_numpy()
    cand = np.arange(n, dtype=np.int64) - 1
    if n:
        cand[np.r_[True, tid[1:] != tid[:-1]]] = -1
    # each pass looks only at the rows whose candidate does not contain them yet (their number
    # shrinks quickly), so the temporaries are a fraction of n
    todo = np.flatnonzero(cand >= 0)
    while todo.size:
        c = cand[todo]
        todo = todo[~((e[c] >= e[todo]) & (s[c] <= s[todo]))]  # not contained: jump on
        if not todo.size:
            break
        cand[todo] = cand[cand[todo]]
        todo = todo[cand[todo] >= 0]
    depth = np.zeros(n, dtype=np.int32)  # (held with the model for the whole run: 4 bytes a range)
    todo = np.flatnonzero(cand >= 0)
    p = cand[todo]
    while todo.size:
        depth[todo] += 1
        p = cand[p]
        keep = p >= 0
        todo, p = todo[keep], p[keep]
    # (held with the model for the whole run: 4 bytes a range where they do)
    parent = cand.astype(np.int32) if n < 2**31 else cand
    return ranges.with_columns(parent=pl.Series(parent), depth=pl.Series(depth))


def innermost_at(
    nested: pl.DataFrame, query_tid: np.ndarray, query_t: np.ndarray, exclude: np.ndarray | None = None
) -> np.ndarray:
    """Index (into ``nested``) of the innermost range open on thread ``query_tid`` at ``query_t``.

    ``nested`` comes from :func:`nest`. A range [start, end) is open at t when
    start <= t < end. Rows flagged in ``exclude`` (bool array over ``nested``) are skipped as if
    absent, but their ancestors still count. Returns -1 where no range is open.
    """
    n = nested.height
    out = np.full(len(query_t), -1, dtype=np.int64)
    if n == 0 or len(query_t) == 0:
        return out
    tid = nested["global_tid"].to_numpy()
    s = nested["start"].to_numpy()
    e = nested["end"].to_numpy()
    parent = nested["parent"].to_numpy()
    # latest-starting range on the same thread with start <= t: search in (tid, start) order
    # nested is normally in this order already (checked: then no sort, no copies)
    if n < 2 or ((tid[1:] > tid[:-1]) | ((tid[1:] == tid[:-1]) & (s[1:] >= s[:-1]))).all():
        key_r, tid_r, s_r = np.arange(n, dtype=np.int64), tid, s
    else:
        key_r = np.lexsort((s, tid))
        tid_r, s_r = tid[key_r], s[key_r]
    qt = np.asarray(query_t, dtype=np.int64)
    qtid = np.asarray(query_tid, dtype=np.int64)
    lo = np.searchsorted(tid_r, qtid, side="left")
    hi = np.searchsorted(tid_r, qtid, side="right")
    # within [lo, hi) search start <= t: use a combined key by offsetting per thread
    pos = np.empty(len(qt), dtype=np.int64)
    for_threads = np.unique(qtid)
    for t in for_threads:  # one vectorized search per thread (few threads), not per event
        m = qtid == t
        a, b = lo[m][0], hi[m][0]
        pos[m] = a + np.searchsorted(s_r[a:b], qt[m], side="right") - 1
        pos[m] = np.where(pos[m] < a, -1, pos[m])
    cur = np.where(pos >= 0, key_r[np.maximum(pos, 0)], -1)
    skip = exclude if exclude is not None else np.zeros(n, dtype=bool)
    # queries still walking up their thread's nesting, and the range each one is at
    todo = np.flatnonzero(cur >= 0)
    cur = cur[todo]
    while todo.size:
        t = qt[todo]
        ok = (e[cur] > t) & (s[cur] <= t) & ~skip[cur]
        out[todo[ok]] = cur[ok]
        move = ~ok
        todo, cur = todo[move], parent[cur[move]]
        keep = cur >= 0
        todo, cur = todo[keep], cur[keep]
    return out
