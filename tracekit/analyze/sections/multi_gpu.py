"""Many GPUs on one host (issue 12): runs the host-contention, communication and waiting-rank
analyses of one export, shapes them for ``--json`` and states the findings.

Frames (:func:`analyze_multi_gpu`): ``rank_ids`` (:mod:`tracekit.analyze.model.rank_ids`),
``host_summary``, ``host_windows``, ``host_phase``, ``host_bandwidth``, ``host_copies``
(:mod:`tracekit.analyze.sections.host_contention`), ``communication`` (per rank and collective kind:
``rank, global_pid, device, collective, count, busy_ns`` whole-trace totals), ``collectives``,
``waiting``, ``waiting_slowest`` (:mod:`tracekit.analyze.sections.waiting_ranks`).

JSON (:func:`to_json`), at the top level of the analysis dict::

    "rank_order": {"source": "nvtx"|"device order", "note": str},
    "hosts": [{"host": str, "host_contention": {"devices": [int], "concurrent_ns": int,
               "h2d_ns": int, "d2h_ns": int, "mixed_ns": int, "windows": [row], "phases": [row],
               "bandwidth": [row], "copy_busy_ns": int, "h2d_bytes": float, "d2h_bytes": float}}],
    "waiting_ranks": {"per_rank": [row], "slowest": [row], "unmatched_collectives": int}

All times ns (totals over the trace unless a row has an ``iteration``), bytes, GB/s = 1e9 B/s.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyze.model import rank_ids
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections import breakdown, host_contention, waiting_ranks
from tracekit.analyze.sections.transfer_common import json_rows, model_comm_kernels
from tracekit.analyze.significance import differs
from tracekit.analyze.trace.export import Export

#: Below this, concurrency or communication is not worth a finding (ns).
MIN_NS = 1_000_000


def communication_totals(model: PhaseModel, ranks: pl.DataFrame) -> pl.DataFrame:
    """Per rank and collective kind, whole trace: ``rank, global_pid, device, collective,
    count, busy_ns`` (union of the kind's kernels, ns)."""
    comm = model_comm_kernels(model)
    comm = comm.join(ranks.select("global_pid", "device", "rank"), on=["global_pid", "device"])
    return totals_of_kernels(comm)


def totals_of_kernels(comm: pl.DataFrame) -> pl.DataFrame:
    """:func:`communication_totals` of communication kernels with ``rank, global_pid, device,
    collective, start, end`` (one export's, or a run's on one clock)."""
    from tracekit.analyze.model.intervals import grouped_union_length

    keys = ["rank", "global_pid", "device", "collective"]
    if comm.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int64, "global_pid": pl.Int64, "device": pl.Int64,
                                    "collective": pl.String, "count": pl.Int64, "busy_ns": pl.Int64})
    n = comm.group_by(keys).agg(count=pl.len().cast(pl.Int64))
    b = grouped_union_length(comm, keys)
    return n.join(b, on=keys).sort("rank", "collective")


def analyze_multi_gpu(export: Export, model: PhaseModel) -> dict[str, pl.DataFrame]:
    """The frames named in the module doc for one export."""
    ranks = rank_ids.distributed_ranks(export, model)
    frames = {"rank_ids": ranks}
    frames.update(host_contention.analyze_host_contention(host_contention.copies_of_model(model, ranks)))
    frames["communication"] = communication_totals(model, ranks)
    coll = waiting_ranks.collectives(model, ranks)
    per = waiting_ranks.waiting(model, ranks, coll)
    frames["collectives"] = coll
    frames["waiting"] = per
    frames["waiting_slowest"] = waiting_ranks.slowest_ranks(per, breakdown.phase_table(model), ranks)
    return frames


def _rows(f: pl.DataFrame, drop: tuple[str, ...] = ()) -> list[dict]:
    return json_rows(f.drop([c for c in drop if c in f.columns]))


def rank_order(frames: dict[str, pl.DataFrame]) -> dict:
    """``{"source", "note"}``: where the ranks' numbers come from."""
    r = frames["rank_ids"]
    if r.height and (r["source"] == "nvtx").all():
        return {"source": "nvtx", "note": "ranks from the capture hook's 'rank R local_rank L world W' record"}
    if r.height and (r["source"] == "nvtx").any():
        return {"source": "nvtx", "note": "ranks from the capture hook's record; processes without one "
                "numbered after them in device order"}
    return {"source": "device order", "note": "no 'rank R local_rank L world W' NVTX record in this trace "
            "(record with tracekit capture): ranks numbered in device order (host, device id)"}


