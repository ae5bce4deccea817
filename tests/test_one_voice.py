"""Issue 21, item 5, "one voice": every saving printed for pinning -- the pageable section, the
findings, the advice and ``compare`` -- is the one what-if scenario's (same value, interval and
confidence), and ``compare`` names the knob that differs (the offload device first).

The pageable section's per-copy ``saving_ns`` is each copy's part of the scenario that holds it
(:func:`tracekit.analyze.sections.whatif.pinning_by_copy`): ``pin_memory`` for the copies
offload_optimizer.pin_memory pins when it is a lever, ``pageable_to_pinned`` for the others (the
ZeRO-3 parameter copy-back among them). The numbers are read from ``--json`` and checked against
each other and, where a number is new, against plain SQL on the fixture.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict

import pytest
from conftest import FIXTURES, bench_cut, run_cli, sql_indexed

FIXTURE_TRACES = sorted(p.name for p in FIXTURES.glob("*.sqlite"))


def _json(*args) -> dict:
    rc, out, err = run_cli(*map(str, args), "--json", "--no-cache")
    assert rc == 0, err
    return json.loads(out)


def _sql(path, q, args=()):
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return c.execute(q, args).fetchall()
    finally:
        c.close()


def _close(a, b, rel=1e-6, abs_=2.0):
    return a == pytest.approx(b, rel=rel, abs=abs_)


@pytest.fixture(scope="module")
def analyses():
    """``analyze --json --section pageable`` of each fixture, computed once."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _json("analyze", FIXTURES / name, "--section", "pageable")
        return cache[name]

    return get


