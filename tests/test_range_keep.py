"""A model that keeps part of its NVTX ranges (issue 24, :class:`phases.RangeKeep`): the kept
subset is exactly what the rule says (checked row by row with a plain Python loop over the full
frame), a reader of other phases gets every range back, and the analysis computed on it equals
the one computed on the whole model, on real fixtures with DeepSpeed, tracekit and worker ranges."""

import json
import re

import polars as pl
import pytest
from conftest import FIXTURES, ZERO3_CUT

from tracekit.analysis import Analysis, analyze
from tracekit.analyze.model import phases
from tracekit.analyze.result import range_keep
from tracekit.analyze.sections import breakdown, whatif_pieces
from tracekit.analyze.trace.export import Export
from tracekit.options import SECTIONS, Options

#: ZeRO-3 with DeepSpeed's ranges only; SuperOffload with tracekit's ranges and a CPU worker;
#: ZeRO-2 with tracekit's capture ranges
TRACES = [ZERO3_CUT, FIXTURES / "superoffload_cut.sqlite", FIXTURES / "zero2_offload_gas2_cut.sqlite"]


def _models(path, keep):
    with Export.open(path) as e:
        full = phases.build(e)
    with Export.open(path) as e:
        kept = phases.build(e, keep=keep)
        memo_left = ("nvtx.load_ranges", None) in e._memo
    return full, kept, memo_left


def _expected_rows(full: phases.PhaseModel, keep: phases.RangeKeep) -> list[int]:
    """The rule, row by row: the range_index of every nested range to keep."""
    pat = re.compile(keep.names)
    spans = {}  # pid -> [(start, end)] of the kept phases' windows and of their phase ranges
    by_index = {r["range_index"]: r for r in full.ranges.iter_rows(named=True)}
    phase_ranges = set()
    for w in full.windows.iter_rows(named=True):
        if w["range_index"] is not None:
            phase_ranges.add(w["range_index"])
        if w["phase"] in keep.phases:
            spans.setdefault(w["global_pid"], []).append((w["start"], w["end"]))
            r = by_index.get(w["range_index"])
            if r is not None:
                spans[w["global_pid"]].append((r["start"], r["end"]))
    out = []
    for r in full.ranges.iter_rows(named=True):
        inside = any(a <= r["start"] <= b for a, b in spans.get(r["global_pid"], ()))
        if pat.search(r["name"] or "") or r["range_index"] in phase_ranges or inside:
            out.append(r["range_index"])
    return out


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_kept_ranges_follow_the_rule(path):
    keep = range_keep(Options())
    full, kept, memo_left = _models(path, keep)
    assert not memo_left  # the whole load is not kept with the export either
    want = _expected_rows(full, keep)
    assert kept.ranges["range_index"].to_list() == want
    assert 0 < kept.ranges.height <= full.ranges.height
    # the kept rows are the full model's rows, column for column, but ``parent`` (a row of the
    # frame) and ``depth``: a kept parent is the same range; else -1 or a kept range around it
    rows = full.ranges.filter(pl.col("range_index").is_in(want))
    assert kept.ranges.drop("parent", "depth").equals(rows.drop("parent", "depth"))
    full_index = full.ranges["range_index"].to_list()
    kept_rows = kept.ranges.to_dicts()
    wanted = set(want)
    for r, k in zip(rows.iter_rows(named=True), kept_rows):
        was = full_index[r["parent"]] if r["parent"] >= 0 else None
        now = kept_rows[k["parent"]] if k["parent"] >= 0 else None
        if was in wanted:
            assert now is not None and now["range_index"] == was
        elif now is not None:
            assert now["global_tid"] == k["global_tid"] and now["start"] <= k["start"] and now["end"] >= k["end"]
    assert kept.ranges_scope == frozenset({"update"})
    assert sorted(kept.range_names) == sorted(full.ranges["name"].drop_nulls().unique().to_list())
    # every other part of the model is the same
    assert kept.windows.equals(full.windows) and kept.ops.equals(full.ops)


