"""Waiting ranks: time inside collectives, and how much of it was waiting for the slowest rank
(issue 12).

Definitions (times ns, on the GPU clock of one export):

- **Collectives** of a rank are its communication kernels
  (:mod:`tracekit.analyze.model.communication`), each with its ``collective`` kind.
- **Matching across ranks**: per rank, the streams that carry communication are numbered by
  first use (``comm_stream`` 0, 1, ...); on each, the collectives of each kind are numbered in
  start order (``seq``). Collective instance (``comm_stream``, ``collective``, ``seq``) is the
  same operation on every rank (NCCL issues collectives of one communicator in the same order
  on every rank). Instances present on fewer than two ranks are not matched (``unmatched``).
- An instance cannot progress before its last rank arrives: ``last_start`` = max over ranks of
  the kernel start. Rank r's **wait** is ``[start_r, min(last_start, end_r))``, its length
  ``wait_ns``; the rank that started last (ties: the highest rank) is that instance's
  **last arrival**.
- Per rank, iteration and phase (the rank's own attribution of the kernel, by its launch):
  ``collective_ns`` = union of its collective kernels, ``wait_ns`` = union of its waits,
  ``wait_share`` = wait / collective, ``collectives``, ``last_arrivals``.
- **Slowest rank** of an iteration and phase: the one the others waited for: the fewest
  ``wait_ns`` (ties: most last arrivals). **Why**, from the phase table
  (:func:`tracekit.analyze.sections.breakdown.phase_table`) of the same iteration and phase, the
  largest of: more CPU-only time (``gpu_idle_ns``), more compute (``kernel_busy_ns``), more
  copy bytes (H2D + D2H), slower copies (lower bytes / copy busy time), each compared to the
  mean of the other ranks; ``reason`` names it with both values. A reason is given only when
  its difference is significant (:func:`tracekit.analyze.significance.differs`: at least 1 ms
  or 1 MiB, for copy speed at least 1 MiB in 0.1 ms of copy time on each side; at least 5 %; beyond
  the other ranks' iteration-to-iteration spread of the metric in that phase).

Within one export every rank is on one clock. Per-rank exports of one run are put on one clock
first (:mod:`tracekit.analyze.run_clock`) and then matched the same way
(:func:`match_collectives`, by :mod:`tracekit.analyze.run_join`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyze.model.intervals import grouped_union_length
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.transfer_common import model_comm_kernels
from tracekit.analyze.significance import differs, spread

RANK = ["global_pid", "device"]

PER_RANK_COLUMNS = ["rank", "global_pid", "device", "iteration", "phase", "collectives", "collective_ns",
                    "wait_ns", "wait_share", "last_arrivals"]


#: Columns of :func:`comm_kernels`: one communication kernel of a rank, before matching.
KERNEL_COLUMNS = ["rank", "global_pid", "device", "stream", "collective", "start", "end", "iteration", "phase"]


def comm_kernels(model: PhaseModel, ranks: pl.DataFrame) -> pl.DataFrame:
    """The communication kernels of the ranks, unmatched: :data:`KERNEL_COLUMNS` (times ns on
    the export's clock; ``iteration`` and ``phase`` from the rank's own attribution). ``ranks``:
    :func:`tracekit.analyze.model.rank_ids.distributed_ranks`. What the many-exports join
    (:mod:`tracekit.analyze.run_join`) takes from each export."""
    comm = model_comm_kernels(model)
    comm = comm.join(ranks.select("global_pid", "device", "rank"), on=RANK, how="inner")
    return comm.select(KERNEL_COLUMNS)


def collectives(model: PhaseModel, ranks: pl.DataFrame) -> pl.DataFrame:
    """Communication kernels of the ranks with their matching key and wait:
    :func:`match_collectives` of :func:`comm_kernels`. ``ranks``:
    :func:`tracekit.analyze.model.rank_ids.distributed_ranks`."""
    return match_collectives(comm_kernels(model, ranks))


def instance_keys(comm: pl.DataFrame) -> pl.DataFrame:
    """``comm`` (:data:`KERNEL_COLUMNS`) with ``comm_stream`` and ``seq`` (see module doc):
    numbered from each rank's own order of events, so the key of an instance does not depend
    on the clocks of the ranks."""
    if comm.height == 0:
        return comm.with_columns(comm_stream=pl.lit(0, pl.Int64), seq=pl.lit(0, pl.Int64))
    first = comm.group_by("rank", "stream").agg(first=pl.col("start").min())
    first = first.sort("rank", "first", "stream").with_columns(
        comm_stream=pl.int_range(pl.len()).over("rank").cast(pl.Int64))
    comm = comm.join(first.select("rank", "stream", "comm_stream"), on=["rank", "stream"])
    return comm.sort("rank", "comm_stream", "collective", "start").with_columns(
        seq=pl.int_range(pl.len()).over("rank", "comm_stream", "collective").cast(pl.Int64))


def match_collectives(comm: pl.DataFrame) -> pl.DataFrame:
    """Match the communication kernels ``comm`` (:data:`KERNEL_COLUMNS`, every rank on one
    clock; ``rank`` unique per (global_pid, device)) across ranks (see module doc).

    Columns: ``rank, global_pid, device, stream, comm_stream, collective, seq, start, end,
    iteration, phase, ranks_in`` (ranks holding this instance), ``last_start``, ``wait_ns``,
    ``last_arrival`` (bool). Unmatched instances have null ``last_start`` and ``wait_ns``.
    """
    comm = comm.select(KERNEL_COLUMNS)
    if comm.height == 0:
        return comm.with_columns(comm_stream=pl.lit(0, pl.Int64), seq=pl.lit(0, pl.Int64),
                                 ranks_in=pl.lit(0, pl.Int64), last_start=pl.lit(None, pl.Int64),
                                 wait_ns=pl.lit(None, pl.Int64), last_arrival=pl.lit(False))
    comm = instance_keys(comm)
    key = ["comm_stream", "collective", "seq"]
    inst = comm.group_by(key).agg(ranks_in=pl.col("rank").n_unique().cast(pl.Int64), last_start=pl.col("start").max())
    comm = comm.join(inst, on=key, how="left")
    matched = pl.col("ranks_in") >= 2
    comm = comm.with_columns(
        last_start=pl.when(matched).then(pl.col("last_start")).otherwise(None),
        wait_ns=pl.when(matched).then(
            (pl.min_horizontal(pl.col("last_start"), pl.col("end")) - pl.col("start")).clip(lower_bound=0)
        ).otherwise(None),
    )
    last = comm.filter(matched & (pl.col("start") == pl.col("last_start"))).group_by(key).agg(
        last_rank=pl.col("rank").max())
    comm = comm.join(last, on=key, how="left").with_columns(
        last_arrival=(pl.col("rank") == pl.col("last_rank")).fill_null(False)).drop("last_rank")
    return comm.sort("rank", "start")


def waiting(model: PhaseModel, ranks: pl.DataFrame, coll: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per rank, iteration and phase: :data:`PER_RANK_COLUMNS` (see module doc); ``wait_ns``
    and ``last_arrivals`` count matched instances only. Empty without communication kernels."""
    c = coll if coll is not None else collectives(model, ranks)
    keys = ["rank", *RANK, "iteration", "phase"]
    if c.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int64, "global_pid": pl.Int64, "device": pl.Int64,
                                    "iteration": pl.Int64, "phase": pl.String, "collectives": pl.Int64,
                                    "collective_ns": pl.Int64, "wait_ns": pl.Int64, "wait_share": pl.Float64,
                                    "last_arrivals": pl.Int64})
    busy = grouped_union_length(c, keys).rename({"busy_ns": "collective_ns"})
    w = c.filter(pl.col("wait_ns").is_not_null()).with_columns(w_end=pl.col("start") + pl.col("wait_ns"))
    wait = grouped_union_length(w, keys, start="start", end="w_end").rename({"busy_ns": "wait_ns"})
    counts = c.group_by(keys).agg(collectives=pl.len().cast(pl.Int64),
                                  last_arrivals=pl.col("last_arrival").sum().cast(pl.Int64))
    out = counts.join(busy, on=keys, how="left", nulls_equal=True).join(wait, on=keys, how="left", nulls_equal=True)
    out = out.with_columns(collective_ns=pl.col("collective_ns").fill_null(0), wait_ns=pl.col("wait_ns").fill_null(0))
    out = out.with_columns(wait_share=pl.when(pl.col("collective_ns") > 0)
                           .then(pl.col("wait_ns") / pl.col("collective_ns")).otherwise(None))
    return out.sort("rank", pl.col("iteration").fill_null(-1), "phase").select(PER_RANK_COLUMNS)


