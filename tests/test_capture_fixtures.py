"""The GPU captures made with ``tracekit capture`` hold the tracekit ranges the analyzer uses.

Fixtures: ``tests/fixtures/zero{3,2}_offload_gas2_cut.sqlite`` (see tests/fixtures/README.md),
cuts of iterations 1-2 of 134 M-parameter LLaMA runs, DeepSpeed 0.19.8, gas 2, bf16,
``offload_optimizer: cpu``. Expectations are computed by hand from the model and the loop:

- per iteration: 2 ``forward``, 1 ``backward``, 1 ``backward boundary``, 1 ``step (no update)``,
  1 ``update``;
- parameters: 2*32000*768 (embeddings, untied head) + 12*(4*768^2 + 3*768*2048 + 2*768)
  + 768 = 134,105,856; in bf16 that is 268,211,712 bytes copied to the GPU per update;
- ZeRO-2 offload copies each of the 12*9 + 3 = 111 parameter tensors' gradients to the host
  once per backward (``grad_copy_to_host``).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import run_cli

FIXTURES = Path(__file__).parent / "fixtures"
ZERO3 = FIXTURES / "zero3_offload_gas2_cut.sqlite"
ZERO2 = FIXTURES / "zero2_offload_gas2_cut.sqlite"

N_PARAMS = 2 * 32000 * 768 + 12 * (4 * 768 * 768 + 3 * 768 * 2048 + 2 * 768) + 768
N_TENSORS = 12 * 9 + 3
ITERATIONS = (1, 2)

RANGES_SQL = """
select n.start, n.end, n.globalTid, coalesce(n.text, s.value) as name
from NVTX_EVENTS n
left join StringIds s on s.id = n.textId
join NVTX_EVENTS d on d.eventType = 75 and d.domainId = n.domainId and d.text = 'tracekit'
where n.eventType = 59
order by n.start
"""


def tracekit_ranges(path: Path) -> list[tuple[int, int, int, str]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(RANGES_SQL).fetchall()
    finally:
        con.close()


def inside(inner, outer) -> bool:
    return inner[2] == outer[2] and outer[0] <= inner[0] and inner[1] <= outer[1]


def iteration_ranges(ranges):
    return {int(r[3].split()[1]): r for r in ranges if r[3].startswith("iteration ")}


def test_parameter_count_by_hand():
    assert N_PARAMS == 134_105_856
    assert N_TENSORS == 111


@pytest.mark.parametrize("path", [ZERO3, ZERO2], ids=["zero3", "zero2"])
def test_engine_ranges_per_iteration(path):
    ranges = tracekit_ranges(path)
    assert len({r[2] for r in ranges}) == 1  # all on the training thread
    iters = iteration_ranges(ranges)
    assert set(ITERATIONS) <= set(iters)
    for n in ITERATIONS:
        it = iters[n]
        names = [r[3] for r in ranges if inside(r, it) and r is not it]
        assert names.count("forward") == 2
        assert names.count("backward") == 1
        assert names.count("backward boundary") == 1
        assert names.count("step (no update)") == 1
        assert names.count("update") == 1
        # order of the micro-steps: fwd, bwd, step, fwd, bwd boundary, update
        top = [x for x in names if x in ("forward", "backward", "backward boundary",
                                         "step (no update)", "update")]
        assert top == ["forward", "backward", "step (no update)", "forward",
                       "backward boundary", "update"]
        # the iteration closes with the update
        update = next(r for r in ranges if r[3] == "update" and inside(r, it))
        assert it[1] - update[1] < 1_000_000  # within 1 ms of the update's end


def _sub_steps(ranges, update):
    return [r[3] for r in ranges if inside(r, update) and r is not update]


def test_zero3_update_sub_steps():
    ranges = tracekit_ranges(ZERO3)
    updates = [r for r in ranges if r[3] == "update"]
    assert len(updates) == 2
    for u in updates:
        assert _sub_steps(ranges, u) == ["grad_norm", "cpu_optimizer_step", "param_copy_back"]
    # ZeRO-3 offload moves gradient partitions to the host inside each backward
    for b in (r for r in ranges if r[3] in ("backward", "backward boundary")):
        assert [r[3] for r in ranges if inside(r, b) and r is not b] == ["grad_copy_to_host"]


def test_zero2_update_sub_steps_and_grad_copies():
    ranges = tracekit_ranges(ZERO2)
    updates = [r for r in ranges if r[3] == "update"]
    assert len(updates) == 2
    for u in updates:
        assert _sub_steps(ranges, u) == ["grad_norm", "cpu_optimizer_step", "param_copy_to_device"]
    for b in (r for r in ranges if r[3] in ("backward", "backward boundary")):
        inner = [r[3] for r in ranges if inside(r, b) and r is not b]
        assert inner == ["grad_copy_to_host"] * N_TENSORS


H2D_SQL = """
with t as ({ranges})
select t.start, sum(m.bytes)
from t
join CUPTI_ACTIVITY_KIND_RUNTIME r
  on r.globalTid = t.globalTid and r.start >= t.start and r.end <= t.end
