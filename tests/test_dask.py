"""``--dask``: per-trace work on a Dask cluster gives the same result as local processes; a
trace the worker cannot see, a worker that dies, a scheduler without workers are each one line."""

from __future__ import annotations

import json
import shutil
import socket
import time

import pytest

distributed = pytest.importorskip("distributed")

from tracekit.analyze import multi  # noqa: E402
from tracekit.analyze.multi import analyze_many, analyze_one  # noqa: E402
from tracekit.cli import main  # noqa: E402
from tracekit.errors import TracekitError  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
    ) as c:
        yield c


@pytest.fixture
def runs(tmp_path, zero3_cut, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "caches"))
    d = tmp_path / "runs"
    d.mkdir()
    for i in (0, 1, 3):
        shutil.copy(zero3_cut, d / f"rank{i}.sqlite")
    return d


def _core(out: dict) -> dict:
    return {
        "summary": out["summary"],
        "traces": [
            [{k: r[k] for k in ("pid", "device", "iterations", "totals")} for r in t["ranks"]] for t in out["traces"]
        ],
        "paths": [t["trace"] for t in out["traces"]],
    }


def test_dask_equals_local_processes(cluster, runs):
    local = analyze_many([runs], jobs=2, cache=False)
    remote = analyze_many([runs], dask=cluster.scheduler_address, cache=False)
    assert _core(remote) == _core(local)
    assert remote["summary"]["missing_ranks"] == [2]


def test_dask_with_cache(cluster, runs):
    first = analyze_many([runs], dask=cluster.scheduler_address, cache=True)
    again = analyze_many([runs], dask=cluster.scheduler_address, cache=True)
    assert again == first  # the second pass is served from the result cache


def test_cli_dask(cluster, runs, capsys):
    assert main(["analyze", str(runs), "--dask", cluster.scheduler_address, "--json", "--no-cache"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["ranks"] == 3


def test_dask_missing_trace_named(cluster, runs, capsys):
    rc = main(["analyze", str(runs / "rank0.sqlite"), str(runs / "rank5.sqlite"), "--dask", cluster.scheduler_address])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "rank5.sqlite" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler(runs, monkeypatch, capsys):
    monkeypatch.setenv("TRACEKIT_DASK_TIMEOUT", "2")
    address = f"tcp://127.0.0.1:{_free_port()}"
    with pytest.raises(TracekitError, match="cannot reach the Dask scheduler"):
        analyze_many([runs], dask=address)
    rc = main(["analyze", str(runs), "--dask", address])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and address in err


def test_bad_address(runs, capsys):
    rc = main(["analyze", str(runs), "--dask", "nonsense://x"])
    err = capsys.readouterr().err
    assert rc == 2 and "nonsense://x" in err and err.count("\n") == 1 and "not a Dask scheduler address" in err


def test_dask_bad_trace_named(cluster, runs, capsys):
    (runs / "rank1.sqlite").write_bytes(b"not an export")
    rc = main(["analyze", str(runs), "--dask", cluster.scheduler_address, "--no-cache"])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    # one line naming the bad trace, one saying the others were reported (issue 9, d13)
    assert rc == 2 and len(lines) == 2
    assert "rank1.sqlite" in lines[0] and "1 of 3 traces could not be analyzed" in lines[1]
    assert "2 ranks in 2 traces" in captured.out


def _ranks(result: dict) -> list:
    return [{k: r[k] for k in ("pid", "device", "iterations", "totals")} for r in result["ranks"]]


def test_worker_without_the_trace(cluster, runs, tmp_path):
    """A path the client has but a worker does not (no shared file system): that trace is named
    as missing on the worker, the others are analyzed, in input order."""
    from tracekit.options import Options

    elsewhere = tmp_path / "not-on-the-worker" / "rank2.sqlite"
    paths = [runs / "rank3.sqlite", elsewhere, runs / "rank0.sqlite"]
    out = list(multi._iter_dask(cluster.scheduler_address, paths, Options.of(None), False))
    local = analyze_one(runs / "rank0.sqlite", cache=False)
    assert [type(o).__name__ for o in out] == ["dict", "TracekitError", "dict"]
    assert out[0]["trace"] == str(paths[0]) and out[2]["trace"] == str(paths[2])
    assert _ranks(out[0]) == _ranks(out[2]) == _ranks(local)
    assert str(out[1]).startswith(f"{elsewhere}: no such file on the Dask worker on {socket.gethostname()}")
    assert "shared file system" in str(out[1]) and out[1].exit_code == 2


def test_scheduler_without_workers(runs, monkeypatch, capsys):
    """No worker ever joins: one line after the timeout instead of waiting forever."""
    monkeypatch.setenv("TRACEKIT_DASK_TIMEOUT", "1")
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as empty:
        t0 = time.monotonic()
        rc = main(["analyze", str(runs), "--dask", empty.scheduler_address, "--no-cache"])
        waited = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "has no workers" in err and empty.scheduler_address in err
    assert waited < 10


_DIE_ON_RANK1 = """
import os, time
import tracekit.analyze.multi as m
if not hasattr(m, "_real_analyze_one"):  # Dask may run a preload twice
    m._real_analyze_one = m.analyze_one
def analyze_one(path, options=None, cache=True):
    if os.path.basename(str(path)) == "rank1.sqlite":
        time.sleep(0.5)  # the client has fetched rank0's result by now
        os._exit(3)  # as the kernel's OOM killer would end it
    return m._real_analyze_one(path, options, cache)
m.analyze_one = analyze_one
"""


def test_worker_dies(runs, tmp_path):
    """A worker process killed while analyzing a trace (Dask: KilledWorker once the scheduler's
    allowed failures are spent) fails that trace only, as with --jobs; the others are reported."""
    import dask

    preload = tmp_path / "die_on_rank1.py"
    preload.write_text(_DIE_ON_RANK1)
    (runs / "rank3.sqlite").unlink()
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                                      preload=[str(preload)]) as c:
            out = analyze_many([runs], dask=c.scheduler_address, cache=False)
    assert [t["trace"] for t in out["traces"]] == [str(runs / "rank0.sqlite")]
    assert _ranks(out["traces"][0]) == _ranks(analyze_one(runs / "rank0.sqlite", cache=False))
    [failed] = out["failed"]
    assert failed["trace"] == str(runs / "rank1.sqlite") and failed["exit_code"] == 1
    assert failed["error"].startswith(f"{runs / 'rank1.sqlite'}: a worker of the Dask cluster died")
    assert out["summary"]["traces"] == 1 and out["summary"]["missing_ranks"] == []
