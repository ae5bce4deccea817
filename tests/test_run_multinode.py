"""One run from many exports (issue 24): a synthetic 4-node x 8-GPU run recorded as 32 per-rank
exports, each on its own clock (every node's clock off by a known amount, most files with their
own capture start), against the hand-made waits and copy overlaps and against the same run
recorded as one export on one clock.

The run, in true time (ns): every rank has a backward range [0, 200 us) and an update range
[200 us, 400 us). Backward holds three AllReduces: instance k starts on rank r at
``20 us + 50 us k + DELAY[k][r]`` and ends at ``50 us + 50 us k`` on every rank (a collective
ends together everywhere); rank 13 arrives last in each. The update holds one 4 MB pinned H2D
copy per rank, GPU l of node n at ``210 us + 1 us n + 3 us l`` for 10 us: the copies of one node
overlap, and those of different nodes must not count together.
"""

import json
import sqlite3

import numpy as np
import polars as pl
import pytest
from conftest import run_cli
from synthetic import MARK, SyntheticTrace, gtid

from tracekit.analyze import multi, run_clock

NODES, GPUS = 4, 8
RANKS = NODES * GPUS
US = 1_000
BASE_UTC = 1_796_000_000_000_000_000
#: each node's clock error (ns): what its clock reads minus the true time
NODE_ERROR = [0, 1_700_000, -900_000, 3_100_000]
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
SLOW = 13  # the rank the others wait for

pytestmark = pytest.mark.slow  # 33 analyses (the 32 exports and the whole run): ~10-15 s on 2 cores


def delay(k: int, r: int) -> int:
    """Arrival of rank r at AllReduce k after the instance's earliest possible start (ns)."""
    return 15 * US if r == SLOW else ((r * 5 + k * 11) % 13) * US


def session_start(node: int, local: int) -> int:
    """True time (ns) of the capture start of rank (node, local)'s export: node 0's eight
    exports start together (one clock group); every other export has a start of its own."""
    return -5_000 * US if node == 0 else -(5_000 * US + 37 * US * local + 100 * US * node)


def _rank(t: SyntheticTrace, node: int, local: int, pid: int, shift: int) -> None:
    """Rank (node, local)'s events in ``t``, times ``true + shift``."""
    r = node * GPUS + local
    tid = gtid(pid, 1)
    t.nvtx.append((shift + 10, None, MARK, f"rank {r} local_rank {local} world {RANKS}", tid, None, None,
                   t.domain("tracekit", tid)))
    t.range("DeepSpeedEngine.backward", shift, shift + 200 * US, tid, "DeepSpeed")
    t.range("DeepSpeedZeroOptimizer_Stage3.step", shift + 200 * US, shift + 400 * US, tid, "DeepSpeed")
    for k in range(3):
        s = shift + 20 * US + 50 * US * k + delay(k, r)
        t.kernel(s, shift + 50 * US + 50 * US * k, pid=pid, tid=1, launch=s - 500, device=local, stream=20, name=AR)
    t.kernel(shift + 180 * US, shift + 190 * US, pid=pid, tid=1, launch=shift + 179 * US, device=local, name="gemm")
    c0 = shift + 210 * US + US * node + 3 * US * local
    t.copy(c0, c0 + 10 * US, 4_000_000, 1, pid=pid, tid=1, launch=c0 - 1000, device=local, src=1, dst=2)


