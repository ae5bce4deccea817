"""Helpers shared by the transfer analyses (overlap, contention, sizes, pageable, ...).

Conventions of every transfer analysis (see docs/transfers.md):

- a **rank** is one (``global_pid``, ``device``) pair; every output frame carries both;
- ``by`` selects the grouping below the rank, any of :data:`BY_COLUMNS`, from the phase model's
  attribution of each copy (by the launching API call, see :mod:`tracekit.analyze.model.phases`):
  ``("iteration", "phase", "micro_step")`` per phase window (the default), ``("phase",)`` for
  whole-trace totals per phase, ``()`` for one whole-trace row per rank, or with
  ``"sub_phase"`` added for the innermost NVTX range;
- times are ns, sizes bytes, rates GB/s = 1e9 B/s (bytes per ns).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.model.gpu_ops import with_strings
from tracekit.analyze.model.phases import PhaseModel
from tracekit.errors import TracekitError
from tracekit.vocab import INTEGRAL_SUFFIXES, json_number

RANK = ["global_pid", "device"]
PHASE_KEYS: tuple[str, ...] = ("iteration", "phase", "micro_step")
BY_COLUMNS = ("iteration", "phase", "micro_step", "boundary", "sub_phase")
HOST_DIRECTIONS = ("H2D", "D2H")


def check_by(by) -> list[str]:
    """``by`` as a list; raises :class:`TracekitError` for a column outside :data:`BY_COLUMNS`."""
    by = list(by or [])
    bad = [b for b in by if b not in BY_COLUMNS]
    if bad:
        raise TracekitError(f"cannot group transfers by {bad}; choose from {', '.join(BY_COLUMNS)}")
    return by


def host_copies(model: PhaseModel) -> pl.DataFrame:
    """Host<->device memcpys (H2D, D2H) of the model with ``host_kind`` (pageable, pinned, ...:
    the source kind of an H2D, the destination kind of a D2H), ``duration_ns`` and ``gbps``
    (bytes / duration; null for a 0 ns copy), plus the attribution columns of ``model.ops``.
    Copies with a null device are dropped. Computed once per section and kept on the model
    until it ends (8 sections read it; :data:`tracekit.analyze.sections.PER_OP_FRAMES`); a
    reader of a few of its columns uses :func:`host_copies_query`."""
    return model.derived("host_copies", lambda: host_copies_query(model).collect())


def host_copies_query(model: PhaseModel) -> pl.LazyFrame:
    """:func:`host_copies` as a query of the ops (the same rows, columns and values): what a
    reader selects and filters of it is all that is read (issue 24)."""
    c = model.scan_ops().filter((pl.col("kind") == "memcpy") & pl.col("direction").is_in(HOST_DIRECTIONS))
    c = with_strings(c.filter(pl.col("device").is_not_null()))  # (its readers read strings)
    return c.with_columns(
        host_kind=pl.when(pl.col("direction") == "H2D").then(pl.col("src_kind")).otherwise(pl.col("dst_kind")),
        duration_ns=pl.col("end") - pl.col("start"),
    ).with_columns(
        gbps=pl.when(pl.col("duration_ns") > 0).then(pl.col("bytes") / pl.col("duration_ns")).otherwise(None),
        sub_phase=pl.col("sub_phase").fill_null("(none)"),
    )


#: The columns of the compute kernels of :func:`model_kernel_frames` (what its readers use).
COMPUTE_KERNEL_COLUMNS = ("global_pid", "device", "start", "end", "phase")


def model_kernel_frames(model: PhaseModel) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(compute kernels, communication kernels) of ``model.ops``
    (:func:`tracekit.analyze.model.communication.kernel_frames`), computed once per model and
    kept on it (the idle, communication, waiting-rank and CPU-update sections read them).
    The compute kernels, most of the ops, keep only :data:`COMPUTE_KERNEL_COLUMNS` (kept for
    the whole run: all 25 columns of the ops were 110 bytes a kernel more, 26 MiB on a 10 GB
    trace); the communication kernels keep every column of ``model.ops``."""
    from tracekit.analyze.model.communication import comm_expr

    def compute() -> tuple[pl.DataFrame, pl.DataFrame]:
        ops = model.scan_ops()
        is_k = pl.col("kind") == "kernel"
        if "comm" not in model.ops_schema:  # all kernels are compute
            return ops.filter(is_k).select(COMPUTE_KERNEL_COLUMNS).collect(), model_comm_kernels(model)
        # two plans, each with its columns picked before the rows are gathered (one collect_all of
        # both shared the kernel filter and gathered every column of every kernel first: 25 MiB
        # on a 10 GB trace)
        compute_k = ops.filter(is_k & ~comm_expr()).select(COMPUTE_KERNEL_COLUMNS).collect()
        return compute_k, model_comm_kernels(model)

    return model.derived("kernel_frames", compute)


