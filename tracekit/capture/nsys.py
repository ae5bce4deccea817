"""Finding Nsight Systems, building ``nsys profile`` command lines, diagnosing nsys failures.

Nothing here runs the training; :mod:`tracekit.capture.runner` does. Every function that
shells out takes the nsys path explicitly so that tests can point it at a fake executable.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from tracekit.errors import TracekitError

ENV_NSYS = "TRACEKIT_NSYS"

# Standard install folders, newest version first after sorting. Nsight Systems (GUI and CLI
# packages), the copy inside a CUDA toolkit, and the full nsys bundled in Nsight Compute.
STANDARD_PATTERNS = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/target-linux-x64/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/target-linux-x64/nsys",
    "/usr/local/cuda/bin/nsys",
    "/usr/local/cuda-*/bin/nsys",
    "/usr/local/cuda*/nsight-systems-*/bin/nsys",
    "/usr/local/cuda*/nsight-systems-*/target-linux-x64/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    "/usr/local/cuda*/nsight-compute-*/host/target-linux-x64/nsys",
)

# nsys short options and their long names (so that user options can replace defaults)
SHORT_OPTIONS = {
    "-t": "--trace", "-s": "--sample", "-o": "--output", "-f": "--force-overwrite",
    "-c": "--capture-range", "-w": "--show-output", "-x": "--stop-on-exit", "-y": "--delay",
    "-d": "--duration", "-e": "--env-var", "-b": "--backtrace", "-n": "--inherit-environment",
    "-p": "--nvtx-capture",
}


@dataclass(frozen=True)
class NsysLocation:
    """An nsys executable and how it was found (``--nsys``, ``TRACEKIT_NSYS``, ``PATH``,
    ``standard folder``)."""

    path: str
    source: str


def _version_key(path: str) -> tuple:
    """Sort key: the numbers in the path, so that 2025.3.1 sorts after 2024.6."""
    return tuple(int(n) for n in re.findall(r"\d+", path))


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_nsys(explicit: str | None = None, environ: dict | None = None,
              patterns: tuple[str, ...] = STANDARD_PATTERNS) -> NsysLocation:
    """Find the nsys executable.

    Order: ``explicit`` (the ``--nsys`` option), ``$TRACEKIT_NSYS``, ``PATH``, then the
    ``patterns`` (standard folders; within them the highest version number wins).
    Raises :class:`TracekitError` (exit 2) naming the places searched when none is usable.
    """
    env = os.environ if environ is None else environ
    if explicit:
        if _is_executable(explicit):
            return NsysLocation(os.path.abspath(explicit), "--nsys")
        raise TracekitError(f"--nsys {explicit}: not an executable file")
    from_env = env.get(ENV_NSYS)
    if from_env:
        if _is_executable(from_env):
            return NsysLocation(os.path.abspath(from_env), ENV_NSYS)
        raise TracekitError(f"{ENV_NSYS}={from_env}: not an executable file")
    on_path = shutil.which("nsys", path=env.get("PATH", ""))
    if on_path:
        return NsysLocation(on_path, "PATH")
    found = [p for pattern in patterns for p in glob.glob(pattern) if _is_executable(p)]
    if found:
        return NsysLocation(max(found, key=_version_key), "standard folder")
    raise TracekitError(
        "nsys (Nsight Systems) not found: looked at --nsys, $TRACEKIT_NSYS, PATH and "
        f"{', '.join(patterns)}; install Nsight Systems or point to it with --nsys PATH "
        f"or {ENV_NSYS}=PATH")


def nsys_version(nsys: str, timeout_s: float = 60) -> str:
    """The version string of ``nsys --version`` (e.g. ``2025.3.1.90-253135822126v0``).

    Raises :class:`TracekitError` when the executable does not run or prints no version.
    """
    try:
        done = subprocess.run([nsys, "--version"], capture_output=True, text=True,
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TracekitError(f"{nsys} --version failed: {exc}") from None
    text = (done.stdout or "") + (done.stderr or "")
    match = re.search(r"version\s+(\S+)", text)
    if done.returncode != 0 or match is None:
        first = text.strip().splitlines()[0] if text.strip() else f"exit status {done.returncode}"
        raise TracekitError(f"{nsys} --version did not report a version: {first}")
    return match.group(1)


def gpu_metrics_devices(nsys: str, timeout_s: float = 120) -> tuple[list[str], str]:
    """GPUs that nsys can sample metrics on, from ``nsys profile --gpu-metrics-devices=help``.

    Returns ``(devices, output)``: the lines naming a usable device (``0: NVIDIA H200 ...``)
    and the raw output, so that callers can say why metrics are off. An empty list means
    the GPU or driver does not support GPU metrics (or the query failed).
    """
    try:
        done = subprocess.run([nsys, "profile", "--gpu-metrics-devices=help"],
                              capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], str(exc)
    text = (done.stdout or "") + (done.stderr or "")
    devices: list[str] = []
    for line in text.splitlines():
        lowered = line.lower()
        if "not supported" in lowered or "unsupported" in lowered:
            break  # nsys lists unsupported GPUs after this heading
        if re.match(r"\s*\d+\s*:", line):
            devices.append(line.strip())
    return devices, text


def split_user_options(options: list[str]) -> list[str]:
    """Split ``--nsys-option`` values (each may hold several words) into nsys tokens."""
    tokens: list[str] = []
    for opt in options:
        tokens.extend(shlex.split(opt))
    return tokens


def normalize_options(tokens: list[str]) -> list[tuple[str, str | None]]:
    """Turn nsys option tokens into ``(long name, value)`` pairs.

    ``-t cuda``, ``-t=cuda``, ``--trace cuda`` and ``--trace=cuda`` all give
    ``("--trace", "cuda")``. A token that is not an option raises :class:`TracekitError`.
    """
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("-"):
            raise TracekitError(f"nsys option expected, got {tok!r} (write --nsys-option=--key=value)")
        if "=" in tok:
            key, value = tok.split("=", 1)
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            key, value = tok, tokens[i + 1]
            i += 1
        else:
            key, value = tok, None
        key = SHORT_OPTIONS.get(key, key)
        pairs.append((key, value))
        i += 1
    return pairs


def merge_options(defaults: list[tuple[str, str | None]],
                  user: list[tuple[str, str | None]]) -> list[str]:
    """Defaults first, with any option the user also gave replaced by the user's value.

    Returns ``--key=value`` tokens (``--key`` alone for a value-less option).
    """
    user_keys = {k for k, _ in user}
    merged = [(k, v) for k, v in defaults if k not in user_keys] + list(user)
    return [k if v is None else f"{k}={v}" for k, v in merged]


@dataclass
class ProfileSettings:
    """What ``tracekit capture`` asks of nsys.

    ``gpu_metrics_frequency_hz`` is the GPU metrics sampling rate in Hz (samples per second);
    ``iterations`` is an inclusive ``(A, B)`` optimizer-step window or None for the whole run;
    ``gpu_metrics_devices`` the value of nsys's ``--gpu-metrics-devices`` (``all``, or one GPU
    index as ``nvidia-smi`` numbers them, for a capture of one rank).
    """

    output: str
    gpu_metrics: bool = True
    gpu_metrics_devices: str = "all"
    gpu_metrics_frequency_hz: int = 1000
    iterations: tuple[int, int] | None = None
    force: bool = False
    user_options: tuple[str, ...] = ()


def default_options(settings: ProfileSettings) -> list[tuple[str, str | None]]:
    """tracekit's defaults for this study, as ``(long name, value)`` pairs."""
    opts: list[tuple[str, str | None]] = [
        ("--trace", "cuda,nvtx"),
        ("--cuda-memory-usage", "true"),
        ("--sample", "none"),
        ("--cpuctxsw", "none"),
        ("--trace-fork-before-exec", "true"),
    ]
    if settings.gpu_metrics:
        opts += [("--gpu-metrics-devices", settings.gpu_metrics_devices),
                 ("--gpu-metrics-frequency", str(settings.gpu_metrics_frequency_hz))]
    if settings.iterations is not None:
        opts += [("--capture-range", "cudaProfilerApi"), ("--capture-range-end", "stop")]
    opts.append(("--export", "sqlite"))
    if settings.force:
        opts.append(("--force-overwrite", "true"))
    return opts