def _target_info(path, utc: int, hosts: dict[int, str]) -> None:
    con = sqlite3.connect(path)
    con.executescript("""CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
                         CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INTEGER, devStateName TEXT, name TEXT,
                                                              nameEnum INTEGER, value TEXT);""")
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (utc,))
    con.executemany("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (?, '', 'Hostname', 0, ?)", list(hosts.items()))
    con.commit()
    con.close()


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """(folder of the 32 per-rank exports, the one export of the whole run)."""
    root = tmp_path_factory.mktemp("multinode")
    folder = root / "ranks"
    folder.mkdir()
    for node in range(NODES):
        for local in range(GPUS):
            # per-rank exports: every machine's nsys says globalVid 1 << 48 (as real exports do), so
            # the same pid on two nodes has the same globalPid; times count from the export's start
            t = SyntheticTrace()
            s = session_start(node, local)
            _rank(t, node, local, pid=(1 << 24) + 1000 + local, shift=-s)
            p = t.write(folder / f"synthetic_rank{node * GPUS + local}.sqlite")
            _target_info(p, BASE_UTC + s + NODE_ERROR[node], {1 << 48: f"node{node}"})
    whole = SyntheticTrace()  # on one clock: rank 0's (node 0 has no clock error)
    for node in range(NODES):
        for local in range(GPUS):
            _rank(whole, node, local, pid=((node + 1) << 24) + 1000 + local, shift=-session_start(0, 0))
    wp = whole.write(root / "synthetic_whole_run.sqlite")
    _target_info(wp, BASE_UTC + session_start(0, 0), {(n + 1) << 48: f"node{n}" for n in range(NODES)})
    return folder, wp


@pytest.fixture(scope="module")
def analyzed(grid):
    folder, whole = grid
    many = multi.analyze_many([folder], {"sections": ()}, cache=False, jobs=1, want="compact")
    single = multi.analyze_one(whole, {"sections": ()}, cache=False)
    return many, single


def _expected_waits() -> dict[int, int]:
    """Per rank, the summed wait of its three AllReduces, by a loop over the hand-made delays:
    wait = min(last start, end) - own start (no two collectives of a rank overlap)."""
    out = {}
    for r in range(RANKS):
        w = 0
        for k in range(3):
            starts = [20 * US + 50 * US * k + delay(k, q) for q in range(RANKS)]
            w += min(max(starts), 50 * US + 50 * US * k) - starts[r]
        out[r] = w
    return out


def _node_overlap(node: int) -> dict:
    """Brute force over the ns of one node's update: time with >= 2 of its GPUs copying, and the
    union of its copies."""
    counts = np.zeros(500 * US, np.int64)
    for local in range(GPUS):
        c0 = 210 * US + US * node + 3 * US * local
        counts[c0:c0 + 10 * US] += 1
    return {"concurrent_ns": int((counts >= 2).sum()), "copy_busy_ns": int((counts >= 1).sum())}


def test_clocks_recovered_exactly(analyzed):
    run = analyzed[0]["run"]
    clock = run["clock"]
    assert run["one_run"] is True and clock["method"] == "collective end times"
    assert clock["groups"] == 1 + (NODES - 1) * GPUS  # node 0's exports share one start
    assert clock["residual_skew_ns"] == 0 and clock["max_end_spread_ns"] == 0
    assert clock["collectives_used"] == 3
    assert clock["reference"].endswith("synthetic_rank0.sqlite")
    files = {f["trace"].rsplit("/", 1)[-1]: f for f in clock["files"]}
    for node in range(NODES):
        for local in range(GPUS):
            f = files[f"synthetic_rank{node * GPUS + local}.sqlite"]
            assert f["host"] == f"node{node}"
            # the capture start puts node n at its clock error off node 0; the collectives take it back
            assert f["correction_ns"] == NODE_ERROR[0] - NODE_ERROR[node]
            assert f["aligned_by"] == "collective end times"
    # step 1 alone: the start offsets, from the capture starts written into the exports, onto
    # rank 0's clock; then the correction: each export's times shifted by the two
    f13 = files["synthetic_rank13.sqlite"]
    assert f13["start_offset_ns"] == session_start(1, 5) + NODE_ERROR[1] - session_start(0, 0)
    assert f13["shift_ns"] == session_start(1, 5) - session_start(0, 0)
    assert files["synthetic_rank0.sqlite"]["shift_ns"] == 0


def test_hosts_and_ranks(analyzed):
    run = analyzed[0]["run"]
    assert run["ranks"] == RANKS and run["rank_order"]["source"] == "nvtx"
    assert run["ranks_per_host"] == {f"node{n}": GPUS for n in range(NODES)}
    for h in run["hosts"]:
        n = int(h["host"][4:])
        assert [r["rank"] for r in h["ranks"]] == list(range(n * GPUS, (n + 1) * GPUS))
        assert [r["device"] for r in h["ranks"]] == list(range(GPUS))
        assert [r["pid"] for r in h["ranks"]] == [1000 + g for g in range(GPUS)]  # same pids on every node


