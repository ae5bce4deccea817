"""The registry dispatches (issue 20): every section module registers exactly one section, the
analysis is the registry's loop in dependency order (each section's ``compute`` is reached by it,
after the sections it needs), and the wiring calls no section by hand."""

import dataclasses
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit.analyze import sections as S
from tracekit.analyze.model import phases
from tracekit.analyze.sections import overlap, pageable
from tracekit.analyze.sections.transfers import analyze_transfers
from tracekit.analyze.trace.export import Export

FIXTURE = Path(__file__).parent / "fixtures" / "zero2_offload_gas2_iterations1-2.sqlite"
SECTIONS_DIR = Path(S.__file__).parent
#: modules of tracekit/analyze/sections that are no section of their own, and why
HELPERS = {
    "transfer_common": "the copies and kernels of a model that several sections read",
    "transfers": "the TransferResult view of a run and its JSON rows",
    "host_contention": "part of the multi_gpu section (analyze_multi_gpu runs it)",
    "waiting_ranks": "part of the multi_gpu section (analyze_multi_gpu runs it)",
    "finding_summary": "part of the findings section (the one-line summary of each finding)",
    "whatif_pieces": "part of the whatif section (measure: the measured pieces the scenarios replay)",
    "pcie_reduce": "part of the pcie section (the streaming reduction reduce_pcie runs)",
    "idle_findings": "part of the idle section (its findings and the larger micro-batch what-if)",
}


def _modules() -> list[str]:
    return sorted(p.stem for p in SECTIONS_DIR.glob("*.py") if p.stem != "__init__")


def test_every_section_module_registers_exactly_one_section():
    mods = _modules()
    assert set(HELPERS) <= set(mods), "a helper listed here is gone: drop it from HELPERS"
    for m in mods:
        owners = [s.name for s in S.REGISTERED.values() if s.module == m]
        if m in HELPERS:
            assert owners == [], (m, owners)
        else:
            assert len(owners) == 1, f"sections/{m}.py registers {len(owners)} sections: {owners}"
    for s in S.REGISTERED.values():
        assert s.module in mods, (s.name, s.module)
        assert callable(s.compute), s.name
        assert all(n in S.REGISTERED for n in s.needs), (s.name, s.needs)
    # the five that result.py wired by hand are registered like the rest
    assert {"breakdown", "multi_gpu", "cpu_update", "whatif", "advice", "findings"} <= set(S.REGISTERED)
    # the --section view is the selectable part, in the same order
    assert S.SECTIONS == tuple(n for n, s in S.REGISTERED.items() if s.option)


def test_order_puts_each_section_after_what_it_needs():
    seq = [s.name for s in S.order()]
    assert sorted(seq) == sorted(S.REGISTERED)
    for s in S.REGISTERED.values():
        for need in (*s.needs, *s.after):
            assert seq.index(need) < seq.index(s.name), (need, s.name)
    # asking for one section brings exactly the closure of its needs, needs first
    closure, todo = set(), ["findings"]
    while todo:
        n = todo.pop()
        if n not in closure:
            closure.add(n)
            todo.extend(S.REGISTERED[n].needs)
    got = [s.name for s in S.order(["findings"])]
    assert set(got) == closure and got[-1] == "findings"
    assert [s.name for s in S.order(["advice"])] == ["whatif", "advice"]
    # the findings section applies the others' add_findings, in the order of its after
    adders = [n for n, s in S.REGISTERED.items() if s.add_findings is not None]
    assert set(adders) <= set(S.REGISTERED["findings"].after)
    assert S.REGISTERED["findings"].after[:2] == ("advice", "cpu_update")  # CPU steps named, then its own finding
    advisers = [n for n, s in S.REGISTERED.items() if s.add_advice is not None]
    assert set(advisers) <= set(S.REGISTERED["advice"].after)
    # an after that does not run brings nothing with it
    assert "advice" not in [s.name for s in S.order([*S.REGISTRY, "findings"])]


