"""The CPU optimizer step wherever it ran (tracekit.analyze.sections.cpu_update, issue 15 item 4).

Real cuts (SuperOffload, ZenFlow with overlap_step, ZeRO-3 NVMe / offload_param, the HF
Trainer; tests/fixtures/README.md) checked against plain SQL over the worker ranges and the
kernel intervals with brute-force unions; synthetic traces with hand-computed values.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from synthetic import SyntheticTrace, gtid

from tracekit.analyze.model import phases
from tracekit.analyze.result import analyze_path
from tracekit.analyze.sections import cpu_update
from tracekit.analyze.trace.export import Export

FIX = Path(__file__).parent / "fixtures"
TK = "tracekit"


# ---------------------------------------------------------------- brute force, no tracekit code
def merge(iv):
    """Union of [s, e) intervals by a plain loop."""
    out = []
    for s, e in sorted(x for x in iv if x[1] > x[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def inter(a, b):
    """Intersection of two interval lists (merged first), every pair tried."""
    out = []
    for s1, e1 in merge(a):
        for s2, e2 in merge(b):
            s, e = max(s1, s2), min(e1, e2)
            if e > s:
                out.append((s, e))
    return merge(out)


def minus(a, b):
    """``a`` without ``b``, by cutting each piece of ``a`` with each piece of ``b`` in turn."""
    pieces = merge(a)
    for s2, e2 in merge(b):
        nxt = []
        for s1, e1 in pieces:
            if e2 <= s1 or s2 >= e1:
                nxt.append([s1, e1])
                continue
            if s1 < s2:
                nxt.append([s1, s2])
            if e2 < e1:
                nxt.append([e2, e1])
        pieces = nxt
    return pieces


def length(iv):
    return sum(e - s for s, e in merge(iv))


def tk_ranges(con, pid: int, like: str):
    """Push/pop ranges of the ``tracekit`` domain of OS process ``pid`` whose name is LIKE ``like``
    (never-closed ones, ending at ANALYSIS_DETAILS.duration, left out)."""
    dur = con.execute("SELECT max(duration) FROM ANALYSIS_DETAILS").fetchone()[0]
    return con.execute(
        """SELECT e.start, e."end", coalesce(e.text, s.value) AS nm FROM NVTX_EVENTS e
           LEFT JOIN StringIds s ON s.id = e.textId
           JOIN NVTX_EVENTS d ON d.eventType = 75 AND d.domainId = e.domainId
                AND (d.globalTid >> 24) & 16777215 = ? AND d.text = ?
           WHERE e.eventType = 59 AND (e.globalTid >> 24) & 16777215 = ? AND nm LIKE ?
                 AND e."end" IS NOT NULL AND e."end" <> ?""",
        (pid, TK, pid, like, dur)).fetchall()


def gpu_intervals(con, pid: int, kernels_only: bool):
    """GPU intervals of process ``pid``: compute kernels (names without nccl), plus copies and
    memsets unless ``kernels_only``."""
    rows = con.execute(
        """SELECT k.start, k."end" FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds s
           ON s.id = coalesce(k.demangledName, k.shortName)
           WHERE (k.globalPid >> 24) & 16777215 = ? AND lower(coalesce(s.value, '')) NOT LIKE '%nccl%'""",
        (pid,)).fetchall()
    if not kernels_only:
        for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            rows += con.execute(f'SELECT start, "end" FROM {t} WHERE (globalPid >> 24) & 16777215 = ?',
                                (pid,)).fetchall()
    return rows


def kept_iterations(con) -> list[int]:
    v = dict(con.execute("SELECT name, value FROM TRACEKIT_TRIM").fetchall())["iterations"]
    a, _, b = v.partition("-")
    return list(range(int(a), int(b or a) + 1))


WORKER_CUTS = {
    # fixture: (rank pid, worker pid) as in its manifest (hook.processes[*].pid / parent_pid)
    "superoffload_cut.sqlite": (685, 879),
    "zenflow_cut.sqlite": (1181, 1380),
}


@pytest.fixture(scope="module")
def results():
    out = {}
    for name in WORKER_CUTS:
        out[name] = analyze_path(FIX / name)
    return out


@pytest.mark.parametrize("name", sorted(WORKER_CUTS))
def test_worker_cuts_against_sql(name, results):
    rank_pid, worker_pid = WORKER_CUTS[name]
    manifest = json.loads((FIX / name.replace("_cut.sqlite", "_capture.json")).read_text())
    assert {p["pid"]: p.get("parent_pid") for p in manifest["hook"]["processes"]}[worker_pid] == rank_pid
    con = sqlite3.connect(f"file:{FIX / name}?mode=ro", uri=True)
    steps = tk_ranges(con, worker_pid, "cpu_optimizer_step it=%")
    waits = [(s, e) for s, e, _ in tk_ranges(con, rank_pid, "cpu_update_wait")]
    kern = gpu_intervals(con, rank_pid, kernels_only=True)
    active = gpu_intervals(con, rank_pid, kernels_only=False)
    rank = [r for r in results[name]["ranks"] if r["pid"] == rank_pid][0]
    by_index = {it["index"]: it for it in rank["iterations"]}
    for n in kept_iterations(con):
        it = by_index[n]
        assert it["complete"]
        mine = [(s, e) for s, e, nm in steps if nm.startswith(f"cpu_optimizer_step it={n} ")]
        assert mine, f"no worker range for iteration {n}"
        busy = length(mine)
        hidden = length(inter(mine, kern))
        exposed = length(minus(inter(mine, waits), active))
        wait = length([w for w in waits if any(w[0] < e and w[1] > s for s, e in mine)])
        cu = it["cpu_update"]
        assert (cu["busy_ns"], cu["hidden_ns"], cu["exposed_ns"], cu["wait_ns"]) == (busy, hidden, exposed, wait)
        assert cu["overlapped_ns"] == length(minus(mine, waits))
        assert cu["busy_ns"] > 0 and cu["worker_ranges"] == len(mine) and cu["workers"] == [worker_pid]
        assert cu["hidden_ns"] + cu["exposed_ns"] <= cu["busy_ns"]
        if name.startswith("zenflow"):
            # overlap_step: iteration N's CPU Adam runs during the selective GPU step and the next
            # forward; the training never waits for it, part of it is hidden behind kernels
            assert cu["hidden_ns"] > 0 and cu["exposed_ns"] == 0
            assert cu["overlapped_by_phase"].get("forward", 0) > 0
        else:
            # SuperOffload with DeepSpeed 0.19.8's default gradient_clipping 1.0 takes the clipping
            # path (_step_with_clipping): every sub-group is stepped inside the update while the
            # training waits, so no kernel runs beside it: hidden 0 is what the trace holds
            assert cu["hidden_ns"] == 0 and cu["exposed_ns"] == busy and cu["wait_ns"] > 2 * busy
    con.close()


def test_superoffload_per_sub_group(results):
    """Ten sub-groups per update (sub_group_size 1e7, 134 M parameters), each range named."""
    con = sqlite3.connect(f"file:{FIX / 'superoffload_cut.sqlite'}?mode=ro", uri=True)
    names = [nm for _, _, nm in tk_ranges(con, 879, "cpu_optimizer_step it=%")]
    for n in kept_iterations(con):
        assert sorted(x for x in names if x.startswith(f"cpu_optimizer_step it={n} ")) == sorted(
            f"cpu_optimizer_step it={n} sg={k}" for k in range(10))
    rank = results["superoffload_cut.sqlite"]["ranks"][0]
    assert all(it["cpu_update"]["ranges"] == 10 for it in rank["iterations"] if it["complete"])


@pytest.mark.parametrize("name,pid", [("nvme_offload_cut.sqlite", 1677), ("zero3_offload_param_cut.sqlite", 1825),
                                      ("hf_trainer_zero3_cut.sqlite", 2588)])
def test_in_process_cpu_step_against_sql(name, pid):
    """ZeRO-3 offload without a worker: the step runs inside update on the training's thread,
    so the part of it with the GPU idle is exposed."""
    res = analyze_path(FIX / name)
    con = sqlite3.connect(f"file:{FIX / name}?mode=ro", uri=True)
    steps = [(s, e) for s, e, nm in tk_ranges(con, pid, "cpu_optimizer_step") if nm == "cpu_optimizer_step"]
    updates = [(s, e) for s, e, nm in tk_ranges(con, pid, "update") if nm == "update"]
    active = gpu_intervals(con, pid, kernels_only=False)
    kern = gpu_intervals(con, pid, kernels_only=True)
    rank = res["ranks"][0]
    for it in rank["iterations"]:
        if not it["complete"]:
            continue
        up = [p for p in it["phases"] if p["phase"] == "update"][0]
        mine = [(s, e) for s, e in steps if up["start_ns"] <= s < up["end_ns"]]
        assert mine
        cu = it["cpu_update"]
        assert cu["busy_ns"] == length(mine) > 0
        assert cu["hidden_ns"] == length(inter(mine, kern))
        assert cu["exposed_ns"] == length(minus(inter(mine, updates), active))
        assert cu["worker_ranges"] == 0 and cu["exposed_basis"] == "update window" and cu["wait_ns"] == 0
    con.close()


# ---------------------------------------------------------------- synthetic, by hand
def _engine(t: SyntheticTrace, pid=100, base=0, update_wait=True, it_names=True, worker=200):
    """One rank (OS pid ``pid``) with two iterations and a CPU optimizer worker ``worker``.

    iteration 0: forward [0,100) kernel [10,90); backward boundary [100,300) kernel [110,290);
    update [300,400) with cpu_update_wait [320,380). Worker: sub-group 0 [150,250) during
    backward (hidden 100), sub-group 1 [330,370) inside the wait with the GPU idle (exposed 40).
    iteration 1: forward [400,500) kernel [410,490); backward boundary [500,700); update
    [700,800) with an in-process cpu_optimizer_step [710,790) and a kernel [700,720) launched
    in it (hidden 10, exposed 70)."""
    tid = gtid(pid, pid)
    b = base
    for name, s, e in (("iteration 0", 0, 400), ("forward", 0, 100), ("backward boundary", 100, 300),
                       ("update", 300, 400), ("iteration 1", 400, 800), ("forward", 400, 500),
                       ("backward boundary", 500, 700), ("update", 700, 800), ("cpu_optimizer_step", 710, 790)):
        t.range(name, b + s, b + e, tid, domain=TK)
    if update_wait:
        t.range("cpu_update_wait", b + 320, b + 380, tid, domain=TK)
    t.kernel(b + 10, b + 90, pid, pid, launch=b + 5)
    t.kernel(b + 110, b + 290, pid, pid, launch=b + 105)
    t.kernel(b + 410, b + 490, pid, pid, launch=b + 405)
    t.kernel(b + 700, b + 720, pid, pid, launch=b + 712)
    wt = gtid(worker, worker)
    n0 = "cpu_optimizer_step it=0 sg=%d" if it_names else "cpu_optimizer_step it=? sg=%d"
    t.range(n0 % 0, b + 150, b + 250, wt, domain=TK)
    t.range(n0 % 1, b + 330, b + 370, wt, domain=TK)


def _model(path):
    with Export.open(path) as ex:
        return phases.build(ex)


def test_synthetic_hidden_exposed_by_hand(tmp_path):
    t = SyntheticTrace()
    _engine(t)
    path = t.write(tmp_path / "synthetic_cpu_update.sqlite")
    model = _model(path)
    # the worker is no rank and has no phase windows of its own
    assert set(model.windows["global_pid"].unique().to_list()) == {100 << 24}
    assert set(model.source) == {100 << 24}
    cu = cpu_update.cpu_update(model)
    rows = {r["iteration"]: r for r in cu.table.iter_rows(named=True)}
    r0, r1 = rows[0], rows[1]
    assert (r0["busy_ns"], r0["hidden_ns"], r0["exposed_ns"], r0["overlapped_ns"], r0["wait_ns"]) == (140, 100, 40, 100, 60)
    assert json.loads(r0["hidden_by_phase"]) == {"backward": 100}
    assert json.loads(r0["overlapped_by_phase"]) == {"backward": 100}
    assert r0["exposed_basis"] == "cpu_update_wait" and r0["worker_ranges"] == 2 and r0["workers"] == [200]
    assert (r1["busy_ns"], r1["hidden_ns"], r1["exposed_ns"], r1["overlapped_ns"], r1["wait_ns"]) == (80, 10, 70, 0, 0)
    assert r1["exposed_basis"] == "update window" and r1["worker_ranges"] == 0
    # means over steady iterations: iteration 0 (warm-up) apart
    st = cpu_update.steady(cu, 100 << 24, 0)
    assert st["iterations"] == [1] and st["warmup"] == [0] and st["busy_ns"] == 80


def test_synthetic_attribution_by_time(tmp_path):
    """``it=?`` (iteration unknown to the worker): the range goes to the iteration whose window holds its start."""
    t = SyntheticTrace()
    _engine(t, it_names=False)
    model = _model(t.write(tmp_path / "synthetic_cpu_update_time.sqlite"))
    rows = {r["iteration"]: r for r in cpu_update.cpu_update(model).table.iter_rows(named=True)}
    assert rows[0]["busy_ns"] == 140 and not rows[0]["by_name"]


def test_synthetic_no_wait_means_not_waited(tmp_path):
    """A worker's step with no cpu_update_wait around it was not waited for, even inside update."""
    t = SyntheticTrace()
    _engine(t, update_wait=False)
    model = _model(t.write(tmp_path / "synthetic_cpu_update_nowait.sqlite"))
    r0 = cpu_update.cpu_update(model).table.row(0, named=True)
    assert (r0["busy_ns"], r0["hidden_ns"], r0["exposed_ns"], r0["overlapped_ns"], r0["wait_ns"]) == (140, 100, 0, 140, 0)
    assert json.loads(r0["overlapped_by_phase"]) == {"backward": 100, "update": 40}


