"""``--dask``: per-trace work on a Dask cluster gives the same result as local processes."""

from __future__ import annotations

import json
import shutil
import socket

import pytest

distributed = pytest.importorskip("distributed")

from tracekit.analyze.multi import analyze_many  # noqa: E402
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