def _check_rank(d: dict, rank: dict) -> dict:
    """Assert the one voice for one rank of ``d`` (see the module doc); returns counts of what it
    checked, so that a caller can insist that something was."""
    pid, dev = rank["pid"], rank["device"]
    preds = {p["scenario"]: p for p in d["predictions"] if (p["pid"], p["device"]) == (pid, dev)}
    pin, p2p = preds["pin_memory"], preds["pageable_to_pinned"]
    n = len(p2p["iterations"])
    assert len(pin["iterations"]) == n
    copies = rank["transfers"]["pageable"]["pageable_copies"]
    with_saving = [c for c in copies if c["saving_ns"] is not None]
    steady = set(p2p["iterations"])
    # a saving exactly for the copies of the steady iterations (what the predictions cover)
    assert all(c["iteration"] in steady for c in with_saving)
    assert all(c["scenario"] in ("pin_memory", "pageable_to_pinned") for c in with_saving)
    by = defaultdict(float)
    by_phase = defaultdict(float)
    for c in with_saving:
        key = "copy_back" if c["copy_back"] else c["scenario"]
        by[key] += c["saving_ns"]
        by_phase[(c["scenario"], c["phase"])] += c["saving_ns"]
    seen = defaultdict(int)
    if any(c["scenario"] == "pin_memory" for c in with_saving):
        # pin_memory is the lever: its copies' savings are its prediction, in all and per phase
        assert _close(by["pin_memory"] / n, pin["saving_ns"])
        for ph, delta in pin["phase_delta_ns"].items():
            assert _close(by_phase[("pin_memory", ph)] / n, -delta)
        # the rest is the ZeRO-3 copy-back (pin_memory does not pin it) and nothing else
        assert by["pageable_to_pinned"] == 0
        assert _close(by["copy_back"] / n, p2p["copy_back_saving_ns"])
        # each phase's saving in an iteration is shared in proportion to max(host, exposed) now
        cost, part = defaultdict(float), defaultdict(float)
        for c in with_saving:
            if c["scenario"] == "pin_memory":
                k = (c["iteration"], c["phase"])
                cost[k] += max(c["host_ns"] or 0, c["exposed_ns"])
                part[k] += c["saving_ns"]
        for c in with_saving:
            k = (c["iteration"], c["phase"])
            if c["scenario"] == "pin_memory" and cost[k] > 0:
                assert _close(c["saving_ns"], part[k] * max(c["host_ns"] or 0, c["exposed_ns"]) / cost[k], abs_=1e-3)
        seen["pin_memory"] += 1
    elif with_saving:
        # no lever (pin_memory already true, or no offload): every copy is pageable_to_pinned's
        assert _close((by["pageable_to_pinned"] + by["copy_back"]) / n, p2p["saving_ns"])
        for ph, delta in p2p["phase_delta_ns"].items():
            assert _close(by_phase[("pageable_to_pinned", ph)] / n, -delta)
        assert _close(by["copy_back"] / n, p2p["copy_back_saving_ns"])
        seen["pageable_to_pinned"] += 1
    # the section's own table sums the same copies
    ph_rows = rank["transfers"]["pageable"]["pageable_phase"]
    assert _close(sum(r["saving_ns"] or 0 for r in ph_rows), sum(c["saving_ns"] for c in with_saving))
    # the advice: the same value, interval and confidence as the scenario
    items = [a for a in d["advice"] if (a["pid"], a["device"]) == (pid, dev)]
    for a in items:
        if a["scenario"] == "pin_memory":
            s, siv, conf = pin["saving_ns"], pin["saving_interval_ns"], pin["confidence"]
        elif a["scenario"] == "pageable_to_pinned":  # the copy-back item
            s, siv, conf = (p2p["copy_back_saving_ns"], p2p["copy_back_saving_interval_ns"],
                            p2p["copy_back_confidence"])
        else:
            continue
        assert a["saving_ms_per_iteration"] == pytest.approx(s / 1e6, abs=1e-3)
        # one steady iteration (ds_zero3_offload_iter1): no spread to give an interval from
        assert a["saving_interval_ms"] == (None if siv is None else pytest.approx([x / 1e6 for x in siv], abs=1e-3))
        assert a["confidence"] == conf
        seen["advice"] += 1
    # the findings quote the scenario they are part of, and their own part of it
    for f in d["findings"]:
        if f["topic"] != "pageable" or (f["pid"], f["device"]) != (pid, dev):
            continue
        v = f["values"]
        p = preds[v["scenario"]]
        if v["copy_back"]:
            assert (v["scenario_saving_ns"], v["saving_interval_ns"], v["confidence"]) == (
                p["copy_back_saving_ns"], p["copy_back_saving_interval_ns"], p["copy_back_confidence"])
        else:
            assert (v["scenario_saving_ns"], v["saving_interval_ns"], v["confidence"]) == (
                p["saving_ns"], p["saving_interval_ns"], p["confidence"])
        mine = sum(c["saving_ns"] for c in with_saving if c["phase"] == f["phase"]
                   and c["sub_phase"] == v["sub_phase"] and c["direction"] == v["direction"])
        assert _close(v["saving_ns"], mine)
        if f["phase"] != "other" and n > 1:
            assert v["iterations"] == n  # per iteration: over the prediction's steady iterations
            assert f"({v['saving_ns'] / n / 1e6:,.1f} ms per iteration)" in f["text"]
        assert f"{v['scenario_saving_ns'] / 1e6:,.1f} ms per iteration in all" in f["text"]
        assert f"{v['confidence']} confidence" in f["text"]
        seen["findings"] += 1
    return seen


@pytest.mark.parametrize("name", FIXTURE_TRACES)
def test_pageable_section_findings_and_advice_agree(analyses, name):
    d = analyses(name)
    seen = defaultdict(int)
    for rank in d["ranks"]:
        for k, v in _check_rank(d, rank).items():
            seen[k] += v
    if name.startswith("advice_pair_base"):  # ZeRO-3, pin_memory false: the lever, the copy-back item
        assert seen["pin_memory"] and seen["advice"] == 2 and seen["findings"] >= 3