def test_waits_equal_hand_values(analyzed):
    run = analyzed[0]["run"]
    exp = _expected_waits()
    assert exp[SLOW] == 0 and exp[0] == 15_000 + 4_000 + 6_000  # delays 0, 11 and 9 us of rank 0
    per = [r for r in run["waiting_ranks"]["per_rank"] if r["phase"] == "backward"]
    assert {r["rank"]: r["wait_ns"] for r in per} == exp
    assert all(r["collectives"] == 3 and r["collective_ns"] == sum(30 * US - delay(k, r["rank"]) for k in range(3))
               for r in per)
    assert {r["rank"]: r["last_arrivals"] for r in per} == {r: 3 if r == SLOW else 0 for r in range(RANKS)}
    slow = [s for s in run["waiting_ranks"]["slowest"] if s["phase"] == "backward"]
    assert [(s["rank"], s["wait_ns"], s["others_wait_ns"]) for s in slow] == [(SLOW, 0, sum(exp.values()))]
    assert run["waiting_ranks"]["unmatched_collectives"] == 0


def test_host_contention_per_node(analyzed):
    run = analyzed[0]["run"]
    for h in run["hosts"]:
        n = int(h["host"][4:])
        hc = h["host_contention"]
        exp = _node_overlap(n)
        assert hc["devices"] == list(range(GPUS))
        assert hc["concurrent_ns"] == exp["concurrent_ns"] == hc["h2d_ns"]  # [3 us, 28 us)
        assert hc["copy_busy_ns"] == exp["copy_busy_ns"] == 31 * US
        assert hc["d2h_ns"] == 0 and hc["mixed_ns"] == 0


def test_same_numbers_as_one_export(analyzed):
    many, single = analyzed
    run = many["run"]
    assert run["waiting_ranks"] == single["waiting_ranks"]
    assert {h["host"]: h["host_contention"] for h in run["hosts"]} == \
        {h["host"]: h["host_contention"] for h in single["hosts"]}


def test_without_the_collectives_the_clocks_stay_apart():
    """The capture starts alone (no collective to align on) leave every export of node n off
    the true shift by node n's clock error: 1.7 ms for node 1, longer than any of the waits."""
    clocks = [{"utc_start_ns": BASE_UTC + session_start(n, g) + NODE_ERROR[n], "host": f"node{n}"}
              for n in range(NODES) for g in range(GPUS)]
    keyed = pl.DataFrame(schema={"part": pl.Int64, "comm_stream": pl.Int64, "collective": pl.String,
                                 "seq": pl.Int64, "end": pl.Int64})
    out = run_clock.align(clocks, keyed)
    assert out["method"] == "capture start" and out["residual_skew_ns"] is None
    assert out["correction_ns"] == [0] * RANKS
    true_shift = [session_start(n, g) - session_start(0, 0) for n in range(NODES) for g in range(GPUS)]
    assert [a - b for a, b in zip(out["shift_ns"], true_shift)] == [NODE_ERROR[n] for n in range(NODES)
                                                                    for _ in range(GPUS)]


def test_cli_json_has_the_run(grid):
    folder, _ = grid
    files = sorted(folder.glob("*.sqlite"))[:GPUS + 2]  # by name: ranks 0, 1 (node 0), 10-15 (node 1), 16, 17
    rc, out, err = run_cli("analyze", *map(str, files), "--json", "--no-cache", "--jobs", "1")
    assert rc == 0, err
    d = json.loads(out)
    assert set(d) == {"traces", "failed", "summary", "run"}
    run = d["run"]
    assert run["one_run"] is True and run["files"] == [str(f) for f in files]
    assert sum(run["ranks_per_host"].values()) == len(files) == run["ranks"]
    assert run["clock"]["method"] == "collective end times" and run["clock"]["residual_skew_ns"] == 0
