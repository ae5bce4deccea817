"""Communication kernels apart from compute (issue 12): names, kernel busy / GPU idle /
overlap on a synthetic two-device trace (checked on an integer time grid) and on the shared
two-GPU torchrun export (checked with plain SQL and a loop)."""

import sqlite3

import polars as pl
import pytest
from conftest import PUBLIC
from conftest import union_length_loop as loop_union
from synthetic import SyntheticTrace, gtid

from tracekit.analyze.model import communication, phases
from tracekit.analyze.sections import breakdown, overlap
from tracekit.analyze.trace.export import Export

TWO_GPU = PUBLIC / "nsys-ai__mfu_2gpu_before.sqlite"


@pytest.mark.parametrize("name,comm,kind", [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True, "AllGather"),
    ("_Z22ncclDevKernel_SendRecv24ncclDevKernelArgsStorageILm4096EE", True, "SendRecv"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", True, "AllReduce"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", True, "ReduceScatter"),
    ("void vllm::cross_device_reduce_1stage<float, 2>(...)", True, "AllReduce"),
    ("one_shot_all_reduce_kernel", True, "AllReduce"),
    ("c10d::intra_node_comm::allReduceKernel", True, "AllReduce"),
    ("vectorized_gather_kernel", False, None),
    ("void at::native::reduce_kernel<512, 1>(...)", False, None),
    ("flash_fwd_kernel", False, None),
    ("", False, None),
])
def test_names(name, comm, kind):
    assert communication.is_communication(name) is comm
    assert communication.collective_kind(name) == kind


# --------------------------------------------------------------------------- synthetic
def _two_device_trace(tmp_path):
    """Two processes (pids 1, 2) on devices 0, 1; one DeepSpeed backward window [0, 1000) each.
    Device 0: compute [100, 300), NCCL [250, 600), H2D copy [500, 700), compute [650, 800).
    Device 1: NCCL [0, 400) (launched at 0), compute [400, 500), D2H [450, 900)."""
    t = SyntheticTrace()
    for pid in (1, 2):
        t.range("DeepSpeedEngine.backward", 0, 1000, gtid(pid, 1), "DeepSpeed")
        t.range("DeepSpeedZeroOptimizer_Stage3.step", 1000, 1100, gtid(pid, 1), "DeepSpeed")
    t.kernel(100, 300, pid=1, tid=1, launch=10, device=0, name="gemm")
    t.kernel(250, 600, pid=1, tid=1, launch=20, device=0, stream=9, name="ncclDevKernel_AllGather_RING_LL(x)")
    t.copy(500, 700, 2000, 1, pid=1, tid=1, launch=30, device=0)
    t.kernel(650, 800, pid=1, tid=1, launch=40, device=0, name="gemm")
    t.kernel(0, 400, pid=2, tid=1, launch=0, device=1, stream=9, name="ncclDevKernel_AllGather_RING_LL(x)")
    t.kernel(400, 500, pid=2, tid=1, launch=5, device=1, name="gemm")
    t.copy(450, 900, 4500, 2, pid=2, tid=1, launch=6, device=1)
    path = t.write(tmp_path / "synthetic_two_device_comm.sqlite")
    with Export.open(path) as e:
        return phases.build(e)


def _grid(intervals, lo=0, hi=1000):
    """Set of integer ns t in [lo, hi) covered by some [s, e)."""
    return {t for s, e in intervals for t in range(max(s, lo), min(e, hi))}