def test_shared_trace_keeps_a_small_part(full_trace):
    """On the shared trace most ranges are in forward and backward: the model keeps few."""
    full, kept, _ = _models(full_trace, range_keep(Options()))
    assert full.ranges.height == 74344
    assert kept.ranges.height == len(_expected_rows(full, range_keep(Options())))
    assert kept.ranges.height < full.ranges.height / 20


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_other_phases_reload_every_range(path):
    full, kept, _ = _models(path, range_keep(Options()))
    assert phases.ranges_for(kept, {"update"}) is kept.ranges
    assert phases.ranges_for(kept, {"forward"}).equals(full.ranges)
    assert phases.ranges_for(kept).equals(full.ranges)
    for phase in ("forward", "backward", "update"):
        assert breakdown.sub_phase_table(kept, phase).equals(breakdown.sub_phase_table(full, phase))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_what_if_pieces_read_the_kept_ranges(path):
    full, kept, _ = _models(path, range_keep(Options()))
    with Export.open(path) as e:
        a = whatif_pieces.measure(e, full)
    with Export.open(path) as e:
        b = whatif_pieces.measure(e, kept)
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], pl.DataFrame):
                assert x[k].equals(y[k]), k
            else:
                assert x[k] == y[k], k


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_analysis_equals_the_whole_model(path, tmp_path):
    """`tracekit analyze` keeps part of the ranges; `Analysis.of_export` (report, compare) keeps
    them all: every section's JSON is the same, with --phase forward too."""
    for opts in (Options(sections=SECTIONS), Options(sections=SECTIONS, phase="forward")):
        lean = analyze(path, opts, cache=False)
        assert lean.model.ranges_scope is not None
        with Export.open(path) as e:
            whole = Analysis.of_export(e, opts)
        assert whole.model.ranges_scope is None
        a, b = lean.to_json(), whole.to_json()
        assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
        # frames read later from the model (sub-phases of another phase) are the same too
        assert lean.sub_phase_table("backward").equals(whole.sub_phase_table("backward"))


def _edited_copy(tmp_path, name: str, sql: list[str]):
    import shutil
    import sqlite3

    out = tmp_path / name
    shutil.copy(FIXTURES / "zero2_offload_gas2_cut.sqlite", out)
    con = sqlite3.connect(out)
    for q in sql:
        con.execute(q)
    con.commit()
    con.close()
    return out


def _same_as_whole(path):
    lean = analyze(path, Options(sections=SECTIONS), cache=False)
    with Export.open(path) as e:
        whole = Analysis.of_export(e, Options(sections=SECTIONS))
    assert json.dumps(lean.to_json(), sort_keys=True, default=str) == json.dumps(whole.to_json(), sort_keys=True,
                                                                                   default=str)
    return lean


def test_inferred_update_reads_every_range(tmp_path):
    """Without update ranges (a copy of the ZeRO-2 cut without tracekit's `update`), the update is
    inferred: no range marks it, so the thin read cannot keep what starts inside; the build reads
    every range, and the analysis is that of the whole model."""
    path = _edited_copy(tmp_path, "zero2_without_update_ranges.sqlite", [
        "DELETE FROM NVTX_EVENTS WHERE rowid IN (SELECT n.rowid FROM NVTX_EVENTS n LEFT JOIN StringIds s "
        "ON s.id = n.textId WHERE coalesce(n.text, s.value) = 'update')"])
    lean = _same_as_whole(path)
    assert list(lean.to_json()["phase_source"].values()) == ["tracekit+inferred-update"]