def test_synthetic_two_ranks_need_the_manifest(tmp_path):
    t = SyntheticTrace()
    _engine(t, pid=100, worker=200)
    _engine(t, pid=101, worker=201, base=0)
    model = _model(t.write(tmp_path / "synthetic_cpu_update_ranks.sqlite"))
    cu = cpu_update.cpu_update(model)  # which worker serves which rank is unknown
    assert cu.table.filter(~cu.table["worker_ranges"].eq(0)).height == 0
    assert any("not tied to a rank" in n for n in cu.notes)
    cu = cpu_update.cpu_update(model, {200: 100, 201: 101})
    r = {(x["pid"], x["iteration"]): x for x in cu.table.iter_rows(named=True)}
    assert r[(100, 0)]["workers"] == [200] and r[(101, 0)]["workers"] == [201]
    assert r[(100, 0)]["busy_ns"] == r[(101, 0)]["busy_ns"] == 140


def test_worker_parents_from_the_manifest(tmp_path):
    shutil.copy(FIX / "superoffload_capture.json", tmp_path / "x_capture.json")
    (tmp_path / "x_cut.sqlite").write_bytes(b"")
    assert cpu_update.worker_parents(tmp_path / "x_cut.sqlite") == {879: 685}
    (tmp_path / "x_capture.json").write_text("{not json")
    assert cpu_update.worker_parents(tmp_path / "x_cut.sqlite") == {}


