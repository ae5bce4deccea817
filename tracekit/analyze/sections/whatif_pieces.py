"""The what-if model's first step: the measured pieces of one steady-state iteration, read from one
trace per rank (:func:`measure`), and what the config inference reads from them (:func:`trace_facts`).

The pieces are means per **steady iteration** (complete iterations, the warm-up apart:
:func:`tracekit.analyze.model.steady.split_warmup`): phase walls, kernel busy time, every host copy
(direction, host memory kind, bytes, duration, the part of it no kernel hides = *exposed*), the
update split into DeepSpeed's steps (:data:`ROLES`), pinned and pageable bandwidth per copy-size
bucket, device-to-device copy bandwidth, the device's memory bandwidth and free GPU memory, and
the per-iteration series the intervals need. The second step, the scenarios that replay the
pieces with one config change each, is :mod:`tracekit.analyze.sections.whatif` (which re-exports
:func:`measure`, :data:`ROLES` and the other names here its callers use).

Over 500 lines because :func:`measure` (~185 lines) and its helpers read one thing, the pieces of
one rank, each helper one piece of it (the unmarked CPU step, the offload-only gradient path, the
eager launch gap, the fixed cost per sub-group, ...); splitting them further would cut the one
loop over ranks from the pieces it fills.

Units: ns, bytes, GB/s = 1e9 B/s (= bytes per ns).
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from tracekit.analyze.model import nvtx
from tracekit.analyze.model.intervals import covered_length, union
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections import breakdown
from tracekit.analyze.sections.copy_sizes import size_bucket
from tracekit.analyze.sections.transfer_common import all_kernel_union, host_copies_query
from tracekit.analyze.trace.export import Export


def _near(cs: np.ndarray, ce: np.ndarray, qs: np.ndarray, qe: np.ndarray) -> np.ndarray:
    """Boolean mask over the sorted, disjoint intervals ``[cs, ce)`` (a union,
    :func:`~tracekit.analyze.model.intervals.union`): those that overlap at least one of the
    intervals ``[qs, qe)`` (any order, may overlap). The length of any ``[qs, qe)`` covered by
    the masked intervals is the length covered by all of them."""
    n = len(cs)
    if not n or not len(qs):
        return np.zeros(n, dtype=bool)
    lo = np.searchsorted(ce, qs, side="right")  # the first interval ending after the start
    hi = np.searchsorted(cs, qe, side="left")  # past the last one starting before the end
    ok = lo < hi
    d = np.bincount(lo[ok], minlength=n + 1) - np.bincount(hi[ok], minlength=n + 1)
    return np.cumsum(d[:n]) > 0


def _busy_in(ops: pl.DataFrame | pl.LazyFrame, ks: np.ndarray, ke: np.ndarray, ws,
             we) -> tuple[np.ndarray, np.ndarray]:
    """The union ``(starts, ends)`` of the rank's GPU work (``ops``: its kernels, copies and
    memsets with ``kind, start, end``, a frame or a query; ``ks``/``ke``: the union of its kernels) that overlaps the
    windows ``ws``/``we``: inside those windows the same instants as the union of every op,
    outside them less (not read there)."""
    wu_s, wu_e = union(ws, we)
    near = _near(ks, ke, wu_s, wu_e)
    # (the ops other than kernels, their times only)
    o = ops.lazy().filter((pl.col("kind") != "kernel").fill_null(True)).select("start", "end").collect()
    os_, oe = o["start"].to_numpy(), o["end"].to_numpy()
    hit = np.searchsorted(wu_s, oe, side="left") > np.searchsorted(wu_e, os_, side="right")
    return union(np.concatenate([ks[near], os_[hit]]), np.concatenate([ke[near], oe[hit]]))


#: Steps of DeepSpeed's optimizer step, by NVTX range name (any domain: DeepSpeed's own ranges
#: and tracekit's capture ranges). Time in none of them (inside the update window) is
#: ``cpu_adam`` in DeepSpeed-only traces: DeepSpeed does not mark ``_optimizer_step``.
ROLES = {
    "overflow_check": r"(_overflow_check_and_loss_scale_update|\.has_overflow|^overflow_check)$",
    "unscale": r"(unscale_and_clip_grads|^unscale_clip)$",
    "copy_back": r"(_reassign_or_swap_out_partitioned_parameters|^param_copy_back|^param_copy_to_device)$",
    "grad_norm": r"(_get_norm_groups|^grad_norm|scaled_global_norm)$",
    "cpu_adam": r"^cpu_optimizer_step$",
    # the training waiting for a CPU optimizer worker (SuperOffload, ZenFlow overlap_step: the
    # Adam itself runs in the worker, tracekit.analyze.sections.cpu_update)
    "cpu_wait": r"^cpu_update_wait$",
    # ZeRO-Infinity NVMe offload: optimizer state read from / written to NVMe inside the step
    "swap": r"^(swap_in|swap_out|param_swap_in|param_swap_out|param_swap_in_wait|param_swap_out_wait)$",
}
#: Ranges with one call per gradient tensor in the boundary backward: tracekit's
#: ``grad_copy_to_host`` around ZeRO-1/2 ``copy_grads_in_partition`` (one per parameter) and
#: DeepSpeed's ZeRO-3 gradient hook ``reduce_partition_and_remove_grads`` (one per parameter);
#: the per-iteration count of the more frequent one is the number of gradient tensors.
GRAD_TENSOR_RANGES = r"(^grad_copy_to_host$|reduce_partition_and_remove_grads$)"


#: the columns of :func:`~tracekit.analyze.sections.transfer_common.host_copies` that
#: :func:`measure` reads of a rank's host copies
COPY_COLUMNS = ("iteration", "phase", "micro_step", "boundary", "direction", "host_kind", "bytes", "duration_ns",
                "start", "end", "correlation_id", "launch", "api_end")


def _role_of(name: str) -> str | None:
    for role, pat in ROLES.items():
        if re.search(pat, name):
            return role
    return None


def _role_expr(names) -> pl.Expr:
    """``name`` -> its :data:`ROLES` role (:func:`_role_of`; null for none), the regexes run once
    per distinct name in ``names`` instead of once per row (~74 k NVTX rows, issue 13)."""
    role_of = {n: role for n in names if (role := _role_of(n)) is not None}
    return pl.col("name").replace_strict(role_of, default=None, return_dtype=pl.String)


def measure(export: Export, model: PhaseModel) -> list[dict]:
    """The measured pieces of every rank; one dict per rank (sorted by pid, device)::

        {"global_pid", "pid", "device", "iterations": [steady], "warmup": [left out],
         "iteration_ns", "phase_ns": {phase: ns}, "kernel_ns": {phase: ns},
         "copies": frame, "bandwidth": frame, "roles": {role: {...}}, "update_ns",
         "sub_groups": int|None, "copy_back_bytes", "d2d_gbps"|None, "device_gbps"|None,
         "free_bytes"|None, "total_memory"|None, "range_names": set, "micro_steps": int|None,
         "sub_group_bytes": [int], "forward_h2d_bytes": float, "forward_h2d_kinds": [str],
         "kernel_dtypes": {"kernels", "Half", "BFloat16": int},
         "iteration_walls_ns": [ns], "phase_walls_ns": {phase: [ns]}, "role_walls_ns": {role: [ns]},
         "grad_tensors": int|None, "launch_gap_ns": float|None, "sub_group_fixed_ns": float|None,
         "sub_group_norm_fixed_ns": float|None, "last_micro_step_walls_ns": {phase: [ns]},
         "last_micro_step_kernel_ns": {phase: [ns]}, "non_boundary_backward_kernel_ns": [ns|None],
         "boundary_backward_copies": {...}, "grad_offload": {...}}

    ``last_micro_step_*``: wall and kernel busy time of the last (boundary) micro-step of forward
    and backward per steady iteration; ``non_boundary_backward_kernel_ns``: a non-boundary backward
    micro-step's kernel busy time (:func:`_non_boundary_backward_kernels`), for ``larger_micro_batch``.

    ``grad_tensors`` / ``launch_gap_ns``: the gradient tensors and the host time of one eager op
    of DeepSpeed's per-tensor gradient code (:func:`_eager_loop`, for
    :func:`~tracekit.analyze.sections.whatif.gpu_loop_time`);
    ``sub_group_fixed_ns``: the fixed part of one sub-group's step (:func:`_sub_group_fixed`),
    ``sub_group_norm_fixed_ns`` that of its gradient norm (:func:`_norm_fixed`).

    ``iteration_walls_ns`` / ``phase_walls_ns`` / ``role_walls_ns``: the wall time of each steady
    iteration, of each phase in it and of each :data:`ROLES` step inside its update (the unmarked
    CPU optimizer step as ``cpu_adam`` in DeepSpeed-only traces), aligned with ``iterations``
    (for :func:`~tracekit.analyze.sections.whatif.interval`).

    ``sub_group_bytes``: H2D bytes of each copy-back range of the first steady iteration (one per
    sub-group, launch order); ``forward_h2d_bytes``: forward's H2D bytes per iteration (parameters
    fetched from host memory with ``offload_param``) and their host kinds; ``kernel_dtypes``: the
    rank's kernels, and how many carry ``Half`` / ``BFloat16`` in their name (:data:`DTYPE_PATTERNS`).

    ``copies``: host copies launched in the steady iterations: ``iteration, phase,
    micro_step, boundary, role, direction, host_kind, bytes, duration_ns, exposed_ns,
    host_ns`` (launching thread's time in the API call; null without a runtime record)``, bucket``,
    and ``start, correlation_id`` (with the rank, what identifies a copy: :func:`whatif.pinning_by_copy`).
    ``bandwidth``: per ``direction, host_kind, bucket`` over the whole trace: ``bytes, ns,
    gbps``. ``roles[role]``: ``wall_ns`` (union of its ranges, per iteration), ``cpu_ns``
    (part with nothing running on the GPU), ``calls`` per iteration. All per-iteration values
    are means over the steady iterations. Ranks without a complete iteration are left out.
    """
    table = breakdown.phase_table(model)
    if model.step_ranges is not None:  # the ranges the build kept for this model (RangeKeep, issue 24)
        ranges, names = model.step_ranges, set(model.step_range_names)
    else:
        ranges = nvtx.load_ranges(export)
        # (the four columns read here, picked before the filter: the ranges are not copied whole)
        ranges = ranges.select("global_pid", "name", "start", "end",
                               _keep=~pl.col("cross_thread") & (pl.col("event_type") == 59))
        keep = ranges["_keep"]
        ranges = ranges.drop("_keep")
        if keep.null_count() or not keep.all():  # (most often every range is kept: no copy then)
            ranges = ranges.filter(keep)
        del keep
        names = set(ranges["name"].drop_nulls().unique().to_list())
    role_expr = _role_expr(names)
    hc = host_copies_query(model)  # (each reader below reads its columns and rows of it)
    gpu = _device_info(export)
    peaks = _free_memory(export, model)
    out = []
    for r in breakdown.ranks(model).iter_rows(named=True):
        gp, dev = r["global_pid"], r["device"]
        t = table.filter((pl.col("global_pid") == gp) & (pl.col("device") == dev) & pl.col("iteration").is_not_null())
        complete = sorted(t.filter(pl.col("complete"))["iteration"].unique().to_list())
        if not complete:
            continue
        from tracekit.analyze.model.steady import forward_counts, split_warmup

        steady, _ = split_warmup(complete, forward_counts(model.windows, gp))  # the one warm-up rule
        n = len(steady)
        ts = t.filter(pl.col("iteration").is_in(steady))
        sums = ts.group_by("phase").agg(pl.col("wall_ns").sum(), pl.col("kernel_busy_ns").sum())
        phase_ns = {p: float(w) / n for p, w, _ in sums.iter_rows()}
        kernel_ns = {p: float(k) / n for p, _, k in sums.iter_rows()}
        micro = ts.filter(pl.col("phase") == "backward").group_by("iteration").len()["len"]
        # the rank's ops as a query: each reader below reads its columns and rows of them only
        ops = model.scan_ops().filter((pl.col("global_pid") == gp) & (pl.col("device") == dev)).select(
            "global_pid", "device", "kind", "start", "end", "direction", "bytes", "launch", "launch_tid",
            "name_id")
        mine = ranges.select(pl.col("global_pid") == gp)["global_pid"]
        # the rank's ranges, once (one process's, most often every range: no copy then)
        rg = ranges if mine.null_count() == 0 and mine.all() else ranges.filter(mine)
        del mine
        # the union of the rank's kernels, from the unions kept on the model (no copy of the kernels' rows)
        ks, ke = all_kernel_union(model, gp, dev)
        # update windows of the steady iterations, and the role of each moment inside them
        upd = model.windows.filter((pl.col("global_pid") == gp) & (pl.col("phase") == "update")
                                   & pl.col("iteration").is_in(steady))
        uw_s, uw_e = upd["start"].to_numpy(), upd["end"].to_numpy()
        # the GPU's busy time is read inside these windows only: the union of the rank's work there
        busy_s, busy_e = _busy_in(ops, ks, ke, uw_s, uw_e)
        rr = rg.select("start", "end", role=role_expr)  # (the columns by_role reads)
        rr = rr.filter(pl.col("role").is_not_null())
        by_role = rr.partition_by("role", as_dict=True)  # one polars call, not one per role
        no_role = rr.head(0)
        roles = {}
        update_total = float((uw_e - uw_s).sum()) / n if n else 0.0
        role_iv = {}
        upd_it = upd["iteration"].to_list()
        role_walls = {}  # {role: [wall ns in each steady iteration]}, for the intervals
        for role in ROLES:
            g = by_role.get((role,), no_role)
            s, e = g["start"].to_numpy(), g["end"].to_numpy()
            inside = np.zeros(len(s), dtype=bool)
            for a, b in zip(uw_s, uw_e):
                inside |= (s >= a) & (e <= b)
            us, ue = union(s[inside], e[inside])
            role_iv[role] = (us, ue)
            per = dict.fromkeys(steady, 0.0)
            for a, b, it in zip(uw_s, uw_e, upd_it):
                k = (us >= a) & (ue <= b)
                per[it] = per.get(it, 0.0) + float((ue[k] - us[k]).sum())
            role_walls[role] = [per[i] for i in steady]
            wall = float((ue - us).sum())
            gpu_busy = float(covered_length(busy_s, busy_e, us, ue).sum()) if len(us) else 0.0
            roles[role] = {"wall_ns": wall / n, "cpu_ns": (wall - gpu_busy) / n, "calls": len(us) / n}
        if roles["cpu_adam"]["calls"] == 0:  # DeepSpeed-only trace: the unmarked rest of the update
            marked_s = np.concatenate([role_iv[k][0] for k in ROLES] + [np.zeros(0, np.int64)])
            marked_e = np.concatenate([role_iv[k][1] for k in ROLES] + [np.zeros(0, np.int64)])
            other = _unmarked_time(rg, uw_s, uw_e, marked_s, marked_e,
                                   busy_s, busy_e, per_w := [])
            per = dict.fromkeys(steady, 0.0)
            for it, w in zip(upd_it, per_w):
                per[it] = per.get(it, 0.0) + w
            role_walls["cpu_adam"] = [per[i] for i in steady]
            roles["cpu_adam"] = {"wall_ns": other[0] / n, "cpu_ns": other[1] / n, "calls": 1.0 if other[0] else 0.0,
                                 "unmarked": True}
        # host copies of the steady iterations, with the role of the range their launch fell in
        # (the columns read here, picked before the rows are gathered)
        c = hc.filter((pl.col("global_pid") == gp) & (pl.col("device") == dev)
                             & pl.col("iteration").is_in(steady)).select(COPY_COLUMNS).collect()
        c = c.sort("launch")
        role_col = np.full(c.height, None, dtype=object)
        launch = c["launch"].to_numpy()
        for role, (us, ue) in role_iv.items():
            if len(us):
                j = np.searchsorted(us, launch, side="right") - 1
                hit = (j >= 0) & (launch < ue[np.maximum(j, 0)])
                role_col[hit] = role
        c = c.with_columns(role=pl.Series(role_col.tolist(), dtype=pl.String))
        if c.height:
            cs, ce = c["start"].to_numpy(), c["end"].to_numpy()
            near = _near(ks, ke, cs, ce)  # (the kernels' pieces that meet a copy)
            exposed = c["duration_ns"].to_numpy() - covered_length(ks[near], ke[near], cs, ce)
            del cs, ce, near
        else:
            exposed = np.zeros(0)
        c = c.with_columns(exposed_ns=pl.Series(exposed, dtype=pl.Float64),
                           bucket=pl.Series(size_bucket(c["bytes"].to_numpy()), dtype=pl.Int64))
        c = c.with_columns(host_ns=(pl.col("api_end") - pl.col("launch")).cast(pl.Float64))
        bwd = model.windows.filter(
            (pl.col("global_pid") == gp) & (pl.col("phase") == "backward") & pl.col("iteration").is_in(steady))
        near = _near(ks, ke, bwd["start"].to_numpy(), bwd["end"].to_numpy())  # (what it reads of them)
        grad_offload = _grad_offload(rg, bwd, c, ks[near], ke[near], steady)
        del near
        copies = c.select("iteration", "phase", "micro_step", "boundary", "role", "direction", "host_kind", "bytes",
                          "duration_ns", "exposed_ns", "host_ns", "bucket", "start", "correlation_id")
        bw = hc.filter((pl.col("global_pid") == gp) & (pl.col("device") == dev)).select(
            "direction", "host_kind", "bytes", "duration_ns").collect()
        bw = bw.with_columns(bucket=pl.Series(size_bucket(bw["bytes"].to_numpy()), dtype=pl.Int64))
        bw = bw.group_by("direction", "host_kind", "bucket").agg(bytes=pl.col("bytes").sum(),
                                                                 ns=pl.col("duration_ns").sum())
        bw = bw.with_columns(gbps=pl.when(pl.col("ns") > 0).then(pl.col("bytes") / pl.col("ns"))).sort(
            "direction", "host_kind", "bucket")
        d2d = ops.lazy().filter((pl.col("kind") == "memcpy") & (pl.col("direction") == "D2D")
                                & (pl.col("bytes") >= 1 << 20)).select("bytes", "start", "end").collect()
        d2d_gbps = (2.0 * d2d["bytes"].sum() / (d2d["end"] - d2d["start"]).sum()) if d2d.height and (
            d2d["end"] - d2d["start"]).sum() > 0 else None
        cb = copies.filter((pl.col("role") == "copy_back") & (pl.col("direction") == "H2D"))
        sub_group_bytes = _sub_group_bytes(c, role_iv["copy_back"], steady[0])
        fwd_h2d = c.filter((pl.col("phase") == "forward") & (pl.col("direction") == "H2D"))
        sub_groups = roles["copy_back"]["calls"] or None
        pk = peaks.filter((pl.col("global_pid") == gp) & (pl.col("device") == dev)) if peaks is not None else None
        # one-time costs: pageable copies outside iterations (start-up), the warm-up iteration's excess
        su = hc.filter((pl.col("global_pid") == gp) & (pl.col("device") == dev) & pl.col("iteration").is_null()
                              & (pl.col("host_kind") == "pageable"))
        su = su.select("bytes", "duration_ns", "direction").collect()
        warm = [i for i in complete if i not in steady]
        warm_ns = {i: float(t.filter(pl.col("iteration") == i)["wall_ns"].sum()) for i in warm}
        one_time = {"startup_pageable_bytes": int(su["bytes"].sum()),
                    "startup_pageable_ns": float(su["duration_ns"].sum()),
                    "startup_pageable_count": su.height,
                    "startup_pageable_d2h_bytes": int(su.filter(pl.col("direction") == "D2H")["bytes"].sum()),
                    "warmup_ns": warm_ns}
        per_it = ts.group_by("iteration", "phase").agg(pl.col("wall_ns").sum())
        walls = {(int(i), ph): float(w) for i, ph, w in per_it.iter_rows()}
        phase_walls = {ph: [walls.get((i, ph), 0.0) for i in steady] for ph in phase_ns}
        iteration_walls = [sum(walls.get((i, ph), 0.0) for ph in phase_ns) for i in steady]
        last_wall, last_kern = _last_micro_step(ts, steady)
        nb_kern = _non_boundary_backward_kernels(ts, steady)
        boundary_copies = _boundary_backward_copies(ts, steady, copies)
        sg_fixed = _sub_group_fixed(rg, uw_s, uw_e)
        launches = _launch_order(ops)  # (sorted once for both readers)
        norm_fixed = _norm_fixed(role_iv["grad_norm"], launches, n, int(round(roles["copy_back"]["calls"])) or None)
        grad_tensors, launch_gap = _eager_loop(rg, launches, model.windows.filter(
            (pl.col("global_pid") == gp) & pl.col("iteration").is_in(steady)), steady)
        out.append({
            "global_pid": gp, "pid": r["pid"], "device": dev, "iterations": steady,
            "grad_tensors": grad_tensors, "launch_gap_ns": launch_gap, "sub_group_fixed_ns": sg_fixed,
            "sub_group_norm_fixed_ns": norm_fixed,
            "iteration_walls_ns": iteration_walls, "phase_walls_ns": phase_walls, "role_walls_ns": role_walls,
            "last_micro_step_walls_ns": last_wall, "last_micro_step_kernel_ns": last_kern,
            "non_boundary_backward_kernel_ns": nb_kern,
            "boundary_backward_copies": boundary_copies,
            "grad_offload": grad_offload,
            "warmup": [i for i in complete if i not in steady],
            "iteration_ns": float(ts["wall_ns"].sum()) / n, "phase_ns": phase_ns, "kernel_ns": kernel_ns,
            "update_ns": update_total, "copies": copies, "bandwidth": bw, "roles": roles,
            "sub_groups": int(round(sub_groups)) if sub_groups else None,
            "copy_back_bytes": float(cb["bytes"].sum()) / n, "d2d_gbps": d2d_gbps,
            "device_gbps": gpu.get(dev, {}).get("gbps"), "gpu_name": gpu.get(dev, {}).get("name"),
            "free_bytes": (int(pk["headroom_bytes"].min()) if pk is not None and pk.height
                           and pk["headroom_bytes"].null_count() < pk.height else None),
            "total_memory": gpu.get(dev, {}).get("total"),
            "range_names": names, "micro_steps": int(micro.median()) if micro.len() else None,
            "one_time": one_time, "sub_group_bytes": sub_group_bytes,
            "forward_h2d_bytes": float(fwd_h2d["bytes"].sum()) / n,
            "forward_h2d_kinds": sorted(set(fwd_h2d["host_kind"].drop_nulls().to_list())),
            "kernel_dtypes": _kernel_dtypes(export, ops).get(dev, {}),
        })
    return out


#: DeepSpeed's per-sub-group bookkeeping around each sub-group's step (stage3.py ``step``: per
#: sub-group ``_prepare_sub_group``, unscale, ``_optimizer_step``, copy-back, ``_release_sub_group``):
#: the part of a sub-group's step that does not grow with its size.
SUB_GROUP_FIXED_RANGES = r"\.(_prepare_sub_group|_release_sub_group)$"


def _sub_group_fixed(rng: pl.DataFrame, uw_s, uw_e) -> float | None:
    """Fixed cost of one sub-group's step (ns): the mean wall of the
    :data:`SUB_GROUP_FIXED_RANGES` pair per sub-group inside the update windows (``uw_s``/``uw_e``),
    less the ranges nested in them; None without those ranges."""
    g = rng.filter(pl.col("name").fill_null("").str.contains(SUB_GROUP_FIXED_RANGES))
    if not g.height or not len(uw_s):
        return None
    s, e = g["start"].to_numpy(), g["end"].to_numpy()
    inside = np.zeros(len(s), dtype=bool)
    for a, b in zip(uw_s, uw_e):
        inside |= (s >= a) & (e <= b)
    prep = g.filter(pl.Series(inside) & pl.col("name").str.ends_with("_prepare_sub_group")).height
    if not prep:
        return None
    # work nested in them grows with the sub-group (without offload _prepare_sub_group builds the
    # fp32 gradient, _prepare_fp32_grad_for_sub_group; NVMe swaps): not the fixed part
    bs, be = union(s[inside], e[inside])
    other = rng.select("start", "end", _o=~pl.col("name").fill_null("").str.contains(SUB_GROUP_FIXED_RANGES))
    other = other.filter(pl.col("_o"))  # (the times only: the names are not copied)
    os_, oe = other["start"].to_numpy(), other["end"].to_numpy()
    j = np.searchsorted(bs, os_, side="right") - 1
    nested = (j >= 0) & (oe <= be[np.maximum(j, 0)])
    ns, ne = union(os_[nested], oe[nested])
    return max(float((be - bs).sum()) - float((ne - ns).sum()), 0.0) / prep


def _eager_loop(rng: pl.DataFrame, launches, windows: pl.DataFrame, steady: list[int]
                ) -> tuple[int | None, float | None]:
    """``(gradient tensors, launch gap ns)`` of one rank, for the GPU step's per-tensor loops
    (:data:`~tracekit.analyze.sections.whatif.GPU_LOOP_LAUNCHES_PER_TENSOR`).

    - gradient tensors: per steady iteration, the ranges of :data:`GRAD_TENSOR_RANGES` of each name
      inside the last backward window (the boundary micro-step), the larger count; the median over
      the steady iterations; None without such ranges (a DeepSpeed-only ZeRO-1/2 trace).
    - launch gap: the median time (ns) between the launches of two consecutive GPU operations, both
      kernels or memsets and from one thread, inside DeepSpeed's per-tensor gradient code of the
      baseline (the update windows and the ``grad_copy_to_host`` ranges of the steady iterations):
      the host time of one eager op of such a loop (the API call, PyTorch's dispatch and the Python
      between). None with fewer than 10 such pairs.

    ``rng``: the rank's NVTX ranges (``name, start, end``); ``launches``: its GPU operations'
    launches (:func:`_launch_order`); ``windows``: its phase windows of the steady iterations."""
    bwd = windows.filter(pl.col("phase") == "backward").sort("start")
    last = bwd.group_by("iteration").agg(pl.col("start").last(), pl.col("end").last())
    gr = rng.filter(pl.col("name").fill_null("").str.contains(GRAD_TENSOR_RANGES))
    counts = []
    if gr.height:
        s, e, nm = gr["start"].to_numpy(), gr["end"].to_numpy(), gr["name"].to_list()
        for a, b in zip(last["start"].to_numpy(), last["end"].to_numpy()):
            k = (s >= a) & (e <= b)
            per = {}
            for name in (n for n, hit in zip(nm, k) if hit):
                per[name] = per.get(name, 0) + 1
            counts.append(max(per.values()) if per else 0)
    tensors = int(np.median(counts)) if counts and max(counts) > 0 else None
    # the loops' windows: update windows and grad_copy_to_host ranges
    upd = windows.filter(pl.col("phase") == "update")
    lo, hi = (windows["start"].min(), windows["end"].max()) if windows.height else (0, -1)
    g = rng.filter((pl.col("name") == GRAD_OFFLOAD_RANGE) & (pl.col("start") >= lo) & (pl.col("end") <= hi))
    ws = np.concatenate([upd["start"].to_numpy(), g["start"].to_numpy()])
    we = np.concatenate([upd["end"].to_numpy(), g["end"].to_numpy()])
    d = _launch_gaps(launches, ws, we)
    gap = float(np.median(d)) if len(d) >= 10 else None
    return tensors, gap


def _launch_order(ops: pl.DataFrame | pl.LazyFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """The launches of ``ops`` (GPU operations with ``kind, launch, launch_tid``; a frame or a
    query) by thread and time, for :func:`_launch_gaps`: ``(launch ns, pair)`` arrays,
    ``pair[i]``: launches ``i`` and ``i + 1`` are of one thread and both of a kernel or memset.
    None when ``ops`` is empty or has no launch times."""
    ops = ops.lazy()
    if "launch" not in ops.collect_schema() or not ops.select(pl.len()).collect().item():
        return None
    # (the kinds tested in polars: no array of Python strings)
    eager = pl.col("kind").is_in(["kernel", "memset"]).fill_null(False)
    o = ops.filter(pl.col("launch").is_not_null()).select("launch", "launch_tid", eager=eager).collect()
    o = o.sort("launch_tid", "launch")
    lt, la, eager = o["launch_tid"].to_numpy(), o["launch"].to_numpy(), o["eager"].to_numpy()
    return la, (lt[1:] == lt[:-1]) & eager[1:] & eager[:-1]


def _launch_gaps(launches: tuple[np.ndarray, np.ndarray] | None, ws, we) -> np.ndarray:
    """Times (ns) between the launches of two consecutive GPU operations of one thread
    (``launches``: :func:`_launch_order` of them), both kernels or memsets, both inside the same
    one of the windows ``ws``/``we`` (merged where they overlap): the host's time per eager op in
    a loop of them (a copy between two launches, e.g. a ``.item()``, breaks the pair)."""
    if not len(ws) or launches is None:
        return np.zeros(0)
    la, pair = launches
    ok = pair.copy()
    ws, we = union(np.asarray(ws), np.asarray(we))
    j = np.searchsorted(ws, la, side="right") - 1
    inside = (j >= 0) & (la < we[np.maximum(j, 0)])
    ok &= inside[1:] & inside[:-1] & (j[1:] == j[:-1])
    return (la[1:] - la[:-1])[ok]


def _norm_fixed(norm_iv, launches, n_iterations: int, sub_groups: int | None) -> float | None:
    """Fixed part (ns) of the gradient norm per sub-group: ZeRO-3 computes it once per sub-group
    (stage3.py ``_get_norm_groups``: ``complete_grad_norm_calculation_for_cpu_offload`` or
    ``get_grad_norm_direct`` for each of ``fp16_groups``), each call a loop over the group's
    parameters plus a fixed part (``float(total_norm)``, a ``FloatTensor``, ``all_reduce``, the root,
    the NaN mask, ``.cpu()``: 5 synchronizations in the benchmark's traces). The loop is the
    back-to-back launches inside the norm ranges (:func:`_launch_gaps`); the rest of the ranges'
    wall, per iteration and sub-group, is the fixed part. ``norm_iv``: the union of the norm
    (``grad_norm``) ranges of the steady update windows, ``launches``: the rank's
    (:func:`_launch_order`); None without them."""
    us, ue = norm_iv
    if not len(us) or not n_iterations:
        return None
    loop = float(_launch_gaps(launches, us, ue).sum())
    return max(float((ue - us).sum()) - loop, 0.0) / n_iterations / (sub_groups or 1)


#: tracekit's capture range around the offload-only gradient path of backward
#: (:mod:`tracekit.capture.hook._tracekit_hook`): ZeRO-1/2 ``copy_grads_in_partition`` when
#: ``cpu_offload`` (the gradient D2H into the CPU fp32 partition, the accumulation in host memory
#: through the GPU, the overflow tracker), ZeRO-3 ``partition_grads`` when ``offload_optimizer``
#: (the D2H of each partition into the CPU gradient buffer and its accumulation there); the range
#: is pushed only with optimizer offload.
GRAD_OFFLOAD_RANGE = "grad_copy_to_host"
#: every range name :func:`measure` reads outside the update windows (or may read inside them by
#: name): what a model built with a :class:`tracekit.analyze.model.phases.RangeKeep` keeps by name
RANGE_NAMES = "|".join(f"(?:{p})" for p in (*ROLES.values(), GRAD_TENSOR_RANGES, SUB_GROUP_FIXED_RANGES,
                                              f"^{GRAD_OFFLOAD_RANGE}$"))


def _grad_offload(rng: pl.DataFrame, bwd: pl.DataFrame, c: pl.DataFrame, ks, ke, steady: list[int]) -> dict:
    """The :data:`GRAD_OFFLOAD_RANGE` ranges inside the backward windows ``bwd`` of each steady
    iteration, aligned with ``steady`` (ns): ``wall_ns`` (union of the ranges), ``kernel_ns``
    (compute-kernel busy time inside them, ``ks``/``ke``: the union of the rank's kernels) and
    ``copy_cost_ns`` (per host copy launched inside one, the longer of ``host_ns`` and
    ``exposed_ns``; ``c``: the rank's host copies of :func:`measure` with ``launch``)."""
    n = len(steady)
    out = {"wall_ns": [0.0] * n, "kernel_ns": [0.0] * n, "copy_cost_ns": [0.0] * n}
    g = rng.filter(pl.col("name") == GRAD_OFFLOAD_RANGE)
    if not g.height or not bwd.height:
        return out
    s, e = g["start"].to_numpy(), g["end"].to_numpy()
    pos = {it: j for j, it in enumerate(steady)}
    launch = c["launch"].to_numpy() if c.height else np.zeros(0, np.int64)
    cost = (np.maximum(c["host_ns"].fill_null(0.0).to_numpy(), c["exposed_ns"].to_numpy())
            if c.height else np.zeros(0))
    for a, b, it in zip(bwd["start"].to_numpy(), bwd["end"].to_numpy(), bwd["iteration"].to_list()):
        k = (s >= a) & (e <= b)
        us, ue = union(s[k], e[k])
        if not len(us):
            continue
        j = pos[it]
        out["wall_ns"][j] += float((ue - us).sum())
        out["kernel_ns"][j] += float(covered_length(ks, ke, us, ue).sum())
        if len(launch):
            i = np.searchsorted(us, launch, side="right") - 1
            hit = (i >= 0) & (launch < ue[np.maximum(i, 0)])
            out["copy_cost_ns"][j] += float(cost[hit].sum())
    return out


def _last_micro_step(ts: pl.DataFrame, steady: list[int]) -> tuple[dict, dict]:
    """``({phase: [wall ns]}, {phase: [kernel busy ns]})`` of the last (boundary) micro-step of
    forward and backward in each steady iteration (aligned with ``steady``; 0 where the phase is
    absent). ``ts``: the rank's phase table rows of the steady iterations (``iteration, phase,
    micro_step, wall_ns, kernel_busy_ns``)."""
    walls, kerns = {}, {}
    for ph in ("forward", "backward"):
        g = ts.filter((pl.col("phase") == ph) & pl.col("micro_step").is_not_null())
        last = g.filter(pl.col("micro_step") == pl.col("micro_step").max().over("iteration"))
        w = {int(i): float(v) for i, v in last.group_by("iteration").agg(pl.col("wall_ns").sum()).iter_rows()}
        k = {int(i): float(v) for i, v in last.group_by("iteration").agg(pl.col("kernel_busy_ns").sum()).iter_rows()}
        walls[ph] = [w.get(i, 0.0) for i in steady]
        kerns[ph] = [k.get(i, 0.0) for i in steady]
    return walls, kerns


def _non_boundary_backward_kernels(ts: pl.DataFrame, steady: list[int]) -> list[float | None]:
    """Kernel busy time (ns) of one non-boundary backward micro-step in each steady iteration (the
    mean over its non-boundary micro-steps; aligned with ``steady``; None where the iteration has
    none, i.e. one micro-step). Its kernels are backward's compute alone: the boundary micro-step
    adds DeepSpeed's once-per-step gradient kernels (fp32 conversion, norm, overflow tracking) to
    them. ``ts``: the rank's phase table rows of the steady iterations."""
    g = ts.filter((pl.col("phase") == "backward") & ~pl.col("boundary") & pl.col("micro_step").is_not_null())
    k = {int(i): float(v) for i, v in g.group_by("iteration").agg(pl.col("kernel_busy_ns").mean()).iter_rows()}
    return [k.get(i) for i in steady]


def _boundary_backward_copies(ts: pl.DataFrame, steady: list[int], copies: pl.DataFrame) -> dict:
    """Host copies of the boundary backward micro-step of each steady iteration (aligned with
    ``steady``): ``{"h2d_bytes", "h2d_ns", "d2h_bytes", "d2h_ns", "h2d_host_ns", "d2h_host_ns":
    [float]}`` (bytes; ns of copy busy time, the phase table's ``h2d_busy_ns`` / ``d2h_busy_ns``;
    ``*_host_ns``: the summed runtime-API time of those copies' calls, ``api_end - launch``, which
    for a pageable copy includes the host's wait for its staging); 0 where there is none.
    ``ts``: the rank's phase table rows of the steady iterations; ``copies``: its host copies with
    ``iteration``, ``phase``, ``boundary``, ``direction``, ``host_ns``."""
    cols = ("h2d_bytes", "h2d_busy_ns", "d2h_bytes", "d2h_busy_ns")
    b = ts.filter((pl.col("phase") == "backward") & pl.col("boundary"))
    agg = {int(r["iteration"]): r for r in b.group_by("iteration").agg(
        [pl.col(c).sum() for c in cols]).iter_rows(named=True)}
    out = {k.replace("_busy", ""): [float(agg[i][k]) if i in agg else 0.0 for i in steady] for k in cols}
    h = copies.filter((pl.col("phase") == "backward") & pl.col("boundary")).group_by("iteration", "direction").agg(
        pl.col("host_ns").sum())
    host = {(int(i), d): float(v) for i, d, v in h.iter_rows()}
    for d in ("H2D", "D2H"):
        out[f"{d.lower()}_host_ns"] = [host.get((i, d), 0.0) for i in steady]
    return out


def _sub_group_bytes(c: pl.DataFrame, copy_back_iv, iteration: int) -> list[int]:
    """H2D bytes launched inside each copy-back range of ``iteration`` (one range per sub-group:
    ``_reassign_or_swap_out_partitioned_parameters(sub_group_id)``), in launch order; ``c``: the
    rank's host copies with ``launch``."""
    us, ue = copy_back_iv
    h = c.filter((pl.col("iteration") == iteration) & (pl.col("direction") == "H2D"))
    if not len(us) or not h.height:
        return []
    launch = h["launch"].to_numpy()
    j = np.searchsorted(us, launch, side="right") - 1
    hit = (j >= 0) & (launch < ue[np.maximum(j, 0)])
    per = {}
    for k, b in zip(j[hit], h["bytes"].to_numpy()[hit]):
        per[int(k)] = per.get(int(k), 0) + int(b)
    return [per[k] for k in sorted(per)]


#: kernel-name fragments of the 16-bit types (PyTorch's templates name them ``c10::Half`` and
#: ``c10::BFloat16``; cuBLAS/CUTLASS kernels ``__half`` / ``__nv_bfloat16`` / ``bf16``)
DTYPE_PATTERNS = {"Half": r"c10::Half|\b__half\b|cutlass::half_t",
                  "BFloat16": r"BFloat16|__nv_bfloat16|cutlass::bfloat16_t"}


def _kernel_dtypes(export: Export, ops: pl.DataFrame | pl.LazyFrame) -> dict:
    """``{device: {"Half": kernels, "BFloat16": kernels, "kernels": all}}``: how many of the
    rank's kernels (the rows of ``ops`` of kind ``kernel``; a frame or a query) carry a 16-bit
    type in their (demangled) name. The kernels are counted per device and name first (no copy
    of their rows)."""
    if "name_id" not in ops.lazy().collect_schema():
        return {}
    kern = ops.lazy().filter(pl.col("kind") == "kernel").group_by("device", "name_id").agg(n=pl.len()).collect()
    if not kern.height:
        return {}
    ids = kern["name_id"].drop_nulls().unique().to_list()
    if not ids:
        return {}
    names = export.query("SELECT id, value FROM StringIds WHERE id IN (" + ",".join(str(int(i)) for i in ids) + ")",
                         schema={"id": pl.Int64, "value": pl.String})
    # the patterns run once per distinct name, not once per kernel
    names = names.select("id", **{label: pl.col("value").fill_null("").str.contains(pat)
                                  for label, pat in DTYPE_PATTERNS.items()})
    k = kern.join(names, left_on="name_id", right_on="id", how="left")
    per = k.group_by("device").agg(kernels=pl.col("n").sum(),
                                   **{label: pl.col("n").filter(pl.col(label).fill_null(False)).sum()
                                      for label in DTYPE_PATTERNS})
    return {int(r["device"]): {"kernels": r["kernels"], **{label: int(r[label]) for label in DTYPE_PATTERNS}}
            for r in per.iter_rows(named=True)}


#: The optimizer step's own range (DeepSpeed's ``instrument_w_nvtx`` of ``step``:
#: ``DeepSpeedZeroOptimizer_Stage3.step``, ``SuperOffloadOptimizer_Stage3.step``): the parent of
#: the update's steps, never one of them, even when it starts or ends a little inside the window
#: (tracekit's ``update`` range opens before DeepSpeed's step range and closes after it).
STEP_RANGE = r"(^|\.)step$"


def _unmarked_time(rng: pl.DataFrame, uw_s, uw_e, ms, me, busy_s, busy_e, per_window: list | None = None
                   ) -> tuple[float, float]:
    """Time inside the update windows on the thread that opened them, not inside any range
    nested in the window other than the step range itself (:data:`STEP_RANGE`, whatever its
    bounds), and not in a marked role: (wall ns, GPU-idle ns). Only ranges strictly inside a
    window count as nested."""
    wall = idle = 0.0
    rng = rng.select("start", "end", _o=~pl.col("name").fill_null("").str.contains(STEP_RANGE))
    rng = rng.filter(pl.col("_o"))  # (the pattern once, not per window; the times only)
    for a, b in zip(uw_s, uw_e):
        inner = rng.filter((pl.col("start") >= a) & (pl.col("end") <= b)
                           & ~((pl.col("start") == a) & (pl.col("end") == b)))
        # the step range itself (same span as the window) is the parent; its direct children cover the marked time
        s, e = inner["start"].to_numpy(), inner["end"].to_numpy()
        # drop ranges that span the whole window (e.g. a wrapper pushed by the hook) from the children
        us, ue = union(np.concatenate([s, ms]), np.concatenate([e, me]))
        keep = (ue > a) & (us < b)
        us, ue = np.maximum(us[keep], a), np.minimum(ue[keep], b)
        covered = float((ue - us).sum())
        w = float(b - a) - covered
        # GPU busy time in the uncovered part
        gaps_s = np.concatenate([[a], ue]) if len(us) else np.array([a])
        gaps_e = np.concatenate([us, [b]]) if len(us) else np.array([b])
        ok = gaps_e > gaps_s
        gb = float(covered_length(busy_s, busy_e, gaps_s[ok], gaps_e[ok]).sum()) if ok.any() else 0.0
        wall += w
        idle += w - gb
        if per_window is not None:
            per_window.append(w)
    return wall, idle


def _device_info(export: Export) -> dict:
    f = export.load("TARGET_INFO_GPU", {"device": "id", "name": "name", "total": "totalMemory",
                                        "bw": "memoryBandwidth"})
    out = {}
    for r in f.iter_rows(named=True):
        if r.get("device") is None:
            continue
        bw = r.get("bw")
        out[int(r["device"])] = {"name": r.get("name"), "total": r.get("total"),
                                 "gbps": float(bw) / 1e9 if bw else None}
    return out


def _free_memory(export: Export, model: PhaseModel) -> pl.DataFrame | None:
    from tracekit.analyze.sections.opportunities import _peaks  # kept on the model, shared

    peaks = _peaks(export, model, ("phase",))
    return None if peaks is None else peaks.filter(pl.col("phase").is_in(["forward", "backward", "update"]))


def trace_facts(pieces: dict) -> dict:
    """What :func:`tracekit.analyze.trace.dsconfig.infer_settings` reads from one rank's pieces."""
    c = pieces["copies"]
    grads = c.filter(pl.col("phase") == "backward")
    kinds = {k: float(g["bytes"].sum()) for (k,), g in grads.group_by(["host_kind"])} if grads.height else {}
    upd = pieces["update_ns"]
    cpu = sum(v["cpu_ns"] for v in pieces["roles"].values())
    names = pieces["range_names"]
    fwd = (pieces.get("forward_h2d_bytes") or 0.0) / (pieces["micro_steps"] or 1)
    return {
        "range_names": names, "micro_steps": pieces["micro_steps"], "grad_copy_kinds": kinds,
        "copy_back_bytes": pieces["copy_back_bytes"], "update_cpu_share": cpu / upd if upd else None,
        "overflow_check": any(n.endswith(".has_overflow") or n == "overflow_check" for n in names),
        "loss_scale_update": any(n.endswith("_overflow_check_and_loss_scale_update") for n in names),
        "sub_groups": pieces["sub_groups"],
        # without a copy-back (offload_param: the step writes the 16-bit parameters in host memory)
        # forward's H2D fetches them, 2 B each, once per micro-step
        "parameters": parameters(pieces) or (fwd / 2 if fwd >= 1 << 20 else None),
        "sub_group_bytes": pieces.get("sub_group_bytes") or [],
        "kernel_dtypes": pieces.get("kernel_dtypes") or {},
        "forward_h2d_bytes_per_micro_step": fwd,
        "forward_h2d_kinds": pieces.get("forward_h2d_kinds") or [],
        "cpu_step_ns": sum(pieces["roles"][k]["cpu_ns"] for k in ("cpu_adam", "cpu_wait", "swap")),
        "cpu_wait_calls": pieces["roles"]["cpu_wait"]["calls"],
        "update_ns": upd,
    }


def parameters(pieces: dict, bytes_per_param: int = 2) -> float | None:
    """Parameters of the rank's partition: the 16-bit parameters its update copies back per
    iteration (``copy_back_bytes / 2``); None without a copy-back."""
    b = pieces.get("copy_back_bytes") or 0
    return b / bytes_per_param if b else None
