"""What-if model: one steady-state iteration rebuilt from measured pieces, replayed with one
config change at a time (equations and assumptions: docs/advice.md).

Two steps, kept apart so that the prediction is a pure function of numbers:

- :func:`measure` (:mod:`tracekit.analyze.sections.whatif_pieces`, re-exported here) reads the
  pieces from one trace, per rank, as means per **steady iteration** (complete iterations, the
  warm-up apart: :func:`tracekit.analyze.model.steady.split_warmup`): phase walls, kernel busy
  time, every host copy (direction, host memory kind, bytes, duration, the part of it no kernel
  hides = *exposed*), the update split into DeepSpeed's steps (:data:`ROLES`: overflow check,
  unscale, gradient norm, parameter copy-back, and the CPU Adam step), pinned and pageable
  bandwidth per copy-size bucket, device-to-device copy bandwidth, the device's memory bandwidth
  and free GPU memory.
- :func:`predict` (this module) takes those pieces and the run's settings
  (:mod:`tracekit.analyze.trace.dsconfig`) and returns one scenario per change (:data:`SCENARIOS`),
  each with the predicted iteration time, the saving per iteration and how it was computed; with
  it live the scenarios' functions and constants, the bandwidth look-ups and the 95 % interval
  (:func:`interval`).

Over 500 lines because the ten scenarios share one set of derived numbers (the parameters, the
GPU step's bytes and time, the free memory, the pin savings) that :func:`predict` computes once
and threads through them; its ~230 lines are one scenario block each.

Units: ns, bytes, GB/s = 1e9 B/s (= bytes per ns).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from tracekit.analyze.sections import pageable as _pageable
from tracekit.analyze.sections.copy_sizes import size_bucket

# the measured pieces (the model's first step), re-exported: callers and tests use them as whatif.NAME
from tracekit.analyze.sections.whatif_pieces import (  # noqa: F401
    DTYPE_PATTERNS,
    GRAD_OFFLOAD_RANGE,
    GRAD_TENSOR_RANGES,
    ROLES,
    STEP_RANGE,
    SUB_GROUP_FIXED_RANGES,
    _boundary_backward_copies,
    _device_info,
    _eager_loop,
    _free_memory,
    _grad_offload,
    _kernel_dtypes,
    _last_micro_step,
    _launch_gaps,
    _norm_fixed,
    _role_expr,
    _role_of,
    _sub_group_bytes,
    _sub_group_fixed,
    _unmarked_time,
    measure,
    parameters,
    trace_facts,
)
from tracekit.analyze.trace import dsconfig

#: Bytes the GPU reads and writes per parameter for the Adam arithmetic of one step, by
#: implementation (fp32 state, the 16-bit gradient already made fp32):
#:
#: - ``fused``: DeepSpeed's FusedAdam (``multi_tensor_adam``, what ZeRO without offload runs for
#:   ``optimizer.type`` Adam/AdamW): one pass reading weight, gradient, momentum, variance and
#:   writing weight, momentum, variance: 7 x 4 = 28 B.
#: - ``torch``: ``torch.optim.AdamW`` / ``Adam`` (``optimizer.params.torch_adam: true``), the
#:   default ``foreach`` path on CUDA, seven passes over the fp32 tensors (weight decay 0):
#:   ``lerp_(m, g)`` 12, ``mul_(v)`` 8, ``addcmul_(v, g, g)`` 12, ``sqrt(v)`` 8, ``div_`` 8,
#:   ``add_(eps)`` 8, ``addcdiv_(w, m, denom)`` 16 = 72 B (+8 for the ``mul_(w)`` of a
#:   non-zero weight decay). A trace shows it as 7 x ceil(P / (320 x 65536)) launches of
#:   ``multi_tensor_apply_kernel``.
ADAM_BYTES_PER_PARAM = {"fused": 28, "torch": 72}
#: Bytes per parameter of the other GPU steps of a ZeRO-3 optimizer step without offload
#: (deepspeed/runtime/zero/stage3.py), each of which the offloaded run does on the CPU or
#: during its copies instead: the fp32 gradient built from the 16-bit partitions
#: (``_prepare_fp32_grad_for_sub_group``: flatten 2+2, ``.to(float32)`` 2+4 = 10), the
#: gradient norm (``get_grad_norm_direct``: ``g.double()`` 2+8, ``.norm(2)`` reads 8 = 18), the
#: unscale (``unscale_and_clip_grads``: ``mul_`` of the fp32 gradient 4+4 = 8) and the 16-bit
#: weights written from the fp32 ones (4+2 = 6): 42 B.
GPU_STEP_OTHER_BYTES_PER_PARAM = 42
#: Bytes per parameter of the fp16 overflow check on the GPU (a ZeRO-3 fp16 run without offload:
#: stage3.py ``has_overflow`` runs ``torch.isinf(buf).any()`` and ``torch.isnan(buf).any()`` over
#: the 16-bit gradient partitions; torch's ``isinf`` of a float is ``abs(x) == inf``: abs 2+2 and
#: the compare 2+1, ``isnan`` is ``x != x`` 2+1, each ``any()`` reads the 1-byte mask: 12 B).
#: Measured on ``advice_pair_nooffload`` (551 M parameters, fp16): the Abs, two CompareEq and the
#: or-reduce kernels take 1.88 ms per step, 12 B x 551 M at its 3,730 GB/s of D2D bandwidth 1.77.
GPU_FP16_OVERFLOW_BYTES_PER_PARAM = 12
#: Bytes per parameter of the gradient norm inside :data:`GPU_STEP_OTHER_BYTES_PER_PARAM` (the part
#: of the GPU step that runs as a loop over the gradient tensors, :data:`GPU_LOOP_LAUNCHES_PER_TENSOR`).
GPU_NORM_BYTES_PER_PARAM = 18
#: Launches per gradient tensor of the GPU step's per-tensor loops without optimizer offload
#: (DeepSpeed 0.19.8; kernels + memsets, each one eager op the host dispatches in turn):
#:
#: - ``norm``: ``get_grad_norm_direct`` (stage_1_and_2.py and stage3.py) runs, per gradient,
#:   ``g.to(norm dtype)`` (1 cast kernel) and ``vector_norm`` / ``.norm(2)`` (a memset and a
#:   reduce kernel): 3. Measured 2.95 (ZeRO-2, 328 launches in the grad_norm range) and 2.86
#:   (ZeRO-3, 318) per tensor for 111 tensors (z2s_nooffload, z3s_nooffload).
#: - ``overflow``: ZeRO-1/2 fp16 only, ``has_overflow_partitioned_grads_serial`` runs per gradient
#:   ``runtime/utils.has_inf_or_nan``: ``amax`` and ``amin`` (a memset and a reduce each),
#:   ``torch.isfinite`` of each (abs, != inf, == self, and: 4 each), ``logical_and``,
#:   ``logical_not`` and the ``+=`` into the count: 13 kernels and 2 memsets = 15. Measured 14.6
#:   (1,446 kernels and 172 memsets in the overflow_check range of z2s_nooffload, 111 tensors).
#:   ZeRO-3 checks its flat gradient buffer at once (a few launches; its bytes are
#:   :data:`GPU_FP16_OVERFLOW_BYTES_PER_PARAM`).
GPU_LOOP_LAUNCHES_PER_TENSOR = {"norm": 3, "overflow": 15}
#: Optimizer state per parameter for mixed-precision Adam (fp32 weight, momentum, variance,
#: gradient).
STATE_BYTES_PER_PARAM = 16
#: Pinned host<->device bandwidth assumed when the trace has no pinned copy of a direction
#: (one rule with the pageable section: :data:`tracekit.analyze.sections.pageable.FALLBACK_PINNED_GBPS`).
FALLBACK_PINNED_GBPS = _pageable.FALLBACK_PINNED_GBPS

#: ``superoffload_no_clipping``: the SuperOffload async path needs ``gradient_clipping`` 0
#: (``SuperOffloadOptimizer_Stage3.partition_grads`` submits a finished sub-group to the worker
#: during the boundary backward only ``if ... not self.clip_grad``, DeepSpeed 0.19.8); DeepSpeed's
#: default became 1.0 in 0.19.3 (deepspeedai/DeepSpeed#8068).
SCENARIOS = ("pageable_to_pinned", "pin_memory", "bf16", "no_offload", "grads_on_gpu", "overlap_grad_copies",
             "ratio", "sub_group_size", "superoffload_no_clipping", "larger_micro_batch")


def accumulation_round_trip_ns(pieces: dict) -> list[float]:
    """Per steady iteration (ns): the host copies a ZeRO-1/2 offload run makes in its boundary
    backward only because earlier micro-steps accumulated on the host. DeepSpeed's
    ``stage_1_and_2.py`` (``copy_grads_in_partition`` -> ``async_accumulate_grad_in_cpu_via_gpu``,
    run when ``micro_step_id > 0 or not is_gradient_accumulation_boundary()``) fetches the
    accumulated gradient back (H2D), adds it and copies the sum back (D2H) before the boundary's
    own fp32 D2H; with one micro-step per iteration neither runs. Their cost: the boundary's H2D
    time plus the same bytes' share of its D2H time, each direction's time the longer of its copy
    busy time and the host time of its copy calls (the backward is host-bound here, and a pageable
    copy holds the host for its staging: ``*_host_ns`` of ``boundary_backward_copies``). Checked on
    the recorded ZeRO-2 134 M pairs (``z2s_base3`` -> ``z2s_mb2``, calls F and I): at gas 2 the
    boundary backward moves 268 MB H2D / 805 MB D2H, at gas 1 0 / 536 MB; in ``z2s_base6`` its H2D
    busy / host time is 25.7 / 38.3 ms and its D2H 46.7 / 68.5 ms per steady iteration, so the cost
    is 61.1 ms (busy times alone: 41.3 ms), and the boundary wall at gas 1 (``z2s_mb2_r4``) is
    62.7 ms shorter."""
    c = pieces.get("boundary_backward_copies") or {}
    out = []
    n = len(c.get("h2d_bytes", []))
    hh, dh = c.get("h2d_host_ns") or [0.0] * n, c.get("d2h_host_ns") or [0.0] * n
    for hb, hn, db, dn, hhn, dhn in zip(c.get("h2d_bytes", []), c.get("h2d_ns", []), c.get("d2h_bytes", []),
                                        c.get("d2h_ns", []), hh, dh):
        out.append(max(hn, hhn) + (max(dn, dhn) * min(hb / db, 1.0) if db > 0 else 0.0))
    return out


# ---------------------------------------------------------------------- bandwidth
def bandwidth(pieces: dict, direction: str, kind: str, nbytes: float) -> tuple[float | None, str]:
    """GB/s of ``kind`` (pinned/pageable) copies of ``direction`` in the trace, for a copy of
    ``nbytes``: bytes / summed duration in its power-of-two size bucket, or the nearest bucket
    holding such copies; ``(None, why)`` when the trace has none."""
    f = pieces["bandwidth"]  # a few rows (one per direction, host kind and size bucket): read in Python
    rows = [(bucket, gbps) for d, k, bucket, nb, gbps in
            zip(f["direction"], f["host_kind"], f["bucket"], f["bytes"], f["gbps"])
            if d == direction and k == kind and gbps is not None and nb is not None and nb > 0]
    if not rows:
        return None, f"no {kind} {direction} copy in the trace"
    b = int(size_bucket(np.array([max(int(nbytes), 1)]))[0])
    k, gbps = min(rows, key=lambda r: (abs(r[0] - b), r[0]))  # the nearest bucket, the smaller on a tie
    k = int(k)
    return float(gbps), f"{kind} {direction} copies of {_size(2 ** k)}-{_size(2 ** (k + 1))} in this trace"


def _size(b: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:g} {unit}"
    return f"{b} B"


def pinned_bandwidth(pieces: dict, direction: str, nbytes: float) -> tuple[float, str, bool]:
    """``(GB/s, basis, measured)``: pinned bandwidth of the trace for that size, else
    :data:`FALLBACK_PINNED_GBPS` (measured False)."""
    g, why = bandwidth(pieces, direction, "pinned", nbytes)
    if g is not None and nbytes >= 1 << 20 and g < _pageable.MIN_PINNED_GBPS:  # only tiny pinned copies
        g = None
    if g is None:
        return FALLBACK_PINNED_GBPS[direction], (f"{FALLBACK_PINNED_GBPS[direction]:.0f} GB/s assumed (no pinned "
                                                 f"{direction} copy of that size in the trace; an H200 reached it on "
                                                 "PCIe Gen5 x16)"), False
    return g, why, True


def _pinned_lookup(pieces: dict):
    """:func:`pinned_bandwidth` of ``pieces`` as a function of ``(direction, nbytes)``, each answer
    looked up once per direction and size bucket (it depends on nothing else: the bucket, and
    whether the copy is 1 MiB or more) for callers that ask it for every copy."""
    memo: dict = {}

    def lookup(direction: str, nbytes) -> tuple[float, str, bool]:
        key = (direction, max(int(nbytes), 1).bit_length(), nbytes >= 1 << 20)
        got = memo.get(key)
        if got is None:
            got = memo[key] = pinned_bandwidth(pieces, direction, nbytes)
        return got

    return lookup


def _pageable_columns(copies: pl.DataFrame, *names: str):
    """The ``names`` columns of the pageable rows of ``copies``, as Python lists (zip them: the
    values ``iter_rows`` gives, without a dict per row)."""
    f = copies.filter(pl.col("host_kind") == "pageable")
    return [f[c].to_list() for c in names]


# ---------------------------------------------------------------------- scenarios
def _pin_saving(pieces: dict, copies: pl.DataFrame) -> tuple[float, bool, list[str]]:
    """Saving per iteration (ns) if the pageable ``copies`` ran from pinned memory: per copy
    ``max(cost_now - cost_pinned, 0)`` with ``cost_now = max(host_ns, exposed_ns)`` (a copy from
    or to pageable memory is staged by the driver and keeps the launching thread in the API
    call, so the iteration pays the longer of the host's stall and the GPU copy time no kernel
    hides) and ``cost_pinned = bytes / pinned_gbps * exposed share`` (the pinned copy as exposed
    as the pageable one was; its API call returns at once)."""
    per_copy, measured, bases = _pin_copy_savings(pieces, copies)
    return sum(per_copy, 0.0) / len(pieces["iterations"]), measured, bases


def _pin_copy_savings(pieces: dict, copies: pl.DataFrame) -> tuple[list[float], bool, list[str]]:
    """:func:`_pin_saving` copy by copy: ``([ns saved by each pageable copy of copies, in their
    order], measured, bases)``; ``measured``: every pinned bandwidth used was measured in the trace
    (none is :data:`FALLBACK_PINNED_GBPS`), ``bases``: where each came from."""
    out = []
    measured = True
    bases = set()
    pinned = _pinned_lookup(pieces)
    for d, nb, dur, exp, host in zip(*_pageable_columns(copies, "direction", "bytes", "duration_ns", "exposed_ns",
                                                        "host_ns")):
        g, why, m = pinned(d, nb)
        measured &= m
        bases.add(why)
        if dur <= 0:
            out.append(0.0)
            continue
        share = exp / dur
        now = max(host or 0.0, exp)
        out.append(max(now - nb / g * share, 0.0))
    return out, measured, sorted(bases)


def _pin_async(pieces: dict, copies: pl.DataFrame) -> tuple[dict, list[float]]:
    """``pin_memory``'s saving (ns) with DeepSpeed's copies made asynchronous: ``({phase: mean
    saving per iteration}, [saving in each steady iteration])``. DeepSpeed issues its offload
    copies with ``non_blocking=True`` (stage3.py ``partition_grads``, stage_1_and_2.py
    ``async_accumulate_grad_in_cpu_via_gpu``); from pageable memory the driver stages them and
    the launching thread waits, into a pinned buffer the call returns at once and the copy runs
    on the GPU while the host goes on with the next hooks. Per phase and steady iteration the
    phase then takes the longer of its host path and its device work::

        new = max(wall - sum(max(host_c, exposed_c)), sum(bytes_c / B_pinned) + pinned_now + kernels)

    over the phase's pageable ``copies`` (``pinned_now``: the GPU time of the phase's copies that
    are pinned already, ``kernels``: its mean kernel busy time), and saves ``max(wall - new, 0)``.
    ``B_pinned``: :func:`pinned_bandwidth` of each copy's direction and size."""
    sv, _ = _pin_async_parts(pieces, copies)
    n = len(pieces["iterations"])
    per_ph = {ph: float(np.mean(v)) for ph, v in sv.items()}
    per_it = [sum(v[j] for v in sv.values()) for j in range(n)]
    return per_ph, per_it