def test_rows_out_of_start_order_read_every_range(tmp_path):
    """NVTX_EVENTS rewritten in reverse start order (a synthetic edit of the ZeRO-2 cut): the thin
    read sees a chunk go back in time, and the build reads every range."""
    from tracekit.analyze.model import nvtx

    path = _edited_copy(tmp_path, "zero2_nvtx_reversed.sqlite", [
        "CREATE TABLE rev AS SELECT * FROM NVTX_EVENTS ORDER BY start DESC, rowid DESC",
        "DELETE FROM NVTX_EVENTS", "INSERT INTO NVTX_EVENTS SELECT * FROM rev", "DROP TABLE rev"])
    with Export.open(path) as e:
        thin = nvtx.Thin({}, "^$", "^$")
        nvtx.load_thin_ranges(e, thin)
        assert thin.ordered is False
    _same_as_whole(path)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_thin_read_keeps_what_its_rule_says(path):
    """The rows of a thin read, against its rule applied by a plain loop to the whole read: a
    range holding a launch of its thread, named, inside an update range of its process, never
    popped, start/end or cross-thread. The dropped ranges' span per process is theirs."""
    from tracekit.analyze.model import nvtx

    keep = range_keep(Options())
    with Export.open(path) as e:
        ops = phases.load_gpu_ops(e)
        thin = phases._thin_read(ops, keep, None)
        got = nvtx.load_thin_ranges(e, thin)
    with Export.open(path) as e:
        every = nvtx.load_ranges(e)
        stop = e.capture_end()
    launches = {}
    for tid, t in ops.select("launch_tid", "launch").drop_nulls().iter_rows():
        launches.setdefault(tid, []).append(t)
    named, upd = re.compile(thin.keep_names), re.compile(thin.update_names)
    rows = sorted(every.iter_rows(named=True), key=lambda r: r["range_id"])
    updates = [(r["global_pid"], r["start"], r["end"]) for r in rows if upd.search(r["name"])]
    want, span = [], {}
    for r in rows:
        inside = any(p == r["global_pid"] and s <= r["start"] <= e for p, s, e in updates)
        holds = any(r["start"] <= t < r["end"] for t in launches.get(r["global_tid"], ()))
        if (holds or named.search(r["name"]) or inside or r["unclosed"] or r["end"] >= stop
                or r["event_type"] == 60 or r["cross_thread"]):
            want.append(r["range_id"])
        else:
            a, b = span.get(r["global_pid"], (r["start"], r["end"]))
            span[r["global_pid"]] = (min(a, r["start"]), max(b, r["end"]))
    assert thin.ordered
    assert sorted(got["range_id"].to_list()) == want
    assert got.equals(every.filter(pl.col("range_id").is_in(want)))
    assert {r[0]: (r[1], r[2]) for r in thin.span.iter_rows()} == span
    assert thin.dropped == len(rows) - len(want)


def test_a_changed_trace_is_not_read_again_silently(tmp_path):
    """The model of `analyze` reloads the ranges of another phase from the trace; a trace changed
    since (here: a copy touched and grown by one byte) gives one line naming it, never other ranges."""
    import os
    import shutil

    from tracekit.errors import TracekitError

    path = tmp_path / "zero3_copy.sqlite"
    shutil.copy(ZERO3_CUT, path)
    a = analyze(path, Options(sections=SECTIONS), cache=False)
    with open(path, "ab") as f:
        f.write(b"\0")
    os.utime(path, ns=(1, 1))
    with pytest.raises(TracekitError, match="changed since it was analyzed"):
        a.sub_phase_table("forward")
    path.unlink()
    with pytest.raises(TracekitError):
        phases.ranges_for(a.model)


def test_range_starting_with_the_update_range_is_kept(tmp_path):
    """A range that starts at the same ns as an update range and comes before it in NVTX_EVENTS
    (an edited copy of the ZeRO-2 cut): it starts inside the update, so the thin read keeps it."""
    from tracekit.analyze.model import nvtx

    path = _edited_copy(tmp_path, "zero2_tie_with_update.sqlite", [
        "INSERT INTO StringIds (id, value) VALUES (987654321, 'tie_child')",
        "INSERT INTO NVTX_EVENTS (start, \"end\", eventType, globalTid, textId, domainId) "
        "SELECT n.start, n.start + 10, 59, n.globalTid, 987654321, n.domainId FROM NVTX_EVENTS n "
        "LEFT JOIN StringIds s ON s.id = n.textId WHERE coalesce(n.text, s.value) = 'update' ORDER BY n.start LIMIT 1",
        "CREATE TABLE t AS SELECT n.* FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
        "ORDER BY n.start, coalesce(n.text, s.value) = 'update'",
        "DELETE FROM NVTX_EVENTS", "INSERT INTO NVTX_EVENTS SELECT * FROM t", "DROP TABLE t"])
    with Export.open(path) as e:
        ops = phases.load_gpu_ops(e)
        thin = phases._thin_read(ops, range_keep(Options()), None)
        got = nvtx.load_thin_ranges(e, thin)
    assert thin.ordered
    assert got.filter(pl.col("name") == "tie_child").height == 1
    _same_as_whole(path)
