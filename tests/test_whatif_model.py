"""What-if model rules of issue 21: stage-aware pinning, the config read from the trace alone,
sub_group_size from DeepSpeed's grouping rule, SuperOffload's unmarked step time. Each expected
value is computed independently: by hand on a synthetic trace, or by plain SQL on a fixture."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from conftest import FIXTURES
from test_whatif import B, MS, build, pieces_of

from tracekit.analyze.sections import advice, whatif
from tracekit.analyze.trace import dsconfig

OFFLOAD = {"zero_optimization.offload_optimizer.device": "cpu", "zero_optimization.offload_optimizer.pin_memory": False}


def _sql(path, q, args=()):
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        return c.execute(q, args).fetchall()


def _copy_kinds_in_range(path, name_like):
    """(copyKind, srcKind, count, bytes) of the memcpys launched inside NVTX ranges named like
    ``name_like``: plain SQL, no tracekit."""
    return _sql(path, """
        with r as (select n.start s, n.end e from NVTX_EVENTS n left join StringIds t on t.id = n.textId
                   where coalesce(n.text, t.value) like ?)
        select m.copyKind, m.srcKind, count(*), sum(m.bytes) from CUPTI_ACTIVITY_KIND_MEMCPY m
        join CUPTI_ACTIVITY_KIND_RUNTIME a on a.correlationId = m.correlationId
        join r on a.start >= r.s and a.start < r.e group by 1, 2""", (name_like,))


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
    ZeRO-2: the copy-back too, and no "DeepSpeed code" item is left for it."""
    (p,) = pieces_of(build(tmp_path / "synthetic_whatif_pin_stage.sqlite", grad_pageable_ns=2 * MS))
    pinned = B / whatif.FALLBACK_PINNED_GBPS["H2D"]
    grad = 2 * MS - pinned
    copy_back = (4 * MS + 2000) - pinned
    z3 = {s["scenario"]: s for s in whatif.predict(p, {**OFFLOAD, "zero_optimization.stage": 3})}
    z2 = {s["scenario"]: s for s in whatif.predict(p, {**OFFLOAD, "zero_optimization.stage": 2})}
    assert z3["pin_memory"]["saving_ns"] == pytest.approx(grad)
    assert z2["pin_memory"]["saving_ns"] == pytest.approx(grad + copy_back)
    assert z3["pageable_to_pinned"]["copy_back_saving_ns"] == pytest.approx(copy_back)
    assert z2["pageable_to_pinned"]["copy_back_saving_ns"] == 0
    assert z2["pin_memory"]["phase_delta_ns"]["update"] == pytest.approx(-copy_back)
    items2 = advice.build_advice(p, list(z2.values()), {**OFFLOAD, "zero_optimization.stage": 2})
    items3 = advice.build_advice(p, list(z3.values()), {**OFFLOAD, "zero_optimization.stage": 3})
    assert not [a for a in items2 if a["knob"].startswith("DeepSpeed code (not")]
    assert [a for a in items3 if a["knob"].startswith("DeepSpeed code (not")]
    # the stage unknown: the ZeRO-3 rule (the conservative one) unless the trace is ZeRO-1/2
    unknown = {s["scenario"]: s for s in whatif.predict(p, OFFLOAD)}
    assert unknown["pin_memory"]["saving_ns"] == pytest.approx(grad)
