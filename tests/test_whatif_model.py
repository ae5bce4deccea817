"""What-if model rules of issue 21: stage-aware pinning, the config read from the trace alone,
sub_group_size from DeepSpeed's grouping rule, SuperOffload's unmarked step time. Each expected
value is computed independently: by hand on a synthetic trace, or by plain SQL on a fixture."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from conftest import FIXTURES, sql_indexed
from test_whatif import MS, B, build, pieces_of

from tracekit.analyze.sections import advice, whatif
from tracekit.analyze.trace import dsconfig

OFFLOAD = {"zero_optimization.offload_optimizer.device": "cpu", "zero_optimization.offload_optimizer.pin_memory": False}


def _sql(path, q, args=(), indexed=False):
    """The rows of query ``q`` on the export ``path``; ``indexed``: on conftest.sql_indexed's
    copy (the same rows; SQLite's plan for some queries is faster there, for others slower)."""
    c = sql_indexed(path) if indexed else sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return c.execute(q, args).fetchall()
    finally:
        c.close()


def _copy_kinds_in_range(path, name_like):
    """(copyKind, srcKind, count, bytes) of the memcpys launched inside NVTX ranges named like
    ``name_like``: plain SQL, no tracekit."""
    return _sql(path, """
        with r as (select n.start s, n.end e from NVTX_EVENTS n left join StringIds t on t.id = n.textId
                   where coalesce(n.text, t.value) like ?)
        select m.copyKind, m.srcKind, count(*), sum(m.bytes) from CUPTI_ACTIVITY_KIND_MEMCPY m
        join CUPTI_ACTIVITY_KIND_RUNTIME a on a.correlationId = m.correlationId
        join r on a.start >= r.s and a.start < r.e group by 1, 2""", (name_like,), indexed=True)  # ~8 s -> 0.05 s


# ---------------------------------------------------------------- 1. stage-aware pinning
def test_copy_back_host_kind_with_pin_memory_by_stage():
    """The premise of the rule, from the traces: with pin_memory true, ZeRO-2's copy of the
    updated parameters to the GPU (tracekit's param_copy_to_device) is from pinned memory
    (srcKind 1), ZeRO-3's copy-back (_reassign_or_swap_out_partitioned_parameters) from
    pageable memory (srcKind 0)."""
    z2 = _copy_kinds_in_range(FIXTURES / "zero2_offload_gas2_cut.sqlite", "param_copy_to_device")
    assert [(k, src) for k, src, _, _ in z2] == [(1, 1)]  # H2D from pinned memory only
    z3 = _copy_kinds_in_range(FIXTURES / "advice_pair_pin.sqlite", "%_reassign_or_swap_out_partitioned_parameters")
    assert [(k, src) for k, src, _, _ in z3] == [(1, 0)]  # H2D from pageable memory only


def test_synthetic_pin_memory_counts_the_copy_back_in_zero2_only(tmp_path):
    """Synthetic: a pageable 16 MiB gradient D2H (2 ms GPU, its API call 1 us) and the pageable
    16 MiB copy-back H2D (4 ms GPU, its API call 4 ms + 2 us), no pinned copy of either
    direction so both re-time at the 53 GB/s fallback. ZeRO-3: only the gradient copy counts;
    ZeRO-2: the copy-back too, and no "DeepSpeed code" item is left for it. pin_memory saves each
    copy whole (pinned, DeepSpeed's non_blocking copies run behind the phase's host path: backward
    18 of 20 ms, the update 26 of 30 ms, each longer than its device work); the generic
    copy-back item keeps the per-copy rule (its copy at the pinned bandwidth stays)."""
    (p,) = pieces_of(build(tmp_path / "synthetic_whatif_pin_stage.sqlite", grad_pageable_ns=2 * MS))
    pinned = B / whatif.FALLBACK_PINNED_GBPS["H2D"]
    grad = 2 * MS
    copy_back = (4 * MS + 2000) - pinned
    z3 = {s["scenario"]: s for s in whatif.predict(p, {**OFFLOAD, "zero_optimization.stage": 3})}
    z2 = {s["scenario"]: s for s in whatif.predict(p, {**OFFLOAD, "zero_optimization.stage": 2})}
    assert z3["pin_memory"]["saving_ns"] == pytest.approx(grad)
    assert z2["pin_memory"]["saving_ns"] == pytest.approx(grad + copy_back + pinned)
    assert z3["pageable_to_pinned"]["copy_back_saving_ns"] == pytest.approx(copy_back)
    assert z2["pageable_to_pinned"]["copy_back_saving_ns"] == 0
    assert z2["pin_memory"]["phase_delta_ns"]["update"] == pytest.approx(-(copy_back + pinned))
    items2 = advice.build_advice(p, list(z2.values()), {**OFFLOAD, "zero_optimization.stage": 2})
    items3 = advice.build_advice(p, list(z3.values()), {**OFFLOAD, "zero_optimization.stage": 3})
    assert not [a for a in items2 if a["knob"].startswith("DeepSpeed code (not")]
    assert [a for a in items3 if a["knob"].startswith("DeepSpeed code (not")]
    # the stage unknown: the ZeRO-3 rule (the conservative one) unless the trace is ZeRO-1/2
    unknown = {s["scenario"]: s for s in whatif.predict(p, OFFLOAD)}
    assert unknown["pin_memory"]["saving_ns"] == pytest.approx(grad)


# ---------------------------------------------------------------- 2. config from the trace alone
def _truth(manifest: dict) -> dict:
    """The values a trace should be read as, from its capture manifest (DeepSpeed's defaults for
    unset keys)."""
    cfg = manifest["deepspeed_config"]
    z = cfg.get("zero_optimization", {})
    oo, op = z.get("offload_optimizer") or {}, z.get("offload_param") or {}
    return {"stage": z.get("stage", 0), "device": oo.get("device", "none"), "param": op.get("device", "none"),
            "precision": "bf16" if (cfg.get("bf16") or {}).get("enabled") else
                         "fp16" if (cfg.get("fp16") or {}).get("enabled") else "fp32",
            "gas": cfg.get("gradient_accumulation_steps", 1), "super_offload": bool(oo.get("super_offload")),
            "zenflow": z.get("zenflow"), "sub_group_size": z.get("sub_group_size", 1e9)}


def _inferred_without_manifest(tmp_path, name):
    src = FIXTURES / f"{name}.sqlite"
    dst = tmp_path / f"{name}_alone.sqlite"  # no manifest beside it under any name tried
    shutil.copyfile(src, dst)
    loaded = dsconfig.load(dst)
    assert loaded["source"] is None
    from tracekit.analyze.model import phases
    from tracekit.analyze.trace.export import Export

    with Export.open(dst) as ex:
        res = advice.advise(ex, phases.build(ex), loaded)
    rows = res["config"]["settings"]
    assert all(r["source"] == "trace" and r["how"] for r in rows)
    return {r["key"]: r["value"] for r in rows}, res


def _kernels_with(path, word):
    return _sql(path, "select count(*) from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s on s.id = k.demangledName "
                      "where s.value like ?", (f"%{word}%",))[0][0]


@pytest.mark.parametrize("name, manifest", [
    ("zero2_offload_gas2_cut", "zero2_offload_gas2_capture.json"),
    ("zero3_offload_param_cut", "zero3_offload_param_capture.json"),
    ("superoffload_cut", "superoffload_capture.json"),
    ("zenflow_cut", "zenflow_capture.json"),
    ("advice_pair_base", "advice_pair_base.json"),
])
def test_config_from_the_trace_alone_matches_the_manifest(tmp_path, name, manifest):
    """Each value read from the trace with its manifest hidden equals the manifest's."""
    truth = _truth(json.loads((FIXTURES / manifest).read_text()))
    got, _ = _inferred_without_manifest(tmp_path, name)
    stage = got["zero_optimization.stage"]
    assert stage == truth["stage"] or (stage == "1 or 2" and truth["stage"] in (1, 2))
    assert got["zero_optimization.offload_optimizer.device"] == truth["device"]
    if truth["stage"] == 3:
        assert got["zero_optimization.offload_param.device"] == truth["param"]
        assert got["zero_optimization.offload_optimizer.super_offload"] is truth["super_offload"]
    else:
        assert "zero_optimization.sub_group_size" not in got  # sub-groups are ZeRO-3's
    assert got["precision"] == truth["precision"]
    # the kernels' names say it (plain SQL): the 16-bit type of the run, and not the other
    trace = FIXTURES / f"{name}.sqlite"
    mine, other = ("BFloat16", "Half") if truth["precision"] == "bf16" else ("Half", "BFloat16")
    assert _kernels_with(trace, mine) > 1000 and _kernels_with(trace, other) == 0
    if truth["zenflow"]:
        assert got["zero_optimization.zenflow"] == "on"
        ui = truth["zenflow"]["update_interval"]
        assert got["gradient_accumulation_steps"] == f"{truth['gas'] * ui} / update_interval"
    else:
        assert "zero_optimization.zenflow" not in got
        assert got["gradient_accumulation_steps"] == truth["gas"]
    if truth["stage"] == 3:
        sg = got["zero_optimization.sub_group_size"]
        if sg.startswith(">= "):  # one sub-group: the setting holds every parameter
            assert truth["sub_group_size"] >= float(sg.split()[1]) * 1e6
        else:
            lo, hi = (float(x) * 1e6 for x in sg.split()[0].split("-"))
            assert lo <= truth["sub_group_size"] <= hi


# ---------------------------------------------------------------- 3. sub_group_size from the setting
def _copy_back_numel(path):
    """16-bit parameters of each H2D copy launched in a copy-back range of the first steady
    iteration (iteration 1), by plain SQL: bytes / 2."""
    rows = _sql(path, """
        with it as (select n.start s, n.end e from NVTX_EVENTS n left join StringIds t on t.id = n.textId
                    where coalesce(n.text, t.value) = 'iteration 1'),
             r as (select n.start s, n.end e from NVTX_EVENTS n left join StringIds t on t.id = n.textId, it
                   where coalesce(n.text, t.value) like '%_reassign_or_swap_out_partitioned_parameters'
                   and n.start >= it.s and n.end <= it.e)
        select m.bytes from CUPTI_ACTIVITY_KIND_MEMCPY m
        join CUPTI_ACTIVITY_KIND_RUNTIME a on a.correlationId = m.correlationId
        join r on a.start >= r.s and a.start < r.e where m.copyKind = 1 order by a.start""")
    return [b / 2 for (b,) in rows]


def test_sub_group_size_bracket_holds_the_setting_superoffload():
    """superoffload_cut ran sub_group_size 1e7 (manifest) in 10 sub-groups. By SQL: every
    sub-group but the last holds >= 1e7 parameters (DeepSpeed's closing rule), and the bracket's
    upper bound is the smallest of them."""
    numel = _copy_back_numel(FIXTURES / "superoffload_cut.sqlite")
    assert len(numel) == 10
    setting = json.loads((FIXTURES / "superoffload_capture.json").read_text())["deepspeed_config"][
        "zero_optimization"]["sub_group_size"]
    assert setting == 1e7 and all(x >= setting for x in numel[:-1])
    lo, hi = dsconfig.sub_group_size_bracket([int(2 * x) for x in numel])
    assert hi == max(min(numel[:-1]), min(numel[1:])) and lo <= setting <= hi


def test_sub_group_size_not_proposed_at_or_below_the_setting():
    """superoffload_cut (1e7, 10 sub-groups): no "-> 1e8" proposal, whether the setting comes
    from the config or from the trace's bracket; a ZeRO-2 trace gets none at all."""
    so = pieces_of(FIXTURES / "superoffload_cut.sqlite")[0]
    base = {"zero_optimization.offload_optimizer.device": "cpu", "zero_optimization.stage": 3}
    for sg in (1e7, "5.1-10.2 M (10 sub-groups)"):
        sc = {s["scenario"]: s for s in whatif.predict(so, {**base, "zero_optimization.sub_group_size": sg})}
        assert sc["sub_group_size"]["applicable"] is False and sc["sub_group_size"]["saving_ns"] == 0
        assert "already at most 1e+08" in sc["sub_group_size"]["why_not"]
    # asked for explicitly, the scenario still answers
    sc = {s["scenario"]: s for s in whatif.predict(so, {**base, "zero_optimization.sub_group_size": 1e7},
                                                   {"sub_group_size": 1e8})}
    assert sc["sub_group_size"]["sub_groups"] == 2  # ceil(134.1 M / 1e8)
    z2 = pieces_of(FIXTURES / "zero2_offload_gas2_cut.sqlite")[0]
    sc = {s["scenario"]: s for s in whatif.predict(z2, {"zero_optimization.offload_optimizer.device": "cpu",
                                                        "zero_optimization.stage": 2})}
    assert sc["sub_group_size"]["applicable"] is False


# ---------------------------------------------------------------- 5. the step range inside the window
def _build_step_inside_update(path, iterations=3):
    """Synthetic, tracekit's ranges and DeepSpeed's: per iteration k (t0 = 100 ms * k), forward
    10 ms, backward 20 ms, tracekit's ``update`` 30 ms from t0 + 30 ms; inside it DeepSpeed's
    ``SuperOffloadOptimizer_Stage3.step`` opens 50 us later and closes 80 us earlier, holding
    the unscale (5 ms) and one copy-back (10 ms, a 16 MiB pageable H2D of 4 ms). The rest of the
    update, 15 ms, is in no nested range: DeepSpeed's CPU optimizer step, with the GPU idle."""
    from synthetic import SyntheticTrace

    s = SyntheticTrace()
    pid, tid = 100, 1
    t = (pid << 24) + tid
    for k in range(iterations):
        t0 = 100 * MS * k
        s.range(f"iteration {k}", t0, t0 + 60 * MS, tid=t, domain="tracekit")
        s.range("forward", t0, t0 + 10 * MS, tid=t, domain="tracekit")
        s.range("DeepSpeedEngine.forward", t0, t0 + 10 * MS, tid=t, domain="DeepSpeed")
        s.kernel(t0 + 1 * MS, t0 + 9 * MS, pid, tid, launch=t0 + MS // 2)
        s.range("backward boundary", t0 + 10 * MS, t0 + 30 * MS, tid=t, domain="tracekit")
        s.range("DeepSpeedEngine.backward", t0 + 10 * MS, t0 + 30 * MS, tid=t, domain="DeepSpeed")
        s.kernel(t0 + 11 * MS, t0 + 19 * MS, pid, tid, launch=t0 + 10 * MS + 1000)
        s.range("update", t0 + 30 * MS, t0 + 60 * MS, tid=t, domain="tracekit")
        s.range("SuperOffloadOptimizer_Stage3.step", t0 + 30 * MS + 50_000, t0 + 60 * MS - 80_000, tid=t,
                domain="DeepSpeed")
        s.range("DeepSpeedZeroOptimizer_Stage3.unscale_and_clip_grads", t0 + 31 * MS, t0 + 36 * MS, tid=t,
                domain="DeepSpeed")
        s.range("SuperOffloadOptimizer_Stage3._reassign_or_swap_out_partitioned_parameters", t0 + 45 * MS,
                t0 + 55 * MS, tid=t, domain="DeepSpeed")
        s.copy(t0 + 50 * MS, t0 + 54 * MS, B, 1, pid, tid, launch=t0 + 50 * MS - 1000, api_end=t0 + 54 * MS + 1000,
               src=0, dst=2)
    return s.write(path)


def test_synthetic_step_range_inside_the_update_window_is_not_a_step(tmp_path):
    (p,) = pieces_of(_build_step_inside_update(tmp_path / "synthetic_step_inside.sqlite"))
    assert p["update_ns"] == pytest.approx(30 * MS)
    adam = p["roles"]["cpu_adam"]
    assert adam.get("unmarked") is True
    # by construction: 30 ms of update - 5 ms unscale - 10 ms copy-back, no GPU work in it
    assert adam["wall_ns"] == pytest.approx(15 * MS)
    assert adam["cpu_ns"] == pytest.approx(15 * MS)


# ---------------------------------------------------------------- 4. ZenFlow's iteration
def test_zenflow_backward_passes_are_training_steps_not_accumulation():
    """zenflow_cut: gas 1, update_interval 4 (manifest); by SQL 4 DeepSpeedEngine.backward
    ranges in tracekit's iteration 1, one of them the boundary. No "gas 4 -> 1" advice."""
    trace = FIXTURES / "zenflow_cut.sqlite"
    n = _sql(trace, """with it as (select n.start s, n.end e from NVTX_EVENTS n left join StringIds t on t.id = n.textId
                                   where coalesce(n.text, t.value) = 'iteration 1')
                      select count(*) from NVTX_EVENTS n left join StringIds t on t.id = n.textId, it
                      where coalesce(n.text, t.value) = 'DeepSpeedEngine.backward' and n.start >= it.s and n.end <= it.e""")
    cfg = json.loads((FIXTURES / "zenflow_capture.json").read_text())["deepspeed_config"]
    assert n[0][0] == cfg["gradient_accumulation_steps"] * cfg["zero_optimization"]["zenflow"]["update_interval"] == 4
    (p,) = pieces_of(trace)
    assert p["micro_steps"] == 4
    sett = {"zero_optimization.offload_optimizer.device": "cpu", "zero_optimization.stage": 2,
            "gradient_accumulation_steps": 1, "zero_optimization.zenflow": "update_interval=4"}
    sc = {s["scenario"]: s for s in whatif.predict(p, sett)}
    assert sc["grads_on_gpu"]["applicable"] is False and sc["grads_on_gpu"]["saving_ns"] == 0
    assert "ZenFlow" in sc["grads_on_gpu"]["why_not"]
    items = advice.build_advice(p, list(sc.values()), sett)
    assert not [a for a in items if a["scenario"] == "grads_on_gpu"]
    # without ZenFlow the same trace would be read as gas 4 (the old advice)
    sc = {s["scenario"]: s for s in whatif.predict(p, {**sett, "zero_optimization.zenflow": None})}
    assert sc["grads_on_gpu"]["applicable"] is True


# ---------------------------------------------------------------- 6. one voice: pageable section = advice
def test_synthetic_pageable_section_saving_by_hand(tmp_path):
    """Synthetic (build with a pageable gradient D2H): per iteration the pageable 16 MiB D2H of
    2 ms (API call 1 us, no kernel under it) and the pageable 16 MiB copy-back H2D of 4 ms (API
    call 4 ms + 2 us); no pinned copy, so both re-time at 53 GB/s. The pageable section's
    saving per copy is the what-if rule's: max(host, exposed) - bytes / 53 GB/s."""
    from tracekit.analyze.model import phases
    from tracekit.analyze.sections import pageable
    from tracekit.analyze.trace.export import Export

    path = build(tmp_path / "synthetic_pageable_voice.sqlite", grad_pageable_ns=2 * MS)
    with Export.open(path) as ex:
        m = phases.build(ex)
        (p,) = whatif.measure(ex, m)
        # no settings: pin_memory is no lever, every copy is pageable_to_pinned's (the per-copy rule)
        c = pageable.pageable_copies(m, ex, savings=whatif.pinning_by_copy(p, {}))
        bare = pageable.pageable_copies(m, ex)
    pinned = B / 53.0
    d2h = c.filter(c["direction"] == "D2H")
    h2d = c.filter(c["direction"] == "H2D")
    assert d2h.height == h2d.height == 3  # one each per iteration
    steady = [i in p["iterations"] for i in d2h["iteration"].to_list()]
    assert d2h["saving_ns"].to_list() == pytest.approx([2 * MS - pinned if s else None for s in steady])
    assert h2d["saving_ns"].to_list() == pytest.approx([4 * MS + 2000 - pinned if s else None for s in steady])
    assert set(c.filter(c["saving_ns"].is_not_null())["scenario"].to_list()) == {"pageable_to_pinned"}
    assert (c["pinned_gbps"] == 53.0).all()
    assert bare["saving_ns"].null_count() == bare.height  # no prediction given: no saving of its own


def test_pageable_section_and_advice_give_one_saving_advice_pair_base():
    """advice_pair_base (pin_memory false): the pageable section's saving over the steady
    iterations, per iteration, is the advice's pageable_to_pinned saving, per phase too (it was
    0.0 ms for backward's D2H: the nearest pinned bucket held only 4-byte copies, 0.005 GB/s)."""
    import polars as pl

    from tracekit.analyze.model import phases
    from tracekit.analyze.sections import pageable
    from tracekit.analyze.trace.export import Export

    path = FIXTURES / "advice_pair_base.sqlite"
    with Export.open(path) as ex:
        m = phases.build(ex)
        (p,) = whatif.measure(ex, m)
        c = pageable.pageable_copies(m, ex, savings=whatif.pinning_by_copy(p, {}))
    its = p["iterations"]
    st = c.filter(pl.col("iteration").is_in(its))
    sc = {s["scenario"]: s for s in whatif.predict(p, {})}["pageable_to_pinned"]
    assert st["saving_ns"].sum() / len(its) == pytest.approx(sc["saving_ns"], rel=1e-9)
    for ph, delta in sc["phase_delta_ns"].items():
        assert st.filter(pl.col("phase") == ph)["saving_ns"].sum() / len(its) == pytest.approx(-delta, rel=1e-9)
    bwd = st.filter((pl.col("phase") == "backward") & (pl.col("direction") == "D2H"))
    assert bwd["saving_ns"].sum() / len(its) > 100e6


def test_compare_offload_vs_no_offload_is_explained_by_the_device():
    """advice_pair_pin (offload, pin_memory true) -> advice_pair_nooffload: the difference is
    explained by offload_optimizer.device (the model run on A, B's torch AdamW), not by
    pin_memory (before: a pin_memory explanation costing 0.0 ms, "no optimizer offload")."""
    from conftest import run_cli

    rc, out, err = run_cli("compare", FIXTURES / "advice_pair_pin.sqlite", FIXTURES / "advice_pair_nooffload.sqlite",
                           "--json")
    assert rc == 0, err
    d = json.loads(out)
    (e,) = d["explanations"]
    assert e["key"] == "zero_optimization.offload_optimizer.device" and e["model_run_on"] == "A"
    assert (e["a"], e["b"], e["scenario"], e["applicable"]) == ("cpu", "none", "no_offload", True)
    (p,) = pieces_of(FIXTURES / "advice_pair_pin.sqlite")
    loaded = dsconfig.load(FIXTURES / "advice_pair_pin.sqlite")
    sett = advice.settings_map(dsconfig.settings(loaded))
    s = {x["scenario"]: x for x in whatif.predict(p, sett, {"gpu_optimizer": "torch"})}["no_offload"]
    assert e["predicted_cost_ms"] == pytest.approx(-s["saving_ns"] / 1e6, abs=1e-3) and e["predicted_cost_ms"] < -500
    # B's iteration as measured: the mean of its steady iterations' ranges (plain SQL)
    its = _sql(FIXTURES / "advice_pair_nooffload.sqlite",
               "select n.end - n.start from NVTX_EVENTS n left join StringIds t on t.id = n.textId "
               "where coalesce(n.text, t.value) in ('iteration 1', 'iteration 2')")
    assert len(its) == 2
    assert e["b_iteration_ms"] == pytest.approx(sum(x for (x,) in its) / 2 / 1e6, rel=0.01)


# ---------------------------------------------------------------- 7. no offload: the GPU overflow check
def test_fp16_no_offload_adds_the_gpu_overflow_check():
    """advice_pair_base (fp16): without offload the overflow check runs on the GPU, 12 B per
    parameter (isinf = abs + compare, isnan, two any()). The measured no-offload run
    (advice_pair_nooffload, plain SQL) spends 1.5-2.5 ms per step in those kernels, the
    modelled 12 B x P at its D2D bandwidth is within that."""
    trace = FIXTURES / "advice_pair_nooffload.sqlite"
    ns = _sql(trace, """
        with w as (select n.start s, n.end e from NVTX_EVENTS n left join StringIds t on t.id = n.textId
                   where coalesce(n.text, t.value) = 'update')
        select sum(k.end - k.start) from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s on s.id = k.demangledName
        join CUPTI_ACTIVITY_KIND_RUNTIME r on r.correlationId = k.correlationId join w on r.start >= w.s and r.start < w.e
        where s.value like '%AbsFunctor<c10::Half>%' or s.value like '%CompareEqFunctor<c10::Half>%'
           or (s.value like '%reduce_kernel%' and s.value like '%or_kernel_cuda%')""")[0][0]
    steps = _sql(trace, "select count(*) from NVTX_EVENTS n left join StringIds t on t.id = n.textId "
                        "where coalesce(n.text, t.value) = 'update'")[0][0]
    measured = ns / steps
    (nooff,) = pieces_of(trace)
    P = 551_339_520  # advice_pair_base's copy-back H2D bytes / 2 (test_advice's fixtures)
    modelled = P * whatif.GPU_FP16_OVERFLOW_BYTES_PER_PARAM / nooff["d2d_gbps"]
    assert 1.5e6 < measured < 2.5e6 and abs(modelled - measured) / measured < 0.15
    (p,) = pieces_of(FIXTURES / "advice_pair_base.sqlite")
    assert whatif.parameters(p) == P
    sett = {"zero_optimization.offload_optimizer.device": "cpu", "optimizer.params.torch_adam": True,
            "zero_optimization.stage": 3}
    fp16 = {s["scenario"]: s for s in whatif.predict(p, {**sett, "precision": "fp16"})}["no_offload"]
    bf16 = {s["scenario"]: s for s in whatif.predict(p, {**sett, "precision": "bf16"})}["no_offload"]
    assert fp16["gpu_step_bytes"] - bf16["gpu_step_bytes"] == 12
    assert fp16["gpu_update_ns"] - bf16["gpu_update_ns"] == pytest.approx(P * 12 / p["d2d_gbps"])


@pytest.mark.parametrize("name, manifest", [
    ("zero2_offload_gas2_cut", "zero2_offload_gas2_capture.json"),
    ("zero3_offload_param_cut", "zero3_offload_param_capture.json"),
])
def test_config_from_a_deepspeed_only_trace(tmp_path, name, manifest):
    """The same traces without the manifest and without tracekit's NVTX ranges (deleted from a
    copy: what a plain nsys capture of DeepSpeed holds). The issue: ZeRO-2 offload read as "no
    optimizer offload" (no copy-back range), offload_param as no offload either (its copy-back
    writes host memory, no H2D); both as "not an fp16/bf16 run"."""
    truth = _truth(json.loads((FIXTURES / manifest).read_text()))
    dst = tmp_path / f"{name}_dsonly.sqlite"
    shutil.copyfile(FIXTURES / f"{name}.sqlite", dst)
    with sqlite3.connect(dst) as c:
        (dom,) = c.execute("select domainId from NVTX_EVENTS where eventType = 75 and text = 'tracekit'").fetchone()
        c.execute("delete from NVTX_EVENTS where eventType = 59 and domainId = ?", (dom,))
        left = c.execute("select count(*) from NVTX_EVENTS n left join StringIds t on t.id = n.textId "
                         "where coalesce(n.text, t.value) in ('update', 'param_copy_to_device', 'cpu_optimizer_step')"
                         ).fetchone()[0]
    assert left == 0
    from tracekit.analyze.model import phases
    from tracekit.analyze.trace.export import Export

    with Export.open(dst) as ex:
        (p,) = whatif.measure(ex, phases.build(ex))
    got = {k: v for k, (v, _) in dsconfig.infer_settings(whatif.trace_facts(p)).items()}
    stage = got["zero_optimization.stage"]
    assert stage == truth["stage"] or (stage == "1 or 2" and truth["stage"] in (1, 2))
    assert got["zero_optimization.offload_optimizer.device"] == truth["device"] == "cpu"
    assert got["precision"] == truth["precision"]
    assert got["gradient_accumulation_steps"] == truth["gas"]
    if truth["stage"] == 3:
        assert got["zero_optimization.offload_param.device"] == truth["param"]


def test_synthetic_zero_duration_copy_back_gives_no_sub_group_prediction(tmp_path):
    """Synthetic (e07): the pageable copy-back H2D records given zero duration: no bandwidth to
    re-time the copy-back at, so the sub_group_size scenario is not applicable (was a TypeError)."""
    path = build(tmp_path / "synthetic_zero_duration.sqlite")
    with sqlite3.connect(path) as c:
        n = c.execute('update CUPTI_ACTIVITY_KIND_MEMCPY set "end" = start where copyKind = 1 and srcKind = 0').rowcount
    assert n == 3
    (p,) = pieces_of(path)
    sc = {s["scenario"]: s for s in whatif.predict(p, {"zero_optimization.offload_optimizer.device": "cpu",
                                                       "zero_optimization.stage": 3})}
    assert sc["sub_group_size"]["applicable"] is False and sc["sub_group_size"]["saving_ns"] == 0
