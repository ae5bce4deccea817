"""Run a training command under ``nsys profile`` with tracekit's hook, keep every byte recorded.

Outputs for ``-o NAME``: ``NAME.nsys-rep`` (nsys's report), ``NAME.sqlite`` (its SQLite
export, what ``tracekit analyze`` reads) and ``NAME.json`` (the manifest). If nsys cannot
import its raw ``NAME.qdstrm`` the raw file stays and tracekit says which library the
importer lacks; if the export fails the report stays and tracekit prints the export command.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

import tracekit
from tracekit.capture import nsys as nsys_mod
from tracekit.errors import TracekitError

HOOK_DIR = Path(__file__).resolve().parent / "hook"

# exit codes of tracekit itself (the training's own code is returned when the capture is fine)
EXIT_CAPTURE_FAILED = 3


@dataclass
class CaptureResult:
    """What one capture produced. Times in seconds; sizes in bytes."""

    exit_code: int
    nsys_exit_code: int
    report: str | None
    sqlite: str | None
    manifest: str
    raw_capture: str | None = None
    problems: list[str] = field(default_factory=list)


def output_paths(output: str) -> dict[str, Path]:
    """The files of capture ``output`` (a path without suffix; a ``.nsys-rep`` suffix is
    dropped): keys ``base``, ``report``, ``sqlite``, ``manifest``, ``qdstrm``."""
    base = output[: -len(".nsys-rep")] if output.endswith(".nsys-rep") else output
    if not base or base.endswith(os.sep):
        raise TracekitError(f"-o {output!r}: give a file name without suffix, e.g. -o runs/zero3")
    b = Path(base)
    return {"base": b, "report": Path(f"{base}.nsys-rep"), "sqlite": Path(f"{base}.sqlite"),
            "manifest": Path(f"{base}.json"), "qdstrm": Path(f"{base}.qdstrm")}


def check_outputs(paths: dict[str, Path], force: bool) -> None:
    """Refuse to overwrite an earlier capture unless ``force``; with ``force`` remove it.

    Raises :class:`TracekitError` (exit 2) naming the existing file; also when the output
    folder does not exist.
    """
    parent = paths["base"].parent
    if not parent.is_dir():
        raise TracekitError(f"output folder {parent} does not exist")
    existing = [p for k, p in paths.items() if k != "base" and p.exists()]
    if existing and not force:
        raise TracekitError(f"{existing[0]} exists; choose another -o NAME or pass --force")
    for p in existing:
        p.unlink()


def sqlite_ok(path: Path) -> bool:
    """True when ``path`` is an SQLite database holding at least one table."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            (n,) = con.execute("select count(*) from sqlite_master where type='table'").fetchone()
        finally:
            con.close()
        return n > 0
    except sqlite3.Error:
        return False


def hook_environment(base_env: dict, report_dir: str, iterations: tuple[int, int] | None) -> dict:
    """The environment for the training: the hook folder first on ``PYTHONPATH``,
    ``TRACEKIT_HOOK=1``, the report folder and the iteration window."""
    env = dict(base_env)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(HOOK_DIR) + (os.pathsep + old if old else "")
    env["TRACEKIT_HOOK"] = "1"
    env["TRACEKIT_HOOK_REPORT_DIR"] = report_dir
    if iterations is not None:
        env["TRACEKIT_ITERATIONS"] = f"{iterations[0]}-{iterations[1]}"
    else:
        env.pop("TRACEKIT_ITERATIONS", None)
    return env


def read_hook_reports(report_dir: str) -> list[dict]:
    """The ``hook-<pid>.json`` reports that training processes wrote, sorted by pid."""
    reports = []
    for p in sorted(Path(report_dir).glob("hook-*.json")):
        try:
            reports.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(reports, key=lambda r: r.get("pid", 0))


def deepspeed_config_from_command(command: list[str]) -> dict | None:
    """The DeepSpeed JSON config named by ``--deepspeed_config``/``--deepspeed`` in the
    training command, when it is a readable JSON file; else None."""
    for i, tok in enumerate(command):
        for flag in ("--deepspeed_config", "--deepspeed"):
            value = None
            if tok == flag and i + 1 < len(command):
                value = command[i + 1]
            elif tok.startswith(flag + "="):
                value = tok.split("=", 1)[1]
            if value and value.endswith(".json") and os.path.isfile(value):
                try:
                    return json.loads(Path(value).read_text())
                except (OSError, ValueError):
                    return None
    return None