def test_unclosed_worker_range_is_left_out(tmp_path):
    """The last worker range of a capture (the worker ends inside it: end = ANALYSIS_DETAILS.duration)."""
    t = SyntheticTrace()
    _engine(t)
    t.stop_time = 5000
    t.range("cpu_optimizer_step it=1 sg=0", 720, 5000, gtid(200, 200), domain=TK)
    model = _model(t.write(tmp_path / "synthetic_cpu_update_unclosed.sqlite"))
    cu = cpu_update.cpu_update(model)
    rows = {r["iteration"]: r for r in cu.table.iter_rows(named=True)}
    assert rows[1]["worker_ranges"] == 0 and rows[1]["busy_ns"] == 80
    assert any("never closed" in n for n in cu.notes)


def test_trim_keeps_a_kept_iterations_worker_range_whole(tmp_path):
    """ZenFlow steps iteration N on the CPU during N+1's forward: the cut of N keeps that range
    and the kernels beside it."""
    from tracekit.analyze.trim import trim

    t = SyntheticTrace()
    tid = gtid(100, 100)
    for name, s, e in (("iteration 0", 0, 400), ("forward", 0, 100), ("backward boundary", 100, 300),
                       ("update", 300, 400), ("iteration 1", 400, 800), ("forward", 400, 500),
                       ("backward boundary", 500, 700), ("update", 700, 800)):
        t.range(name, s, e, tid, domain=TK)
    for s in (10, 110, 410, 510):
        t.kernel(s, s + 80, 100, 100, launch=s - 5)
    t.range("cpu_optimizer_step it=0 sg=all", 380, 460, gtid(200, 200), domain=TK)
    src = t.write(tmp_path / "synthetic_zenflow_like.sqlite")
    out = trim(src, tmp_path / "synthetic_zenflow_like_cut.sqlite", "0")
    assert out["window_ns"] == (0, 460)
    model = _model(tmp_path / "synthetic_zenflow_like_cut.sqlite")
    r = cpu_update.cpu_update(model).table.row(0, named=True)
    # [380,400) in update with the GPU idle (no wait: not exposed), [410,460) beside the forward kernel
    assert (r["iteration"], r["busy_ns"], r["hidden_ns"], r["exposed_ns"]) == (0, 80, 50, 0)


