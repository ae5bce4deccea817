"""What-if model on a hand-made synthetic trace whose outcome is known by construction."""

from __future__ import annotations

import json

import pytest
from synthetic import SyntheticTrace

from tracekit.analyze.model import phases
from tracekit.analyze.sections import advice, whatif
from tracekit.analyze.trace import dsconfig
from tracekit.analyze.trace.export import Export

MS = 1_000_000
B = 16 << 20  # bytes of the pageable copy-back and of the pinned copy of the same size
PINNED_NS = 400_000  # the pinned copy: 16 MiB in 0.4 ms
PAGEABLE_NS = 4 * MS  # the pageable copy-back: 16 MiB in 4 ms
DS = "DeepSpeed"
S3 = "DeepSpeedZeroOptimizer_Stage3."


def build(path, iterations=3, fp16=True, extra_pageable_in_last=0, grad_pageable_ns=None, grad_host_ns=None,
          d2d=False):
    """Per iteration k (t0 = 100 ms * k): forward 10 ms (kernel 8 ms), backward 20 ms with one
    pinned 16 MiB H2D (0.4 ms) and a kernel, then the optimizer step 30 ms: overflow check
    5 ms (has_overflow inside, when fp16), copy-back 10 ms with a pageable 16 MiB H2D of 4 ms,
    and 15 ms of unmarked CPU Adam. ``grad_pageable_ns``: a pageable gradient D2H of that
    duration instead of the pinned copy, its API call returning ``grad_host_ns`` after the
    launch (default 1 us); ``d2d``: a 40 MB device-to-device copy of 20 us in each forward
    (2 x 40e6 B / 20 us = 4,000 GB/s of device bandwidth)."""
    s = SyntheticTrace()
    pid, tid = 100, 1
    for k in range(iterations):
        t0 = 100 * MS * k
        s.range("DeepSpeedEngine.forward", t0, t0 + 10 * MS, tid=(pid << 24) + tid, domain=DS)
        s.kernel(t0 + 1 * MS, t0 + 9 * MS, pid, tid, launch=t0 + MS // 2)
        if d2d:
            s.copy(t0 + 2 * MS, t0 + 2 * MS + 20_000, 40_000_000, 8, pid, tid, launch=t0 + MS, src=2, dst=2)
        s.range("DeepSpeedEngine.backward", t0 + 10 * MS, t0 + 30 * MS, tid=(pid << 24) + tid, domain=DS)
        s.kernel(t0 + 11 * MS, t0 + 19 * MS, pid, tid, launch=t0 + 10 * MS + 1000)
        if grad_pageable_ns:  # the gradient copy from pageable memory instead (pin_memory false)
            s.copy(t0 + 20 * MS, t0 + 20 * MS + grad_pageable_ns, B, 2, pid, tid, launch=t0 + 19 * MS + 500, src=2, dst=0,
                   api_end=None if grad_host_ns is None else t0 + 19 * MS + 500 + grad_host_ns)
        else:
            s.copy(t0 + 20 * MS, t0 + 20 * MS + PINNED_NS, B, 1, pid, tid, launch=t0 + 19 * MS + 500, src=1, dst=2)
        s.range(S3 + "step", t0 + 30 * MS, t0 + 60 * MS, tid=(pid << 24) + tid, domain=DS)
        s.range(S3 + "_overflow_check_and_loss_scale_update", t0 + 31 * MS, t0 + 36 * MS, tid=(pid << 24) + tid,
                domain=DS)
        if fp16:
            s.range(S3 + "has_overflow", t0 + 31 * MS + MS // 2, t0 + 35 * MS + MS // 2, tid=(pid << 24) + tid,
                    domain=DS)
        s.range(S3 + "_reassign_or_swap_out_partitioned_parameters", t0 + 45 * MS, t0 + 55 * MS,
                tid=(pid << 24) + tid, domain=DS)
        nbytes = B + (extra_pageable_in_last if k == iterations - 1 else 0)
        dur = PAGEABLE_NS * nbytes // B
        s.copy(t0 + 50 * MS, t0 + 50 * MS + dur, nbytes, 1, pid, tid, launch=t0 + 50 * MS - 1000,
               api_end=t0 + 50 * MS + dur + 1000, src=0, dst=2)
    return s.write(path)


@pytest.fixture
def synthetic_whatif(tmp_path):
    # one micro-step per iteration: iterations 0 and 1 hold the run's first two, the warm-up
    # (tracekit/analyze/model/steady.py); 4 iterations leave two steady ones
    return build(tmp_path / "synthetic_whatif.sqlite", iterations=4)


def pieces_of(path):
    with Export.open(path) as ex:
        model = phases.build(ex)
        return whatif.measure(ex, model)


def test_measured_pieces_match_construction(synthetic_whatif):
    (p,) = pieces_of(synthetic_whatif)
    assert p["iterations"] == [2, 3] and p["warmup"] == [0, 1]
    # a steady iteration: 40 ms gap (other) + 10 + 20 + 30 ms
    assert p["iteration_ns"] == pytest.approx(100 * MS)
    assert p["update_ns"] == pytest.approx(30 * MS)
    assert p["roles"]["overflow_check"]["wall_ns"] == pytest.approx(5 * MS)
    assert p["roles"]["copy_back"]["wall_ns"] == pytest.approx(10 * MS)
    # unmarked CPU Adam: the step minus its marked children
    assert p["roles"]["cpu_adam"]["wall_ns"] == pytest.approx(15 * MS)
    assert p["roles"]["cpu_adam"].get("unmarked") is True
    # copy-back bytes per iteration, one sub-group
    assert p["copy_back_bytes"] == B and p["sub_groups"] == 1


def test_pageable_to_pinned_saving_by_hand(synthetic_whatif):
    (p,) = pieces_of(synthetic_whatif)
    scen = {s["scenario"]: s for s in whatif.predict(p, {"precision": "fp16",
                                                         "zero_optimization.offload_optimizer.device": "cpu",
                                                         "zero_optimization.offload_optimizer.pin_memory": True})}
    # by hand: the launching thread is in the call 1 us before and after the 4 ms pageable copy (host stall
    # 4.002 ms > its 4 ms exposed time), replaced by 16 MiB at the pinned 16 MiB / 0.4 ms: 3.602 ms per iteration
    expect = (PAGEABLE_NS + 2000) - B / (B / PINNED_NS)
    assert scen["pageable_to_pinned"]["saving_ns"] == pytest.approx(expect)
    assert scen["pageable_to_pinned"]["predicted_ns"] == pytest.approx(100 * MS - expect)
    assert scen["pageable_to_pinned"]["confidence"] == "high"  # pinned bandwidth measured in this trace
    # pin_memory already true: nothing to gain from the config, the copy-back is DeepSpeed's temporary
    assert scen["pin_memory"]["applicable"] is False and scen["pin_memory"]["saving_ns"] == 0
    # fp16 -> bf16: the 5 ms overflow check goes
    assert scen["bf16"]["saving_ns"] == pytest.approx(5 * MS)
    # ratio with one sub-group moves nothing (DeepSpeed: GPU when i < int((1 - ratio) * n))
    r = whatif.predict(p, {"zero_optimization.offload_optimizer.device": "cpu"}, {"ratio": 0.5})
    r = {s["scenario"]: s for s in r}["ratio"]
    assert r["gpu_sub_groups"] == 0 and r["saving_ns"] == 0 and r["applicable"] is False


def test_pin_memory_false_saves_the_pageable_gradient_copies(tmp_path):
    """A pageable 16 MiB gradient D2H of 2 ms (its API call returns after 1 us, the copy exposed:
    no kernel under it) and no pinned D2H in the trace: pin_memory false -> true saves the whole
    2 ms per iteration: pinned, the copy (16 MiB at the assumed 53 GB/s, 0.3 ms) runs behind the
    backward's other 18 ms, longer than its device work (0.3 + 8 ms of kernels); the copy-back
    (DeepSpeed's temporary) is not counted."""
    (p,) = pieces_of(build(tmp_path / "synthetic_whatif_pin.sqlite", grad_pageable_ns=2 * MS))
    inferred = dsconfig.infer_settings(whatif.trace_facts(p))
    assert inferred["zero_optimization.offload_optimizer.pin_memory"][0] is False
    sett = {"zero_optimization.offload_optimizer.device": "cpu", "zero_optimization.offload_optimizer.pin_memory": False}
    scen = {s["scenario"]: s for s in whatif.predict(p, sett)}
    assert 18 * MS > B / whatif.FALLBACK_PINNED_GBPS["D2H"] + 8 * MS  # host path longer than the device work
    assert scen["pin_memory"]["saving_ns"] == pytest.approx(2 * MS)
    assert scen["pin_memory"]["phase_delta_ns"] == {"backward": pytest.approx(-2 * MS)}
    # the generic item (every pageable copy, not DeepSpeed's non_blocking ones) keeps the per-copy rule
    expect = 2 * MS - B / whatif.FALLBACK_PINNED_GBPS["D2H"]
    assert scen["pageable_to_pinned"]["phase_delta_ns"]["backward"] == pytest.approx(-expect)
    assert scen["pin_memory"]["confidence"] == "medium"  # no pinned D2H measured: assumed bandwidth


def test_bf16_not_applicable_without_overflow_check(tmp_path):
    (p,) = pieces_of(build(tmp_path / "synthetic_whatif_bf16.sqlite", fp16=False))
    facts = whatif.trace_facts(p)
    inferred = dsconfig.infer_settings(facts)
    assert inferred["precision"][0] == "bf16 or fp32"
    scen = {s["scenario"]: s for s in whatif.predict(p, {k: v[0] for k, v in inferred.items()})}
    assert scen["bf16"]["applicable"] is False and scen["bf16"]["saving_ns"] == 0


def test_advice_sorted_and_json_shape(synthetic_whatif, tmp_path):
    with Export.open(synthetic_whatif) as ex:
        res = advice.advise(ex, phases.build(ex), dsconfig.load(synthetic_whatif))
    items = res["advice"]
    assert items, res
    savings = [a["saving_ms_per_iteration"] for a in items]
    assert savings == sorted(savings, reverse=True)
    for a in items:
        assert isinstance(a["problem"], str) and isinstance(a["knob"], str) and isinstance(a["change"], str)
        for k in ("baseline_iteration_ms", "predicted_iteration_ms", "saving_ms_per_iteration"):
            assert isinstance(a[k], float)
        assert a["confidence"] in ("high", "medium", "low")
        assert a["predicted_iteration_ms"] == pytest.approx(a["baseline_iteration_ms"] - a["saving_ms_per_iteration"],
                                                            abs=1e-3)
        assert "steady iterations 2-3" in a["problem"]
    by = {a["scenario"]: a for a in items}
    assert by["bf16"]["saving_ms_per_iteration"] == pytest.approx(5.0)
    assert by["bf16"]["knob"].startswith("fp16.enabled")
    cb = [a for a in items if not a["config_fixable"]]
    assert cb and "DS_PIN_MEMORY_BACKEND=native" in cb[0]["problem"]
    assert cb[0]["saving_ms_per_iteration"] == pytest.approx(3.602)
    json.dumps(res["advice"])  # serialisable
    assert "_cpu_steps" in res  # for the findings; result.py pops it


def test_gpu_step_bytes_by_implementation():
    """FusedAdam: 7 x 4 B in one pass; torch foreach AdamW: 12+8+12+8+8+8+16 = 72 B (+8 with a weight
    decay, torch's default 1e-2 when unset); both + 42 B of ZeRO-3's other GPU steps."""
    assert whatif.gpu_step_bytes({})[:2] == ("fused", 28 + 42)
    assert whatif.gpu_step_bytes({"optimizer.params.torch_adam": True, "optimizer.params.weight_decay": 0.0})[:2] == (
        "torch", 72 + 42)
    assert whatif.gpu_step_bytes({"optimizer.params.torch_adam": True})[:2] == ("torch", 80 + 42)
    assert whatif.gpu_step_bytes({}, {"gpu_optimizer": "torch"})[0] == "torch"
    with pytest.raises(ValueError, match="gpu_optimizer 'apex'"):
        whatif.gpu_step_bytes({}, {"gpu_optimizer": "apex"})


def test_no_offload_saving_by_hand(tmp_path):
    """Backward's pageable 16 MiB gradient D2H runs 2 ms on the GPU (not hidden) but holds the thread
    3 ms in the call: backward saves 3 ms. The update's CPU steps (5 ms overflow check, 10 ms copy-back,
    15 ms unmarked Adam) go; a GPU step of (72 + 42 + 12) B x 8 Mi parameters (16 MiB of 16-bit
    copy-back; 12 B: the fp16 overflow check, on the GPU without offload, the trace being fp16 by its
    has_overflow range) at the trace's D2D 4,000 GB/s comes instead."""
    (p,) = pieces_of(build(tmp_path / "synthetic_whatif_nooffload.sqlite", grad_pageable_ns=2 * MS,
                           grad_host_ns=3 * MS, d2d=True))
    assert p["d2d_gbps"] == pytest.approx(4000.0)
    sett = {"zero_optimization.offload_optimizer.device": "cpu", "optimizer.params.torch_adam": True,
            "optimizer.params.weight_decay": 0.0}
    s = {x["scenario"]: x for x in whatif.predict(p, sett)}["no_offload"]
    gpu = (B // 2) * (72 + 42 + 12) / 4000.0
    assert s["applicable"] and s["gpu_optimizer"] == "torch"
    assert s["gpu_update_ns"] == pytest.approx(gpu)
    assert s["saving_ns"] == pytest.approx(3 * MS + 30 * MS - gpu)
    assert s["phase_delta_ns"]["backward"] == pytest.approx(-3 * MS)
    assert s["phase_delta_ns"]["update"] == pytest.approx(gpu - 30 * MS)


def test_roles_per_row_equal_the_regex_per_row(zero3_cut):
    """issue 13: the role of each NVTX row, matched once per distinct name, is what running
    :func:`whatif._role_of` on every row gives (a brute-force loop), on a real trace and on names
    that match one role, two patterns, none, or are null."""
    import polars as pl

    from tracekit.analyze.model import nvtx

    with Export.open(zero3_cut, cache=False) as export:
        names = nvtx.load_ranges(export)["name"].to_list()
    names += ["cpu_optimizer_step", "x.has_overflow", "overflow_check", "grad_norm", "param_copy_back",
              "swap_in", "swap_in_x", "cpu_update_wait", "DeepSpeedZeroOptimizer_Stage3.unscale_and_clip_grads",
              "scaled_global_norm_overflow_check", "forward", "", None]
    frame = pl.DataFrame({"name": names}, schema={"name": pl.String})
    got = frame.select(role=whatif._role_expr(set(frame["name"].drop_nulls().to_list())))["role"].to_list()
    want = [None if n is None else whatif._role_of(n) for n in names]
    assert got == want
    assert {r for r in want if r} >= {"cpu_adam", "overflow_check", "grad_norm", "copy_back", "swap", "cpu_wait",
                                      "unscale"}


def test_bandwidth_nearest_bucket_hand_made():
    """``bandwidth``: the bucket of the copy size when measured, else the nearest measured one
    (the smaller of two equally near), only rows of that direction and host kind with bytes and
    a rate (hand-made frame; buckets are log2 of the size: 2**20 B is bucket 20)."""
    import polars as pl

    from tracekit.analyze.sections.whatif import bandwidth

    bw = pl.DataFrame({
        "direction": ["H2D", "H2D", "H2D", "H2D", "D2H", "H2D"],
        "host_kind": ["pinned", "pinned", "pinned", "pageable", "pinned", "pinned"],
        "bucket": [18, 22, 26, 20, 20, 20],
        "bytes": [10, 30, 50, 70, 90, 0],
        "ns": [1, 1, 1, 1, 1, 1],
        "gbps": [1.0, 3.0, 5.0, 7.0, 9.0, None],
    })
    pieces = {"bandwidth": bw}
    assert bandwidth(pieces, "H2D", "pinned", 2 ** 22)[0] == 3.0           # its own bucket
    assert bandwidth(pieces, "H2D", "pinned", 2 ** 20)[0] == 1.0           # 18 and 22 equally near: 18
    g, why = bandwidth(pieces, "H2D", "pinned", 2 ** 25)                    # nearest: 26
    assert (g, why) == (5.0, "pinned H2D copies of 64 MiB-128 MiB in this trace")
    assert bandwidth(pieces, "D2H", "pinned", 1)[0] == 9.0                  # the only D2H pinned row
    assert bandwidth(pieces, "D2H", "pageable", 2 ** 20) == (None, "no pageable D2H copy in the trace")
