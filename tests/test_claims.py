"""Messages and claims on public exports (issue 25): what a missing-CUDA message says, the
whole-trace report of an export without NVTX, and the one significance rule of every comparing
claim (tracekit.analyze.significance)."""

import sqlite3
from pathlib import Path

import pytest
from conftest import PUBLIC, assert_one_line_error
from conftest import run_cli as run
from synthetic import SyntheticTrace

from tracekit.analyze.model import phases
from tracekit.analyze.result import analyze_export
from tracekit.analyze.trace import recording
from tracekit.analyze.trace.export import Export
from tracekit.errors import MissingDataError
from tracekit.vocab import NO_NVTX

# the public exports: ../shared beside the checkout, or the workplace's shared folder
_PUB = next((p for p in (PUBLIC, Path(__file__).resolve().parents[3] / "shared" / "traces" / "public")
             if p.is_dir()), None)
needs_public = pytest.mark.skipif(_PUB is None, reason="shared public exports not present")


# ---------------------------------------------------------------------- 1. missing CUDA work
def _no_gpu_work(path: Path, capture: list[tuple[str, str]] | None = None, overhead: list[str] | None = None,
                 runtime_calls: int = 0) -> Path:
    """synthetic: an export with NVTX ranges, ``runtime_calls`` CUDA runtime calls and no kernel
    or copy; ``capture`` rows of META_DATA_CAPTURE, ``overhead`` names of PROFILER_OVERHEAD."""
    t = SyntheticTrace()
    t.range("DeepSpeedEngine.forward", 0, 1000, tid=(7 << 24) + 1, domain="DeepSpeed")
    for i in range(runtime_calls):
        t.runtime.append((10 * i, 10 * i + 5, (7 << 24) + 1, 100 + i, t.sid("cudaStreamSynchronize")))
    for name in overhead or []:
        t.sid(name)
    t.write(path)
    con = sqlite3.connect(path)
    if capture is not None:
        con.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT)")
        con.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)", capture)
    if overhead is not None:
        con.execute("CREATE TABLE PROFILER_OVERHEAD (start INTEGER, \"end\" INTEGER, globalTid INTEGER, "
                    "nameId INTEGER, domainId INTEGER)")
        ids = dict(con.execute("SELECT value, id FROM StringIds").fetchall())
        con.executemany("INSERT INTO PROFILER_OVERHEAD VALUES (0, 10, 1, ?, 0)", [(ids[n],) for n in overhead])
    con.commit()
    con.close()
    return path


def _error(path: Path) -> str:
    with Export.open(path) as e, pytest.raises(MissingDataError) as exc:
        phases.build(e)
    return str(exc.value)


def test_synthetic_cuda_on_by_capture_settings_does_not_suggest_t_cuda(tmp_path):
    p = _no_gpu_work(tmp_path / "on.sqlite", capture=[("CAPTURE_EVENT_TYPE", "NvtxEvents"),
                                                       ("CAPTURE_EVENT_TYPE", "Cuda")], runtime_calls=3)
    msg = _error(p)
    assert "CUDA tracing was on (META_DATA_CAPTURE lists Cuda)" in msg
    assert "-t cuda" not in msg
    # what the export holds, counted by SQL: 3 runtime calls, 2 NVTX rows (domain create + range)
    assert "3 CUDA runtime calls, 2 NVTX events and no kernel or copy" in msg
    assert msg.startswith(f"{p}: CUPTI_ACTIVITY_KIND_KERNEL has no rows in this trace")  # the path as given


def test_synthetic_cuda_on_by_per_process_setting_or_runtime_rows_or_overhead(tmp_path):
    a = _no_gpu_work(tmp_path / "a.sqlite", capture=[("PROCESS_0:COLLECT_CUDA_TRACE", "true")])
    assert recording.traced(Export.open(a)) == recording.Traced(True, "META_DATA_CAPTURE says COLLECT_CUDA_TRACE true")
    b = _no_gpu_work(tmp_path / "b.sqlite", runtime_calls=1)  # no settings, but CUDA runtime calls recorded
    assert recording.traced(Export.open(b)) == recording.Traced(True, "CUPTI_ACTIVITY_KIND_RUNTIME has rows")
    c = _no_gpu_work(tmp_path / "c.sqlite", overhead=["NVTX profiling initialization", "CUPTI: Buffer flush"])
    assert recording.traced(Export.open(c)) == recording.Traced(True, "PROFILER_OVERHEAD has 'CUPTI: Buffer flush'")
    for p in (a, b, c):
        assert "-t cuda" not in _error(p)


def test_synthetic_cuda_off_or_unknown_suggests_t_cuda(tmp_path):
    off = _no_gpu_work(tmp_path / "off.sqlite", capture=[("CAPTURE_EVENT_TYPE", "NvtxEvents"),
                                                         ("PROCESS_0:COLLECT_CUDA_TRACE", "false")])
    msg = _error(off)
    assert "CUDA tracing was off (META_DATA_CAPTURE lists NvtxEvents, not Cuda" in msg
    assert msg.endswith("record it with `nsys profile -t cuda`")
    # only NVTX's own start-up in PROFILER_OVERHEAD: CUDA unknown
    unk = _no_gpu_work(tmp_path / "unk.sqlite", overhead=["NVTX profiling initialization"])
    assert recording.traced(Export.open(unk)) == recording.Traced(None)
    msg = _error(unk)
    assert "does not say whether CUDA tracing was on" in msg and msg.endswith("`nsys profile -t cuda`")