def _updates(con, pid, its):
    """The update ranges of iterations ``its`` (the k-th update range of the cut is iteration its[k])."""
    ups = sorted((s, e) for s, e, nm in tk_ranges(con, pid, "update") if nm == "update")
    return ups[:len(its)]


def test_superoffload_findings_and_advice_use_the_wait():
    res = analyze_path(FIX / "superoffload_cut.sqlite")
    con = sqlite3.connect(f"file:{FIX / 'superoffload_cut.sqlite'}?mode=ro", uri=True)
    its = kept_iterations(con)
    ups = _updates(con, 685, its)
    waits = [(s, e) for s, e, _ in tk_ranges(con, 685, "cpu_update_wait") if any(a <= s and e <= b for a, b in ups)]
    idle_wait = length(minus(waits, gpu_intervals(con, 685, kernels_only=False))) / len(its)
    wait = length(waits) / len(its)
    con.close()
    clip = [r for r in res["config"]["settings"] if r["key"] == "gradient_clipping"][0]
    assert (clip["value"], clip["source"]) == (1.0, "default")  # DeepSpeed >= 0.19.3 (manifest: 0.19.8)
    upd = [f for f in res["findings"] if f["topic"] == "update"][0]
    assert f"waiting for the CPU optimizer worker (cpu_update_wait) {idle_wait / 1e6:,.1f} ms" in upd["text"]
    assert "ran in worker process 879" in upd["text"]
    cu = [f for f in res["findings"] if f["topic"] == "cpu-update"][0]
    assert cu["values"]["hidden_share"] == 0 and cu["values"]["exposed_share"] == 1
    adv = [a for a in res["advice"] if a["knob"] == "gradient_clipping"][0]
    assert adv["change"].startswith("1.0 -> 0.0") and adv["confidence"] == "low"
    assert f"{wait / 1e6:,.1f} ms per iteration in cpu_update_wait" in adv["problem"]