def test_benchmark_cut_pin_memory_false_section_is_the_advice(tmp_path):
    """The reported symptom ("the pageable section says pinning saves 0.0 ms on a pin_memory:
    false run while the advice says 1.2 s"), on the benchmark's 2.7 B cut z3x_base with its
    config: the section's savings are the advice's pin_memory and copy-back items."""
    db = bench_cut("z3x_base", tmp_path)
    cfg = FIXTURES.parent.parent / "benchmarks" / "whatif" / "manifests" / "z3x_base.ds.json"
    d = _json("analyze", db, "--section", "pageable", "--ds-config", cfg)
    (rank,) = d["ranks"]
    seen = _check_rank(d, rank)
    assert seen["pin_memory"] and seen["advice"] == 2
    (item,) = [a for a in d["advice"] if a["scenario"] == "pin_memory"]
    assert item["saving_ms_per_iteration"] > 1000
    copies = rank["transfers"]["pageable"]["pageable_copies"]
    n = len(next(p for p in d["predictions"] if p["scenario"] == "pin_memory")["iterations"])
    pinned_by_config = sum(c["saving_ns"] for c in copies if c["scenario"] == "pin_memory") / n / 1e6
    assert pinned_by_config == pytest.approx(item["saving_ms_per_iteration"], abs=1e-2)


def _copy_back_copies(path):
    """(start, correlationId, bytes, copyKind) of the pageable copies launched (the runtime call
    starting on the same thread) inside a ``param_copy_back`` range: plain SQL, on an indexed
    in-memory copy (conftest.sql_indexed, and an index on the copies' correlationId), the
    ranges first: the same rows as the three-way join taken copy by copy, which on the bare
    export scanned the runtime and NVTX tables per copy (~26 s of CPU per fixture, now ~0.03 s)."""
    con = sql_indexed(path)
    try:
        con.execute("CREATE INDEX test_memcpy_correlation ON CUPTI_ACTIVITY_KIND_MEMCPY(correlationId)")
        return con.execute("""
            WITH n AS MATERIALIZED (
                SELECT n.globalTid, n.start, n."end" FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                WHERE coalesce(n.text, s.value) = 'param_copy_back' AND n.eventType = 59)
            SELECT m.start, m.correlationId, m.bytes, m.copyKind FROM n
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.globalTid = n.globalTid AND r.start >= n.start AND r.start < n."end"
            JOIN CUPTI_ACTIVITY_KIND_MEMCPY m ON m.correlationId = r.correlationId
            WHERE r.globalTid IS NOT NULL
              AND ((m.copyKind = 1 AND m.srcKind = 0) OR (m.copyKind = 2 AND m.dstKind = 0))""").fetchall()
    finally:
        con.close()


def test_copy_back_copies_by_sql(analyses):
    """advice_pair_base (ZeRO-3, pin_memory false): the copies the voice gives the copy-back item
    are the pageable copies launched inside param_copy_back (SQL), and every other pageable copy
    of the steady iterations is pin_memory's."""
    d = analyses("advice_pair_base.sqlite")
    (rank,) = d["ranks"]
    copies = rank["transfers"]["pageable"]["pageable_copies"]
    sql = {(s, c): (b, k) for s, c, b, k in _copy_back_copies(FIXTURES / "advice_pair_base.sqlite")}
    assert len(sql) == 2 and all(k == 1 for b, k in sql.values())  # one 1.1 GB H2D per iteration
    got = {(c["start"], c["correlation_id"]): c["bytes"] for c in copies if c["copy_back"]}
    assert got == {k: b for k, (b, _) in sql.items()}
    rest = [c for c in copies if c["saving_ns"] is not None and not c["copy_back"]]
    assert rest and {c["scenario"] for c in rest} == {"pin_memory"}


def _pinned_bucket_gbps(path, copy_kind):
    """{power-of-two size bucket: GB/s} of the pinned copies of one direction: plain SQL."""
    out = defaultdict(lambda: [0, 0])
    for b, d in _sql(path, 'SELECT bytes, "end" - start FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = ? AND '
                     + ("srcKind = 1" if copy_kind == 1 else "dstKind = 1"), (copy_kind,)):
        o = out[max(int(b), 1).bit_length() - 1]
        o[0] += b
        o[1] += d
    return {k: b / d for k, (b, d) in out.items() if d > 0 and b > 0}