def _pin_async_parts(pieces: dict, copies: pl.DataFrame) -> tuple[dict, dict]:
    """The parts of :func:`_pin_async`: ``({phase: [saving ns in each steady iteration]},
    {phase: [summed max(host_c, exposed_c) of its pageable copies in each steady iteration]})``."""
    n = len(pieces["iterations"])
    pos = {it: j for j, it in enumerate(pieces["iterations"])}
    cost, dev = {}, {}
    pinned = _pinned_lookup(pieces)
    for ph, it, d, nb, exp, host in zip(*_pageable_columns(copies, "phase", "iteration", "direction", "bytes",
                                                           "exposed_ns", "host_ns")):
        j = pos.get(it)
        if ph is None or j is None:
            continue
        g, _, _ = pinned(d, nb)
        cost.setdefault(ph, [0.0] * n)[j] += max(host or 0.0, exp)
        dev.setdefault(ph, [0.0] * n)[j] += nb / g
    already = pieces["copies"].filter(pl.col("host_kind") == "pinned")
    sv = {}
    for ph in sorted(cost):
        walls = pieces["phase_walls_ns"].get(ph, [0.0] * n)
        a = already.filter(pl.col("phase") == ph)
        pinned_now = _per_it(pieces, a, a["duration_ns"].to_numpy())
        k = pieces["kernel_ns"].get(ph, 0.0)
        sv[ph] = [max(w - max(w - c, d + p + k), 0.0) for w, c, d, p in zip(walls, cost[ph], dev[ph], pinned_now)]
    return sv, cost