def test_superoffload_advice_names_the_one_reduce_bucket(tmp_path):
    """DeepSpeed's default reduce_bucket_size (5e8) holds all 134 M parameters of the example
    model (sum of the LLaMA's weights: docs/capture.md), so partition_grads runs once, at backward's
    end, and unclipped sub-groups cannot finish during backward (measured on the H200:
    docs/advice.md): the advice says so and adds the bucket change, 1e7 (about P / 10); with the
    config's reduce_bucket_size 1e7 neither is said."""
    from tracekit.options import Options, load_ds_config

    trace = FIX / "superoffload_cut.sqlite"
    res = analyze_path(trace)
    (pred,) = [p for p in res["predictions"] if p["scenario"] == "superoffload_no_clipping"]
    assert (pred["one_reduce_bucket"], pred["reduce_bucket_size"], pred["suggested_reduce_bucket_size"]) == (
        True, 500_000_000, 1e7)
    assert "partition_grads runs once" in pred["basis"]
    (adv,) = [a for a in res["advice"] if a["knob"] == "gradient_clipping"]
    assert adv["change"].endswith("with zero_optimization.reduce_bucket_size 5e+08 -> 1e+07 so that sub-groups "
                                  "complete during backward")
    cfg = json.loads((FIX / "superoffload_capture.json").read_text())["deepspeed_config"]
    path = tmp_path / "small_bucket.json"
    path.write_text(json.dumps(cfg))  # a config alone names no DeepSpeed version: clipping's default unknown
    res = analyze_path(trace, Options(ds_config=load_ds_config(trace, path)))
    (pred,) = [p for p in res["predictions"] if p["scenario"] == "superoffload_no_clipping"]
    # the config leaves gradient_clipping unknown; the trace shows clipping on: more than one
    # cpu_update_wait per update (one per CPU sub-group, superoffload_stage3.py _step_with_clipping)
    con = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    waits = [n for (n,) in con.execute(
        "SELECT (SELECT count(*) FROM NVTX_EVENTS w JOIN StringIds sw ON sw.id = w.textId WHERE sw.value = "
        "'cpu_update_wait' AND w.start >= u.start AND w.end <= u.end) FROM NVTX_EVENTS u JOIN StringIds su "
        "ON su.id = u.textId WHERE su.value = 'update' AND u.end IS NOT NULL")]
    con.close()
    assert waits and min(waits) >= 2
    rows = {r["source"]: r["value"] for r in res["config"]["settings"] if r["key"] == "gradient_clipping"}
    assert rows == {"unknown": None, "trace": "> 0"}
    assert pred["applicable"] and pred["saving_ns"] > 0
    cfg["zero_optimization"]["reduce_bucket_size"] = 10_000_000
    cfg["gradient_clipping"] = 1.0
    path.write_text(json.dumps(cfg))
    res = analyze_path(trace, Options(ds_config=load_ds_config(trace, path)))
    (pred,) = [p for p in res["predictions"] if p["scenario"] == "superoffload_no_clipping"]
    assert (pred["one_reduce_bucket"], pred["suggested_reduce_bucket_size"]) == (False, None)
    assert "partition_grads" not in pred["basis"] and pred["saving_ns"] > 0
    (adv,) = [a for a in res["advice"] if a["knob"] == "gradient_clipping"]
    assert "reduce_bucket_size" not in adv["change"]