def model_comm_kernels(model: PhaseModel) -> pl.DataFrame:
    """The communication kernels of ``model.ops`` (the second frame of :func:`model_kernel_frames`:
    every column, the Enum columns as strings), without the compute kernels: what the idle,
    communication and waiting-rank sections read. Computed once per section and kept on the
    model until it ends (:data:`tracekit.analyze.sections.PER_OP_FRAMES`)."""
    from tracekit.analyze.model.communication import comm_expr

    def compute() -> pl.DataFrame:
        ops = model.scan_ops()
        if "comm" not in model.ops_schema:  # all kernels are compute
            return with_strings(ops.head(0).collect())
        return with_strings(ops.filter((pl.col("kind") == "kernel") & comm_expr()).collect())  # (readers read strings)

    return model.derived("comm_kernels", compute)


#: The columns of :func:`model_compute_ops` (what its readers use).
COMPUTE_OP_COLUMNS = ("global_pid", "device", "start", "end")


def model_compute_ops(model: PhaseModel) -> pl.DataFrame:
    """``model.ops`` without communication kernels, what GPU idle counts as activity
    (:func:`compute_ops_query`), only :data:`COMPUTE_OP_COLUMNS` (the rows in the ops' order),
    computed once per section and kept on the model until it ends (the breakdown, its
    sub-phases and the CPU-update section read it; :data:`tracekit.analyze.sections.PER_OP_FRAMES`)."""
    return model.derived("compute_ops", lambda: compute_ops_query(model).select(COMPUTE_OP_COLUMNS).collect())


def compute_ops_query(model: PhaseModel) -> pl.LazyFrame:
    """``model.ops`` without communication kernels, as a query of the ops (every column, the
    rows in the ops' order); without a ``comm`` column (an older model) every op."""
    from tracekit.analyze.model.communication import comm_expr

    return model.scan_ops().filter(~comm_expr()) if "comm" in model.ops_schema else model.scan_ops()


def kernel_unions(model: PhaseModel, comm: bool = False) -> dict[tuple[int, int], tuple]:
    """Per rank ``(global_pid, device)``, the union (``(starts, ends)``,
    :func:`tracekit.analyze.model.intervals.union`) of its device's compute kernels (``comm``:
    communication kernels) of :func:`model_kernel_frames`; kernels without a device are left out.
    Computed once per section and kept on the model until it ends (the overlap, pageable and
    what-if sections read them; :data:`tracekit.analyze.sections.PER_OP_FRAMES`).
    Read from ``model.ops`` rank by rank, two columns at a time (not from
    :func:`model_kernel_frames`, which would keep the compute kernels on the model)."""
    from tracekit.analyze.model.communication import comm_expr
    from tracekit.analyze.model.intervals import union

    def compute() -> dict:
        if "comm" in model.ops_schema:
            which = (pl.col("kind") == "kernel") & (comm_expr() if comm else ~comm_expr())
        elif comm:  # all kernels are compute
            return {}
        else:
            which = pl.col("kind") == "kernel"
        k = model.scan_ops().filter(which & pl.col("device").is_not_null())
        ranks = k.select(RANK).unique().collect()
        out = {}
        for gpid, dev in ranks.iter_rows():
            mine = k if ranks.height == 1 else k.filter(
                pl.col("global_pid").eq_missing(gpid) & (pl.col("device") == dev))
            t = mine.select("start", "end").collect()
            out[(gpid, dev)] = union(t["start"].to_numpy(), t["end"].to_numpy())
        return out

    return model.derived(("overlap_kernel_unions", comm), compute)