def to_json(frames: dict[str, pl.DataFrame]) -> dict:
    """The top-level keys of the module doc."""
    hosts = []
    for s in frames["host_summary"].iter_rows(named=True):
        h = s["host"]

        def of(name):
            f = frames[name]
            return f.filter(pl.col("host") == h).drop("host")

        hosts.append({"host": h, "host_contention": {
            "devices": [int(g) for g in s["gpus"]], "concurrent_ns": s["concurrent_ns"], "h2d_ns": s["h2d_ns"],
            "d2h_ns": s["d2h_ns"], "mixed_ns": s["mixed_ns"], "copy_busy_ns": s["copy_busy_ns"],
            "h2d_bytes": round(s["h2d_bytes"], 3), "d2h_bytes": round(s["d2h_bytes"], 3),
            "windows": _rows(of("host_windows")), "phases": _rows(of("host_phase")),
            "bandwidth": _rows(of("host_bandwidth")),
        }})
    return {
        "rank_order": rank_order(frames),
        "hosts": hosts,
        "waiting_ranks": {
            "per_rank": _rows(frames["waiting"], ("global_pid",)),
            "slowest": _rows(frames["waiting_slowest"], ("global_pid",)),
            "unmatched_collectives": waiting_ranks.unmatched_count(frames["collectives"]),
        },
    }


# ---------------------------------------------------------------------- findings
def _ms(ns) -> str:
    return f"{ns / 1e6:,.1f} ms"


def _size(b: int) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b} B"


_ADVICE = {
    ("update", "H2D"): "staggering the parameter copy-back of the ranks or a smaller sub_group_size spreads it",
    ("backward", "D2H"): "staggering the gradient copies to the host (a smaller reduce_bucket_size, "
                         "overlap_comm) spreads them",
}