def test_nvme_update_names_the_swaps():
    res = analyze_path(FIX / "nvme_offload_cut.sqlite")
    con = sqlite3.connect(f"file:{FIX / 'nvme_offload_cut.sqlite'}?mode=ro", uri=True)
    its = kept_iterations(con)
    ups = _updates(con, 1677, its)
    swaps = [(s, e) for like in ("swap_in", "swap_out") for s, e, nm in tk_ranges(con, 1677, like)
             if nm == like and any(a <= s and e <= b for a, b in ups)]
    idle = length(minus(swaps, gpu_intervals(con, 1677, kernels_only=False))) / len(its)
    con.close()
    upd = [f for f in res["findings"] if f["topic"] == "update"][0]
    assert f"NVMe swap of the optimizer state (swap_in/swap_out) {idle / 1e6:,.1f} ms" in upd["text"]
    assert idle > 0.5 * upd["values"]["gpu_idle_ns"] / upd["values"]["updates"]  # the swaps are most of it
    no = [a for a in res["advice"] if a["scenario"] == "no_offload"][0]
    assert no["change"].startswith("nvme -> none")


@pytest.mark.parametrize("name", ["superoffload_cut.sqlite", "zenflow_cut.sqlite"])
def test_no_finding_blames_the_update_for_a_worker_step(name, results):
    for f in results[name]["findings"]:
        assert "runs the optimizer step" not in f["text"] and "unmarked CPU optimizer step" not in f["text"]


