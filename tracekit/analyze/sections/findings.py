"""The findings summary: the largest transfer problems of a run, each a sentence with numbers.

Built only from the frames of the transfer analyses (no new measurement), per rank:

- ``exposed-copies``: the phase with the most copy time not hidden behind kernels
  (:func:`tracekit.analyze.sections.overlap.overlap` by phase);
- ``pageable``: each phase/sub-phase whose pageable copies could save at least 1 ms
  with pinned memory (:mod:`tracekit.analyze.sections.pageable`);
- ``contention``: contention windows per phase, or that there were none;
- ``gradient-round-trip`` and ``update``: the two offload opportunities
  (:mod:`tracekit.analyze.sections.opportunities`);
- ``pcie``: time at or above the saturation threshold per phase, when the series was read;
- ``cpu-update``: where the CPU optimizer step ran (a worker process, or the training's own
  thread), how much of it GPU compute hid and how much the training waited for
  (:func:`cpu_update_findings`, from :mod:`tracekit.analyze.sections.cpu_update`; added by
  :mod:`tracekit.analyze.result`, since the worker ranges are no transfer frame);
- ``pcie-cross-check``: the link peak implied by copy bytes/s and the metric per phase
  (:func:`tracekit.analyze.sections.pcie_metrics.pcie_phase_stats`); within 25 % of each other the
  copies account for the traffic.

A comparison in a finding (pageable vs pinned speed, contended vs uncontended copies, a rank
against the others) is said only when it passes :func:`tracekit.analyze.significance.differs`
(the one rule of a comparative claim, docs/transfers.md).

Each finding is a dict ``{"topic", "pid", "device", "phase", "text", "values"}`` (and
``"summary"``, its one line: :mod:`tracekit.analyze.sections.finding_summary`); ``values``
holds the numbers of the sentence in base units (ns, bytes, GB/s) and ``iterations``, the
number of iterations that have the phase, by which per-iteration figures divide.
"""

from __future__ import annotations

import re

import polars as pl

from tracekit.analyze.model.steady import split_warmup
from tracekit.analyze.significance import differs
from tracekit.vocab import B_PER_MB, fmt_gb, fmt_mb, fmt_ms, os_pid

MIN_SAVING_NS = 1_000_000
#: sub-phases holding ZeRO-3's parameter copy-back (DeepSpeed's range, tracekit's capture range)
_COPY_BACK = re.compile(r"_reassign_or_swap_out_partitioned_parameters|^param_copy_back$")


def _ms(ns) -> str:
    return f"{fmt_ms(ns, 1)} ms"


def _mb(b) -> str:
    return f"{fmt_mb(b, 0)} MB" if b >= B_PER_MB else f"{b / 1e3:,.1f} kB"


def _gb(b) -> str:
    return f"{fmt_gb(b, 1)} GB"


def _short(name: str | None) -> str:
    if not name or name == "(none)":
        return ""
    return name.rsplit(".", 1)[-1] if len(name) > 40 else name


def _rank_filter(frame: pl.DataFrame | None, gpid: int, dev: int) -> pl.DataFrame | None:
    if frame is None or frame.height == 0:
        return frame
    return frame.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev))