def multi_gpu_findings(frames: dict[str, pl.DataFrame]) -> list[dict]:
    """Findings of the module's frames (dicts like :func:`tracekit.analyze.sections.findings.build_findings`'s):
    ``host-contention`` (concurrent copies of several GPUs of a host and their bandwidth
    against alone copies, or that there were none), ``communication`` (time in communication
    kernels and the share spent waiting), ``waiting-rank`` (the slowest rank per phase and
    why). Figures are totals over the trace; rows without frames give nothing. A speed or a
    reason compared is said only when it passes :func:`tracekit.analyze.significance.differs`."""
    if "rank_ids" not in frames:
        return []
    out: list[dict] = []
    ranks = frames["rank_ids"]
    who = {int(r["rank"]): (int(r["pid"]), int(r["device"])) for r in ranks.iter_rows(named=True)}
    by_dev = {(r["host"], int(r["device"])): int(r["rank"]) for r in ranks.iter_rows(named=True)}

    def add(topic, phase, text, pid, dev, **values):
        out.append({"topic": topic, "pid": pid, "device": dev, "phase": phase, "text": text, "values": values})

    for s in frames["host_summary"].iter_rows(named=True):
        gpus = s["gpus"]
        if len(gpus) < 2:
            continue
        host = s["host"]
        first = by_dev.get((host, gpus[0]))
        pid, dev = who.get(first, (None, gpus[0]))
        if s["concurrent_ns"] < MIN_NS:
            if s["copy_busy_ns"] >= MIN_NS:
                add("host-contention", None, f"host {host}: no host-level copy contention: copies of GPUs "
                    f"{', '.join(map(str, gpus))} were in flight together for {_ms(s['concurrent_ns'])} of "
                    f"{_ms(s['copy_busy_ns'])} of copy time (totals over the trace)", pid, dev,
                    concurrent_ns=s["concurrent_ns"], copy_busy_ns=s["copy_busy_ns"])
            continue
        ph = frames["host_phase"].filter(pl.col("host") == host).group_by("phase").agg(
            pl.col("concurrent_ns").sum(), pl.col("h2d_ns").sum(), pl.col("d2h_ns").sum(),
            pl.col("iteration").drop_nulls().n_unique().alias("iterations")).sort("concurrent_ns", descending=True)
        top = ph.row(0, named=True)
        direction = "H2D" if top["h2d_ns"] >= top["d2h_ns"] else "D2H"
        bw = frames["host_bandwidth"].filter((pl.col("host") == host) & (pl.col("direction") == direction)
                                             & pl.col("slower_share").is_not_null()).sort("bytes", descending=True)
        its = f" in {top['iterations']} iterations" if top["iterations"] else ""
        text = (f"host {host}: GPUs {', '.join(map(str, gpus))} copy at once: {_ms(s['concurrent_ns'])} with copies of "
                f"two or more GPUs in flight (both H2D {_ms(s['h2d_ns'])}, both D2H {_ms(s['d2h_ns'])}, one of each "
                f"{_ms(s['mixed_ns'])}; totals over the trace), most in {top['phase']} ({_ms(top['concurrent_ns'])}{its})")
        values = dict(concurrent_ns=s["concurrent_ns"], h2d_ns=s["h2d_ns"], d2h_ns=s["d2h_ns"], mixed_ns=s["mixed_ns"])
        # the largest size class whose speed differs by the one rule of a comparative claim
        bw = bw.filter(pl.Series([bool(differs(r["gbps"], r["alone_gbps"], "GB/s",
                                               samples=((r["bytes"], r["concurrent_ns"]),
                                                        (r["alone_bytes"], r["alone_ns"]))))
                                  for r in bw.iter_rows(named=True)], dtype=pl.Boolean)) if bw.height else bw
        if bw.height:
            b = bw.row(0, named=True)
            kind = f"{b['host_kind']} " if b["host_kind"] else ""
            pct = 100 * b["slower_share"]
            text += (f"; {kind}{direction} copies of {_size(2 ** b['bucket'])}-{_size(2 ** (b['bucket'] + 1))} ran at "
                     f"{b['gbps']:.1f} GB/s then vs {b['alone_gbps']:.1f} GB/s alone "
                     f"({abs(pct):.0f} % {'slower' if pct >= 0 else 'faster'}"
                     f"{'' if b['alone_bucket'] == b['bucket'] else ', alone copies of the nearest size class'})")
            values.update(gbps=b["gbps"], alone_gbps=b["alone_gbps"], slower_share=b["slower_share"])
        advice = _ADVICE.get((top["phase"], direction))
        if advice:
            text += f"; {advice}"
        add("host-contention", top["phase"], text, pid, dev, **values)

    comm = frames.get("communication")
    wait = frames.get("waiting")
    if comm is not None and comm.height:
        for rk, g in comm.group_by(["rank"], maintain_order=True):
            rk = int(rk[0])
            busy = int(g["busy_ns"].sum())
            if busy < MIN_NS:
                continue
            kinds = ", ".join(f"{r['collective']} {r['count']}" for r in g.iter_rows(named=True))
            pid, dev = who.get(rk, (None, None))
            text = (f"rank {rk}: {_ms(busy)} in communication kernels ({kinds}; total over the trace), counted apart "
                    f"from compute (kernel busy and GPU idle leave them out)")
            values = dict(comm_busy_ns=busy)
            if wait is not None and wait.height:
                w = wait.filter(pl.col("rank") == rk)
                wn = int(w["wait_ns"].sum())
                if w["collective_ns"].sum():
                    text += (f"; {_ms(wn)} of it ({100 * wn / w['collective_ns'].sum():.0f} %) waiting for the last "
                             f"rank to arrive")
                    values["wait_ns"] = wn
            add("communication", None, text, pid, dev, **values)

    slow = frames.get("waiting_slowest")
    if slow is not None and slow.height:
        for (phase,), g in slow.group_by(["phase"], maintain_order=True):
            counts = g.group_by("rank").agg(n=pl.len(), others=pl.col("others_wait_ns").sum(),
                                            own=pl.col("wait_ns").sum(),
                                            others_mean=(pl.col("others_wait_ns") / (pl.col("ranks") - 1)).sum()
                                            ).sort("n", "others", descending=True)
            top = counts.row(0, named=True)
            # the others (each, on average) waited significantly longer than the rank itself
            if top["others"] < MIN_NS or not differs(top["others_mean"], top["own"], "ns"):
                continue
            rk = int(top["rank"])
            row = g.filter(pl.col("rank") == rk).sort("others_wait_ns", descending=True).row(0, named=True)
            n_it = g.height
            where = f"in {top['n']} of {n_it} iterations" if g["iteration"].drop_nulls().len() else "over the trace"
            text = (f"{phase}: rank {rk} is the slowest {where}: the other ranks waited {_ms(top['others'])} for it in "
                    f"collectives (total)")
            if row["reason_metric"]:
                fmt = (lambda v: f"{v:.1f} GB/s") if row["reason_metric"] == "copy_gbps" else (
                    (lambda v: f"{v / 1e6:,.0f} MB") if row["reason_metric"] == "copy_bytes" else _ms)
                at = "" if row["iteration"] is None else f" (iteration {row['iteration']})"
                text += f"; it has {row['reason']}: {fmt(row['value'])} vs {fmt(row['others_mean'])} on the others{at}"
            pid, dev = who.get(rk, (None, None))
            add("waiting-rank", phase, text, pid, dev, rank=rk, others_wait_ns=top["others"],
                reason=row["reason_metric"])
    return out


def rank_index(frames: dict[str, pl.DataFrame]) -> dict[tuple[int, int], dict]:
    """``{(global_pid, device): {"rank", "local_rank", "world", "host"}}`` from ``rank_ids``
    (the keys each rank of the analysis dict carries; ranks are listed in ``rank`` order)."""
    r = frames.get("rank_ids")
    if r is None:
        return {}
    return {(int(x["global_pid"]), int(x["device"])): {"rank": x["rank"], "local_rank": x["local_rank"],
                                                       "world": x["world"], "host": x["host"]}
            for x in r.iter_rows(named=True)}