def test_order_refuses_cycles_and_unknown_needs(monkeypatch):
    reg = dict(S.REGISTERED)
    reg["whatif"] = dataclasses.replace(reg["whatif"], needs=("advice",))
    monkeypatch.setattr(S, "REGISTERED", reg)
    with pytest.raises(ValueError, match="need each other: advice -> whatif -> advice"):
        S.order(["advice"])
    reg["whatif"] = dataclasses.replace(S.REGISTERED["whatif"], needs=(), after=("advice",))
    with pytest.raises(ValueError, match="need each other: advice -> whatif -> advice"):
        S.order(["advice"])
    reg["whatif"] = dataclasses.replace(reg["whatif"], needs=("nope",))
    with pytest.raises(ValueError, match="needs 'nope', which is not registered"):
        S.order()
    with pytest.raises(ValueError, match="no section 'nope'"):
        S.order(["nope"])


def _spy(monkeypatch) -> list[str]:
    calls: list[str] = []
    reg = dict(S.REGISTERED)
    for name, s in reg.items():
        def wrapped(ctx, _f=s.compute, _n=name):
            missing = [n for n in S.REGISTERED[_n].needs if n not in ctx.ran]
            assert not missing, f"{_n} ran before {missing}"
            calls.append(_n)
            return _f(ctx)
        reg[name] = dataclasses.replace(s, compute=wrapped)
    monkeypatch.setattr(S, "REGISTERED", reg)
    return calls


def test_the_analysis_is_the_registry_loop(monkeypatch):
    calls = _spy(monkeypatch)
    a = tracekit.analyze(FIXTURE, sections=S.SECTIONS, cache=False)
    assert calls == [s.name for s in S.order()]  # each section once, in dependency order
    assert a.to_json()["findings"] and a.advice_result()["predictions"]
    # a frame of the loop against the section's other entry point (no summing upward)
    with Export.open(FIXTURE) as ex:
        model = phases.build(ex)
        want = overlap.overlap(model, by=("phase",))
        from tracekit.analyze.sections import advice as advice_mod
        from tracekit.analyze.trace import dsconfig

        pinning = advice_mod.advise(ex, model, dsconfig.load(FIXTURE))["_pinning"]  # the saving's one voice
        copies = pageable.pageable_copies(model, ex, savings=pinning)
        want_pg = pageable.pageable_summary(model, by=("phase", "sub_phase"), copies=copies)
    got = a.part("transfers").frames
    key = ["global_pid", "device", "phase"]
    assert_frame_equal(got["overlap_phase"].sort(key), want.sort(key), check_column_order=False)
    key = ["global_pid", "device", "phase", "sub_phase"]
    assert_frame_equal(got["pageable_phase"].sort(key, nulls_last=True), want_pg.sort(key, nulls_last=True))


def test_the_transfer_frames_alone_run_the_selected_sections_multi_gpu_and_findings(monkeypatch):
    calls = _spy(monkeypatch)
    with Export.open(FIXTURE) as ex:
        tr = analyze_transfers(ex, phases.build(ex), ("sizes",))
    assert calls == [*S.REGISTRY, "multi_gpu", "findings"]
    assert set(tr.stored) == {"copy_sizes"} and "rank_ids" in tr.multi_gpu
    assert tr.findings and not {"cpu-update"} & {f["topic"] for f in tr.findings}  # no CPU update ran
    # the sizes frame: bytes and copies per direction against a plain sum over the copies
    f = tr.stored["copy_sizes"].group_by("direction").agg(pl.col("bytes").sum(), pl.col("count").sum())
    with Export.open(FIXTURE) as ex:
        rows = ex.conn.execute("SELECT copyKind, SUM(bytes), COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                               "GROUP BY copyKind").fetchall()
    kind = {1: "H2D", 2: "D2H", 8: "D2D"}
    assert {d: (b, n) for d, b, n in f.iter_rows()} == {kind[k]: (b, n) for k, b, n in rows}


def test_the_wiring_calls_no_section_by_hand():
    # what result.py and transfers.py did by hand before: now a section's compute
    for mod in ("result.py", "sections/transfers.py"):
        text = (SECTIONS_DIR.parent / mod).read_text()
        for call in ("analyze_multi_gpu(", "advise(", "for_model(", "phase_table(", "measure(", "build_findings(",
                     "overlap_levels(", "contention_summary(", "pageable_summary(", "reduce_pcie(",
                     "gradient_round_trips(", "memory_peaks(", "phase_json(", "idle_findings(",
                     "microbatch_advice(", "idle_windows("):
            assert call not in text, (mod, call)