join CUPTI_ACTIVITY_KIND_MEMCPY m
  on m.correlationId = r.correlationId and m.globalPid = (r.globalTid / 16777216) * 16777216
where m.copyKind = 1 and t.name = ?
group by t.start
"""


@pytest.mark.parametrize("path,name", [(ZERO3, "param_copy_back"), (ZERO2, "param_copy_to_device")],
                         ids=["zero3", "zero2"])
def test_parameter_copy_moves_the_bf16_model(path, name):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(H2D_SQL.format(ranges=RANGES_SQL.replace("order by n.start", "")),
                           (name,)).fetchall()
    finally:
        con.close()
    assert [b for _, b in rows] == [2 * N_PARAMS] * 2


def analyze_json(path: Path, *args: str) -> dict:
    rc, out, err = run_cli("analyze", path, *args, "--json")  # in this process (conftest)
    assert rc == 0, err
    return json.loads(out)


@pytest.mark.parametrize("path,copy_name", [(ZERO3, "param_copy_back"), (ZERO2, "param_copy_to_device")],
                         ids=["zero3", "zero2"])
def test_analyzer_takes_phases_from_tracekit_ranges(path, copy_name):
    ranges = tracekit_ranges(path)
    result = analyze_json(path, "--phase", "update")
    assert set(result["phase_source"].values()) == {"tracekit"}
    (rank,) = result["ranks"]
    got = {it["index"]: ph for it in rank["iterations"] for ph in it["phases"]}
    iters = iteration_ranges(ranges)
    for n in ITERATIONS:
        update = next(r for r in ranges if r[3] == "update" and inside(r, iters[n]))
        assert got[n]["phase"] == "update"
        assert (got[n]["start_ns"], got[n]["end_ns"]) == (update[0], update[1])
    subs = rank["sub_phases"]["update"]
    names = {s["sub_phase"] for s in subs}
    assert "cpu_optimizer_step" in names
    if path == ZERO2:  # DeepSpeed marks nothing in ZeRO-1/2 optimizers: only tracekit's ranges
        assert {"grad_norm", "cpu_optimizer_step", "param_copy_to_device"} <= names
        for n in ITERATIONS:
            cpu = next(r for r in ranges if r[3] == "cpu_optimizer_step" and inside(r, iters[n]))
            sub = next(s for s in subs if s["iteration"] == n and s["sub_phase"] == "cpu_optimizer_step")
            assert sub["wall_ns"] == cpu[1] - cpu[0]


# --------------------------------------------------------------------------- --iterations
ITERS = FIXTURES / "zero2_offload_gas2_iterations1-2.sqlite"
ITERS_MANIFEST = FIXTURES / "zero2_offload_gas2_iterations1-2_capture.json"
N_PARAMS_4_LAYERS = 2 * 32000 * 768 + 4 * (4 * 768 * 768 + 3 * 768 * 2048 + 2 * 768) + 768
N_TENSORS_4_LAYERS = 4 * 9 + 3


def test_capture_range_holds_only_the_asked_iterations():
    """A whole (untrimmed) capture made with --iterations 1-2 of a 4-step run."""
    ranges = tracekit_ranges(ITERS)
    assert sorted(iteration_ranges(ranges)) == [1, 2]
    names = [r[3] for r in ranges]
    assert names.count("update") == 2 and names.count("forward") == 4
    assert names.count("grad_copy_to_host") == N_TENSORS_4_LAYERS * 4
    con = sqlite3.connect(f"file:{ITERS}?mode=ro", uri=True)
    try:
        first, last = con.execute("select min(start), max(end) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    finally:
        con.close()
    iters = iteration_ranges(ranges)
    # every kernel ran between the start of iteration 1 and the end of iteration 2
    assert iters[1][0] <= first and last <= iters[2][1]
    manifest = json.loads(ITERS_MANIFEST.read_text())
    assert manifest["options"]["iterations"] == [1, 2]
    assert "--capture-range=cudaProfilerApi" in manifest["nsys"]["command"]
    assert manifest["exit_status"] == {"nsys": 0, "tracekit": 0}


def test_capture_range_parameter_copies():
    con = sqlite3.connect(f"file:{ITERS}?mode=ro", uri=True)
    try:
        rows = con.execute(H2D_SQL.format(ranges=RANGES_SQL.replace("order by n.start", "")),
                           ("param_copy_to_device",)).fetchall()
    finally:
        con.close()
    assert N_PARAMS_4_LAYERS == 77_470_464
    assert [b for _, b in rows] == [2 * N_PARAMS_4_LAYERS] * 2


def test_manifests_of_the_gpu_captures():
    for name, stage in (("zero3", 3), ("zero2", 2)):
        m = json.loads((FIXTURES / f"{name}_offload_gas2_capture.json").read_text())
        assert m["versions"]["deepspeed"] == "0.19.8"
        assert m["deepspeed_config"]["zero_optimization"]["stage"] == stage
        assert m["deepspeed_config"]["gradient_accumulation_steps"] == 2
        assert m["hook"]["missing"] == []
        assert m["gpus"][0]["name"] == "NVIDIA H200"
        assert m["exit_status"] == {"nsys": 0, "tracekit": 0}
        assert m["nsys"]["found_via"] == "standard folder"