def gpu_inventory() -> list[dict]:
    """GPUs and driver from ``nvidia-smi`` (empty when it is absent or fails)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        done = subprocess.run([smi, "--query-gpu=index,name,driver_version,pci.bus_id,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            gpus.append(dict(zip(["index", "name", "driver_version", "pci_bus_id", "memory_total"], parts)))
    return gpus


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` as indented JSON to ``path`` through a temporary file in the same folder."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _file_info(path: Path | None) -> dict | None:
    if path is None or not path.exists():
        return None
    return {"path": str(path), "bytes": path.stat().st_size}


def run_capture(command: list[str], settings: nsys_mod.ProfileSettings, nsys_explicit: str | None,
                console: Console | None = None, environ: dict | None = None) -> CaptureResult:
    """Profile ``command`` under nsys with the hook; returns a :class:`CaptureResult`.

    ``exit_code`` is the training's exit code when the report and export exist, else
    :data:`EXIT_CAPTURE_FAILED` (3) if the training itself succeeded. Raises
    :class:`TracekitError` for bad input (exit 2) before anything runs.
    """
    console = console or Console(stderr=True, highlight=False, soft_wrap=True)
    env_in = dict(os.environ if environ is None else environ)
    if not command:
        raise TracekitError("no training command given: tracekit capture [OPTIONS] -- deepspeed train.py ...")
    paths = output_paths(settings.output)
    settings.output = str(paths["base"])  # nsys appends .nsys-rep itself
    location = nsys_mod.find_nsys(nsys_explicit, env_in)
    version = nsys_mod.nsys_version(location.path)
    check_outputs(paths, settings.force)
    console.print(f"tracekit: nsys {version} at {location.path} (found via {location.source})")

    user_pairs = nsys_mod.normalize_options(nsys_mod.split_user_options(list(settings.user_options)))
    user_keys = {k for k, _ in user_pairs}
    user_trace = dict(user_pairs).get("--trace")
    if user_trace is not None and "nvtx" not in user_trace.split(","):
        console.print(f"tracekit: warning: --trace={user_trace} has no nvtx: the tracekit phase "
                      "ranges will not be recorded")
    metrics_note = None
    metrics_devices: list[str] | None = None
    if settings.gpu_metrics and "--gpu-metrics-devices" not in user_keys:
        devices, raw = nsys_mod.gpu_metrics_devices(location.path)
        metrics_devices = devices
        if not devices:
            settings.gpu_metrics = False
            last = raw.strip().splitlines()[-1] if raw.strip() else "no output"
            metrics_note = f"GPU metrics off: nsys lists no supported GPU ({last})"
            console.print(f"tracekit: {metrics_note}")
    cmd = nsys_mod.build_profile_command(location.path, settings, command)
    console.print("tracekit: " + shlex.join(cmd))

    report_dir = tempfile.mkdtemp(prefix="tracekit-hook-")
    env = hook_environment(env_in, report_dir, settings.iterations)
    started = _dt.datetime.now(_dt.timezone.utc)
    t0 = time.monotonic()
    rc = _run_forwarding_signals(cmd, env)
    elapsed = time.monotonic() - t0
    hooks = read_hook_reports(report_dir)
    shutil.rmtree(report_dir, ignore_errors=True)

    problems: list[str] = []
    retry: list[str] = []
    report = paths["report"] if paths["report"].is_file() else None
    raw = paths["qdstrm"] if paths["qdstrm"].is_file() else None
    sqlite_path = paths["sqlite"] if sqlite_ok(paths["sqlite"]) else None

    if report is None and raw is not None:
        importer = nsys_mod.find_importer(location.path)
        missing = nsys_mod.missing_libraries(importer, env_in) if importer else []
        why = (f"its importer {importer} cannot load {', '.join(missing)}" if missing else
               "its importer failed (QdstrmImporter; see nsys's messages above)")
        problems.append(f"nsys recorded {raw} but could not turn it into a report: {why}")
        if missing:
            problems.append(f"put the folder holding {missing[0]} on LD_LIBRARY_PATH "
                            "(Debian/Ubuntu package libdw1 for libdw.so.1) and run the import:")
        if importer:
            retry.append(shlex.join([importer, "--input-file", str(raw)]))
        retry.append(shlex.join(nsys_mod.export_command(location.path, str(paths["report"]),
                                                        str(paths["sqlite"]))))
    elif report is None:
        problems.append(f"nsys exited with status {rc} and wrote no report "
                        f"(nothing recorded? with --iterations, did the training reach them?)")
    elif sqlite_path is None:
        console.print("tracekit: the SQLite export is missing; running nsys export once more")
        export = nsys_mod.export_command(location.path, str(report), str(paths["sqlite"]))
        done = subprocess.run(export, env=env_in)
        if done.returncode == 0 and sqlite_ok(paths["sqlite"]):
            sqlite_path = paths["sqlite"]
        else:
            problems.append(f"nsys export failed (status {done.returncode}); the report "
                            f"{report} is kept; retry with:")
            retry.append(shlex.join(export))

    training_ok_guess = rc == 0
    if problems:
        exit_code = EXIT_CAPTURE_FAILED if training_ok_guess else rc
    else:
        exit_code = rc

    ds_config = next((h.get("deepspeed_config") for h in hooks if h.get("deepspeed_config")), None)
    if ds_config is None:
        ds_config = deepspeed_config_from_command(command)
    manifest = {
        "tracekit_version": tracekit.__version__,
        "command": command,
        "command_line": shlex.join(command),
        "nsys": {"path": location.path, "found_via": location.source, "version": version,
                 "command": cmd},
        "options": {"output": str(paths["base"]), "gpu_metrics": settings.gpu_metrics,
                    "gpu_metrics_frequency_hz": settings.gpu_metrics_frequency_hz
                    if settings.gpu_metrics else None,
                    "iterations": list(settings.iterations) if settings.iterations else None,
                    "nsys_options": list(settings.user_options), "force": settings.force},
        "gpu_metrics_note": metrics_note,
        "gpu_metrics_devices": metrics_devices,
        "versions": {
            "python": platform.python_version(),
            "deepspeed": next((h.get("deepspeed_version") for h in hooks if h.get("deepspeed_version")), None),
            "torch": next((h.get("torch_version") for h in hooks if h.get("torch_version")), None),
        },
        "gpus": gpu_inventory(),
        "deepspeed_config": ds_config,
        "hook": {"processes": hooks,
                 "wrapped": sorted({w for h in hooks for w in h.get("wrapped", [])}),
                 "missing": sorted({m for h in hooks for m in h.get("missing", [])})},
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_seconds": round(elapsed, 3),
        "exit_status": {"nsys": rc, "tracekit": exit_code},
        "files": {"report": _file_info(report), "sqlite": _file_info(sqlite_path),
                  "raw_capture": _file_info(raw)},
        "problems": problems,
        "retry_commands": retry,
    }
    write_json_atomic(paths["manifest"], manifest)

    if not hooks:
        console.print("tracekit: warning: no process reported the DeepSpeed hook "
                      "(was DeepSpeed imported by a Python that reads PYTHONPATH?)")
    for warning in dict.fromkeys(w for h in hooks for w in h.get("warnings", [])):
        console.print(f"tracekit: hook warning: {warning}")
    for line in problems:
        console.print(f"tracekit: error: {line}")
    for line in retry:
        console.print(f"  {line}")
    console.print(f"tracekit: {elapsed:.1f} s; wrote " + ", ".join(
        str(p) for p in (report, sqlite_path, paths["manifest"], raw) if p is not None))
    return CaptureResult(exit_code=exit_code, nsys_exit_code=rc,
                         report=str(report) if report else None,
                         sqlite=str(sqlite_path) if sqlite_path else None,
                         manifest=str(paths["manifest"]), raw_capture=str(raw) if raw else None,
                         problems=problems)


def _run_forwarding_signals(cmd: list[str], env: dict) -> int:
    """Run ``cmd`` in its own session; SIGINT/SIGTERM/SIGHUP to tracekit go to nsys, which
    stops the training and finalizes the report. Returns nsys's exit status (a negative
    signal number becomes 128 + n)."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, forward)
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handler replaced above
                forward(signal.SIGINT, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - rc if rc < 0 else rc