def build_findings(frames: dict[str, pl.DataFrame], iterations: dict[tuple[int, int], dict[str, int]],
                   pcie_threshold: float = 80.0, forwards: dict[int, dict[int, int]] | None = None) -> list[dict]:
    """Findings from ``frames`` (keys as in :func:`tracekit.analyze.sections.transfers.analyze_transfers`).

    ``iterations[(global_pid, device)][phase]`` is the number of iterations with that phase
    (for per-iteration figures). ``forwards``: ``{global_pid: {iteration: forward windows}}``
    (:func:`tracekit.analyze.model.steady.forward_counts`) for the warm-up rule of the update
    finding's steady mean; None: only iteration 0 is warm-up. Returns the list of finding dicts,
    most costly first per rank.
    """
    ranks = set(iterations)
    for name in ("overlap_phase", "pageable_phase", "contention_phase"):
        f = frames.get(name)
        if f is not None and f.height:
            ranks |= set(f.select("global_pid", "device").unique().iter_rows())
    out: list[dict] = []
    for gpid, dev in sorted(ranks):
        pid = os_pid(gpid)
        its = iterations.get((gpid, dev), {})
        rank_out: list[tuple[float, dict]] = []

        def add(topic, phase, text, cost, **values):
            if phase in its:  # iterations with the phase: the divisor of its per-iteration figures
                values.setdefault("iterations", its[phase])
            rank_out.append((cost, {"topic": topic, "pid": pid, "device": dev, "phase": phase, "text": text,
                                    "values": values}))

        def per_it(ns, phase, paren=True):
            n = its.get(phase, 0)
            if n <= 1:
                return ""
            return f" ({_ms(ns / n)} per iteration)" if paren else f", {_ms(ns / n)} per iteration"

        def copies(n):
            return f"{n} cop{'y' if n == 1 else 'ies'}"

        ov = _rank_filter(frames.get("overlap_phase"), gpid, dev)
        if ov is not None and ov.height:
            top = ov.filter(pl.col("phase") != "other").sort("copy_exposed_ns", descending=True)
            if top.height == 0:
                top = ov.sort("copy_exposed_ns", descending=True)
            for r in top.head(2).iter_rows(named=True):
                if r["copy_exposed_ns"] < MIN_SAVING_NS:
                    continue
                share = r["copy_exposed_ns"] / r["copy_busy_ns"]
                text = (f"{r['phase']}: {_ms(r['copy_exposed_ns'])} of host<->device copy time{per_it(r['copy_exposed_ns'], r['phase'])} "
                        f"is exposed ({100 * share:.0f}% of its {_ms(r['copy_busy_ns'])} copy time runs with no kernel "
                        f"on the GPU; H2D {_mb(r['h2d_bytes'])}, D2H {_mb(r['d2h_bytes'])})")
                add("exposed-copies", r["phase"], text, r["copy_exposed_ns"], exposed_ns=r["copy_exposed_ns"],
                    copy_busy_ns=r["copy_busy_ns"], overlap_ratio=r["overlap_ratio"])

        preds = frames.get("pinning_scenarios") or {}

        def voice(r):
            """The prediction a pageable row's saving is part of: ``(per-iteration divisor, clause,
            values)``; the clause names the scenario with its saving, interval and confidence as
            the advice prints them (issue 21, one voice)."""
            names = (r.get("scenario") or "").split("+")
            name = "pin_memory" if "pin_memory" in names else "pageable_to_pinned"
            p = preds.get((pid, dev, name))
            if p is None:
                return None, "", {}
            cb = name == "pageable_to_pinned" and bool(r.get("copy_back")) and p.get("copy_back_saving_ns")
            total = p["copy_back_saving_ns"] if cb else p["saving_ns"]
            siv = p.get("copy_back_saving_interval_ns") if cb else p.get("saving_interval_ns")
            conf = p.get("copy_back_confidence", p["confidence"]) if cb else p["confidence"]
            what = {"pin_memory": "offload_optimizer.pin_memory false -> true",
                    "pageable_to_pinned": "every pageable copy pinned"}[name]
            if cb:
                what = "the parameter copy-back's temporary pinned (DeepSpeed code)"
            iv = "no interval" if siv is None else f"95 % interval {fmt_ms(siv[0], 1)} to {fmt_ms(siv[1], 1)} ms"
            clause = (f" by the what-if model's {name}{' copy-back' if cb else ''} prediction ({what}: "
                      f"{_ms(total)} per iteration in all, {iv}, {conf} confidence)")
            n = len(p.get("iterations") or []) or None
            return n, clause, {"scenario": name, "copy_back": bool(cb), "scenario_saving_ns": total,
                               "saving_interval_ns": siv, "confidence": conf}

        pg = _rank_filter(frames.get("pageable_phase"), gpid, dev)
        refs = _rank_filter(frames.get("pageable_reference"), gpid, dev)
        refs = {} if refs is None else {(x["phase"], x["sub_phase"], x["direction"]): (x["ref_bytes"], x["ref_ns"])
                                         for x in refs.iter_rows(named=True)}
        if pg is not None and pg.height:
            for r in pg.filter(pl.col("saving_ns").fill_null(0) >= MIN_SAVING_NS).sort("saving_ns", descending=True).iter_rows(named=True):
                ref = refs.get((r["phase"], r.get("sub_phase"), r["direction"]))
                if ref is not None and not differs(r["gbps"], r["pinned_gbps"], "GB/s",
                                                   samples=((r["bytes"], r["copy_ns"]), ref)):
                    continue  # the pinned speed rests on too little, or is not 5 % faster
                where = r["phase"] if r["phase"] != "other" else "outside the training phases (start-up/other)"
                sub = _short(r.get("sub_phase"))
                sub = f" in {sub}" if sub else ""
                faster = r["pinned_gbps"] > r["gbps"]
                n_pred, clause, pv = voice(r)
                # per iteration: over the steady iterations the prediction covers (the warm-up is no
                # part of it); one iteration's findings (--iteration) divide by their own 1
                n = its.get(r["phase"], 0)
                n = min(n, n_pred) if n_pred else n
                each = f" ({_ms(r['saving_ns'] / n)} per iteration)" if n > 1 and r["phase"] != "other" else ""
                text = (f"{where}: {_mb(r['bytes'])} of pageable {r['direction']}{sub} in {copies(r['count'])} at "
                        + (f"{r['gbps']:.1f} GB/s vs {r['pinned_gbps']:.1f} GB/s for pinned copies of that size in this "
                           "trace; " if faster else
                           f"{r['gbps']:.1f} GB/s (pinned copies of that size run no faster here: "
                           f"{r['pinned_gbps']:.1f} GB/s); ")
                        + f"pinning would save ~{_ms(r['saving_ns'])}{each}{clause}"
                        + ("" if faster else ", the launching thread's stall in the copy calls, which asynchronous "
                           "pinned copies do not have"))
                if r["direction"] == "H2D" and r.get("sub_phase") and _COPY_BACK.search(r["sub_phase"]):
                    text += ("; this is DeepSpeed's fp32 -> 16-bit temporary of the parameter copy-back, which "
                             "offload_optimizer.pin_memory does not pin (see the advice)")
                if r["host_ns"]:
                    text += f"; the launching thread spent {_ms(r['host_ns'])} inside the copy calls"
                    if r["blocking_count"]:
                        text += f" ({r['blocking_count']} blocking: synchronous or pageable D2H)"
                add("pageable", r["phase"], text, r["saving_ns"], bytes=r["bytes"], gbps=r["gbps"],
                    pinned_gbps=r["pinned_gbps"], saving_ns=r["saving_ns"], host_ns=r["host_ns"],
                    sub_phase=r.get("sub_phase"), direction=r["direction"], **pv)
                if n and r["phase"] in its:
                    rank_out[-1][1]["values"]["iterations"] = n

        ct = _rank_filter(frames.get("contention_phase"), gpid, dev)
        if ct is not None and ct.height:
            hit = ct.filter(pl.col("windows") > 0).sort("contention_ns", descending=True)
            busy = ct["copy_busy_ns"].sum()
            if hit.height == 0 and busy >= MIN_SAVING_NS:  # worth saying only when there is copy time
                add("contention", None, f"no PCIe contention: no two H2D/D2H copies were ever in flight at the same time "
                    f"on this device ({_ms(busy)} of copy time, all serialized)", 0, contention_ns=0, copy_busy_ns=busy)
            for r in hit.iter_rows(named=True):
                slow = f"; copies ran {r['median_slowdown']:.1f}x slower than uncontended (median)" \
                    if differs(r["median_slowdown"], 1.0, "x", samples=(
                        r["contention_ns"], r["copy_busy_ns"] - r["contention_ns"])) else ""
                add("contention", r["phase"],
                    f"{r['phase']}: {r['windows']} PCIe contention windows, {_ms(r['contention_ns'])} "
                    f"({100 * (r['contention_share'] or 0):.0f}% of its copy time; same-direction "
                    f"{_ms(r['same_direction_ns'])}, bidirectional {_ms(r['bidirectional_ns'])}){slow}",
                    r["contention_ns"], windows=r["windows"], contention_ns=r["contention_ns"],
                    contention_share=r["contention_share"], median_slowdown=r["median_slowdown"])

        rt = _rank_filter(frames.get("round_trip_summary"), gpid, dev)
        if rt is not None and rt.height:
            r = rt.row(0, named=True)
            if r["h2d_bytes"] or r["d2h_bytes"]:
                text = (f"gradient accumulation round trip: {r['micro_steps']} non-boundary backward micro-steps move "
                        f"{_mb(r['h2d_bytes'])} H2D + {_mb(r['d2h_bytes'])} D2H ({_ms(r['round_trip_ns'])} of copy time"
                        f"{per_it(r['round_trip_ns'], 'backward', paren=False)})")
                if r["backward_headroom_bytes"] is not None:
                    verdict = "could" if r["fits"] else "could not"
                    text += (f"; the backward headroom of {_gb(r['backward_headroom_bytes'])} (device {_gb(r['total_memory'])}, "
                             f"peak in use {_gb(r['backward_peak_bytes'])}) {verdict} hold the {_mb(r['grad_bytes'])} of "
                             f"gradients per micro-step on the GPU instead")
                else:
                    text += "; GPU memory headroom unknown (record with --cuda-memory-usage=true)"
                add("gradient-round-trip", "backward", text, r["round_trip_ns"], **{k: r[k] for k in (
                    "micro_steps", "h2d_bytes", "d2h_bytes", "round_trip_ns", "grad_bytes", "backward_headroom_bytes", "fits")})

        up = _rank_filter(frames.get("update_opportunity"), gpid, dev)
        if up is not None and up.height:
            # one basis: the mean over steady iterations, the warm-up apart (the one warm-up rule)
            steady_its, _ = split_warmup(up["iteration"].drop_nulls().to_list(), (forwards or {}).get(gpid))
            warm = up.filter(~pl.col("iteration").is_in(steady_its)) if steady_its else up.head(0)
            up = up.filter(pl.col("iteration").is_in(steady_its)) if steady_its else up
            n = up.height
            idle = up["gpu_idle_ns"].sum()
            wall = up["wall_ns"].sum()
            h2d = up["h2d_bytes"].sum()
            span = f"{steady_its[0]}-{steady_its[-1]}" if len(steady_its) > 1 else f"{steady_its[0]}" if steady_its else "?"
            warm_its = ", ".join(f"{i}: {_ms(w)}"
                                 for i, w in warm.sort("iteration").select("iteration", "wall_ns").iter_rows())
            text = (f"update: the GPU is idle {_ms(idle / n)} of {_ms(wall / n)} per iteration "
                    f"({100 * idle / wall if wall else 0:.0f}%; mean over steady iterations {span}"
                    + (f"; warm-up iteration{'s' if warm.height > 1 else ''} {warm_its} update" if warm.height else "")
                    + ") while the CPU works")
            free = up["free_bytes"].min() if up["free_bytes"].null_count() < n else None
            if free is not None:
                text += (f"; {_gb(free)} of GPU memory stays free at the update's peak, room for the optimizer state "
                         f"of {free / 16 / 1e9:,.1f} B parameters at 16 B/parameter (a GPU-side update)")
            if h2d:
                text += (f"; the update copies {_mb(h2d / n)} back to the GPU per iteration"
                         f" (= {h2d / n / 2 / 1e6:,.0f} M parameters if 2-byte fp16/bf16)")
            add("update", "update", text, idle, gpu_idle_ns=idle, wall_ns=wall, updates=n, free_bytes=free,
                h2d_bytes=h2d)

        pc = _rank_filter(frames.get("pcie_saturation"), gpid, dev)
        if pc is not None and pc.height:
            for (phase, d), g in pc.group_by(["phase", "direction"]):
                add("pcie", phase, f"{phase}: PCIe {'RX (H2D)' if d == 'H2D' else 'TX (D2H)'} at or above "
                    f"{pcie_threshold:.0f}% of the link for {_ms(g['duration_ns'].sum())} in {g.height} windows "
                    f"(peak {g['peak_pct'].max():.0f}%)", g["duration_ns"].sum() / 10, saturated_ns=g["duration_ns"].sum(),
                    windows=g.height, direction=d, threshold=pcie_threshold)
        pp = _rank_filter(frames.get("pcie_phase"), gpid, dev)
        if pp is not None and pp.height:
            ok = pp.filter((pl.col("copy_gbps") > 0.5) & pl.col("implied_peak_gbps").is_not_null())
            if ok.height:
                lo, hi = ok["implied_peak_gbps"].min(), ok["implied_peak_gbps"].max()
                verdict = ("the copies account for the link traffic" if hi <= 1.25 * lo else
                           "the phases disagree, so part of the link traffic is not in the traced copies "
                           "(or the metric's scale differs)")
                add("pcie-cross-check", None, f"PCIe cross-check: copy bytes/s vs the RX/TX metric imply a link peak of "
                    f"{lo:.0f}-{hi:.0f} GB/s over {ok.height} phase/direction pairs; {verdict}", 0,
                    implied_min_gbps=lo, implied_max_gbps=hi)
        rank_out.sort(key=lambda x: -x[0])
        out.extend(f for _, f in rank_out)
    from tracekit.analyze.sections.multi_gpu import multi_gpu_findings  # host contention, communication, waiting ranks

    out.extend(multi_gpu_findings(frames))
    return out