def pin_memory_lever(pieces: dict, settings: dict) -> tuple[bool, pl.DataFrame, bool, str]:
    """``(lever, pinnable copies, copy_back_pinned_by_config, stage_why)``: whether
    ``offload_optimizer.pin_memory`` false -> true is a change the run can make (optimizer offload
    on, pin_memory not already true: the ``pin_memory`` scenario applies), and the copies of
    ``pieces`` it pins (every copy but, in ZeRO-3, the parameter copy-back's temporary:
    :func:`copy_back_pinned_by_pin_memory`)."""
    copies = pieces["copies"]
    cb_pinned, why = copy_back_pinned_by_pin_memory(pieces, settings)
    pinnable = copies if cb_pinned else copies.filter(pl.col("role").is_null() | (pl.col("role") != "copy_back"))
    offload = settings.get("zero_optimization.offload_optimizer.device")
    pin = settings.get("zero_optimization.offload_optimizer.pin_memory")
    return offload not in (None, "none") and pin is not True, pinnable, cb_pinned, why


#: columns of :func:`pinning_by_copy`
PINNING_COLUMNS = ("global_pid", "device", "start", "correlation_id", "scenario", "copy_back", "saving_ns")


def pinning_by_copy(pieces: dict, settings: dict) -> pl.DataFrame:
    """What pinning saves, copy by copy: the one voice of the pageable section, its findings, the
    advice and ``compare`` (issue 21). One row per pageable copy of ``pieces``' steady iterations:
    ``global_pid, device, start, correlation_id`` (the copy), ``scenario`` (the :func:`predict`
    scenario whose prediction holds the copy), ``copy_back`` (bool: the ZeRO-3 parameter copy-back
    that pin_memory does not pin, the advice's "DeepSpeed code" item) and ``saving_ns`` (ns, its part
    of that scenario's saving in its iteration).

    - When ``pin_memory`` false -> true is a lever (:func:`pin_memory_lever`), the copies it pins
      belong to ``pin_memory``: each phase's saving in each steady iteration (:func:`_pin_async`)
      is shared over the phase's pageable copies of that iteration in proportion to what each
      costs now, ``max(host_c, exposed_c)`` (the saving never exceeds their sum). Their sum over
      the copies, divided by the steady iterations, is ``pin_memory``'s ``saving_ns``, per phase
      its ``phase_delta_ns``.
    - Every other pageable copy (the ZeRO-3 copy-back, or all of them when pin_memory is already
      true or there is no optimizer offload) belongs to ``pageable_to_pinned`` with the per-copy
      rule (:func:`_pin_saving`); the copy-back's sum / iterations is ``copy_back_saving_ns``."""
    lever, pinnable, cb_pinned, _ = pin_memory_lever(pieces, settings)
    copies = pieces["copies"]
    pos = {it: j for j, it in enumerate(pieces["iterations"])}
    gp, dv = pieces["global_pid"], pieces["device"]
    rows = []
    rest = copies
    if lever:
        sv, cost = _pin_async_parts(pieces, pinnable)
        for r in pinnable.filter(pl.col("host_kind") == "pageable").iter_rows(named=True):
            ph, j = r["phase"], pos.get(r["iteration"])
            c = max(r["host_ns"] or 0.0, r["exposed_ns"])
            tot = cost[ph][j] if ph in cost and j is not None else 0.0
            rows.append((gp, dv, r["start"], r["correlation_id"], "pin_memory", False,
                         sv[ph][j] * c / tot if tot > 0 else 0.0))
        rest = copies.head(0) if cb_pinned else copies.filter(pl.col("role") == "copy_back")
    rest = rest.filter(pl.col("host_kind") == "pageable")
    per_copy, _, _ = _pin_copy_savings(pieces, rest)
    for r, saving in zip(rest.iter_rows(named=True), per_copy):
        rows.append((gp, dv, r["start"], r["correlation_id"], "pageable_to_pinned",
                     r["role"] == "copy_back" and not cb_pinned, saving))
    schema = {"global_pid": pl.Int64, "device": copies.schema.get("device", pl.Int64),
              "start": copies.schema["start"], "correlation_id": copies.schema["correlation_id"],
              "scenario": pl.String, "copy_back": pl.Boolean, "saving_ns": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


#: the phase a scenario's saving is taken from, when it does not give ``phase_delta_ns`` itself
SCENARIO_PHASE = {"bf16": "update", "grads_on_gpu": "backward", "overlap_grad_copies": "backward",
                  "sub_group_size": "update"}


def _phase_delta(pieces: dict, copies: pl.DataFrame) -> dict:
    """``{phase: -saving ns}`` of :func:`_pin_saving` per phase of ``copies``."""
    sums = _pin_sums(pieces, copies, "phase")
    n = len(pieces["iterations"])
    return {ph: -(sums.get(ph, 0.0) / n) for ph in sorted(set(copies["phase"].drop_nulls().to_list()))}


def _pin_sums(pieces: dict, copies: pl.DataFrame, by: str) -> dict:
    """``{value of by: summed ns}``: :func:`_pin_copy_savings` of ``copies`` summed per value of
    their column ``by``, each sum in the copies' order (the sum :func:`_pin_saving` of that value's
    copies alone makes), from one pass over the copies."""
    per_copy, _, _ = _pin_copy_savings(pieces, copies)
    (keys,) = _pageable_columns(copies, by)
    sums: dict = {}
    for k, v in zip(keys, per_copy):
        sums[k] = sums.get(k, 0.0) + v
    return sums


#: Two-sided 95 % critical values of Student's t, ``t(0.975, df)``, for df = 1..30, then 40, 60,
#: 120 and infinity (NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.2, "Critical
#: values of the Student's t distribution", column 0.025 upper tail). scipy is not a dependency.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
       20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
       29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t95(df: int) -> float:
    """Two-sided 95 % Student t critical value for ``df`` >= 1 degrees of freedom (:data:`T95`;
    between tabulated values the next smaller df, i.e. the wider interval; 1.960 above 120).
    Raises ValueError for df < 1."""
    if df < 1:
        raise ValueError(f"degrees of freedom {df}: need at least 1")
    if df in T95:
        return T95[df]
    if df > 120:
        return 1.960
    return T95[max(k for k in T95 if k <= df)]


def _sd(v) -> float:
    """Sample standard deviation (n - 1) of ``v`` (>= 2 values)."""
    return float(np.std(np.asarray(v, dtype=float), ddof=1))


#: Between-run spread: the relative standard deviation of the difference between the mean steady
#: iterations of two runs of the same config recorded one after the other in one device call,
#: beyond what their iteration-to-iteration noise explains. Measured on the what-if benchmark's
#: same-call noise-floor pairs (benchmarks/whatif, one H200 VM with 16 host cores): per pair
#: ``d = (mean_B - mean_A) / mean_A`` and its within-run part ``w^2 = (s_A^2 / n_A + s_B^2 / n_B) /
#: mean_A^2`` (``s`` the sample sd of a run's steady iteration walls, ``n`` their count), pooled over
#: the pairs as ``sqrt(mean(d^2 - w^2))`` (a pooled estimate, not one per model size: the 1.3 B and
#: 2.7 B models have three and one such pairs, too few for a spread of their own). The pairs and
#: the count are :data:`BETWEEN_RUN_PAIRS`; ``tests/test_whatif_bench.py`` recomputes the value from
#: ``benchmarks/whatif/summaries.json``.
BETWEEN_RUN_REL_SD = 0.1141
#: The same-call noise-floor pairs (first run, second run) :data:`BETWEEN_RUN_REL_SD` is pooled
#: over; their count is the degrees of freedom of that estimate.
BETWEEN_RUN_PAIRS = (("z3s_base", "z3s_base2"), ("z2s_base", "z2s_base2"), ("z3l_base", "z3l_base2"),
                     ("z3s_base4", "z3s_base5"), ("z3s_base6", "z3s_base7"), ("z3x_base", "z3x_base2"),
                     ("z3s_base8", "z3s_base9"), ("z3l_base5", "z3l_base6"), ("z2s_base4", "z2s_base5"),
                     ("z3s_base11", "z3s_base12"), ("z2s_base6", "z2s_base7"), ("so_base3", "so_base4"),
                     ("z3s_base13", "z3s_base14"), ("z3s_base15", "z3s_base16"), ("z3s_base17", "z3s_base18"),
                     ("z3s_base19", "z3s_base20"), ("z3s_base21", "z3s_base22"), ("z3s_base23", "z3s_base24"),
                     ("z3s_base26", "z3s_base27"), ("z3s_base28", "z3s_base29"), ("z3l_base7", "z3l_base8"),
                     ("so_base5", "so_base6"), ("so_base7", "so_base8"))


def interval(pieces: dict, saving_ns: float, per_iteration_saving_ns: list | None,
             between_run_rel_sd: float = BETWEEN_RUN_REL_SD, between_run_df: int = len(BETWEEN_RUN_PAIRS)) -> dict:
    """The 95 % interval of a prediction (docs/advice.md, "Interval"). With ``n`` steady
    iterations of the baseline (``pieces["iteration_walls_ns"]``, their wall times):

    - noise = ``sd(iteration walls) * sqrt(1/n + 1/n)`` (standard error of the difference of the
      baseline's mean and the next run's mean over as many iterations),
    - term = ``sd(per_iteration_saving_ns) * sqrt(1/n + 1/n)`` (the scenario's saving in each
      steady iteration; None counts as a saving of ``saving_ns`` in every iteration: term 0),
    - between-run = ``between_run_rel_sd * predicted iteration`` (:data:`BETWEEN_RUN_REL_SD`: the
      drift between two recordings of one config, which neither of the others holds; of a
      predicted iteration below 0, 0),
    - half width = ``sqrt((t95(n - 1) * sqrt(noise**2 + term**2))**2 + (t95(between_run_df) *
      between)**2)``: each part's own 95 % half width (the within-run parts with the ``n - 1`` degrees
      of freedom of the baseline's iterations, the between-run one with those of the noise-floor
      pairs it was measured on), combined in quadrature, so the interval is never narrower than
      without the between-run term (Welch-Satterthwaite's pooled df can be: with 2 steady
      iterations it raises df 1 to ~3 and shrinks t from 12.7 to 3.2).

    Returns ``{"interval_ns": [low, high]`` (of the predicted iteration time), ``"saving_interval_ns":
    [low, high], "within_noise": bool`` (the saving interval holds 0), ``"interval_basis": str``,
    and the same without the between-run term: ``"interval_within_run_ns", "saving_interval_within_run_ns",
    "within_noise_within_run"``, and ``"between_run_sd_ns"}``, all ns; with fewer than 2 steady
    iterations the intervals and within_noise are None and the basis says why. The iteration
    interval's low end is never below 0 (nor the saving's high end above the baseline iteration):
    a wide interval from 2 steady iterations (t = 12.7) would go below. Raises ValueError for a
    negative ``between_run_rel_sd`` or a ``between_run_df`` below 1 with a non-zero spread."""
    if between_run_rel_sd < 0:
        raise ValueError(f"between-run relative sd {between_run_rel_sd}: must be >= 0")
    if between_run_rel_sd and between_run_df < 1:
        raise ValueError(f"between-run degrees of freedom {between_run_df}: need at least 1")
    walls = pieces.get("iteration_walls_ns") or []
    n = len(walls)
    if n < 2:
        return {"interval_ns": None, "saving_interval_ns": None, "within_noise": None,
                "interval_basis": f"no interval: {n} steady iteration(s), at least 2 needed for a spread",
                "interval_within_run_ns": None, "saving_interval_within_run_ns": None,
                "within_noise_within_run": None, "between_run_sd_ns": None}
    se = math.sqrt(2.0 / n)
    noise = _sd(walls) * se
    term = _sd(per_iteration_saving_ns) * se if per_iteration_saving_ns is not None else 0.0
    pred = pieces["iteration_ns"] - saving_ns
    between = between_run_rel_sd * max(pred, 0.0)
    t_in = t95(n - 1)
    t_b = t95(between_run_df) if between else 0.0
    half_in = t_in * math.hypot(noise, term)
    half = math.hypot(half_in, t_b * between)

    def ends(h):
        lo, hi = saving_ns - h, min(saving_ns + h, float(pieces["iteration_ns"]))
        # an iteration takes no negative time: the low end stops at 0 (and the saving at the whole iteration)
        return [round(max(0.0, pred - h), 3), round(pred + h, 3)], [round(lo, 3), round(hi, 3)], bool(lo <= 0 <= hi)

    iv, siv, within = ends(half)
    iv_in, siv_in, within_in = ends(half_in)
    clamped = pred - half < 0
    return {"interval_ns": iv, "saving_interval_ns": siv, "within_noise": within,
            "interval_within_run_ns": iv_in, "saving_interval_within_run_ns": siv_in,
            "within_noise_within_run": within_in, "between_run_sd_ns": round(between, 3),
            "interval_basis": (f"95 %: +-sqrt((t(0.975, {n - 1}) = {t_in:g} x sqrt(noise {noise / 1e6:,.2f}^2 + "
                               f"modelled term {term / 1e6:,.2f}^2))^2 + (t(0.975, {between_run_df}) = {t_b:g} x "
                               f"between-run {between / 1e6:,.2f})^2) ms = +-{half / 1e6:,.1f} ms (+-{half_in / 1e6:,.1f} "
                               f"without the between-run term); noise: the baseline's iteration-to-iteration sd x "
                               f"sqrt(2/{n}), term: the saving's sd over the {n} steady iterations x sqrt(2/n), "
                               f"between-run: {100 * between_run_rel_sd:.2f} % of the predicted iteration (the drift "
                               f"between two recordings of one config, measured on {between_run_df} same-call pairs of "
                               "the what-if benchmark's H200)" + ("; the low end stops at 0 ms" if clamped else ""))}


def _per_it(pieces: dict, frame: pl.DataFrame, values) -> list[float]:
    """Sum of ``values`` (an array aligned with ``frame``) in each steady iteration of ``pieces``."""
    its = frame["iteration"].to_numpy() if frame.height else np.zeros(0)
    v = np.asarray(values, dtype=float)
    return [float(v[its == i].sum()) for i in pieces["iterations"]]


def _pin_per_it(pieces: dict, copies: pl.DataFrame) -> list[float]:
    """:func:`_pin_saving` of each steady iteration alone (ns in that iteration)."""
    n = len(pieces["iterations"])
    sums = _pin_sums(pieces, copies, "iteration")
    # (/ n * n: the float :func:`_pin_saving` of the iteration's copies times n gave, bit for bit)
    return [sums.get(i, 0.0) / n * n for i in pieces["iterations"]]


def _scaled(per_source: list[float], saving_ns: float) -> list[float]:
    """The saving spread over the steady iterations in proportion to the per-iteration values of
    the phase or sub-phase it comes from (scenarios that work on means only)."""
    m = float(np.mean(per_source)) if per_source else 0.0
    return [saving_ns * v / m for v in per_source] if m else [saving_ns] * len(per_source)


def _result(pieces, name, saving_ns, basis, confidence, applicable=True, why="", per_it=None, **extra) -> dict:
    """One scenario's dict (:func:`predict`); ``per_it``: its saving in each steady iteration
    (ns), for :func:`interval` (None: every iteration saves ``saving_ns``)."""
    base = pieces["iteration_ns"]
    if "phase_delta_ns" not in extra and name in SCENARIO_PHASE:
        extra["phase_delta_ns"] = {SCENARIO_PHASE[name]: -saving_ns}
    if not saving_ns:
        per_it = None
    return {"scenario": name, "applicable": applicable, "why_not": why, "baseline_ns": base,
            "predicted_ns": base - saving_ns, "saving_ns": saving_ns, "basis": basis, "confidence": confidence,
            **extra, **interval(pieces, saving_ns, per_it)}


def predict(pieces: dict, settings: dict, changes: dict | None = None) -> list[dict]:
    """Every scenario of :data:`SCENARIOS` for one rank's ``pieces`` (:func:`measure`).

    ``settings``: ``{key: value}`` of the run (dotted DeepSpeed keys and ``precision``, see
    :mod:`tracekit.analyze.trace.dsconfig`; None = unknown). ``changes`` sets the target of the
    tunable scenarios: ``{"ratio": 0.5, "sub_group_size": 2e7, "gpu_optimizer": "torch"}``
    (defaults: the largest GPU share that fits the free memory; 1e8; the implementation the
    config selects, see :func:`gpu_step_bytes`).

    Returns one dict per scenario: ``scenario, applicable, why_not, baseline_ns, predicted_ns,
    saving_ns`` (per steady iteration; negative = slower), ``basis`` (how it was computed),
    ``confidence`` (high|medium|low) and scenario-specific numbers (``phase_delta_ns``, ...),
    and the 95 % interval of :func:`interval`: ``interval_ns`` (of ``predicted_ns``),
    ``saving_interval_ns``, ``within_noise``, ``interval_basis`` (``pageable_to_pinned`` also
    ``copy_back_saving_interval_ns``, of ``copy_back_saving_ns``).
    """
    changes = changes or {}
    n = len(pieces["iterations"])
    copies = pieces["copies"]
    roles = pieces["roles"]
    offload = settings.get("zero_optimization.offload_optimizer.device")
    pin = settings.get("zero_optimization.offload_optimizer.pin_memory")
    precision = settings.get("precision")
    P = parameters(pieces)
    out = []

    # 1. every pageable copy at pinned bandwidth
    s, measured, bases = _pin_saving(pieces, copies)
    out.append(_result(pieces, "pageable_to_pinned", s,
                       "each pageable copy of the steady iterations: the longer of its host stall in the API call and its exposed "
                       "time, replaced by its bytes at the pinned bandwidth of its size ("
                       + "; ".join(bases) + "), times its exposed share" if bases else "no pageable copy",
                       "high" if measured else "medium", applicable=s > 0,
                       why="" if s > 0 else "no pageable copy in the steady iterations",
                       per_it=_pin_per_it(pieces, copies) if s else None,
                       phase_delta_ns=_phase_delta(pieces, copies)))
    cb = copies.filter(pl.col("role") == "copy_back")
    ok, pinnable, cb_pinned_by_config, stage_why = pin_memory_lever(pieces, settings)
    s_cb, cb_measured, _ = _pin_saving(pieces, cb)
    # ZeRO-1/2: pin_memory pins the copy-back's source too, so no code change is needed for it
    out[-1]["copy_back_saving_ns"] = 0.0 if cb_pinned_by_config else s_cb
    cbi = interval(pieces, out[-1]["copy_back_saving_ns"],
                   None if cb_pinned_by_config or not s_cb else _pin_per_it(pieces, cb))
    out[-1]["copy_back_saving_interval_ns"] = cbi["saving_interval_ns"]
    # the copy-back item's own confidence: the scenario's rule on its copies' bandwidths alone
    out[-1]["copy_back_confidence"] = "high" if cb_measured else "medium"

    # 2. pin_memory false -> true: every pageable copy but (ZeRO-3) DeepSpeed's copy-back temporary
    _, measured, bases = _pin_saving(pieces, pinnable)
    pin_ph, pin_it = _pin_async(pieces, pinnable)
    s = sum(pin_ph.values())
    what = ("pageable copies, the parameter copy-back included (" + stage_why + ")" if cb_pinned_by_config else
            "pageable gradient copies (all but the parameter copy-back, whose fp32->16-bit temporary "
            "stays pageable)")
    out.append(_result(pieces, "pin_memory", s if ok else 0.0,
                       what + ": DeepSpeed's non_blocking copies into pinned buffers return at once and run "
                       "behind the host's work, so each phase takes the longer of its host path (its wall less "
                       "each copy's host stall or exposed time, the longer) and its device work (the copies' bytes "
                       "at the pinned bandwidth of their size (" + "; ".join(bases) + "), the phase's pinned copies "
                       "and kernels)", "high" if measured else "medium",
                       applicable=ok and s > 0,
                       why="" if ok else ("pin_memory is already true" if pin is True else "no optimizer offload"),
                       per_it=pin_it if ok and s else None,
                       phase_delta_ns={ph: -v for ph, v in pin_ph.items()} if ok else {}))

    # 3. fp16 -> bf16: no overflow check (has_overflow) and loss-scale bookkeeping
    oc = roles["overflow_check"]
    ok = precision == "fp16" or (precision is None and oc["wall_ns"] > 0 and "has_overflow" in " ".join(
        pieces["range_names"]))
    out.append(_result(pieces, "bf16", oc["wall_ns"] if ok else 0.0,
                       f"the overflow check and loss-scale update (_overflow_check_and_loss_scale_update / "
                       f"has_overflow, {oc['wall_ns'] / 1e6:,.1f} ms per iteration, {oc['cpu_ns'] / 1e6:,.1f} ms of "
                       "it CPU-only) is not run in bf16; everything else unchanged (unscale_and_clip_grads still runs)",
                       "high", applicable=ok and oc["wall_ns"] > 0, why="" if ok else "not an fp16 run",
                       per_it=pieces["role_walls_ns"]["overflow_check"] if ok else None))

    # 4. no optimizer offload
    bwd_host = copies.filter(pl.col("phase") == "backward")
    bwd_exposed = float(bwd_host["exposed_ns"].sum()) / n
    # what backward pays for its host copies: per copy the longer of the launching thread's stall
    # in the API call (a pageable copy is staged by the driver) and its exposed GPU time
    bwd_cost = float(np.maximum(bwd_host["host_ns"].fill_null(0.0).to_numpy(),
                                bwd_host["exposed_ns"].to_numpy()).sum()) / n if bwd_host.height else 0.0
    upd_roles = ("cpu_adam", "copy_back", "overflow_check", "unscale", "grad_norm", "cpu_wait", "swap")
    upd_cpu = sum(roles[k]["wall_ns"] for k in upd_roles)
    bwd_cost_it = _per_it(pieces, bwd_host, np.maximum(bwd_host["host_ns"].fill_null(0.0).to_numpy(),
                                                       bwd_host["exposed_ns"].to_numpy()) if bwd_host.height else [])
    upd_cpu_it = [sum(pieces["role_walls_ns"][k][j] for k in upd_roles) for j in range(n)]
    # the offload-only gradient path (GRAD_OFFLOAD_RANGE) goes whole, not only its copies: its
    # host work around the copies (the CPU accumulation, the fp32 partition, the overflow
    # tracker) too; its compute kernels are kept (the GPU path still partitions the gradients)
    go = pieces.get("grad_offload") or {}
    go_extra_it = [max(w - k - c, 0.0) for w, k, c in zip(go.get("wall_ns", [0.0] * n), go.get("kernel_ns", [0.0] * n),
                                                          go.get("copy_cost_ns", [0.0] * n))]
    go_extra = float(np.mean(go_extra_it)) if go_extra_it else 0.0
    go_wall = float(np.mean(go["wall_ns"])) if go.get("wall_ns") else 0.0
    bwd_cost_it = [b + x for b, x in zip(bwd_cost_it, go_extra_it)]
    bwd_cost += go_extra
    dev_gbps, dev_basis = _device_bandwidth(pieces)
    impl, step_bytes, impl_basis = gpu_step_bytes(settings, changes)
    gpu_upd_ratio = (P * step_bytes / dev_gbps) if P and dev_gbps else None  # ratio: the overflow check stays on the CPU
    fp16 = precision == "fp16" or (precision is None and "has_overflow" in " ".join(pieces["range_names"]))
    if fp16:  # the overflow check moves to the GPU with the gradients
        step_bytes += GPU_FP16_OVERFLOW_BYTES_PER_PARAM
        impl_basis += f" + fp16 overflow check (isinf/isnan of the 16-bit gradients) {GPU_FP16_OVERFLOW_BYTES_PER_PARAM} B"
    gpu_upd = (P * step_bytes / dev_gbps) if P and dev_gbps else None
    loop_ns, loop_basis = gpu_loop_time(pieces, P, dev_gbps, fp16 and cb_pinned_by_config)
    if gpu_upd is not None:
        gpu_upd += loop_ns
    free = pieces["free_bytes"]
    need = P * STATE_BYTES_PER_PARAM if P else None
    fits = None if free is None or need is None else need <= free
    ok = offload not in (None, "none") and gpu_upd is not None and fits is not False
    s = (bwd_cost + upd_cpu - gpu_upd) if ok else 0.0
    out.append(_result(
        pieces, "no_offload", s,
        f"backward without its host copies and the offload-only gradient path ({bwd_cost / 1e6:,.1f} ms per "
        f"iteration: per copy the longer of the host stall in the API call and the exposed time, "
        f"{bwd_exposed / 1e6:,.1f} ms exposed; the {GRAD_OFFLOAD_RANGE} ranges, {go_wall / 1e6:,.1f} ms, whole but "
        f"their compute kernels, {go_extra / 1e6:,.1f} ms beyond their copies); the update without "
        f"the CPU steps (Adam, copy-back, overflow check, unscale, norm, waits for a CPU optimizer worker, NVMe swaps: "
        f"{upd_cpu / 1e6:,.1f} ms) plus a GPU step "
        f"reading and writing {step_bytes} B per parameter ({impl_basis}; {(P or 0) / 1e6:,.0f} M parameters) at "
        f"{dev_basis}, {loop_basis} = {(gpu_upd or 0) / 1e6:,.2f} ms"
        + ("" if fits is None else f"; optimizer state {need / 1e9:,.1f} GB vs {free / 1e9:,.1f} GB free"),
        "medium", applicable=ok,
        why="" if ok else ("no optimizer offload" if offload in (None, "none") else
                           "the optimizer state does not fit the free GPU memory" if fits is False else
                           "parameter count or device bandwidth unknown"),
        per_it=[b + u - gpu_upd for b, u in zip(bwd_cost_it, upd_cpu_it)] if ok else None,
        gpu_update_ns=gpu_upd, gpu_loop_ns=loop_ns, state_bytes=need, free_bytes=free, gpu_optimizer=impl, gpu_step_bytes=step_bytes,
        phase_delta_ns={"backward": -bwd_cost if ok else 0.0, "update": (gpu_upd - upd_cpu) if ok else 0.0}))

    # 5. gradients kept on the GPU across accumulation micro-steps
    nb = bwd_host.filter(~pl.col("boundary"))
    b_h2d = bwd_host.filter(pl.col("boundary") & (pl.col("direction") == "H2D"))
    s = (float(nb["exposed_ns"].sum()) + float(b_h2d["exposed_ns"].sum())) / n
    grad_bytes = float(nb.filter(pl.col("direction") == "D2H")["bytes"].sum()) / n / max(
        (pieces["micro_steps"] or 2) - 1, 1)
    fits = None if free is None else grad_bytes <= free
    # ZenFlow steps the CPU optimizer every update_interval training steps: the backward passes of
    # one such iteration are gas x update_interval, each training step copying its gradients to
    # the CPU by design; only gas > 1 (the config's) has an accumulation round trip to remove
    zen = settings.get("zero_optimization.zenflow")
    gas = settings.get("gradient_accumulation_steps")
    zen_no_gas = zen not in (None, False, "") and not (type(gas) is int and gas > 1)
    ok = (pieces["micro_steps"] or 1) > 1 and s > 0 and fits is not False and not zen_no_gas
    gog_it = [a + b for a, b in zip(_per_it(pieces, nb, nb["exposed_ns"].to_numpy()),
                                    _per_it(pieces, b_h2d, b_h2d["exposed_ns"].to_numpy()))]
    out.append(_result(pieces, "grads_on_gpu", s if ok else 0.0,
                       "the exposed time of every host copy of the non-boundary backward micro-steps and of the "
                       "boundary's H2D (accumulated gradients fetched back); the boundary's D2H stays",
                       "medium", applicable=ok, per_it=gog_it if ok else None,
                       why="" if ok else (
                           f"ZenFlow: the {pieces['micro_steps']} backward passes per optimizer step are update_interval "
                           f"training steps (gradient_accumulation_steps {gas if gas is not None else 'unknown'}), each "
                           "copying its gradients to the CPU by design, not an accumulation round trip" if zen_no_gas else
                           "no gradient accumulation round trip" if s == 0 else "gradients do not fit")))

    # 6. gradient copies overlapped with backward compute
    exposed = bwd_exposed
    room = max(pieces["kernel_ns"].get("backward", 0.0) - float(bwd_host["duration_ns"].sum() - bwd_host["exposed_ns"].sum()) / n, 0.0)
    s = min(exposed, room)
    out.append(_result(pieces, "overlap_grad_copies", s,
                       f"exposed backward copy time ({exposed / 1e6:,.1f} ms) hidden under backward kernels, at most "
                       f"the kernel time not already hiding copies ({room / 1e6:,.1f} ms); assumes the copies can "
                       "start as soon as each gradient is ready", "low", applicable=s > 0,
                       per_it=_scaled(_per_it(pieces, bwd_host, bwd_host["exposed_ns"].to_numpy()), s),
                       why="" if s > 0 else "no exposed backward copy"))

    # 7. part of the sub-groups on the GPU (offload_optimizer.ratio)
    nsg = pieces["sub_groups"] or 1
    ratio = changes.get("ratio")
    if ratio is None:
        frac_fit = min(1.0, free / need) if free and need else 0.0
        ratio = max(0.0, 1.0 - frac_fit)
    gpu_groups = int((1 - ratio) * nsg)  # DeepSpeed: sub-group i is on the GPU when i < int((1 - ratio) * n)
    f = gpu_groups / nsg
    per_group_cpu = roles["cpu_adam"]["wall_ns"] + roles["copy_back"]["wall_ns"] + roles["unscale"]["wall_ns"]
    b_fp32 = _boundary_fp32_d2h(bwd_host, n)
    s = f * (per_group_cpu + b_fp32) - f * (gpu_upd_ratio or 0.0)
    ok = offload not in (None, "none")
    out.append(_result(
        pieces, "ratio", s if ok else 0.0,
        f"offload_optimizer.ratio {ratio:g} with {nsg} sub-group(s) puts {gpu_groups} on the GPU (DeepSpeed: "
        f"sub-group i is on the GPU when i < int((1 - ratio) * {nsg})): that share ({100 * f:.0f}%) of the CPU Adam "
        f"step, copy-back and unscale ({per_group_cpu / 1e6:,.1f} ms) and of the boundary's fp32 gradient D2H "
        f"({b_fp32 / 1e6:,.1f} ms exposed) replaced by a GPU step at device bandwidth; the overflow check still "
        "reads the CPU gradient buffer", "medium" if gpu_groups else "high", applicable=ok and gpu_groups > 0,
        why="" if (ok and gpu_groups) else ("no optimizer offload" if not ok else
                                             f"with {nsg} sub-group(s) ratio {ratio:g} moves none to the GPU; "
                                             "lower sub_group_size first"),
        per_it=[f * (sum(pieces["role_walls_ns"][k][j] for k in ("cpu_adam", "copy_back", "unscale")) + b_fp32)
                - f * (gpu_upd_ratio or 0.0) for j in range(n)] if ok else None,
        ratio=ratio, gpu_sub_groups=gpu_groups, sub_groups=nsg,
        phase_delta_ns={"backward": -f * b_fp32 if ok else 0.0,
                        "update": -(f * per_group_cpu - f * (gpu_upd_ratio or 0.0)) if ok else 0.0}))

    # 8. sub_group_size
    explicit = changes.get("sub_group_size")
    target = float(explicit or 1e8)
    current, current_why = current_sub_group_size(pieces, settings)
    zero12, _ = copy_back_pinned_by_pin_memory(pieces, settings)  # ZeRO-1/2 by the config or the trace
    if zero12:
        out.append(_result(pieces, "sub_group_size", 0.0, "ZeRO-1/2 steps one flat partition: no sub-groups", "high",
                           applicable=False, why="sub_group_size is a ZeRO-3 setting", sub_group_size=target,
                           sub_groups=None))
    elif explicit is None and current is not None and current <= target:
        out.append(_result(pieces, "sub_group_size", 0.0, f"sub_group_size {current_why}", "high", applicable=False,
                           why=f"sub_group_size is already at most {target:.0e} ({current_why})",
                           sub_group_size=target, sub_groups=nsg))
    else:
        out.append(_sub_group(pieces, cb, target, P, nsg, n))

    # 9. SuperOffload without gradient clipping: the worker steps sub-groups during the boundary backward
    wait = roles["cpu_wait"]["wall_ns"]
    so = settings.get("zero_optimization.offload_optimizer.super_offload") is True
    clip = settings.get("gradient_clipping")
    micro = pieces.get("micro_steps") or 1
    bwd_boundary = pieces["phase_ns"].get("backward", 0.0) / micro
    clip_on = (isinstance(clip, (int, float)) and clip > 0) or clip == dsconfig.CLIPPING_ON
    ok = so and clip_on and wait > 0
    s = min(wait, bwd_boundary) if ok else 0.0
    # partition_grads runs once per reduce bucket: a bucket holding every parameter means one call,
    # at backward's end, so no sub-group completes during backward (measured: docs/advice.md)
    bucket = settings.get("zero_optimization.reduce_bucket_size")
    one_bucket = bool(P) and isinstance(bucket, (int, float)) and bucket >= P
    bucket_note = (
        f"; with reduce_bucket_size {bucket:.0e} >= the {P / 1e6:,.0f} M parameters partition_grads runs once, at "
        "backward's end, so nothing completes during backward: the saving then comes from handing every sub-group "
        "to the worker at once instead (measured on an H200 with 10 sub-groups: 259 ms where this predicts 168), "
        f"and reduce_bucket_size <= {P / 10:.0e} lets the sub-groups finish during backward" if one_bucket else "")
    out.append(_result(
        pieces, "superoffload_no_clipping", s,
        f"the update's waits for the CPU optimizer worker (cpu_update_wait, {wait / 1e6:,.1f} ms per iteration: with "
        f"gradient_clipping {clip} every sub-group is stepped inside the update while the training waits) hidden behind "
        f"the boundary backward ({bwd_boundary / 1e6:,.1f} ms: the backward per micro-step), at most its length; the "
        "per-sub-group unscale and copy-back stay; assumes the worker keeps up with backward's sub-groups"
        + bucket_note, "low",
        applicable=ok and s > 0,
        why="" if ok else ("not SuperOffload" if not so else
                           "gradient_clipping unknown (its default depends on the DeepSpeed version: give the "
                           "capture manifest or set it in --ds-config)"
                           if not isinstance(clip, (int, float)) and clip != dsconfig.CLIPPING_ON else
                           "gradient_clipping is already 0" if not clip else
                           "no wait for the CPU optimizer worker measured"),
        per_it=[min(w, b / micro) for w, b in zip(pieces["role_walls_ns"]["cpu_wait"],
                                                  pieces["phase_walls_ns"].get("backward", [0.0] * n))] if ok else None,
        wait_ns=wait, boundary_backward_ns=bwd_boundary, one_reduce_bucket=one_bucket,
        reduce_bucket_size=bucket if isinstance(bucket, (int, float)) else None,
        suggested_reduce_bucket_size=float(f"{P / 10:.0e}") if one_bucket else None))

    # 10. gradient_accumulation_steps g -> 1 with micro-batch x g (same global batch)
    out.append(_larger_micro_batch(pieces, zen_no_gas, settings.get("zero_optimization.stage") in (1, 2, "1 or 2")))
    return out


def _larger_micro_batch(pieces: dict, zen_no_gas: bool, zero12: bool = False) -> dict:
    """``larger_micro_batch``: ``gradient_accumulation_steps`` g -> 1 with the micro-batch x g
    (same global batch). The one new micro-step is the baseline's last (boundary) micro-step --
    its forward and backward walls as measured, so its host time (launches, framework, hooks) and
    every copy of the boundary backward stay (the boundary's gradient D2H and its H2D, which a
    run with gas 1 has too: the recorded ``z3s_mb2`` backward moves the same 268 MB H2D / 805 MB
    D2H as ``z3s_base3``'s boundary micro-step) -- plus (g - 1) x its kernel busy time, fully
    exposed (kernel time linear in the micro-batch). The g - 1 non-boundary micro-steps go: their
    launches and their gradient round trip (the ``grads_on_gpu`` copies). Per phase (forward,
    backward) ``saving = wall - last micro-step's wall - (g - 1) x kernels``, kernels = the last
    forward micro-step's kernel busy time, and for backward a non-boundary micro-step's
    (``non_boundary_backward_kernel_ns``: backward's compute; the boundary's own gradient kernels,
    fp32 conversion and norm, act on the parameters and run once at any micro-batch), per
    steady iteration (for :func:`interval`). ZeRO-1/2 (``zero12``): the boundary's accumulation
    round trip goes too (:func:`accumulation_round_trip_ns`), which ZeRO-3 keeps (its gas-1 run
    moves the boundary's bytes, above)."""
    g = pieces.get("micro_steps") or 1
    lw = pieces.get("last_micro_step_walls_ns") or {}
    lk = dict(pieces.get("last_micro_step_kernel_ns") or {})
    n = len(pieces["iterations"])
    ok = g > 1 and not zen_no_gas and bool(lw)
    # backward's batch-sized kernels: a non-boundary micro-step's (compute alone); the boundary's
    # once-per-step gradient kernels (fp32 conversion, norm) do not grow with the micro-batch
    nbk = pieces.get("non_boundary_backward_kernel_ns") or [None] * n
    lk["backward"] = [b if b is not None else k for b, k in zip(nbk, lk.get("backward", [0.0] * n))]
    per_ph = {}
    per_it = [0.0] * n
    for ph in ("forward", "backward"):
        walls = pieces["phase_walls_ns"].get(ph, [0.0] * n)
        sv = [w - a - (g - 1) * k for w, a, k in zip(walls, lw.get(ph, [0.0] * n), lk.get(ph, [0.0] * n))]
        if ph == "backward" and zero12:
            rt = accumulation_round_trip_ns(pieces)
            sv = [v + r for v, r in zip(sv, rt)] if len(rt) == len(sv) else sv
        per_ph[ph] = float(np.mean(sv)) if sv else 0.0
        per_it = [x + y for x, y in zip(per_it, sv)]
    s = sum(per_ph.values()) if ok else 0.0
    basis = (f"gradient_accumulation_steps {g} -> 1 with the micro-batch x {g}: forward and backward become the "
             f"last micro-step's (its host time and the boundary's copies kept) plus {g - 1} x its compute kernel "
             "time (backward: a non-boundary micro-step's, the boundary's gradient kernels run once), exposed; "
             f"the {g - 1} other micro-step(s) go with their gradient round trip"
             + (" and so does the boundary's (ZeRO-1/2: the accumulated gradients fetched back and copied again)"
                if zero12 else "") + " (forward "
             f"{per_ph['forward'] / 1e6:,.1f} ms, backward {per_ph['backward'] / 1e6:,.1f} ms saved per iteration); "
             "assumes host time per micro-step does not grow with the micro-batch and that twice the activations fit")
    return _result(pieces, "larger_micro_batch", s, basis, "low", applicable=ok and s > 0,
                   why="" if ok else ("one micro-step per iteration" if g <= 1 else
                                      "ZenFlow: the backward passes are update_interval steps, not accumulation"),
                   per_it=per_it if ok else None, gas=g,
                   phase_delta_ns={ph: -v for ph, v in per_ph.items()} if ok else {})


def gpu_loop_time(pieces: dict, P: float | None, dev_gbps: float | None, overflow_loop: bool) -> tuple[float, str]:
    """``(ns, basis)``: the host time of the GPU step's per-tensor loops beyond their bytes at the
    device bandwidth, per iteration. Each loop (:data:`GPU_LOOP_LAUNCHES_PER_TENSOR`: the gradient
    norm, and with ``overflow_loop`` -- ZeRO-1/2 fp16 -- the overflow check) launches ``k`` small
    ops per gradient tensor, each costing the host the baseline's eager launch gap
    (``pieces["launch_gap_ns"]``, :func:`_eager_loop`); it takes the longer of that and its bytes
    (:data:`GPU_NORM_BYTES_PER_PARAM`, :data:`GPU_FP16_OVERFLOW_BYTES_PER_PARAM` per parameter,
    already in the step's bytes), so the extra is ``max(T x k x gap - P x b / B, 0)``. 0 when the
    tensors, the gap, ``P`` or the bandwidth are unknown (the basis says so)."""
    T, gap = pieces.get("grad_tensors"), pieces.get("launch_gap_ns")
    if not (T and gap and P and dev_gbps):
        return 0.0, "per-tensor loops not timed (no gradient-tensor count or launch gap in the trace)"
    loops = [("norm", GPU_NORM_BYTES_PER_PARAM)] + ([("overflow", GPU_FP16_OVERFLOW_BYTES_PER_PARAM)]
                                                    if overflow_loop else [])
    extra, parts = 0.0, []
    for name, b in loops:
        k = GPU_LOOP_LAUNCHES_PER_TENSOR[name]
        host = T * k * gap
        extra += max(host - P * b / dev_gbps, 0.0)
        parts.append(f"{name} {T} tensors x {k} launches x {gap / 1e3:,.1f} us = {host / 1e6:,.1f} ms")
    return extra, ("per-tensor loops at the baseline's eager launch gap (median between back-to-back launches "
                   "in its update and grad_copy_to_host ranges), the longer of that and their bytes: "
                   + "; ".join(parts) + f" (+{extra / 1e6:,.1f} ms)")


def gpu_step_bytes(settings: dict, changes: dict | None = None) -> tuple[str, int, str]:
    """``(implementation, bytes per parameter, basis)`` of a ZeRO-3 optimizer step done on the GPU:
    :data:`ADAM_BYTES_PER_PARAM` of the Adam implementation plus
    :data:`GPU_STEP_OTHER_BYTES_PER_PARAM`. The implementation is ``changes["gpu_optimizer"]``
    (``"fused"`` or ``"torch"``) when given, else ``torch`` when the config sets
    ``optimizer.params.torch_adam: true``, else DeepSpeed's FusedAdam. torch's AdamW adds 8 B
    for a non-zero weight decay (its default, 1e-2, when ``optimizer.params.weight_decay`` is unset).
    Raises ValueError for another implementation name."""
    changes = changes or {}
    impl = changes.get("gpu_optimizer")
    if impl is None:
        impl = "torch" if settings.get("optimizer.params.torch_adam") is True else "fused"
    if impl not in ADAM_BYTES_PER_PARAM:
        raise ValueError(f"gpu_optimizer {impl!r}: choose fused or torch")
    adam = ADAM_BYTES_PER_PARAM[impl]
    wd = settings.get("optimizer.params.weight_decay")
    if impl == "torch" and (wd is None or wd != 0):
        adam += 8
    name = ("torch.optim AdamW, foreach" if impl == "torch" else "DeepSpeed FusedAdam")
    stage = settings.get("zero_optimization.stage")  # the trace's stage: an int, "1 or 2" (inferred) or unknown
    zero = "ZeRO-1/2" if stage == "1 or 2" else f"ZeRO-{stage}" if type(stage) is int else "ZeRO"
    return impl, adam + GPU_STEP_OTHER_BYTES_PER_PARAM, (
        f"{name} {adam} B + {zero} fp32 gradient, norm, unscale and 16-bit copy {GPU_STEP_OTHER_BYTES_PER_PARAM} B")


def copy_back_pinned_by_pin_memory(pieces: dict, settings: dict) -> tuple[bool, str]:
    """``(pinned, why)``: whether ``offload_optimizer.pin_memory: true`` makes the parameter
    copy-back's host source pinned, by ZeRO stage (the config's, else the trace's).

    - ZeRO-1/2 (``stage_1_and_2.py``): the step converts the fp32 partition into
      ``param_buffer_of_bit16_for_cpu_offload_groups[i]``, a buffer allocated once and passed
      through ``get_accelerator().pin_memory`` when pin_memory is set, then copies it to the GPU
      (``non_blocking=True``): pinned.
    - ZeRO-3 (``stage3.py`` ``_reassign_or_swap_out_partitioned_parameters``):
      ``fp16_partitioned_groups_flat.copy_(fp32_partitioned_groups_flat)`` converts on the CPU
      into a fresh pageable temporary: stays pageable.

    An unknown stage counts as ZeRO-3 unless the trace's copy-back range is tracekit's ZeRO-1/2
    ``param_copy_to_device`` with no ``DeepSpeedZeroOptimizer_Stage3`` range."""
    stage = settings.get("zero_optimization.stage")
    if stage in (1, 2, "1 or 2"):
        return True, (f"ZeRO-{stage if type(stage) is int else '1/2'}: pin_memory also pins "
                      "param_buffer_of_bit16_for_cpu_offload_groups, the 16-bit buffer the step copies to the GPU")
    if stage == 3:
        return False, "ZeRO-3"
    names = pieces.get("range_names") or set()
    if "param_copy_to_device" in names and not any("Stage3" in n for n in names):
        return True, ("ZeRO-1/2 by its param_copy_to_device range: pin_memory also pins "
                      "param_buffer_of_bit16_for_cpu_offload_groups, the 16-bit buffer the step copies to the GPU")
    return False, ""


def current_sub_group_size(pieces: dict, settings: dict) -> tuple[float | None, str]:
    """``(parameters, why)``: the run's ``sub_group_size``, or an upper bound of it. The config's
    (or DeepSpeed's default) when the settings hold a number; else, from two or more measured
    sub-groups, the smallest one that is not last (DeepSpeed closes a sub-group once it holds
    ``>= sub_group_size`` parameters, :func:`tracekit.analyze.trace.dsconfig.sub_group_size_bracket`);
    else None (one sub-group: the setting is at least the parameters, unknown above)."""
    from tracekit.analyze.trace.dsconfig import sub_group_size_bracket

    v = settings.get("zero_optimization.sub_group_size")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v), f"{float(v):.0e} in the config"
    b = sub_group_size_bracket(pieces.get("sub_group_bytes") or [])
    if b is not None:
        return b[1], (f"at most {b[1] / 1e6:,.1f} M parameters: the smallest of the {len(pieces['sub_group_bytes'])} "
                      "sub-groups measured that is not the last")
    return None, ""