@needs_public
def test_public_exports_recording_settings():
    """Each public export's CUDA setting, against what its tables say (checked by hand with sqlite3)."""
    want = {"kmeans-parallel__report1.sqlite": None,  # no metadata, no CUDA table
            "DLProf__nsys_profile.sqlite": True,  # 2022.1: runtime rows
            "SC23-OpenMP-Tutorial__report3.sqlite": True,  # META_DATA_CAPTURE lists Cuda
            "nsys-ai__mfu_2gpu_before.sqlite": True}  # lists Cuda; its PROCESS_0:COLLECT_CUDA_TRACE is false
    for name, on in want.items():
        with Export.open(_PUB / name) as e:
            assert recording.traced(e).on is on, name
    rc, out, err = run("analyze", _PUB / "kmeans-parallel__report1.sqlite")
    assert_one_line_error(rc, out, err, "2 GPU descriptions and no kernel or copy, and does not say whether CUDA "
                                        "tracing was on; record it with `nsys profile -t cuda`")


# ---------------------------------------------------------------------- 2. no NVTX: whole-trace report
def _gpu_work(path: Path, nvtx: str) -> tuple[Path, SyntheticTrace]:
    """synthetic: 4 kernels and 3 copies of one process; ``nvtx``: "none" (no NVTX_EVENTS
    table), "empty" (the table, no rows) or "other" (ranges that are no phase)."""
    t = SyntheticTrace()
    tid = 1
    for i in range(4):
        t.kernel(1_000_000 * i, 1_000_000 * i + 400_000, pid=9, tid=tid, launch=1_000_000 * i - 10_000)
    t.copy(5_000_000, 5_300_000, 3 << 20, 1, pid=9, tid=tid, launch=4_990_000)
    t.copy(5_400_000, 5_500_000, 1 << 20, 2, pid=9, tid=tid, launch=5_390_000)
    t.copy(5_600_000, 5_700_000, 1000, 1, pid=9, tid=tid, launch=5_590_000)
    if nvtx == "other":
        t.range("my_loop", 0, 6_000_000, tid=(9 << 24) + tid)
    t.write(path)
    if nvtx == "none":
        con = sqlite3.connect(path)
        con.execute("DROP TABLE NVTX_EVENTS")
        con.commit()
        con.close()
    return path, t


@pytest.mark.parametrize("nvtx", ["none", "empty", "other"])
def test_synthetic_kernels_and_copies_without_phase_ranges_get_the_whole_trace(tmp_path, nvtx):
    path, t = _gpu_work(tmp_path / f"{nvtx}.sqlite", nvtx)
    with Export.open(path) as e:
        res = analyze_export(e)
    assert res["phase_source"] == {"9": NO_NVTX if nvtx in ("none", "empty") else "none"}
    (rank,) = res["ranks"]
    assert rank["iterations"] == [] and list(rank["totals"]) == ["other"]
    other = rank["totals"]["other"]
    # independent: the rows the synthetic trace wrote
    assert other["kernel_count"] == len(t.kernels) == 4
    assert other["h2d_bytes"] == sum(c[6] for c in t.memcpy if c[7] == 1) == (3 << 20) + 1000
    assert other["d2h_bytes"] == 1 << 20
    rc, out, err = run("analyze", path)
    assert rc == 0, err
    flat = " ".join(out.split())
    if nvtx == "other":
        assert "no phase ranges (tracekit capture or DeepSpeed NVTX)" in flat
    else:
        assert ("pid 9: no NVTX ranges in this trace: phases cannot be told apart, so the report covers the whole "
                "trace and all its GPU work is 'other'; record with `nsys profile -t cuda,nvtx` and "
                "`tracekit capture`") in flat


def test_synthetic_phase_map_on_a_trace_without_nvtx(tmp_path):
    path, _ = _gpu_work(tmp_path / "none.sqlite", "none")
    rc, out, err = run("analyze", path, "--phase-map", "forward=fwd")
    assert_one_line_error(rc, out, err, f"{path} has no NVTX ranges to match")


@needs_public
def test_public_openmp_export_without_nvtx_whole_trace_numbers():
    """SC23-OpenMP-Tutorial: 100 H2D + 100 D2H copies, 50 kernels, no NVTX_EVENTS table."""
    path = _PUB / "SC23-OpenMP-Tutorial__report3.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    h2d, n_h2d = con.execute("SELECT sum(bytes), count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1").fetchone()
    kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    with Export.open(path) as e:
        res = analyze_export(e)
    assert set(res["phase_source"].values()) == {NO_NVTX}
    other = res["ranks"][0]["totals"]["other"]
    assert (other["kernel_count"], other["h2d_bytes"], other["h2d_count"]) == (kernels, h2d, n_h2d)