_REASONS = [
    # (label, column of the phase table, more is slower, unit of tracekit.analyze.significance)
    ("more CPU-only time (GPU idle)", "gpu_idle_ns", True, "ns"),
    ("more compute (kernel busy)", "kernel_busy_ns", True, "ns"),
    ("more copy bytes (H2D + D2H)", "copy_bytes", True, "bytes"),
    ("slower copies (GB/s)", "copy_gbps", False, "GB/s"),
]


def _spreads(t: pl.DataFrame) -> dict:
    """{(global_pid, device, phase, column): iteration-to-iteration spread} of the reasons'
    columns (:func:`tracekit.analyze.significance.spread`; absent with fewer than two iterations)."""
    out = {}
    tt = t.filter(pl.col("iteration").is_not_null())
    for (gp, dev, ph), g in tt.group_by(["global_pid", "device", "phase"]):
        for _label, col, _more, _unit in _REASONS:
            s = spread(g[col].to_list())
            if s is not None:
                out[(gp, dev, ph, col)] = s
    return out


def slowest_ranks(per_rank: pl.DataFrame, table: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """The rank the others waited for, per iteration and phase (see module doc).

    ``per_rank``: :func:`waiting`; ``table``: :func:`tracekit.analyze.sections.breakdown.phase_table`;
    ``ranks``: :func:`tracekit.analyze.model.rank_ids.distributed_ranks`. Columns: ``iteration,
    phase, rank, global_pid, device, wait_ns`` (its own), ``others_wait_ns`` (summed wait of
    the other ranks), ``ranks`` (compared), ``reason`` (text), ``reason_metric``,
    ``value``, ``others_mean`` (of that metric; ns, bytes or GB/s). Only groups of two or more
    ranks.
    """
    schema = {"iteration": pl.Int64, "phase": pl.String, "rank": pl.Int64, "global_pid": pl.Int64,
              "device": pl.Int64, "wait_ns": pl.Int64, "others_wait_ns": pl.Int64, "ranks": pl.Int64,
              "reason": pl.String, "reason_metric": pl.String, "value": pl.Float64, "others_mean": pl.Float64}
    if per_rank.height == 0:
        return pl.DataFrame(schema=schema)
    t = table.group_by("global_pid", "device", "iteration", "phase").agg(
        gpu_idle_ns=pl.col("gpu_idle_ns").sum(), kernel_busy_ns=pl.col("kernel_busy_ns").sum(),
        copy_bytes=(pl.col("h2d_bytes") + pl.col("d2h_bytes")).sum(),
        copy_busy=(pl.col("h2d_busy_ns") + pl.col("d2h_busy_ns")).sum(),
    ).with_columns(copy_gbps=pl.when(pl.col("copy_busy") > 0).then(pl.col("copy_bytes") / pl.col("copy_busy")))
    spreads = _spreads(t)
    rows = []
    for (it, ph), g in per_rank.group_by(["iteration", "phase"], maintain_order=True):
        if g["rank"].n_unique() < 2:
            continue
        g = g.sort("wait_ns", pl.col("last_arrivals"), descending=[False, True])
        slow = g.row(0, named=True)
        others = g.filter(pl.col("rank") != slow["rank"])
        tt = t.filter(pl.col("iteration").eq_missing(it) & (pl.col("phase") == ph))
        mine = tt.filter((pl.col("global_pid") == slow["global_pid"]) & (pl.col("device") == slow["device"]))
        rest = tt.join(others.select(*RANK), on=RANK, how="semi")
        best = None
        if mine.height and rest.height:
            m = mine.row(0, named=True)
            for label, col, more_is_slower, unit in _REASONS:
                v, o = m[col], rest[col].mean()
                if v is None or o is None:
                    continue
                v, o = float(v), float(o)
                score = (v - o) / o if o > 0 else (np.inf if v > 0 else 0.0)
                if not more_is_slower:
                    score = (o - v) / o if o > 0 else 0.0
                if score <= 0:
                    continue
                # the one rule of a comparative claim: enough data, >= 5 %, beyond the others' spread
                samples = ((m["copy_bytes"], m["copy_busy"]),
                           (rest["copy_bytes"].mean(), rest["copy_busy"].mean())) if unit == "GB/s" else None
                ref_spread = max((spreads.get((gp, dev, ph, col)) or 0.0
                                  for gp, dev in rest.select(*RANK).iter_rows()), default=None)
                if not differs(v, o, unit, samples=samples, spread=ref_spread):
                    continue
                if best is None or score > best[0]:
                    best = (score, label, col, v, o)
        rows.append({
            "iteration": it, "phase": ph, "rank": slow["rank"], "global_pid": slow["global_pid"],
            "device": slow["device"], "wait_ns": slow["wait_ns"], "others_wait_ns": int(others["wait_ns"].sum()),
            "ranks": g.height,
            "reason": best[1] if best else "no significant difference in CPU-only time, compute, copy bytes or copy speed",
            "reason_metric": best[2] if best else None, "value": best[3] if best else None,
            "others_mean": best[4] if best else None,
        })
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame(rows, schema=schema).sort(pl.col("iteration").fill_null(-1), "phase")


def unmatched_count(coll: pl.DataFrame) -> int:
    """Collective kernels that have no counterpart on another rank (see module doc)."""
    if coll.height == 0:
        return 0
    return int((coll["ranks_in"] < 2).sum())