def test_gradient_clipping_default_by_version():
    from tracekit.analyze.trace.dsconfig import config_value

    assert config_value({}, "gradient_clipping", "0.19.8") == (1.0, "default")
    assert config_value({}, "gradient_clipping", "0.19.2") == (0.0, "default")
    assert config_value({}, "gradient_clipping", None) == (None, "unknown")
    assert config_value({"gradient_clipping": 0.0}, "gradient_clipping", "0.19.8") == (0.0, "config")


@pytest.mark.parametrize("name", sorted(WORKER_CUTS))
def test_worker_is_no_rank(name, results):
    """The worker process has tracekit ranges but no GPU work: no rank, no phase source, no windows."""
    rank_pid, worker_pid = WORKER_CUTS[name]
    res = results[name]
    assert [r["pid"] for r in res["ranks"]] == [rank_pid]
    assert set(res["phase_source"]) == {str(rank_pid)}


def test_terminal_table(results):
    from rich.console import Console

    from tracekit.render.cpu_update_tables import render_cpu_update

    res = results["superoffload_cut.sqlite"]
    con = Console(record=True, width=200)
    render_cpu_update(con, "rank pid 685 device 0", res["ranks"][0], res["cpu_update_notes"])
    out = con.export_text()
    assert "CPU optimizer step per iteration (cpu_optimizer_step ranges in worker process 879; ms)" in out
    for it in res["ranks"][0]["iterations"]:
        c = it["cpu_update"]
        assert f"{c['busy_ns'] / 1e6:,.2f}" in out and f"{c['wait_ns'] / 1e6:,.2f}" in out
    st = res["ranks"][0]["cpu_update_steady"]
    assert f"per iteration (mean over steady iterations 1-2): CPU optimizer step {st['busy_ns'] / 1e6:,.2f} ms" in out
    con = Console(record=True, width=200)
    render_cpu_update(con, "x", {"pid": 1, "iterations": [{"index": 0, "complete": True, "cpu_update": None}]})
    assert con.export_text() == ""


def test_finding_of_one_iteration(tmp_path):
    """``--iteration N``: the cpu-update finding on that iteration alone, after the rank's update finding."""
    from tracekit.analyze.sections.findings import cpu_update_findings

    t = SyntheticTrace()
    _engine(t)
    cu = cpu_update.cpu_update(_model(t.write(tmp_path / "synthetic_cpu_update_finding.sqlite")))
    upd = {"topic": "update", "pid": 100, "device": 0, "phase": "update", "text": "update: ...", "values": {}}
    out = cpu_update_findings([upd], cu, iteration=0)
    assert [f["topic"] for f in out] == ["update", "cpu-update"]
    v = out[1]["values"]
    assert (v["busy_ns"], v["hidden_ns"], v["exposed_ns"], v["wait_ns"], v["basis"]) == (140, 100, 40, 60, "iteration 0")
    assert "worker process 200" in out[1]["text"] and "ran in worker process 200" in out[0]["text"]
    assert cpu_update_findings([], cu, iteration=7) == []
