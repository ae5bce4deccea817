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
from urllib.parse import quote

from rich.console import Console

import tracekit
from tracekit.capture import nsys as nsys_mod
from tracekit.capture.ranks import (  # noqa: F401  (the rank names, importable from here too)
    _DS_LAUNCHERS,
    LOCAL_RANK_VARS,
    NODE_RANK_VARS,
    PLACEHOLDERS,
    RANK_VARS,
    WORLD_SIZE_VARS,
    _first_int,
    expand_output,
    multinode_problem,
    rank_gpu,
    rank_identity,
)
from tracekit.errors import TracekitError
from tracekit.textsafe import clean, text

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
    manifest: str | None
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


CAPTURE_FILES = ("report", "sqlite", "manifest", "qdstrm")


def check_outputs(paths: dict[str, Path], force: bool) -> list[Path]:
    """Check, before anything runs, that the capture ``paths`` can be written.

    Returns the files of an earlier capture under these names (only possible with ``force``;
    nothing is removed here: :func:`run_capture` records under :func:`scratch_paths` and
    replaces them only once the new capture is complete). Raises :class:`TracekitError`
    (exit 2) when the output folder is missing or not writable (tested by creating and
    removing a probe file, so ACLs, read-only mounts and dropped capabilities count), when a
    file exists without ``force``, or when an output name is taken by something that is not
    a regular file (a folder, a FIFO).
    """
    parent = paths["base"].parent
    if not parent.is_dir():
        raise TracekitError(f"output folder {parent} does not exist")
    existing = [paths[k] for k in CAPTURE_FILES if os.path.lexists(paths[k])]
    if existing and not force:
        raise TracekitError(f"{existing[0]} exists; choose another -o NAME or pass --force")
    for p in existing:
        if p.is_symlink() or not p.is_file():
            raise TracekitError(f"{p} exists and is not a regular file; choose another -o NAME")
    check_writable(parent)
    return existing