def test_synthetic_busy_idle_overlap_on_grid(tmp_path):
    m = _two_device_trace(tmp_path)
    comp = {0: [(100, 300), (650, 800)], 1: [(400, 500)]}
    comm = {0: [(250, 600)], 1: [(0, 400)]}
    copies = {0: [(500, 700)], 1: [(450, 900)]}
    tot = breakdown.totals(m).filter(pl.col("phase") == "backward")
    ov = overlap.overlap(m, by=("phase",)).filter(pl.col("phase") == "backward")
    for dev in (0, 1):
        r = tot.filter(pl.col("device") == dev).row(0, named=True)
        assert r["kernel_busy_ns"] == len(_grid(comp[dev]))
        assert r["comm_busy_ns"] == len(_grid(comm[dev]))
        assert (r["kernel_count"], r["comm_count"]) == (len(comp[dev]), 1)
        # GPU idle: no compute kernel and no copy running (communication does not count)
        assert r["gpu_idle_ns"] == 1000 - len(_grid(comp[dev] + copies[dev]))
        o = ov.filter(pl.col("device") == dev).row(0, named=True)
        assert o["copy_overlap_ns"] == len(_grid(copies[dev]) & _grid(comp[dev]))
        assert o["copy_comm_overlap_ns"] == len(_grid(copies[dev]) & _grid(comm[dev]))
        assert o["copy_exposed_ns"] == len(_grid(copies[dev]) - _grid(comp[dev]))
    # hand check of the grid itself: device 0's copy [500, 700) is under NCCL for 100 ns, compute for 50
    o0 = ov.filter(pl.col("device") == 0).row(0, named=True)
    assert (o0["copy_comm_overlap_ns"], o0["copy_overlap_ns"]) == (100, 50)


def test_sub_phase_table_splits_communication(tmp_path):
    m = _two_device_trace(tmp_path)
    sub = breakdown.sub_phase_table(m, "backward")
    d1 = sub.filter(pl.col("device") == 1)
    assert d1["kernel_busy_ns"].sum() == 100 and d1["comm_busy_ns"].sum() == 400
    # sub-phase GPU idle leaves communication out: 1000 - |[400,500) u [450,900)| = 500
    assert d1["gpu_idle_ns"].sum() == 500


# --------------------------------------------------------------------------- the shared two-GPU export
@pytest.fixture(scope="module")
def two_gpu():
    if not TWO_GPU.exists():
        pytest.skip("shared two-GPU export not present")
    with Export.open(TWO_GPU) as e:
        m = phases.build(e)
    con = sqlite3.connect(f"file:{TWO_GPU}?mode=ro", uri=True)
    yield m, con
    con.close()


def test_two_gpu_comm_and_compute_match_sql(two_gpu):
    m, con = two_gpu
    tot = breakdown.totals(m)
    # the export has no phase ranges: everything is 'other'
    assert tot["phase"].unique().to_list() == ["other"]
    for dev in (0, 1):
        rows = con.execute(
            """SELECT k.start, k."end", s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k
               JOIN StringIds s ON s.id = k.demangledName WHERE k.deviceId = ?""", (dev,)).fetchall()
        nccl = [(s, e) for s, e, n in rows if "nccl" in n.lower()]
        comp = [(s, e) for s, e, n in rows if "nccl" not in n.lower()]
        r = tot.filter(pl.col("device") == dev).row(0, named=True)
        assert r["comm_count"] == len(nccl) == 33
        assert r["comm_busy_ns"] == loop_union(nccl)
        assert r["kernel_count"] == len(comp)
        assert r["kernel_busy_ns"] == loop_union(comp)
        # GPU idle inside the rank's 'other' window: wall minus the union of compute, copies, memsets
        other = con.execute(
            """SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = ?
               UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = ?""", (dev, dev)).fetchall()
        w0, w1 = r["start_ns"], r["end_ns"]
        busy = loop_union([(max(s, w0), min(e, w1)) for s, e in comp + other])
        assert r["gpu_idle_ns"] == r["wall_ns"] - busy
    # plain SQL: SELECT deviceId, sum("end" - start) ... WHERE shortName -> ncclDevKernel_SendRecv (no overlap)
    comm = dict(zip(tot["device"].to_list(), tot["comm_busy_ns"].to_list()))
    assert comm == {0: 17_172_652, 1: 8_229_100}


def test_rank_figure_shows_communication(tmp_path):
    """The report's per-rank figure: communication time per steady iteration, from the grid."""
    from tracekit.render import figures
    from tracekit.render.data import ReportData

    _two_device_trace(tmp_path)
    fig, frame = figures.rank_summary(ReportData.load(tmp_path / "synthetic_two_device_comm.sqlite"))
    got = frame.group_by("device").agg(pl.col("comm_ns").sum()).sort("device")["comm_ns"].to_list()
    # one complete iteration: device 0's NCCL [250, 600), device 1's [0, 400)
    assert got == [len(_grid([(250, 600)])), len(_grid([(0, 400)]))] == [350, 400]
    gids = {p.get_gid() for ax in fig.axes for p in ax.patches}
    assert {"comm:0", "comm:1"} <= gids
