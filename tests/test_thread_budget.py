"""One budget of threads for a many-trace run (issue 13 item 5): ``--jobs`` workers x their
polars and GPU_METRICS reader threads stay within the cores, and the default ``--jobs`` is what
the cores, the memory and the number of traces allow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tracekit.analyze import multi, multi_runners


def report_threads(path, opts, cache):
    """Run in a spawned worker: the thread settings it sees and the size of polars' pool."""
    import polars as pl

    from tracekit.analyze.sections import pcie_metrics

    return {"path": path, "pid": os.getpid(), "polars_env": os.environ.get("POLARS_MAX_THREADS"),
            "polars_pool": pl.thread_pool_size(), "read_threads": pcie_metrics.read_threads()}


def test_worker_threads_split_the_cores(monkeypatch):
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    monkeypatch.delenv("TRACEKIT_READ_THREADS", raising=False)
    # by hand: 16 cores / 4 workers = 4 each, 2 of them readers; 2 / 2 = 1; 3 / 8 -> at least 1
    assert multi.worker_threads(4, cores=16) == {"POLARS_MAX_THREADS": "4", "TRACEKIT_READ_THREADS": "2"}
    assert multi.worker_threads(2, cores=2) == {"POLARS_MAX_THREADS": "1", "TRACEKIT_READ_THREADS": "1"}
    assert multi.worker_threads(8, cores=3) == {"POLARS_MAX_THREADS": "1", "TRACEKIT_READ_THREADS": "1"}
    monkeypatch.setenv("POLARS_MAX_THREADS", "7")  # the user's own setting wins
    assert multi.worker_threads(4, cores=16)["POLARS_MAX_THREADS"] == "7"


def test_spawned_workers_get_the_budget_and_the_parent_keeps_its_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    monkeypatch.delenv("TRACEKIT_READ_THREADS", raising=False)
    monkeypatch.setattr(multi_runners, "usable_cores", lambda: 4)  # looked up there
    paths = [tmp_path / f"t{i}.sqlite" for i in range(4)]
    out = list(multi._iter_processes(paths, None, False, 2, work=report_threads))
    assert [o["path"] for o in out] == [str(p) for p in paths]
    assert len({o["pid"] for o in out}) <= 2
    for o in out:  # 4 cores / 2 workers
        assert (o["polars_env"], o["polars_pool"], o["read_threads"]) == ("2", 2, 2)
    assert "POLARS_MAX_THREADS" not in os.environ and "TRACEKIT_READ_THREADS" not in os.environ


def test_default_jobs_by_cores_traces_and_memory(tmp_path):
    big = tmp_path / "big.sqlite"
    with open(big, "wb") as fh:  # a sparse 600 MB file: st_size is what counts
        fh.truncate(600_000_000)
    small = [tmp_path / f"s{i}.sqlite" for i in range(3)]
    for p in small:
        p.write_bytes(b"x" * 1000)
    peak_big = multi.PEAK_FIXED_BYTES + multi.PEAK_PER_TRACE_BYTE * 600_000_000  # 428 MB
    assert multi.default_jobs(small, cores=8, memory=None) == 3            # one per trace
    assert multi.default_jobs(small * 4, cores=8, memory=None) == 8        # one per core
    assert multi.default_jobs([big] * 8, cores=8, memory=int(3 * peak_big) + 1) == 3  # memory bound
    assert multi.default_jobs([big] * 8, cores=8, memory=int(3 * peak_big) - 1) == 2
    assert multi.default_jobs([big] * 8, cores=8, memory=1) == 1           # never below 1
    assert multi.default_jobs([big] + small, cores=8, memory=int(2 * peak_big)) == 2  # the largest counts


def test_available_memory_is_at_most_meminfo():
    got = multi.available_memory()
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        pytest.skip("no /proc/meminfo on this system")
    avail = next(int(ln.split()[1]) * 1024 for ln in meminfo.read_text().splitlines()
                 if ln.startswith("MemAvailable:"))
    assert got is not None and 0 <= got <= avail * 1.05  # MemAvailable moves between the reads
