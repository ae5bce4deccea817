"""The exports of one run joined into one job (issue 24): ranks across files, waiting ranks and
host contention computed across the exports, as if their ranks were in one export.

Input: the run part of each export (:func:`tracekit.analyze.run_parts.run_part`). The join:

1. **Ranks.** Every (export, process, device) is one rank. Its number: the capture hook's
   ``rank R`` record when every rank has one and no two share a number (``source`` ``nvtx``);
   else, when each export holds one rank and every file name carries a distinct number
   (:func:`tracekit.analyze.multi.rank_numbers`: ``rank3.sqlite``), that number (``file
   name``); else ranks are numbered in device order (host, device, pid, file; ``device
   order``). Hosts are the exports' host names (``TARGET_INFO_SYSTEM_ENV`` ``Hostname``); an
   export without one, in a run of several clocks, gets its own host named after the file.
   Processes of different exports with the same nsys ``globalPid`` (the same pid on two
   machines) are told apart.
2. **Clocks.** Each export's times are shifted onto one axis (:mod:`tracekit.analyze.run_clock`).
3. **Waiting ranks.** The communication kernels of all exports, on that axis, are matched
   across ranks and their waits computed exactly as within one export
   (:func:`tracekit.analyze.sections.waiting_ranks.match_collectives`,
   :func:`~tracekit.analyze.sections.waiting_ranks.waiting`,
   :func:`~tracekit.analyze.sections.waiting_ranks.slowest_ranks`, the reasons from each rank's
   own phase table).
4. **Host contention.** The host copies of every export of a host, on that axis
   (:func:`tracekit.analyze.sections.host_contention.analyze_host_contention`).

The splits of one export (``benchmarks/split_ranks.py``) share one clock (nothing is shifted),
so the join gives exactly the numbers of the export itself.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

#: The rank-order notes of the run (``rank_order.note``) by source.
RANK_NOTES = {
    "nvtx": "ranks from the capture hook's 'rank R local_rank L world W' record of each export",
    "file name": "no 'rank R ...' NVTX record in every export: ranks from the numbers in the file names "
                 "(one rank per file)",
    "device order": "no 'rank R ...' NVTX record in every export and no distinct rank number in every file "
                    "name: ranks numbered in device order (host, device id, pid, file)",
}


def _unify_ranks(parts: list[dict], names: list[str], file_ranks: list[int | None], groups: int) -> pl.DataFrame:
    """Step 1: one row per rank of every export: ``part, trace, global_pid`` (the export's),
    ``key`` (unique across exports), ``pid, device, host, rank, local_rank, world, source``."""
    rows = []
    for i, (p, name) in enumerate(zip(parts, names)):
        r = p["ranks"]
        host_known = p["clock"].get("host") is not None
        r = r.with_columns(part=pl.lit(i, pl.Int64), trace=pl.lit(name))
        if not host_known and groups > 1:
            r = r.with_columns(host=pl.lit(f"{Path(name).name}: ") + pl.col("host"))
        rows.append(r.select("part", "trace", "global_pid", "pid", "device", "host", "rank", "local_rank", "world",
                             "source"))
    rk = pl.concat(rows) if rows else pl.DataFrame()
    gp = rk.select("part", "global_pid").unique().sort("part", "global_pid")
    if gp["global_pid"].n_unique() == gp.height:
        rk = rk.with_columns(key=pl.col("global_pid"))
    else:  # the same globalPid in two exports (two machines): a key of their own
        gp = gp.with_columns(key=(pl.int_range(pl.len()) + 1).cast(pl.Int64))
        rk = rk.join(gp, on=["part", "global_pid"])
    one_each = rk.group_by("part").len()["len"].max() == 1
    nums = [file_ranks[i] if file_ranks else None for i in range(len(parts))]
    if (rk["source"] == "nvtx").all() and rk["rank"].n_unique() == rk.height:
        rk = rk.with_columns(source=pl.lit("nvtx"))
    elif one_each and all(n is not None for n in nums) and len(set(nums)) == len(nums):
        rk = rk.with_columns(rank=pl.col("part").replace_strict(dict(enumerate(nums)), return_dtype=pl.Int64),
                             source=pl.lit("file name"), world=pl.lit(rk.height, pl.Int64))
        rk = rk.sort("rank").with_columns(local_rank=pl.int_range(pl.len()).over("host").cast(pl.Int64))
    else:
        rk = rk.sort("host", "device", "pid", "part").with_columns(
            rank=pl.int_range(pl.len()).cast(pl.Int64), source=pl.lit("device order"),
            world=pl.lit(rk.height, pl.Int64))
        rk = rk.with_columns(local_rank=pl.int_range(pl.len()).over("host").cast(pl.Int64))
    return rk.sort("rank", "device")


def join(parts: list[dict], names: list[str] | None = None, file_ranks: list[int | None] | None = None) -> dict:
    """Join the run parts of one run (module doc).

    ``parts``: :func:`tracekit.analyze.run_parts.run_part` per export; ``names``: how each
    export is named (default its part's ``trace``); ``file_ranks``: the rank number in each
    file name or None (:func:`tracekit.analyze.multi.rank_numbers`).

    Returns ``{"ranks": frame (:func:`_unify_ranks`' columns), "clock":
    :func:`tracekit.analyze.run_clock.align`'s dict, "frames": {...}}``; ``frames`` holds, on the
    common axis, the frames of :func:`tracekit.analyze.sections.multi_gpu.analyze_multi_gpu`
    (``rank_ids``, ``host_summary``, ``host_windows``, ``host_phase``, ``host_bandwidth``,
    ``host_copies``, ``communication``, ``collectives``, ``waiting``, ``waiting_slowest``) with
    ``global_pid`` the rank's key across exports. Times ns, bytes.
    """
    from tracekit.analyze import run_clock
    from tracekit.analyze.sections import host_contention, multi_gpu, waiting_ranks

    names = names or [p["trace"] for p in parts]
    clocks = [p["clock"] for p in parts]
    ngroups = len(set(run_clock.clock_groups(clocks)))
    rk = _unify_ranks(parts, names, file_ranks or [], ngroups)
    link = rk.select("part", "global_pid", "device", "key", pl.col("rank").alias("_rank"),
                     pl.col("host").alias("_host"))

    def tagged(name: str) -> pl.DataFrame:
        fs = [p[name].with_columns(part=pl.lit(i, pl.Int64)) for i, p in enumerate(parts)]
        return pl.concat(fs, how="vertical_relaxed") if fs else pl.DataFrame()

    comm = tagged("collectives").join(link, on=["part", "global_pid", "device"], how="inner")
    comm = comm.with_columns(rank=pl.col("_rank"), global_pid=pl.col("key")).drop("_rank", "_host", "key")
    keyed = waiting_ranks.instance_keys(comm)  # each rank's own order: independent of the clocks
    lowest = int(rk.row(0, named=True)["part"]) if rk.height else 0
    clock = run_clock.align(clocks, keyed.select("part", "comm_stream", "collective", "seq", "end"), lowest)
    shift = pl.col("part").replace_strict(dict(enumerate(clock["shift_ns"])), return_dtype=pl.Int64)
    comm = comm.with_columns(start=pl.col("start") + shift, end=pl.col("end") + shift)
    coll = waiting_ranks.match_collectives(comm.drop("part"))

    copies = tagged("copies").join(link, on=["part", "global_pid", "device"], how="inner")
    copies = copies.with_columns(host=pl.col("_host"), global_pid=pl.col("key"), start=pl.col("start") + shift,
                                 end=pl.col("end") + shift).select(host_contention.COPY_COLUMNS)
    table = tagged("table").join(link.select("part", "global_pid", "device", "key"),
                                 on=["part", "global_pid", "device"], how="inner")
    table = table.with_columns(global_pid=pl.col("key")).drop("key", "part")

    ranks = rk.with_columns(global_pid=pl.col("key"))
    per = waiting_ranks.waiting(None, ranks, coll)
    frames = {"rank_ids": ranks}
    frames.update(host_contention.analyze_host_contention(copies))
    frames["communication"] = multi_gpu.totals_of_kernels(coll)
    frames["collectives"] = coll
    frames["waiting"] = per
    frames["waiting_slowest"] = waiting_ranks.slowest_ranks(per, table, ranks)
    return {"ranks": rk, "clock": clock, "frames": frames}


def run_json(parts: list[dict], names: list[str], file_ranks: list[int | None] | None, note: str | None,
             run_groups: list[list[str]]) -> dict:
    """The top-level ``"run"`` of ``tracekit analyze A B ... --json``.

    One run (``note`` None)::

        {"one_run": true, "note": null, "files": [trace], "ranks": int,
         "hosts": [{"host", "ranks": [{"rank", "local_rank", "trace", "pid", "device"}],
                    "files": [trace], "host_contention": {...} | null}],
         "ranks_per_host": {host: int},
         "rank_order": {"source": "nvtx" | "file name" | "device order", "note"},
         "clock": {"method", "basis", "reference", "groups", "collectives_used",
                   "residual_skew_ns", "max_end_spread_ns",
                   "files": [{"trace", "host", "clock_group", "utc_start_ns", "start_offset_ns",
                              "correction_ns", "shift_ns", "aligned_by"}]},
         "waiting_ranks": {"per_rank": [row], "slowest": [row], "unmatched_collectives": int},
         "findings": [{"topic", "pid", "device", "phase", "text", "values", "summary"}]}

    ``host_contention`` and ``waiting_ranks`` have the shapes of one export's ``hosts`` and
    ``waiting_ranks`` (:mod:`tracekit.analyze.sections.multi_gpu`; totals over the run, ns,
    bytes), computed across the files (:func:`join`); ``host_contention`` is null for a host
    without host copies. ``findings``: the host-contention, communication and waiting-rank
    findings of :func:`tracekit.analyze.sections.multi_gpu.multi_gpu_findings` on the joined
    frames (their text names the host or rank; ``pid`` and ``device`` may recur on every
    node). Different runs: ``{"one_run": false, "note", "files", "run_groups",
    "hosts": null, "waiting_ranks": null, ...}`` (nothing compared across them).
    """
    from tracekit.analyze.sections.finding_summary import add_summaries
    from tracekit.analyze.sections.multi_gpu import multi_gpu_findings, to_json

    base = {"one_run": note is None, "note": note, "files": list(names), "run_groups": run_groups}
    if note is not None or not parts:
        return {**base, "ranks": None, "hosts": None, "ranks_per_host": None, "rank_order": None, "clock": None,
                "waiting_ranks": None, "findings": []}
    j = join(parts, names, file_ranks)
    rk, clock = j["ranks"], j["clock"]
    single = to_json(j["frames"])
    contention = {h["host"]: h["host_contention"] for h in single["hosts"]}
    hosts = []
    for (host,), g in rk.group_by(["host"], maintain_order=True):
        hosts.append({
            "host": host,
            "ranks": [{"rank": r["rank"], "local_rank": r["local_rank"], "trace": r["trace"], "pid": r["pid"],
                       "device": r["device"]} for r in g.sort("rank").iter_rows(named=True)],
            "files": sorted(set(g["trace"].to_list()), key=names.index),
            "host_contention": contention.get(host),
        })
    src = rk["source"][0] if rk.height else "device order"
    ref = names[int(rk["part"][0])] if rk.height else None  # the export of the lowest rank
    files = [{"trace": n, "host": p["clock"].get("host"), "clock_group": clock["clock_group"][i],
              "utc_start_ns": p["clock"].get("utc_start_ns"), "start_offset_ns": clock["start_offset_ns"][i],
              "correction_ns": clock["correction_ns"][i], "shift_ns": clock["shift_ns"][i],
              "aligned_by": clock["aligned_by"][i]} for i, (n, p) in enumerate(zip(names, parts))]
    return {
        **base, "ranks": rk.height, "hosts": hosts, "ranks_per_host": {h["host"]: len(h["ranks"]) for h in hosts},
        "rank_order": {"source": src, "note": RANK_NOTES[src]},
        "clock": {"method": clock["method"], "basis": clock["basis"], "reference": ref, "groups": clock["groups"],
                  "collectives_used": clock["collectives_used"], "residual_skew_ns": clock["residual_skew_ns"],
                  "max_end_spread_ns": clock["max_end_spread_ns"], "files": files},
        "waiting_ranks": single["waiting_ranks"],
        "findings": add_summaries(multi_gpu_findings(j["frames"])),  # each with its one line, as one export's
    }