@pytest.mark.parametrize("name,want", [("advice_pair_base.sqlite", "medium"), ("advice_pair_pin.sqlite", "high"),
                                       ("zero3_offload_gas2_cut.sqlite", "high")])
def test_copy_back_confidence_by_sql(analyses, name, want):
    """The copy-back item's confidence is its scenario's rule on its own copies (it was "medium"
    always): high when each copy-back copy's nearest pinned H2D size bucket is measured at >= 5 GB/s
    (else the 53 GB/s assumption, medium). Pinned buckets by SQL."""
    path = FIXTURES / name
    buckets = _pinned_bucket_gbps(path, 1)
    measured = True
    for _, _, b, _ in _copy_back_copies(path):
        k = int(b).bit_length() - 1
        near = min(buckets, key=lambda x: (abs(x - k), x)) if buckets else None
        measured &= near is not None and not (b >= 1 << 20 and buckets[near] < 5)
    assert ("high" if measured else "medium") == want
    d = analyses(name)
    (item,) = [a for a in d["advice"] if a["scenario"] == "pageable_to_pinned"]
    assert item["confidence"] == want
    (p,) = [p for p in d["predictions"] if p["scenario"] == "pageable_to_pinned"]
    assert p["copy_back_confidence"] == want


def test_compare_pin_memory_is_the_advice_of_a(analyses):
    """advice_pair_base (pin_memory false) -> advice_pair_pin (true): the difference is explained by
    pin_memory (before: no explanation, as only no_offload was replayed on A), with A's advice
    item's number, interval and confidence."""
    cmp = _json("compare", FIXTURES / "advice_pair_base.sqlite", FIXTURES / "advice_pair_pin.sqlite")
    (e,) = cmp["explanations"]
    assert (e["key"], e["scenario"], e["model_run_on"], e["a"], e["b"]) == (
        "zero_optimization.offload_optimizer.pin_memory", "pin_memory", "A", False, True)
    (item,) = [a for a in analyses("advice_pair_base.sqlite")["advice"] if a["scenario"] == "pin_memory"]
    assert e["predicted_cost_ms"] == pytest.approx(-item["saving_ms_per_iteration"], abs=1e-3)
    assert e["predicted_cost_interval_ms"] == pytest.approx([-x for x in item["saving_interval_ms"][::-1]], abs=1e-3)
    assert e["confidence"] == item["confidence"]
    assert e["advice"]["saving_ms_per_iteration"] == item["saving_ms_per_iteration"]
    # the measured B - A is a gain too (B pins): the explanation's sign is the measurement's
    assert e["measured_iteration_delta_ms"] < 0


@pytest.mark.parametrize("a,b", [("advice_pair_base", "advice_pair_nooffload"),
                                 ("advice_pair_nooffload", "advice_pair_base")])
def test_compare_offload_device_first(a, b):
    """Offload on one side only: the offload device explains the difference, first; pin_memory
    (which exists only with offload) is no explanation of its own."""
    cmp = _json("compare", FIXTURES / f"{a}.sqlite", FIXTURES / f"{b}.sqlite")
    diff = {c["key"] for c in cmp["config"] if c["differs"]}
    assert "zero_optimization.offload_optimizer.device" in diff
    keys = [e["key"] for e in cmp["explanations"]]
    assert keys[0] == "zero_optimization.offload_optimizer.device"
    assert "zero_optimization.offload_optimizer.pin_memory" not in keys
    e = cmp["explanations"][0]
    assert e["scenario"] == "no_offload" and e["applicable"]
    lo, hi = e["predicted_cost_interval_ms"]
    assert lo <= e["predicted_cost_ms"] <= hi