def name_cpu_steps(findings: list[dict], steps: dict[tuple[int, int], dict[str, float]]) -> list[dict]:
    """Name the CPU work of each rank's ``update`` finding: ``steps[(pid, device)]`` is
    ``{step label: CPU-only ns per steady iteration}`` (e.g. from
    :func:`tracekit.analyze.sections.whatif.measure`'s roles: the fp16 overflow check, the unmarked CPU
    optimizer step, the parameter copy-back). The largest three are appended to the sentence,
    so that the finding blames the step that costs most. Returns ``findings`` (changed in place)."""
    for f in findings:
        st = steps.get((f.get("pid"), f.get("device")))
        if f.get("topic") != "update" or not st:
            continue
        top = sorted(((v, k) for k, v in st.items() if v >= MIN_SAVING_NS), reverse=True)[:3]
        if top:
            f["text"] = f["text"].replace(" while the CPU works", " while the CPU works: " + ", ".join(
                f"{k} {_ms(v)}" for v, k in top) + " per iteration with the GPU idle", 1)
            f["values"]["cpu_steps_ns"] = {k: v for v, k in top}
    return findings


def iteration_findings(export, model, iteration: int, pcie_threshold: float = 80.0, *, frames_of) -> list[dict]:
    """The findings of one iteration only (``--iteration N``): the model narrowed to that
    iteration's windows and the GPU operations attributed to them, then the same frames and
    sentences as for the whole trace (per-iteration figures divide by 1). ``frames_of(model)``:
    the frames :func:`build_findings` reads, computed on a model (the registry's, which this
    module does not import: it runs this one)."""
    import dataclasses

    windows = model.windows.filter(pl.col("iteration") == iteration)
    ops = model.scan_ops().filter(pl.col("iteration") == iteration).collect()
    one = dataclasses.replace(model, windows=windows, ops=ops)
    if hasattr(one, "cache"):
        one.cache = {}
    ff = frames_of(one)
    iters = {}
    for (gpid, dev) in ops.select("global_pid", "device").unique().drop_nulls().iter_rows():
        w = windows.filter(pl.col("global_pid") == gpid)
        iters[(gpid, dev)] = {p: 1 for p in w["phase"].unique().to_list()}
    return build_findings(ff, iters, pcie_threshold)


