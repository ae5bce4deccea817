"""The default ``tracekit analyze`` screen of a multi-GPU trace (issue 23): <= 40 lines of <= 80
columns, the advice once per run, the phases across ranks per steady iteration, the ranks'
differences with numbers, and the findings as one-line summaries (also on one GPU).

tests/fixtures holds no multi-GPU DeepSpeed trace, so :func:`two_rank_copy` makes one from the
real ZeRO-3 fixture: every row of its training process copied to a second process (pid + 1)
on device 1, with that copy's timestamps stretched by a factor (a rank slower by that much).
The numbers on screen are checked against plain SQL on that file: the optimizer-step NVTX
ranges (the update phase) and the span from the first forward to the last step (the iterations
tile it), per process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import PUBLIC, ZERO3_CUT, run_cli
from test_waiting_ranks import _skew_trace

STRETCH = 1.2  # rank 1 is 20 % slower than rank 0: more than its iteration-to-iteration spread
STEP = "DeepSpeedZeroOptimizer_Stage3.step"
FORWARD = "DeepSpeedEngine.forward"


def two_rank_copy(src: Path, dst: Path, stretch: float = STRETCH) -> Path:
    """``src`` (one training process on device 0) with a copy of that process as a second rank
    (:func:`rank_copies` with one stretch). Returns ``dst``."""
    return rank_copies(src, dst, (stretch,))


def rank_copies(src: Path, dst: Path, stretches=(STRETCH,)) -> Path:
    """``src`` (one training process on device 0) with copies of that process as ranks 1, 2,
    ...: for copy k, the kernels, copies, memsets, syncs, CUDA events, memory events, runtime
    calls and NVTX ranges of the process with ``globalPid``/``globalTid`` + k * 2^24 (OS pid +
    k), ``deviceId`` k and every timestamp t mapped to t0 + (t - t0) * ``stretches[k - 1]`` (t0:
    the first NVTX range); the GPU, CUDA device, context, streams, process and thread names and
    the GPU metrics (``typeId`` + k) copied for device k. Returns ``dst``."""
    shutil.copy(src, dst)
    con = sqlite3.connect(dst)
    (gp,), = con.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    (t0,) = con.execute("SELECT MIN(start) FROM NVTX_EVENTS").fetchone()
    (ty,), = con.execute("SELECT DISTINCT typeId FROM GPU_METRICS").fetchall()
    pid = gp >> 24 & 0xFFFFFF
    end = con.execute("SELECT stopTime FROM ANALYSIS_DETAILS").fetchone()[0]

    def dup(table, where, repl):
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        sel = ", ".join(repl.get(c, c) for c in cols)
        con.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {sel} FROM {table} WHERE {where}")

    for k, stretch in enumerate(stretches, 1):
        step = k << 24

        def t(c):
            return f"CASE WHEN {c} IS NULL THEN NULL ELSE {t0} + CAST(({c} - {t0}) * {stretch} AS INTEGER) END"

        pid_rows = f"globalPid = {gp}"
        tid_rows = f"globalTid >= {gp} AND globalTid < {gp + (1 << 24)}"
        moved = {"globalPid": f"globalPid + {step}", "deviceId": str(k)}
        for tb in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                   "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"):
            dup(tb, pid_rows, {**moved, "start": t("start"), "end": t("end")})
        dup("CUPTI_ACTIVITY_KIND_CUDA_EVENT", pid_rows, moved)
        dup("CUDA_GPU_MEMORY_USAGE_EVENTS", pid_rows, {**moved, "start": t("start")})
        dup("CUPTI_ACTIVITY_KIND_RUNTIME", tid_rows, {"globalTid": f"globalTid + {step}", "start": t("start"),
                                                      "end": t("end")})
        dup("NVTX_EVENTS", tid_rows, {"globalTid": f"globalTid + {step}", "start": t("start"), "end": t("end"),
                                      "endGlobalTid": f"endGlobalTid + {step}"})
        dup("ThreadNames", tid_rows, {"globalTid": f"globalTid + {step}"})
        dup("PROCESSES", pid_rows, {"globalPid": f"globalPid + {step}", "pid": f"pid + {k}"})
        dup("TARGET_INFO_GPU", "id = 0", {"id": str(k), "busLocation": f"'0000:00:{6 + k:02x}.0'",
                                          "cuDevice": str(k), "uuid": f"'00000000-0000-0000-0000-{k:012d}'"})
        dup("TARGET_INFO_CUDA_DEVICE", f"pid = {pid}", {"gpuId": str(k), "cudaId": str(k), "pid": f"pid + {k}"})
        dup("TARGET_INFO_CUDA_CONTEXT_INFO", f"processId = {pid}", {"processId": f"processId + {k}",
                                                                     "deviceId": str(k)})
        dup("TARGET_INFO_CUDA_STREAM", f"processId = {pid}", {"processId": f"processId + {k}"})
        dup("TARGET_INFO_GPU_METRICS", f"typeId = {ty}", {"typeId": f"typeId + {k}", "sourceId": f"sourceId + {k}"})
        dup("GPU_METRICS", f"typeId = {ty}", {"typeId": f"typeId + {k}", "timestamp": t("timestamp"),
                                              "rawTimestamp": t("rawTimestamp")})
    last = t0 + int((end - t0) * max(1.0, *stretches))
    con.execute(f"UPDATE ANALYSIS_DETAILS SET stopTime = {last}, duration = {last} - startTime")
    con.commit()
    con.close()
    return dst


def _env(columns=None):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns:
        env["COLUMNS"] = str(columns)
    return env


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return two_rank_copy(ZERO3_CUT, tmp_path_factory.mktemp("two") / "two_rank.sqlite")


@pytest.fixture(scope="module")
def screen(two):
    rc, out, err = run_cli("analyze", two, "--no-cache", env=_env(80))
    assert rc == 0, err
    return out


def _sql_per_process(path: Path) -> dict[int, dict[str, float]]:
    """Per OS pid, from the NVTX ranges alone: the mean optimizer-step range (the update phase,
    ns) and the mean iteration (the first forward's start to the last step's end over the
    number of steps; the iterations tile that span)."""
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT (n.globalTid >> 24) & 16777215 AS pid, coalesce(n.text, s.value) AS name, n.start, n.end "
        "FROM NVTX_EVENTS n LEFT JOIN StringIds s ON n.textId = s.id WHERE n.end IS NOT NULL "
        f"AND coalesce(n.text, s.value) IN ('{STEP}', '{FORWARD}')").fetchall()
    con.close()
    out = {}
    for pid in sorted({r[0] for r in rows}):
        steps = [(s, e) for p, n, s, e in rows if p == pid and n == STEP]
        first = min(s for p, n, s, e in rows if p == pid and n == FORWARD)
        out[pid] = {"update_ns": sum(e - s for s, e in steps) / len(steps),
                    "iteration_ns": (max(e for _, e in steps) - first) / len(steps)}
    return out


@pytest.mark.parametrize("columns", [80, None], ids=["COLUMNS=80", "piped"])
def test_two_ranks_fit_one_screen(two, columns):
    rc, out, err = run_cli("analyze", two, "--no-cache", env=_env(columns))
    assert rc == 0, err
    lines = out.splitlines()
    assert 10 <= len(lines) <= 40, out
    assert max(len(x) for x in lines) <= 80, out


def test_four_ranks_fit_one_screen(tmp_path):
    four = rank_copies(ZERO3_CUT, tmp_path / "four_rank.sqlite", (1.05, 1.1, 1.3))
    rc, out, err = run_cli("analyze", four, "--no-cache", env=_env(80))
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) <= 40 and max(len(x) for x in lines) <= 80, out
    sql = _sql_per_process(four)
    it = [sql[p]["iteration_ns"] / 1e6 for p in sorted(sql)]
    assert len(it) == 4
    flat = " ".join(out.split())
    assert f"ranks: iteration {it[0]:,.1f} (rank 0) to {it[3]:,.1f} ms (rank 3) per steady iteration" in flat
    assert "advice once for 4 ranks" in flat


def test_two_ranks_are_two_ranks(two):
    con = sqlite3.connect(two)
    assert con.execute("SELECT COUNT(DISTINCT globalPid), COUNT(DISTINCT deviceId) "
                       "FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone() == (2, 2)
    con.close()


def test_advice_once_per_run(two, screen):
    rc, out, _ = run_cli("analyze", two, "--no-cache", "--json", env=_env())
    per_rank = json.loads(out)["advice"]
    changes = {(a["knob"], a["change"]) for a in per_rank}
    assert len(per_rank) == 2 * len(changes)  # the fixture's advice on both ranks
    rows = [x for x in screen.splitlines() if re.match(r"\d+ {2,}\S", x)]
    assert len(rows) == len(changes), screen  # each change once
    assert "pid 642 device 0:" not in screen and "pid 643 device 1:" not in screen
    # the saving per steady iteration of each rank's item, as the row's min-max
    for i, (knob, change) in enumerate(sorted(changes, key=lambda c: -sum(
            a["saving_ms_per_iteration"] for a in per_rank if (a["knob"], a["change"]) == c)), 1):
        s = sorted(a["saving_ms_per_iteration"] for a in per_rank if (a["knob"], a["change"]) == (knob, change))
        row = next(x for x in rows if x.startswith(f"{i} "))
        assert f"{s[0]:,.1f}-{s[1]:,.1f}" in row and f"{(s[0] + s[1]) / 2:,.1f}" in row


def test_phases_across_ranks_match_sql(two, screen):
    sql = _sql_per_process(two)
    assert sorted(sql) == [642, 643]
    assert "phases of 2 ranks: ms per steady iteration (1-2)" in screen
    upd = [u["update_ns"] / 1e6 for u in sql.values()]
    row = next(x.split() for x in screen.splitlines() if x.startswith("update "))
    assert row[1:4] == [f"{sum(upd) / 2:,.1f}", f"{min(upd):,.1f}", f"{max(upd):,.1f}"]
    assert row[4:6] == ["rank", "1"]  # the stretched copy has the longest update
    it = {pid: v["iteration_ns"] / 1e6 for pid, v in sql.items()}
    assert it[643] == pytest.approx(STRETCH * it[642], rel=1e-6)
    flat = " ".join(screen.split())
    assert (f"ranks: iteration {it[642]:,.1f} (rank 0) to {it[643]:,.1f} ms (rank 1) per steady iteration; "
            "rank 1 is the slowest") in flat
    assert "waiting: no collective kernels" in flat  # the fixture has none (one GPU recorded)


def test_findings_once_per_run_with_rank_spread(two, screen):
    sql = _sql_per_process(two)
    lines = " ".join(screen.split("findings, one line each")[1].split())
    upd = sorted(v["update_ns"] / 1e6 for v in sql.values())
    # the update finding once, the slowest rank's line, and the range over the ranks
    assert lines.count("update CPU-bound") == 1
    assert f"of {upd[1]:,.1f} ms/it" in lines and f"(ranks {upd[0]:,.1f}-{upd[1]:,.1f} ms/it, most: rank 1)" in lines
    assert "…" not in screen.split("findings, one line each")[1]


def test_explain_has_every_rank_and_finding_whole(two):
    import tracekit

    j = tracekit.analyze(two, tracekit.Options(sections=()), cache=False).to_json()  # the table's sections
    rc, ex, _ = run_cli("analyze", two, "--no-cache", "--explain", env=_env(80))
    assert rc == 0
    flat = " ".join(ex.split())
    for a in j["advice"]:
        assert " ".join(a["basis"].split()) in flat
    for f in j["findings"]:
        assert " ".join(f["text"].split()) in flat
    n = len(j["advice_per_run"])
    rc, _, err = run_cli("analyze", two, "--no-cache", f"--explain={n + 1}", env=_env(80))
    assert rc == 2 and f"the advice has {n} item(s)" in err


def test_wide_keeps_every_rank(two):
    rc, out, _ = run_cli("analyze", two, "--no-cache", "--wide", env=_env())
    assert rc == 0
    assert "rank 0 (pid 642 device 0): per iteration and phase" in out
    assert "rank 1 (pid 643 device 1): per iteration and phase" in out


def test_one_gpu_findings_are_summaries_with_sql_numbers():
    rc, out, _ = run_cli("analyze", ZERO3_CUT, "--no-cache", env=_env(80))
    assert rc == 0
    part = out.split("findings, one line each")[1]
    assert "…" not in part
    (upd,) = [v["update_ns"] / 1e6 for v in _sql_per_process(ZERO3_CUT).values()]
    line = next(x for x in part.splitlines() if x.startswith("- update CPU-bound"))
    assert f"of {upd:,.1f} ms/it" in line  # the optimizer-step ranges' mean (125.5 ms)
    rc, out, _ = run_cli("analyze", ZERO3_CUT, "--no-cache", "--json", env=_env())
    for f in json.loads(out)["findings"]:
        assert f["summary"] and "\n" not in f["summary"] and len(f["summary"]) <= 80, f


# the public exports: ../shared beside the checkout, or the workplace's shared folder (as test_claims)
_PUB = next((p for p in (PUBLIC, Path(__file__).resolve().parents[3] / "shared" / "traces" / "public")
             if p.is_dir()), PUBLIC)
TWO_GPU = _PUB / "nsys-ai__mfu_2gpu_before.sqlite"


def test_synthetic_collectives_fit(tmp_path):
    rc, out, err = run_cli("analyze", _skew_trace(tmp_path), "--no-cache", env=_env(80))
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) <= 40 and max(len(x) for x in lines) <= 80, out
    assert "waiting for the last rank in collectives per steady iteration" in out


def test_public_two_gpu_export_waits_against_sql():
    """No phase ranges in this export: the ranks are compared over the whole trace ("in all");
    the waits are those of test_waiting_ranks' SQL (the k-th SendRecv of each GPU is one
    operation; a rank waits from its start to the last rank's start, within its kernel)."""
    if not TWO_GPU.exists():
        pytest.skip(f"{TWO_GPU} not present")
    from conftest import union_length_loop

    con = sqlite3.connect(f"file:{TWO_GPU}?mode=ro", uri=True)
    per_dev = {dev: con.execute(
        """SELECT k.start, k."end" FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
           WHERE k.deviceId = ? AND s.value = 'ncclDevKernel_SendRecv' ORDER BY k.start""", (dev,)).fetchall()
        for dev in (0, 1)}
    con.close()
    waits = {0: [], 1: []}
    for a, b in zip(per_dev[0], per_dev[1]):
        last = max(a[0], b[0])
        for dev, (st, en) in ((0, a), (1, b)):
            waits[dev].append((st, min(last, en)))
    w = {dev: union_length_loop(v) / 1e6 for dev, v in waits.items()}
    assert w[0] > 2 * w[1]  # device 0 (rank 0 in device order) waits most
    rc, out, err = run_cli("analyze", TWO_GPU, "--no-cache", env=_env(80))
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) <= 40 and max(len(x) for x in lines) <= 80, out
    flat = " ".join(out.split())
    assert (f"waiting for the last rank in collectives in all: rank 0 most, {w[0]:,.1f} ms vs {w[1]:,.1f} ms on the "
            f"others (rank 0 {w[0]:,.1f}, rank 1 {w[1]:,.1f} ms)") in flat
    assert "phases of 2 ranks: ms in all (whole trace)" in flat