def _boundary_fp32_d2h(bwd_host: pl.DataFrame, n: int) -> float:
    """Exposed time per iteration of the boundary micro-step's D2H beyond a non-boundary one's
    (the fp32 gradients DeepSpeed copies to the CPU optimizer at the boundary)."""
    b = bwd_host.filter(pl.col("boundary") & (pl.col("direction") == "D2H"))
    nb = bwd_host.filter(~pl.col("boundary") & (pl.col("direction") == "D2H"))
    steps_nb = nb.select("iteration", "micro_step").unique().height or 1
    extra = float(b["exposed_ns"].sum()) / n - (float(nb["exposed_ns"].sum()) / steps_nb if nb.height else 0.0)
    return max(extra, 0.0)


def _sub_group(pieces, cb: pl.DataFrame, target: float, P, nsg: int, n: int) -> dict:
    """``sub_group_size`` = target: the copy-back H2D split into ceil(P / target) copies, each at
    the bandwidth the trace's copies of that host kind reach at that size; the CPU-side part
    of the copy-back (conversion) and the CPU Adam step keep their total; each extra sub-group
    adds the measured per-sub-group cost of the small ranges around it (none measured with one)."""
    h2d = cb.filter(pl.col("direction") == "H2D")
    if not P or h2d.height == 0:
        return _result(pieces, "sub_group_size", 0.0, "no parameter copy-back measured", "low", applicable=False,
                       why="no parameter copy-back in the update")
    new_n = max(1, math.ceil(P / target))
    kind = h2d.group_by("host_kind").agg(pl.col("bytes").sum()).sort("bytes", descending=True)["host_kind"][0]
    per_it_bytes = float(h2d["bytes"].sum()) / n
    now = float(h2d["duration_ns"].sum()) / n
    chunk = per_it_bytes / new_n
    g, why = bandwidth(pieces, "H2D", kind, chunk)
    if g is None:
        g, why = per_it_bytes / now if now else None, "the copy-back's own bandwidth"
    if not g:  # no copy of that kind with a duration (e.g. zero-duration records): no bandwidth to re-time at
        return _result(pieces, "sub_group_size", 0.0, f"no {kind} H2D bandwidth measured (the copy-back's copies "
                       "have no duration)", "low", applicable=False,
                       why=f"no {kind} H2D copy with a measured duration to re-time the copy-back at",
                       sub_group_size=target, sub_groups=new_n)
    new = per_it_bytes / g
    book = pieces.get("sub_group_fixed_ns") or 0.0
    norm = pieces.get("sub_group_norm_fixed_ns") or 0.0
    fixed = book + norm
    s = now - new - (new_n - nsg) * fixed
    per_it = [d - b / g for d, b in zip(_per_it(pieces, h2d, h2d["duration_ns"].to_numpy()),
                                        _per_it(pieces, h2d, h2d["bytes"].to_numpy()))]
    return _result(pieces, "sub_group_size", s,
                   f"{nsg} -> {new_n} sub-group(s) of ~{target / 1e6:,.0f} M parameters: the copy-back's "
                   f"{per_it_bytes / 1e6:,.0f} MB of {kind} H2D per iteration in {new_n} copies of "
                   f"{chunk / 1e6:,.1f} MB at {g:,.1f} GB/s ({why}) instead of {now / 1e6:,.1f} ms now; the CPU work "
                   "(conversion, Adam, unscale) keeps its total; each sub-group more (or less) costs (saves) the "
                   f"measured fixed part of a sub-group's step, {fixed / 1e6:,.2f} ms: its gradient norm's "
                   f"{norm / 1e6:,.2f} ms outside the per-parameter loop (synchronizations, all_reduce) and "
                   f"_prepare_sub_group + _release_sub_group {book / 1e3:,.1f} us ({new_n - nsg:+d} x "
                   f"{fixed / 1e6:,.2f} ms)", "medium", applicable=True,
                   sub_group_size=target, sub_groups=new_n, sub_group_fixed_ns=fixed,
                   per_it=[x - (new_n - nsg) * fixed for x in per_it])


def _device_bandwidth(pieces: dict) -> tuple[float | None, str]:
    if pieces.get("d2d_gbps"):
        return pieces["d2d_gbps"], f"{pieces['d2d_gbps']:,.0f} GB/s (device-to-device copies in this trace)"
    if pieces.get("device_gbps"):
        return pieces["device_gbps"], (f"{pieces['device_gbps']:,.0f} GB/s (the device's memory bandwidth, "
                                       "TARGET_INFO_GPU)")
    return None, "unknown device bandwidth"
