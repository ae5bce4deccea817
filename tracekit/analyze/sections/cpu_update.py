"""The CPU optimizer step of each iteration, wherever it ran, and how much of it the training waited for.

An iteration's update may run partly outside its ``update`` window: SuperOffload and ZenFlow
(``overlap_step``) step the CPU Adam in a spawned worker process, overlapped with backward
(SuperOffload without gradient clipping) or with the next iteration's forward/backward (ZenFlow).
tracekit's capture marks that work with ``cpu_optimizer_step`` ranges in the ``tracekit`` NVTX
domain: ``cpu_optimizer_step it=N sg=K`` (``sg=all``) in the worker, plain
``cpu_optimizer_step`` where the step runs inside ``update`` in the training process
(ZeRO-Offload, ZeRO-3 ``offload_optimizer``, NVMe, ZenFlow sequential). The training waits
for the worker in ``cpu_update_wait`` ranges (SuperOffload's ``_wait_for_async_operations`` /
``_wait_for_single_async_result``, ZenFlow's ``_wait_for_optimizer_process``).

Per rank and iteration (units: ns):

- ``busy_ns``: length of the union of the iteration's ``cpu_optimizer_step*`` ranges, in any
  process of the job. A range belongs to iteration N by the ``it=N`` in its name when present,
  else by time (the rank's phase window containing its start). A worker process belongs to the
  rank whose process started it: ``parent_pid`` of the worker's entry in the capture manifest
  (``hook.processes``), else the only rank of the trace. Ranges never closed are left out
  (counted in :attr:`CpuUpdate.notes`).
- ``hidden_ns``: the part of ``busy_ns`` during which the rank's GPU ran compute kernels of the
  training (communication kernels do not count); ``hidden_by_phase``: the same per phase of the
  kernels (the phase they were launched in).
- ``exposed_ns``: the part the training waited for, with the GPU idle (no kernel, copy or
  memset of the rank executing, as ``gpu_idle_ns`` of :mod:`tracekit.analyze.sections.breakdown`): a
  worker's step inside the rank's ``cpu_update_wait`` ranges (the hook marks every wait of
  SuperOffload and ZenFlow for their workers; no wait range, no waiting), a step in the rank's
  own process inside the iteration's ``update`` window (the training's thread runs it).
  ``exposed_basis`` says which (``"cpu_update_wait"``, ``"update window"``, or both joined by
  ``" + "``). ``hidden_ns + exposed_ns <= busy_ns``;
  the rest ran while the GPU was idle or copying but the training did not wait for it.
- ``overlapped_ns``: the part of ``busy_ns`` the training did not wait for (as above, but
  with the GPU busy or idle): the training went
  on meanwhile, whether its GPU was busy or not (a small model leaves the GPU mostly idle even in
  backward); ``overlapped_by_phase``: the same per phase window of the rank at that time.
- ``wait_ns``: length of the union of the rank's ``cpu_update_wait`` ranges that overlap this
  iteration's ``busy_ns`` intervals (the whole wait, also its part with the worker not yet busy:
  the hand-off); 0 without such ranges.
- ``ranges``: number of ranges; ``worker_ranges``: those in another process than the rank's;
  ``workers``: OS pids of the processes that ran them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from tracekit.analyze.model.intervals import intersect, subtract, union
from tracekit.analyze.model.phases import TRACEKIT_DOMAIN, PhaseModel
from tracekit.analyze.model.steady import forward_counts, split_warmup
from tracekit.analyze.sections import breakdown
from tracekit.analyze.sections.transfer_common import model_compute_ops, model_kernel_frames, rank_rows
from tracekit.vocab import os_pid

#: Names of the CPU optimizer step ranges (``it``: iteration, ``sg``: sub-group, or ``all``).
CPU_STEP = r"^cpu_optimizer_step(?: it=(\d+|\?) sg=(\S+))?$"
#: The training waiting for the CPU optimizer worker.
CPU_WAIT = r"^cpu_update_wait$"

#: Columns of :attr:`CpuUpdate.table`.
COLUMNS = ["global_pid", "pid", "device", "iteration", "complete", "busy_ns", "hidden_ns", "exposed_ns",
           "overlapped_ns", "wait_ns", "hidden_by_phase", "overlapped_by_phase", "exposed_basis", "ranges", "worker_ranges", "workers", "by_name"]


@dataclass
class CpuUpdate:
    """Result of :func:`cpu_update`.

    Attributes:
        table: one row per rank and iteration that has CPU optimizer ranges, :data:`COLUMNS`
            (``hidden_by_phase``, ``overlapped_by_phase`` JSON object strings ``{phase: ns}``, ``workers`` a list of
            OS pids, ``by_name`` whether the iteration came from ``it=N`` names).
        ranks: ``(global_pid, device)`` of the ranks with any CPU optimizer range (their
            iterations without one have no row: zero CPU optimizer time).
        notes: sentences about ranges left out (never closed, no rank, no such iteration).
        forwards: ``{global_pid: {iteration: forward windows}}`` of the model
            (:func:`tracekit.analyze.model.steady.forward_counts`), for the warm-up rule of
            :func:`steady`; empty: only iteration 0 is warm-up.
    """

    table: pl.DataFrame
    ranks: set = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    forwards: dict = field(default_factory=dict)


def worker_parents(trace: str | Path | None) -> dict[int, int]:
    """``{worker OS pid: parent OS pid}`` from the capture manifest beside ``trace``
    (``hook.processes[*].parent_pid``, written by the hook for each CPU optimizer worker);
    empty when there is no readable manifest or it names no worker."""
    from tracekit.analyze.trace.dsconfig import manifest_for, read_manifest

    if trace is None:
        return {}
    path = manifest_for(trace)
    if path is None:
        return {}
    data, _note = read_manifest(path)  # the one reader (size, depth, shape); the advice says why not
    if data is None:
        return {}
    try:
        procs = (data.get("hook") or {}).get("processes") or []
        return {int(p["pid"]): int(p["parent_pid"]) for p in procs
                if isinstance(p, dict) and p.get("parent_pid") is not None and p.get("pid") is not None}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _len(iv) -> int:
    s, e = iv
    return int((e - s).sum())


def cpu_update(model: PhaseModel, parents: dict[int, int] | None = None) -> CpuUpdate:
    """The CPU optimizer step per rank and iteration (see the module doc for the definitions).

    ``model``: :func:`tracekit.analyze.model.phases.build`; ``parents``: ``{worker OS pid: parent
    OS pid}`` (:func:`worker_parents`), needed only when the trace has several rank processes.
    Returns a :class:`CpuUpdate`; its table is empty when the trace has no ``cpu_optimizer_step``
    range (no CPU optimizer, or no tracekit capture ranges). Raises nothing for odd input: a
    range that cannot be placed is left out and named in ``notes``.
    """
    parents = parents or {}
    empty = pl.DataFrame(schema={"global_pid": pl.Int64, "pid": pl.Int64, "device": pl.Int64,
                                 "iteration": pl.Int64, "complete": pl.Boolean, "busy_ns": pl.Int64,
                                 "hidden_ns": pl.Int64, "exposed_ns": pl.Int64, "overlapped_ns": pl.Int64,
                                 "wait_ns": pl.Int64, "hidden_by_phase": pl.String, "overlapped_by_phase": pl.String, "exposed_basis": pl.String, "ranges": pl.Int64,
                                 "worker_ranges": pl.Int64, "workers": pl.List(pl.Int64), "by_name": pl.Boolean})
    rg = model.ranges
    if rg.height == 0 or "domain" not in rg.columns:
        return CpuUpdate(empty)
    tk = rg.filter((pl.col("domain") == TRACEKIT_DOMAIN) & ~pl.col("cross_thread"))
    steps = tk.filter(pl.col("name").str.contains(CPU_STEP))
    waits = tk.filter(pl.col("name").str.contains(CPU_WAIT) & ~pl.col("unclosed"))
    if steps.height == 0:
        return CpuUpdate(empty)
    notes = []
    n_unclosed = int(steps["unclosed"].sum())
    if n_unclosed:
        notes.append(f"{n_unclosed} cpu_optimizer_step range(s) never closed (the worker ended inside them): left out")
    steps = steps.filter(~pl.col("unclosed"))
    rk = breakdown.ranks(model)
    rank_gps = sorted(set(rk["global_pid"].to_list()))
    by_os = {os_pid(gp): gp for gp in rank_gps}

    def owner(gp: int) -> int | None:
        if gp in by_os.values():
            return gp
        par = parents.get(os_pid(gp))
        if par is not None and par in by_os:
            return by_os[par]
        return rank_gps[0] if len(rank_gps) == 1 else None

    steps = steps.with_columns(
        owner=pl.col("global_pid").map_elements(owner, return_dtype=pl.Int64),
        it_name=pl.col("name").str.extract(CPU_STEP, 1).cast(pl.Int64, strict=False),
    )
    lost = steps.filter(pl.col("owner").is_null()).height
    if lost:
        notes.append(f"{lost} cpu_optimizer_step range(s) in processes not tied to a rank (several ranks and no "
                     "capture manifest naming the worker's parent): left out")
    steps = steps.filter(pl.col("owner").is_not_null())
    # iteration by time: the owner's window containing the range's start
    w = model.windows.filter(pl.col("iteration").is_not_null()).select(
        owner="global_pid", w_start="start", w_end="end", t_iter="iteration").sort("w_start")
    steps = steps.sort("start").join_asof(w, left_on="start", right_on="w_start", by="owner", strategy="backward",
                                          check_sortedness=False)
    steps = steps.with_columns(t_iter=pl.when(pl.col("start") < pl.col("w_end")).then(pl.col("t_iter")))
    steps = steps.with_columns(iteration=pl.coalesce("it_name", "t_iter"), by_name=pl.col("it_name").is_not_null())
    its = model.windows.filter(pl.col("iteration").is_not_null()).group_by("global_pid", "iteration").agg(
        complete=pl.col("complete").all())
    steps = steps.join(its.rename({"global_pid": "owner"}), on=["owner", "iteration"], how="left")
    outside = steps.filter(pl.col("complete").is_null()).height
    if outside:
        notes.append(f"{outside} cpu_optimizer_step range(s) of iterations outside this trace's iterations "
                     "(before the first, or a cut's edge): left out")
    steps = steps.filter(pl.col("complete").is_not_null())

    active = model_compute_ops(model)
    kern, _ = model_kernel_frames(model)
    rows = []
    ranks_with = set()
    for r in rk.iter_rows(named=True):
        gp, dev = r["global_pid"], r["device"]
        mine = steps.filter(pl.col("owner") == gp)
        if mine.height == 0:
            continue
        ranks_with.add((gp, dev))
        k = rank_rows(kern, gp, dev, "start", "end", "phase")  # (no copy for one rank)
        k_iv = union(k["start"].to_numpy(), k["end"].to_numpy())
        k_phase = {p: union(g["start"].to_numpy(), g["end"].to_numpy())
                   for (p,), g in k.group_by(["phase"])} if k.height else {}
        a = rank_rows(active, gp, dev, "start", "end")  # (two columns, no copy for one rank)
        a_iv = union(a["start"].to_numpy(), a["end"].to_numpy())
        wr = waits.filter(pl.col("global_pid") == gp)
        w_s, w_e = wr["start"].to_numpy(), wr["end"].to_numpy()
        w_iv = union(w_s, w_e)
        pw = model.windows.filter(pl.col("global_pid") == gp)
        p_phase = {p: union(g["start"].to_numpy(), g["end"].to_numpy()) for (p,), g in pw.group_by(["phase"])}
        for (it,), g in mine.group_by(["iteration"], maintain_order=True):
            b_iv = union(g["start"].to_numpy(), g["end"].to_numpy())
            busy = _len(b_iv)
            hidden = _len(intersect(b_iv, k_iv))
            by_phase = {str(p): _len(intersect(b_iv, iv)) for p, iv in k_phase.items()}
            inproc = g.filter(pl.col("global_pid") == gp)
            worker = g.filter(pl.col("global_pid") != gp)
            # what the training waited for: a worker's step inside cpu_update_wait; a step on the
            # training's own process inside the update window (its thread runs it)
            bw_iv = union(worker["start"].to_numpy(), worker["end"].to_numpy())
            u = pw.filter((pl.col("iteration") == it) & (pl.col("phase") == "update"))
            waited = union(*[np.concatenate(x) for x in zip(
                intersect(bw_iv, w_iv),
                intersect(union(inproc["start"].to_numpy(), inproc["end"].to_numpy()),
                          union(u["start"].to_numpy(), u["end"].to_numpy())))])
            basis = " + ".join(b for b, n in (("cpu_update_wait", worker.height), ("update window", inproc.height)) if n)
            ov = np.zeros(len(w_s), dtype=bool)  # the waits that overlap this iteration's worker steps, whole
            for s, e in zip(*bw_iv):
                ov |= (w_s < e) & (w_e > s)
            wait = _len(union(w_s[ov], w_e[ov]))
            exposed = _len(subtract(waited, a_iv))
            free = subtract(b_iv, waited)
            over_phase = {str(p): _len(intersect(free, iv)) for p, iv in p_phase.items()}
            workers = sorted({os_pid(p) for p in g["global_pid"].to_list()})
            rows.append({
                "global_pid": gp, "pid": r["pid"], "device": dev, "iteration": int(it),
                "complete": bool(g["complete"][0]), "busy_ns": busy, "hidden_ns": hidden, "exposed_ns": exposed,
                "overlapped_ns": _len(free), "wait_ns": wait,
                "hidden_by_phase": json.dumps({p: v for p, v in sorted(by_phase.items()) if v}),
                "overlapped_by_phase": json.dumps({p: v for p, v in sorted(over_phase.items()) if v}),
                "exposed_basis": basis, "ranges": g.height,
                "worker_ranges": int((g["global_pid"] != gp).sum()), "workers": workers,
                "by_name": bool(g["by_name"].all()),
            })
    table = pl.DataFrame(rows, schema=empty.schema) if rows else empty
    return CpuUpdate(table.sort("global_pid", "device", "iteration"), ranks_with, notes,
                     forward_counts(model.windows))


def iteration_json(cu: CpuUpdate, global_pid: int, device: int, iteration: int) -> dict | None:
    """The ``"cpu_update"`` object of one iteration of the result (:mod:`tracekit.analyze.result`):
    ``{"busy_ns", "hidden_ns", "exposed_ns", "overlapped_ns", "wait_ns", "hidden_by_phase":
    {phase: ns}, "overlapped_by_phase": {phase: ns}, "exposed_basis", "ranges", "worker_ranges", "workers": [OS pid]}``; zeros for an iteration
    of a rank with CPU optimizer ranges elsewhere; None for a rank without any (no CPU
    optimizer marked in this trace)."""
    if (global_pid, device) not in cu.ranks:
        return None
    t = cu.table.filter((pl.col("global_pid") == global_pid) & (pl.col("device") == device)
                        & (pl.col("iteration") == iteration))
    if t.height == 0:
        return {"busy_ns": 0, "hidden_ns": 0, "exposed_ns": 0, "overlapped_ns": 0, "wait_ns": 0,
                "hidden_by_phase": {}, "overlapped_by_phase": {}, "exposed_basis": None, "ranges": 0, "worker_ranges": 0, "workers": []}
    r = t.row(0, named=True)
    return {"busy_ns": r["busy_ns"], "hidden_ns": r["hidden_ns"], "exposed_ns": r["exposed_ns"],
            "overlapped_ns": r["overlapped_ns"], "wait_ns": r["wait_ns"],
            "hidden_by_phase": json.loads(r["hidden_by_phase"]),
            "overlapped_by_phase": json.loads(r["overlapped_by_phase"]),
            "exposed_basis": r["exposed_basis"], "ranges": r["ranges"], "worker_ranges": r["worker_ranges"],
            "workers": list(r["workers"])}


def steady(cu: CpuUpdate, global_pid: int, device: int) -> dict | None:
    """Means per steady iteration of one rank (its complete iterations with CPU optimizer
    ranges, the warm-up apart by :func:`tracekit.analyze.model.steady.split_warmup` on
    :attr:`CpuUpdate.forwards`): ``{"iterations": [int], "warmup": [int], "busy_ns",
    "hidden_ns", "exposed_ns", "overlapped_ns", "wait_ns" (floats, ns per iteration),
    "hidden_by_phase", "overlapped_by_phase": {phase: ns per iteration}, "exposed_basis", "worker_ranges", "workers": [OS pid]}``; None when the
    rank has no complete iteration with CPU optimizer ranges."""
    t = cu.table.filter((pl.col("global_pid") == global_pid) & (pl.col("device") == device) & pl.col("complete"))
    if t.height == 0:
        return None
    keep, warm = split_warmup(t["iteration"].to_list(), cu.forwards.get(global_pid))
    s = t.filter(pl.col("iteration").is_in(keep))
    n = len(keep)
    by_phase: dict[str, dict[str, float]] = {"hidden_by_phase": {}, "overlapped_by_phase": {}}
    for col, acc in by_phase.items():
        for h in s[col].to_list():
            for p, v in json.loads(h).items():
                acc[p] = acc.get(p, 0.0) + v / n
    return {"iterations": keep, "warmup": warm,
            **{k: float(s[k].sum()) / n for k in ("busy_ns", "hidden_ns", "exposed_ns", "overlapped_ns", "wait_ns")},
            **by_phase, "exposed_basis": s["exposed_basis"][0],
            "worker_ranges": int(s["worker_ranges"].sum()),
            "workers": sorted({p for ws in s["workers"].to_list() for p in ws})}


def for_model(model: PhaseModel, trace: str | Path | None) -> CpuUpdate:
    """:func:`cpu_update` of ``model`` with the worker parents of the manifest beside ``trace``,
    computed once per model and kept in ``model.cache``."""
    return model.derived("cpu_update", lambda: cpu_update(model, worker_parents(trace)))