def all_kernel_union(model: PhaseModel, gpid: int, dev: int) -> tuple:
    """The union ``(starts, ends)`` of every kernel (compute and communication) of the rank
    ``(gpid, dev)``: the union of the two :func:`kernel_unions` (the same set of instants as the
    union of the kernels themselves, in the same canonical form: sorted, disjoint, touching pieces
    merged), without reading ``model.ops`` again."""
    import numpy as np

    from tracekit.analyze.model.intervals import union

    none = (np.empty(0, np.int64), np.empty(0, np.int64))
    a, b = kernel_unions(model).get((gpid, dev), none), kernel_unions(model, comm=True).get((gpid, dev), none)
    if not len(b[0]):
        return a
    return union(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def rank_rows(frame: pl.DataFrame, gpid: int, dev: int, *columns: str) -> pl.DataFrame:
    """The rows of ``frame`` of the rank ``(gpid, dev)``, only ``columns`` (all when none): the
    columns are picked before the rows are gathered, and nothing is copied when the rank holds
    every row (a one-GPU trace)."""
    picked = frame.select(columns) if columns else frame
    mine = frame.select((pl.col("global_pid") == gpid) & (pl.col("device") == dev)).to_series()
    if mine.null_count() == 0 and mine.all():
        return picked
    return picked.filter(mine)


def group_codes(frame: pl.DataFrame, keys: list[str]) -> tuple[pl.DataFrame, np.ndarray]:
    """The distinct ``keys`` of ``frame`` (one row each, nulls equal, in no particular order)
    and, per row of ``frame``, the index of its group among them (int64 numpy array): group
    numbers that later steps sort and join on instead of the key columns (strings among them)."""
    g = frame.select(keys).with_row_index("_i").group_by(keys).agg(pl.col("_i"))
    code = np.empty(frame.height, np.int64)
    code[g["_i"].explode().to_numpy()] = np.repeat(np.arange(g.height, dtype=np.int64), g["_i"].list.len().to_numpy())
    return g.drop("_i"), code


def ranks_of(model: PhaseModel) -> pl.DataFrame:
    """(global_pid, device) pairs with GPU work, sorted. (A lazy unique: the eager one hashes
    every op's pair at once, 16 MiB on a 10 GB trace; issue 24.)"""
    return model.scan_ops().select(RANK).unique().collect().drop_nulls().sort(RANK)


def attach_window(model: PhaseModel, frame: pl.DataFrame, time_col: str = "start") -> pl.DataFrame:
    """Add ``window_id, iteration, phase, micro_step, boundary`` of the phase window (of the
    frame row's ``global_pid``) that contains ``frame[time_col]``: attribution by time, for
    things that have no launching call (memory events, bins, metric samples).

    Rows keep their order. The windows of a process tile its span, so the window of time t is
    the last one starting at or before t, if t is before its end: one binary search per row
    (no sort of the frame, which matters for millions of metric samples).
    """
    import numpy as np

    cols = ("window_id", "iteration", "phase", "micro_step", "boundary")
    w = model.windows.select("global_pid", *cols, w_start="start", w_end="end").sort("global_pid", "w_start")
    f = frame.drop([c for c in cols if c in frame.columns])
    t = f[time_col].to_numpy()
    gp = f["global_pid"].to_numpy()
    wg, ws, we = w["global_pid"].to_numpy(), w["w_start"].to_numpy(), w["w_end"].to_numpy()
    idx = np.full(len(t), -1, dtype=np.int64)
    for pid in np.unique(wg):
        lo, hi = np.searchsorted(wg, pid, "left"), np.searchsorted(wg, pid, "right")
        rows = gp == pid
        if not rows.any():
            continue
        tt = t[rows]
        j = np.searchsorted(ws[lo:hi], tt, side="right") - 1
        jj = np.where(j >= 0, j, 0) + lo
        idx[rows] = np.where((j >= 0) & (tt < we[jj]), jj, -1)  # NaN (null time) compares False
    inside = pl.Series(idx >= 0)
    g = w.select(cols).gather(np.maximum(idx, 0)) if w.height else pl.DataFrame(
        {c: pl.Series(c, [None] * f.height, dtype=w.schema[c]) for c in cols}
    )
    g = g.with_columns(
        **{c: pl.when(inside).then(pl.col(c)).otherwise(None) for c in ("window_id", "iteration", "micro_step")},
        phase=pl.when(inside).then(pl.col("phase")).otherwise(pl.lit("other")),
        boundary=pl.when(inside).then(pl.col("boundary")).otherwise(False),
    )
    return pl.concat([f, g], how="horizontal")


def gbps(num: str, den: str) -> pl.Expr:
    """``num / den`` when ``den > 0`` else null (bytes / ns = GB/s)."""
    return pl.when(pl.col(den) > 0).then(pl.col(num) / pl.col(den)).otherwise(None)


def ratio(num: str, den: str) -> pl.Expr:
    """``num / den`` when ``den > 0`` else null."""
    return pl.when(pl.col(den) > 0).then(pl.col(num) / pl.col(den)).otherwise(None)


PHASE_ORDER = {"forward": 0, "backward": 1, "update": 2, "other": 3}


def sort_groups(frame: pl.DataFrame, by: list[str], extra: list[str] | None = None) -> pl.DataFrame:
    """Sort a per-group frame by rank, then in time order within an iteration: iteration
    (nulls first: start-up), micro-step (nulls last), phase (forward, backward, update, other),
    then the other ``by`` columns and ``extra``."""
    keys = [pl.col("global_pid"), pl.col("device")]
    if "iteration" in by:
        keys.append(pl.col("iteration").fill_null(-(2**62)))
    if "micro_step" in by:
        keys.append(pl.col("micro_step").fill_null(2**62))
    if "phase" in by:
        keys.append(pl.col("phase").replace_strict(PHASE_ORDER, default=9, return_dtype=pl.Int64))
    for b in [*by, *(extra or [])]:
        if b not in ("iteration", "micro_step", "phase"):
            keys.append(pl.col(b))
    return frame.sort(keys)


_INF = (float("inf"), float("-inf"))


def json_rows(f: pl.DataFrame) -> list[dict]:
    """The rows of ``f`` as dicts, numbers as :func:`tracekit.vocab.json_number` writes them
    (other floats rounded to 6 decimals, NaN and inf as None), built column by column (the 1 ms
    throughput timeline of a long trace has ~100k rows)."""
    cols = []
    for name, dtype in f.schema.items():
        vals = f[name].to_list()
        if dtype.is_float():
            if name.endswith(INTEGRAL_SUFFIXES):
                vals = [None if v is None else json_number(name, v) for v in vals]
            else:
                vals = [None if v is None or v != v or v in _INF else round(v, 6) for v in vals]
        cols.append(vals)
    names = f.columns
    return [dict(zip(names, r)) for r in zip(*cols)]