def _pct(part, whole) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def cpu_update_findings(findings: list[dict], cu, iteration: int | None = None) -> list[dict]:
    """Add one ``cpu-update`` finding per rank with CPU optimizer ranges, from ``cu``
    (:class:`tracekit.analyze.sections.cpu_update.CpuUpdate`): where the CPU optimizer step ran, how much
    of it GPU compute hid, how much the training waited for (exposed) and how long it sat in
    ``cpu_update_wait``. The basis is the mean over steady iterations, or ``iteration`` alone
    when given (``--iteration N``). When the step ran in a worker process the rank's ``update``
    finding says so, since the update window then holds only the waiting and the copies.
    The new finding follows the rank's ``update`` finding (else the rank's last one); its
    ``values`` hold the numbers in ns per iteration. Returns ``findings`` (changed in place)."""
    import json as _json

    import polars as _pl

    from tracekit.analyze.sections import cpu_update as _cu

    for gpid, dev in sorted(cu.ranks):
        pid = os_pid(gpid)
        if iteration is None:
            s = _cu.steady(cu, gpid, dev)
            if s is None:
                continue
            its = s["iterations"]
            basis = (f"mean over steady iterations {its[0]}-{its[-1]}" if len(its) > 1 else f"iteration {its[0]}")
            if s["warmup"]:
                plural = "s" if len(s["warmup"]) > 1 else ""
                basis += f", warm-up iteration{plural} {', '.join(map(str, s['warmup']))} apart"
        else:
            t = cu.table.filter((_pl.col("global_pid") == gpid) & (_pl.col("device") == dev)
                                & (_pl.col("iteration") == iteration))
            if t.height == 0:
                continue
            r = t.row(0, named=True)
            s = {**{k: float(r[k]) for k in ("busy_ns", "hidden_ns", "exposed_ns", "overlapped_ns", "wait_ns")},
                 "hidden_by_phase": _json.loads(r["hidden_by_phase"]),
                 "overlapped_by_phase": _json.loads(r["overlapped_by_phase"]),
                 "worker_ranges": r["worker_ranges"], "workers": list(r["workers"]), "exposed_basis": r["exposed_basis"]}
            basis = f"iteration {iteration}"
        busy, hidden, exposed, over, wait = (s[k] for k in ("busy_ns", "hidden_ns", "exposed_ns", "overlapped_ns",
                                                             "wait_ns"))
        workers = [w for w in s["workers"] if w != pid]
        if s["worker_ranges"]:
            where = (f"worker process{'es' if len(workers) > 1 else ''} {', '.join(map(str, workers))} "
                     "(cpu_optimizer_step ranges)")
            waited = "the training waiting in cpu_update_wait with the GPU idle"
        else:
            where = "the training's own process, inside update"
            waited = "inside update with the GPU idle"

        def phases_of(d):
            top = sorted(((v, k) for k, v in d.items() if v >= 0.05e6), reverse=True)
            return ", ".join(f"{k} {_ms(v)}" for v, k in top)

        text = f"CPU optimizer step in {where}: {_ms(busy)} per iteration ({basis}); "
        hp = phases_of(s["hidden_by_phase"])
        text += f"{_ms(hidden)} ({_pct(hidden, busy)}) hidden behind GPU compute kernels" + (f" ({hp})" if hp else "")
        text += f", {_ms(exposed)} ({_pct(exposed, busy)}) exposed ({waited})"
        if over:
            op = phases_of(s["overlapped_by_phase"])
            text += (f"; {_ms(over)} ({_pct(over, busy)}) ran while the training went on without waiting"
                     + (f" (during {op})" if op else ""))
        if wait:
            text += (f"; the training waited {_ms(wait)} per iteration in cpu_update_wait for it, "
                     f"{wait / busy:.1f}x the step's busy time" if busy else "")
            if busy and wait > 1.2 * busy:
                text += " (the rest is the hand-off to the worker and back: queueing, wake-up, the result's return)"
        new = {"topic": "cpu-update", "pid": pid, "device": dev, "phase": "update", "text": text,
               "values": {"busy_ns": busy, "hidden_ns": hidden, "exposed_ns": exposed, "overlapped_ns": over,
                          "wait_ns": wait, "hidden_share": hidden / busy if busy else None,
                          "exposed_share": exposed / busy if busy else None, "workers": workers, "basis": basis}}
        mine = [i for i, f in enumerate(findings) if f.get("pid") == pid and f.get("device") == dev]
        upd = [i for i in mine if findings[i].get("topic") == "update"]
        if upd and s["worker_ranges"]:
            f = findings[upd[0]]
            f["text"] += (f"; the CPU optimizer step itself ran in worker process {', '.join(map(str, workers))}, "
                          f"{_ms(busy)} per iteration, {_ms(over)} of it outside the training's waits (see the "
                          "cpu-update finding)")
            f["values"]["cpu_step_in_worker"] = True
        at = (upd[0] + 1) if upd else (mine[-1] + 1 if mine else len(findings))
        findings.insert(at, new)
    return findings