def output_option(base: str) -> str:
    """``--output=BASE`` with each ``%`` written ``%%``: nsys expands ``%p`` (pid), ``%h``
    (host name), ``%q{VAR}`` (environment) and ``%n`` in the output name and writes ``%%`` as
    one ``%`` (Nsight Systems User Guide, ``--output``), so tracekit's own name is kept literally."""
    return "--output=" + base.replace("%", "%%")


def build_profile_command(nsys: str, settings: ProfileSettings, command: list[str]) -> list[str]:
    """The full ``nsys profile ... -- command`` argument list.

    Raises :class:`TracekitError` for an empty ``command`` or a user ``--output`` (tracekit's
    ``-o`` names the outputs).
    """
    if not command:
        raise TracekitError("no training command given: tracekit capture [OPTIONS] -- deepspeed train.py ...")
    user = normalize_options(split_user_options(list(settings.user_options)))
    if any(k == "--output" for k, _ in user):
        raise TracekitError("give the output name with tracekit's -o NAME, not as an nsys option")
    options = merge_options(default_options(settings), user)
    return [nsys, "profile", *options, output_option(settings.output), *command]


def export_command(nsys: str, report: str, sqlite_path: str) -> list[str]:
    """The ``nsys export`` command that (re)makes the SQLite export of ``report``."""
    return [nsys, "export", "--type=sqlite", "--force-overwrite=true",
            f"--output={sqlite_path}", report]


# --------------------------------------------------------------------------- importer
def find_importer(nsys: str) -> str | None:
    """The ``QdstrmImporter`` that belongs to this nsys (it turns ``.qdstrm`` into
    ``.nsys-rep``), or None. Nsight Systems keeps it in a ``host-linux-x64`` folder beside
    the target folder; Nsight Compute's copy in ``linux-desktop-glibc_*-x64``."""
    real = os.path.realpath(nsys)
    here = os.path.dirname(real)
    candidates = [os.path.join(here, "QdstrmImporter")]
    for pattern in ("../host-linux-x64/QdstrmImporter", "../linux-desktop-*/QdstrmImporter",
                    "../*/QdstrmImporter"):
        candidates += sorted(glob.glob(os.path.join(here, pattern)))
    for c in candidates:
        if _is_executable(c):
            return os.path.normpath(c)
    return None


_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.M)
_LOADER = re.compile(r"error while loading shared libraries:\s*([^:\s]+)")


def parse_missing_libraries(text: str) -> list[str]:
    """Shared libraries named as missing in ``ldd`` output or a dynamic loader error."""
    names = _NOT_FOUND.findall(text) + _LOADER.findall(text)
    return list(dict.fromkeys(names))


def missing_libraries(binary: str, environ: dict | None = None) -> list[str]:
    """Libraries that ``binary`` cannot load, found with ``ldd`` and by running it.

    Returns an empty list when nothing is missing or nothing could be learnt.
    """
    env = dict(os.environ if environ is None else environ)
    text = ""
    for cmd in (["ldd", binary], [binary, "--help"]):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
            text += (done.stdout or "") + (done.stderr or "")
        except (OSError, subprocess.TimeoutExpired):
            continue
    return parse_missing_libraries(text)
