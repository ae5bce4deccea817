"""``tracekit capture`` end to end with a FAKE nsys (``tests/fake_nsys/nsys``, not NVIDIA's).

The fake runs the training command, writes placeholder outputs and logs each call's argv and
environment, so these tests check what tracekit asks of nsys and what it does with the result.
"""

from __future__ import annotations

import json
import os
import signal
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
