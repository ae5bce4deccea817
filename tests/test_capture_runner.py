"""``tracekit capture`` end to end with a FAKE nsys (``tests/fake_nsys/nsys``, not NVIDIA's).

The fake runs the training command, writes placeholder outputs and logs each call's argv and
environment, so these tests check what tracekit asks of nsys and what it does with the result.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracekit.capture import runner

FAKE_NSYS = str(Path(__file__).parent / "fake_nsys" / "nsys")
ROOT = Path(__file__).resolve().parents[1]


def capture(tmp_path, *args, mode="ok", gpu="supported", timeout=120):
    """Run the real CLI in a subprocess; returns (exit code, stderr, fake nsys calls)."""
    log = tmp_path / "fake_nsys.jsonl"
    env = dict(os.environ, FAKE_NSYS_MODE=mode, FAKE_NSYS_GPU=gpu, FAKE_NSYS_LOG=str(log))
    env.pop("TRACEKIT_NSYS", None)
    done = subprocess.run([sys.executable, "-m", "tracekit.cli", "capture", "--nsys", FAKE_NSYS, *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done.returncode, done.stderr, calls


def profile_call(calls):
    return next(c for c in calls if c.get("argv", [""])[0] == "profile"
                and "--gpu-metrics-devices=help" not in c["argv"])


def test_success_writes_three_files_and_manifest(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    rc, err, calls = capture(tmp_path, "-o", "run", "--", sys.executable, "-c", "print('hi')",
                             "--deepspeed_config", "ds.json")
    assert rc == 0, err
    for suffix in (".nsys-rep", ".sqlite", ".json"):
        assert (tmp_path / f"run{suffix}").is_file()
    assert not list(tmp_path.glob("*.part"))
    m = json.loads((tmp_path / "run.json").read_text())
    assert m["command"][-2:] == ["--deepspeed_config", "ds.json"]
    assert m["nsys"]["version"] == "2099.1.1.1-fake" and m["nsys"]["found_via"] == "--nsys"
    assert m["exit_status"] == {"nsys": 0, "tracekit": 0}
    assert m["deepspeed_config"] == {"zero_optimization": {"stage": 2}}  # from the command line
    assert m["gpu_metrics_devices"] == ["0: NVIDIA FAKE GPU PCI[0000:01:00.0]"]
    assert m["files"]["sqlite"]["bytes"] == (tmp_path / "run.sqlite").stat().st_size
    assert m["problems"] == [] and m["retry_commands"] == []
    call = profile_call(calls)
    assert "--gpu-metrics-devices=all" in call["argv"] and "--output=run" in call["argv"]
    # the training sees the hook
    assert call["env"]["TRACEKIT_HOOK"] == "1"
    assert call["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(runner.HOOK_DIR)
    assert "TRACEKIT_ITERATIONS" not in call["env"]
    assert "nsys 2099.1.1.1-fake at" in err


def test_training_exit_code_is_returned_and_capture_kept(tmp_path):
    rc, err, _ = capture(tmp_path, "-o", "run", "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert rc == 7
    assert (tmp_path / "run.sqlite").is_file()
    assert err.strip().splitlines()[-1].startswith("tracekit: error: the training exited with status 7")
    m = json.loads((tmp_path / "run.json").read_text())
    assert m["exit_status"] == {"nsys": 7, "tracekit": 7}


def test_refuses_existing_output_unless_force(tmp_path):
    (tmp_path / "run.sqlite").write_text("old")
    rc, err, calls = capture(tmp_path, "-o", "run", "--", "true")
    assert rc == 2 and "run.sqlite exists" in err and "--force" in err
    assert not any(c["argv"][0] == "profile" for c in calls)
    assert (tmp_path / "run.sqlite").read_text() == "old"
    rc, err, calls = capture(tmp_path, "-o", "run", "--force", "--", "true")
    assert rc == 0, err
    assert "--force-overwrite=true" in profile_call(calls)["argv"]
    assert runner.sqlite_ok(tmp_path / "run.sqlite")


def test_importer_failure_keeps_raw_capture_and_names_library(tmp_path):
    rc, err, _ = capture(tmp_path, "-o", "run", "--", "true", mode="importer-fail")
    assert rc == runner.EXIT_CAPTURE_FAILED
    assert (tmp_path / "run.qdstrm").read_bytes() == b"FAKE raw capture"
    assert "cannot load libdw.so.1" in err
    assert "QdstrmImporter --input-file run.qdstrm" in err
    m = json.loads((tmp_path / "run.json").read_text())
    assert m["files"]["raw_capture"]["path"] == "run.qdstrm"
    assert any("libdw.so.1" in p for p in m["problems"])
    assert len(m["retry_commands"]) == 2


def test_export_failure_keeps_report_and_prints_retry(tmp_path):
    rc, err, calls = capture(tmp_path, "-o", "run", "--", "true", mode="export-fail")
    assert rc == runner.EXIT_CAPTURE_FAILED
    assert (tmp_path / "run.nsys-rep").is_file() and not (tmp_path / "run.sqlite").exists()
    retry = f"{FAKE_NSYS} export --type=sqlite --force-overwrite=true --output=run.sqlite run.nsys-rep"
    assert retry in err
    assert [c["argv"][0] for c in calls].count("export") == 1  # tracekit tried once itself
    m = json.loads((tmp_path / "run.json").read_text())
    assert m["retry_commands"] == [retry]


def test_nothing_recorded(tmp_path):
    rc, err, _ = capture(tmp_path, "-o", "run", "--", "true", mode="no-report")
    assert rc == runner.EXIT_CAPTURE_FAILED
    assert "wrote no report" in err


def test_failed_training_and_failed_export_returns_training_code(tmp_path):
    rc, _, _ = capture(tmp_path, "-o", "run", "--", "sh", "-c", "exit 5", mode="export-fail")
    assert rc == 5


def test_gpu_metrics_off_when_unsupported(tmp_path):
    rc, err, calls = capture(tmp_path, "-o", "run", "--", "true", gpu="unsupported")
    assert rc == 0, err
    assert "GPU metrics off" in err
    assert not any(a.startswith("--gpu-metrics") for a in profile_call(calls)["argv"])
    assert json.loads((tmp_path / "run.json").read_text())["options"]["gpu_metrics"] is False


def test_iterations_and_user_options(tmp_path):
    rc, err, calls = capture(tmp_path, "-o", "run", "--iterations", "2-3", "--no-gpu-metrics",
                             "--nsys-option=--trace=cuda,nvtx,osrt", "--", "true")
    assert rc == 0, err
    call = profile_call(calls)
    assert call["env"]["TRACEKIT_ITERATIONS"] == "2-3"
    assert "--capture-range=cudaProfilerApi" in call["argv"]
    assert "--capture-range-end=stop" in call["argv"]
    assert "--trace=cuda,nvtx,osrt" in call["argv"] and "--trace=cuda,nvtx" not in call["argv"]
    assert not any(c["argv"] == ["profile", "--gpu-metrics-devices=help"] for c in calls)
    assert "has no nvtx" not in err


def test_warns_when_user_trace_drops_nvtx(tmp_path):
    rc, err, _ = capture(tmp_path, "-o", "run", "--no-gpu-metrics", "--nsys-option", "-t cuda,osrt",
                         "--", "true")
    assert rc == 0
    assert "--trace=cuda,osrt has no nvtx" in err


@pytest.mark.parametrize("args,message", [
    (["--iterations", "3-1", "--", "true"], "A <= B"),
    (["--iterations", "x", "--", "true"], "A-B"),
    (["--gpu-metrics-frequency", "1", "--", "true"], "between 10 and 200000"),
    ([], "no training command"),
    (["-o", "missing_dir/run", "--", "true"], "does not exist"),
])
def test_bad_input_one_line(tmp_path, args, message):
    rc, err, _ = capture(tmp_path, *args)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:") and message in lines[0]


def test_nsys_not_found_one_line(tmp_path):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable))
    env.pop("TRACEKIT_NSYS", None)
    done = subprocess.run([sys.executable, "-m", "tracekit.cli", "capture", "--", "true"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    # the test machine has no nsys in the standard folders either (skip if it does)
    if "nsys (Nsight Systems) not found" not in done.stderr:
        pytest.skip("an nsys is installed in a standard folder here")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--nsys PATH" in done.stderr


def test_sigterm_is_forwarded_and_capture_finalized(tmp_path):
    log = tmp_path / "fake_nsys.jsonl"
    env = dict(os.environ, FAKE_NSYS_LOG=str(log))
    proc = subprocess.Popen([sys.executable, "-m", "tracekit.cli", "capture", "--nsys", FAKE_NSYS,
                             "-o", "run", "--no-gpu-metrics", "--", "sleep", "60"],
                            cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while time.time() < deadline and not (log.exists() and '"profile"' in log.read_text()):
        time.sleep(0.1)
    time.sleep(0.5)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.time() - t0 < 20  # did not wait for the 60 s sleep
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {"signal": int(signal.SIGTERM)} in calls  # nsys got the signal
    assert (tmp_path / "run.nsys-rep").is_file() and (tmp_path / "run.sqlite").is_file()
    m = json.loads((tmp_path / "run.json").read_text())
    assert m["exit_status"]["nsys"] == 128 + signal.SIGTERM
    assert proc.returncode == 128 + signal.SIGTERM


def test_module_entry_point_runs_capture_alone(tmp_path):
    env = dict(os.environ, FAKE_NSYS_LOG=str(tmp_path / "log.jsonl"))
    done = subprocess.run([sys.executable, "-m", "tracekit.capture", "--nsys", FAKE_NSYS, "-o", "run",
                           "--", "true"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run.sqlite").is_file()


def test_output_paths():
    p = runner.output_paths("dir/run.nsys-rep")
    assert p["report"] == Path("dir/run.nsys-rep") and p["sqlite"] == Path("dir/run.sqlite")
    assert p["manifest"] == Path("dir/run.json") and p["qdstrm"] == Path("dir/run.qdstrm")


def test_deepspeed_config_from_command(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"a": 1}')
    assert runner.deepspeed_config_from_command(["t.py", f"--deepspeed={cfg}"]) == {"a": 1}
    assert runner.deepspeed_config_from_command(["t.py", "--deepspeed_config", str(cfg)]) == {"a": 1}
    assert runner.deepspeed_config_from_command(["t.py", "--deepspeed_config", "nope.json"]) is None


def test_output_name_with_nsys_rep_suffix_is_dropped(tmp_path):
    rc, err, calls = capture(tmp_path, "-o", "ok.nsys-rep", "--", sys.executable, "-c", "print('hi')")
    assert rc == 0, err
    assert "--output=ok" in profile_call(calls)["argv"]
    assert sorted(p.name for p in tmp_path.glob("ok*")) == ["ok.json", "ok.nsys-rep", "ok.sqlite"]


# ------------------------------------------------------------------ issue 9: d09, d10, d11
def _tree(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` (relative name -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv to drop root's DAC override")
def test_readonly_output_folder_fails_before_training(tmp_path):
    """d09: a folder the user cannot write is one line and exit 2, and the training never
    starts (it would create ``ran``). Root ignores mode 0555, so the DAC-override
    capabilities are dropped as in ../shared/repro/d09."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    marker = tmp_path / "ran"
    done = subprocess.run([*drop, sys.executable, "-m", "tracekit.cli", "capture", "--nsys", FAKE_NSYS,
                           "-o", str(ro / "run"), "--", sys.executable, "-c",
                           f"open({str(marker)!r}, 'w').write('training ran')"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: output folder") and "not writable" in lines[0]
    assert not marker.exists()
    assert list(ro.iterdir()) == []  # no probe file left behind


def test_output_folder_taken_by_directory_is_refused(tmp_path):
    (tmp_path / "run.sqlite").mkdir()
    rc, err, calls = capture(tmp_path, "-o", "run", "--force", "--", "true")
    assert rc == 2 and "run.sqlite exists and is not a regular file" in err
    assert not any(c["argv"][0] == "profile" for c in calls)


@pytest.mark.parametrize("name", ["run#1", "run?x=1", "run%1", "run%p", "a b#c?d%20e"])
def test_output_names_with_uri_and_nsys_characters(tmp_path, name):
    """d10: '#', '?' and '%' in -o are file-name characters: the export is found (no re-export,
    exit 0), no stray file appears (an unquoted 'file:run#1...' URI opened 'run' read-write),
    and nsys gets '%' as '%%' (it expands %p, %h, %q{VAR} in --output)."""
    rc, err, calls = capture(tmp_path, "-o", name, "--", "true")
    assert rc == 0, err
    assert "export is missing" not in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "fake_nsys.jsonl") == sorted(
        f"{name}{s}" for s in (".json", ".nsys-rep", ".sqlite"))
    assert f"--output={name.replace('%', '%%')}" in profile_call(calls)["argv"]
    assert runner.sqlite_ok(tmp_path / f"{name}.sqlite")
    con = sqlite3.connect(tmp_path / f"{name}.sqlite")
    assert con.execute("select note from FAKE_EXPORT").fetchall() == [("written by tests/fake_nsys/nsys",)]
    con.close()


def test_sqlite_ok_never_creates_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert runner.sqlite_ok(Path("missing#1.sqlite")) is False
    (tmp_path / "x#1.sqlite").write_bytes(b"")
    assert runner.sqlite_ok(Path("x#1.sqlite")) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x#1.sqlite"]
    assert runner.sqlite_uri(Path("/a b/r#1?%.sqlite")) == "file:/a%20b/r%231%3F%25.sqlite?mode=ro"


def _good_capture(tmp_path):
    rc, err, _ = capture(tmp_path, "-o", "run", "--", "true")
    assert rc == 0, err
    # mark the earlier capture so that a replaced file is told from a kept one
    con = sqlite3.connect(tmp_path / "run.sqlite")
    con.execute("insert into FAKE_EXPORT values ('the earlier capture')")
    con.commit()
    con.close()
    return _tree(tmp_path)


@pytest.mark.parametrize("mode", ["no-report", "importer-fail", "export-fail"])
def test_force_keeps_earlier_capture_when_new_one_is_incomplete(tmp_path, mode):
    """d11: --force replaces the earlier capture only with a complete one (report + export)."""
    before = _good_capture(tmp_path)
    rc, err, calls = capture(tmp_path, "-o", "run", "--force", "--", "true", mode=mode)
    assert rc == runner.EXIT_CAPTURE_FAILED
    after = _tree(tmp_path)
    for name in ("run.nsys-rep", "run.sqlite", "run.json"):
        assert after[name] == before[name], name  # byte for byte
    assert "the earlier capture is kept unchanged" in err
    last = [c for c in calls if c.get("argv", [""])[0] == "profile" and "--gpu-metrics-devices=help" not in c["argv"]][-1]
    pid_base = next(a.split("=", 1)[1] for a in last["argv"] if a.startswith("--output="))
    assert pid_base.startswith("run.new-")
    new = sorted(n for n in after if n.startswith(pid_base))
    if mode == "no-report":
        assert new == [] and "this run recorded nothing" in err
    elif mode == "importer-fail":
        assert new == [f"{pid_base}.json", f"{pid_base}.qdstrm"]
        m = json.loads(after[f"{pid_base}.json"])
        assert m["files"]["raw_capture"]["path"] == f"{pid_base}.qdstrm"
        assert f"QdstrmImporter --input-file {pid_base}.qdstrm" in err
    else:
        assert new == [f"{pid_base}.json", f"{pid_base}.nsys-rep"]
        assert f"--output={pid_base}.sqlite {pid_base}.nsys-rep" in err  # the retry command


def test_force_replaces_earlier_capture_when_new_one_is_complete(tmp_path):
    _good_capture(tmp_path)
    (tmp_path / "run.qdstrm").write_bytes(b"old raw capture")  # of the capture being replaced
    rc, err, calls = capture(tmp_path, "-o", "run", "--force", "--", sys.executable, "-c", "print(1)")
    assert rc == 0, err
    names = sorted(p.name for p in tmp_path.iterdir() if p.name != "fake_nsys.jsonl")
    assert names == ["run.json", "run.nsys-rep", "run.sqlite"]  # no scratch names, no old .qdstrm
    con = sqlite3.connect(tmp_path / "run.sqlite")
    assert con.execute("select count(*) from FAKE_EXPORT").fetchone() == (1,)  # the new export
    con.close()
    m = json.loads((tmp_path / "run.json").read_text())
    assert m["files"]["sqlite"]["path"] == "run.sqlite" and m["options"]["output"] == "run"
    last = [c for c in calls if c.get("argv", [""])[0] == "profile" and "--gpu-metrics-devices=help" not in c["argv"]][-1]
    assert last["argv"][-3:] == [sys.executable, "-c", "print(1)"]
    assert any(a.startswith("--output=run.new-") for a in last["argv"])


def test_capture_lines_print_paths_as_data(tmp_path):
    """d08 in capture: a bracketed name is printed as given, an ESC as a visible escape."""
    (tmp_path / "d[v1]").mkdir()
    rc, err, _ = capture(tmp_path, "-o", "d[v1]/run[red]x", "--", "true")
    assert rc == 0, err
    assert "wrote d[v1]/run[red]x.nsys-rep, d[v1]/run[red]x.sqlite, d[v1]/run[red]x.json" in err
    rc, err, _ = capture(tmp_path, "-o", "e\x1b[31m", "--", "true")
    assert rc == 0, err
    assert "\x1b" not in err and "e\\x1b[31m.sqlite" in err