def check_writable(folder: Path) -> None:
    """Raise :class:`TracekitError` unless a file can be created in ``folder`` (a probe file
    ``.tracekit-probe-*`` is created and removed)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".tracekit-probe-", dir=folder)
    except OSError as exc:
        raise TracekitError(f"output folder {folder}: not writable ({exc.strerror}); choose "
                            "another -o NAME") from None
    os.close(fd)
    os.unlink(probe)


def scratch_paths(paths: dict[str, Path], pid: int | None = None) -> dict[str, Path]:
    """Where a capture that would replace an earlier one is recorded first:
    ``NAME.new-PID.*`` beside ``NAME.*`` (same folder, so the final rename is atomic)."""
    return output_paths(f"{paths['base']}.new-{os.getpid() if pid is None else pid}")


def promote(work: dict[str, Path], final: dict[str, Path]) -> None:
    """Move the complete capture ``work`` (report and export; a raw capture if any) onto the
    names ``final``, replacing the earlier capture file by file (``os.replace``: each name
    always holds a whole file); an earlier file of a kind the new capture lacks (an old
    ``.qdstrm``) is removed, since it belonged to the capture being replaced."""
    for key in ("report", "sqlite", "qdstrm"):
        if work[key].is_file():
            os.replace(work[key], final[key])
        elif os.path.lexists(final[key]):
            final[key].unlink()


def sqlite_uri(path: Path) -> str:
    """The read-only SQLite URI of ``path``: ``file:`` + the percent-encoded absolute path +
    ``?mode=ro`` (RFC 8089 / sqlite.org/uri.html: an unquoted ``#`` or ``?`` would end the
    path, ``%`` would start an escape)."""
    return f"file:{quote(str(Path(path).resolve()))}?mode=ro"


def sqlite_ok(path: Path) -> bool:
    """True when ``path`` is an SQLite database holding at least one table (opened read-only
    through :func:`sqlite_uri`, so any file name works and nothing is created)."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    try:
        con = sqlite3.connect(sqlite_uri(path), uri=True)
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
    training command, when :func:`tracekit.analyze.trace.dsconfig.read_json_object` takes it (a
    regular file of at most 16 MiB holding a JSON object); else None."""
    for i, tok in enumerate(command):
        for flag in ("--deepspeed_config", "--deepspeed"):
            value = None
            if tok == flag and i + 1 < len(command):
                value = command[i + 1]
            elif tok.startswith(flag + "="):
                value = tok.split("=", 1)[1]
            if value and value.endswith(".json") and os.path.isfile(value):
                from tracekit.analyze.trace.dsconfig import read_json_object  # its size/depth/FIFO checks
                from tracekit.errors import TracekitError

                try:
                    return read_json_object(value, "--deepspeed_config")
                except TracekitError:
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


def _keep_manifest_elsewhere(path: Path, data: dict, exc: OSError) -> tuple[Path | None, str]:
    """Write the manifest that could not be written as ``path`` (``exc``) into a new folder
    under the temporary directory instead, so that the capture's record is never lost; its
    temporary beside ``path`` is removed. Returns (where it is now or None, the problem line)."""
    part = path.with_name(path.name + ".part")
    try:
        if part.is_file():
            part.unlink()
    except OSError:
        pass
    why = exc.strerror or type(exc).__name__
    try:
        kept = Path(tempfile.mkdtemp(prefix="tracekit-capture-")) / path.name
        write_json_atomic(kept, data)
    except OSError as exc2:
        return None, (f"cannot write the manifest {path} ({why}), nor a copy in the temporary folder "
                      f"({exc2.strerror or type(exc2).__name__}); the capture's files are kept")
    return kept, f"cannot write the manifest {path} ({why}); it is kept as {kept}: move it beside the trace"


def _file_info(path: Path | None) -> dict | None:
    if path is None or not path.exists():
        return None
    return {"path": str(path), "bytes": path.stat().st_size}



def _say(console: Console, line: str, style: str = "") -> None:
    """Print one line built from paths, commands and hook messages as data (no markup)."""
    console.print(text(line, style))


def run_capture(command: list[str], settings: nsys_mod.ProfileSettings, nsys_explicit: str | None,
                console: Console | None = None, environ: dict | None = None,
                per_rank: bool = False) -> CaptureResult:
    """Profile ``command`` under nsys with the hook; returns a :class:`CaptureResult`.

    ``exit_code`` is the training's exit code when the report and export exist, else
    :data:`EXIT_CAPTURE_FAILED` (3) if the training itself succeeded. Raises
    :class:`TracekitError` for bad input (exit 2) before anything runs: a missing or
    unwritable output folder, an existing capture without ``force``, a multi-node
    ``deepspeed`` command (:func:`multinode_problem`).

    With ``per_rank`` this process is one rank of a job (started by the launcher in place of
    the training): the output name gets the rank (:func:`expand_output`), GPU metrics are
    sampled on this rank's GPU only (:func:`rank_gpu`), and the manifest records the rank.

    An earlier capture under the same names (``force``) is replaced only when the new one is
    complete (report and SQLite export): until then nsys records under
    :func:`scratch_paths`; an incomplete new capture stays there, beside the earlier one.
    """
    console = console or Console(stderr=True, highlight=False, soft_wrap=True)
    env_in = dict(os.environ if environ is None else environ)
    if not command:
        raise TracekitError("no training command given: tracekit capture [OPTIONS] -- deepspeed train.py ...")
    ident = rank_identity(env_in)
    paths = output_paths(expand_output(settings.output, ident, per_rank))
    if not per_rank:
        problem = multinode_problem(command)
        if problem:
            raise TracekitError(problem)
    location = nsys_mod.find_nsys(nsys_explicit, env_in)
    version = nsys_mod.nsys_version(location.path)
    existing = check_outputs(paths, settings.force)
    work = scratch_paths(paths) if existing else paths
    if existing:
        check_outputs(work, force=False)  # never write over an earlier attempt's files
    settings.output = str(work["base"])  # nsys appends .nsys-rep itself
    who = f" (rank {ident['rank']} from {ident['rank_from']})" if per_rank else ""
    _say(console, f"tracekit{who}: nsys {version} at {location.path} (found via {location.source})")

    user_pairs = nsys_mod.normalize_options(nsys_mod.split_user_options(list(settings.user_options)))
    user_keys = {k for k, _ in user_pairs}
    user_trace = dict(user_pairs).get("--trace")
    if user_trace is not None and "nvtx" not in user_trace.split(","):
        _say(console, f"tracekit: warning: --trace={user_trace} has no nvtx: the tracekit phase "
                      "ranges will not be recorded")
    metrics_note = None
    metrics_devices: list[str] | None = None
    if settings.gpu_metrics and "--gpu-metrics-devices" not in user_keys:
        devices, raw = nsys_mod.gpu_metrics_devices(location.path)
        metrics_devices = devices
        if not devices:
            settings.gpu_metrics = False
            last = raw.strip().splitlines()[-1] if raw.strip() else "no output"
            metrics_note = f"GPU metrics off: nsys lists no supported GPU ({clean(last)})"
        elif per_rank:
            # one nsys per rank: each samples only its own GPU (two sessions cannot sample one GPU)
            gpu = rank_gpu(env_in, ident["local_rank"])
            listed = {d.split(":", 1)[0].strip() for d in devices}
            if gpu is not None and gpu in listed:
                settings.gpu_metrics_devices = gpu
            else:
                settings.gpu_metrics = False
                metrics_note = (f"GPU metrics off: this rank's GPU ({gpu or 'unknown'}, from LOCAL_RANK and "
                                "CUDA_VISIBLE_DEVICES) is not among those nsys can sample")
        if metrics_note:
            _say(console, f"tracekit: {metrics_note}")
    cmd = nsys_mod.build_profile_command(location.path, settings, command)
    _say(console, "tracekit: " + shlex.join(cmd))

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
    report = work["report"] if work["report"].is_file() else None
    raw = work["qdstrm"] if work["qdstrm"].is_file() else None
    sqlite_path = work["sqlite"] if sqlite_ok(work["sqlite"]) else None

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
        retry.append(shlex.join(nsys_mod.export_command(location.path, str(work["report"]),
                                                        str(work["sqlite"]))))
    elif report is None:
        problems.append(f"nsys exited with status {rc} and wrote no report "
                        f"(nothing recorded? with --iterations, did the training reach them?)")
    elif sqlite_path is None:
        _say(console, "tracekit: the SQLite export is missing; running nsys export once more")
        export = nsys_mod.export_command(location.path, str(report), str(work["sqlite"]))
        done = subprocess.run(export, env=env_in)
        if done.returncode == 0 and sqlite_ok(work["sqlite"]):
            sqlite_path = work["sqlite"]
        else:
            problems.append(f"nsys export failed (status {done.returncode}); the report "
                            f"{report} is kept; retry with:")
            retry.append(shlex.join(export))

    # where the new capture ends up (see the docstring)
    final = work
    recorded = report is not None or raw is not None or sqlite_path is not None
    if existing and report is not None and sqlite_path is not None:
        promote(work, paths)
        final = paths
        report, sqlite_path = paths["report"], paths["sqlite"]
        raw = paths["qdstrm"] if paths["qdstrm"].is_file() else None
    elif existing:
        kept = ", ".join(str(p) for p in existing)
        problems.append(f"the earlier capture is kept unchanged ({kept}); "
                        + (f"what this run recorded is under {work['base']}.*" if recorded
                           else "this run recorded nothing"))
    write_manifest = recorded or not existing

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
        "options": {"output": str(final["base"]), "gpu_metrics": settings.gpu_metrics,
                    "gpu_metrics_devices": settings.gpu_metrics_devices if settings.gpu_metrics else None,
                    "gpu_metrics_frequency_hz": settings.gpu_metrics_frequency_hz
                    if settings.gpu_metrics else None,
                    "iterations": list(settings.iterations) if settings.iterations else None,
                    "nsys_options": list(settings.user_options), "force": settings.force,
                    "per_rank": per_rank},
        "rank": ident if per_rank else None,
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
    manifest_path = final["manifest"]
    if write_manifest:
        try:
            write_json_atomic(manifest_path, manifest)
        except OSError as exc:  # the folder went read-only (or full) while the training ran
            manifest_path, line = _keep_manifest_elsewhere(manifest_path, manifest, exc)
            problems.append(line)
            exit_code = EXIT_CAPTURE_FAILED if training_ok_guess else rc

    if not hooks:
        _say(console, "tracekit: warning: no process reported the DeepSpeed hook "
                      "(was DeepSpeed imported by a Python that reads PYTHONPATH?)")
    for warning in dict.fromkeys(w for h in hooks for w in h.get("warnings", [])):
        _say(console, f"tracekit: hook warning: {warning}")
    for line in problems:
        _say(console, f"tracekit: error: {line}")
    for line in retry:
        _say(console, f"  {line}")
    wrote = [p for p in (report, sqlite_path, manifest_path if write_manifest else None, raw) if p is not None]
    _say(console, f"tracekit: {elapsed:.1f} s; wrote " + (", ".join(str(p) for p in wrote) or "nothing"))
    return CaptureResult(exit_code=exit_code, nsys_exit_code=rc,
                         report=str(report) if report else None,
                         sqlite=str(sqlite_path) if sqlite_path else None,
                         manifest=str(manifest_path) if write_manifest and manifest_path else None,
                         raw_capture=str(raw) if raw else None,
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
