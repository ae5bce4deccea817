"""``tracekit capture``: profile an unmodified DeepSpeed training under Nsight Systems."""

from __future__ import annotations

from typing import List, Optional

import typer

CAPTURE_HELP = """Profile a training command under Nsight Systems with tracekit's NVTX phases.

    tracekit capture -o run -- deepspeed --num_gpus 1 train.py --deepspeed_config ds.json

Writes NAME.nsys-rep, NAME.sqlite (for tracekit analyze) and NAME.json (manifest).
Exits with the training's exit code; 3 when the training succeeded but the capture did not.
"""


def parse_iterations_option(text: str | None) -> tuple[int, int] | None:
    """``"A-B"`` -> ``(A, B)`` (0-based optimizer steps, inclusive); raises TracekitError."""
    if text is None:
        return None
    from tracekit.capture.hook._tracekit_hook import parse_iterations
    from tracekit.errors import TracekitError

    try:
        return parse_iterations(text)
    except ValueError as exc:
        raise TracekitError(f"--iterations: {exc}") from None


def capture_main(
    command: List[str],
    output: str = "tracekit-capture",
    force: bool = False,
    nsys: Optional[str] = None,
    iterations: Optional[str] = None,
    gpu_metrics: bool = True,
    gpu_metrics_frequency: int = 1000,
    nsys_option: Optional[List[str]] = None,
) -> int:
    """Run one capture; returns 0, or raises :class:`TracekitError` carrying the training's
    non-zero exit code (or 3 when the training succeeded but the capture failed)."""
    from tracekit.capture.nsys import ProfileSettings
    from tracekit.capture.runner import run_capture
    from tracekit.errors import TracekitError

    if gpu_metrics_frequency < 10 or gpu_metrics_frequency > 200000:
        raise TracekitError("--gpu-metrics-frequency must be between 10 and 200000 Hz")
    window = parse_iterations_option(iterations)
    settings = ProfileSettings(output=output, gpu_metrics=gpu_metrics,
                               gpu_metrics_frequency_hz=gpu_metrics_frequency,
                               iterations=window, force=force,
                               user_options=tuple(nsys_option or ()))
    result = run_capture(list(command or []), settings, nsys)
    if result.exit_code != 0:
        if result.problems:
            message = "the capture is incomplete (see the lines above); manifest " + result.manifest
        else:
            message = (f"the training exited with status {result.exit_code}; what was recorded "
                       f"is in {result.sqlite}")
        raise TracekitError(message, exit_code=result.exit_code)
    return 0


def register(app: typer.Typer) -> None:
    """Add the ``capture`` command to ``app``."""

    @app.command(
        "capture",
        help=CAPTURE_HELP,
        context_settings={"allow_interspersed_args": False},
    )
    def capture(
        command: List[str] = typer.Argument(None, metavar="-- COMMAND...",
                                            help="the training command, after --"),
        output: str = typer.Option("tracekit-capture", "-o", "--output",
                                   help="output name: NAME.nsys-rep, NAME.sqlite, NAME.json"),
        force: bool = typer.Option(False, "--force", help="overwrite an existing capture"),
        nsys: Optional[str] = typer.Option(None, "--nsys", help="nsys executable to use"),
        iterations: Optional[str] = typer.Option(
            None, "--iterations", help="record only optimizer steps A-B (0-based, inclusive)"),
        gpu_metrics: bool = typer.Option(True, "--gpu-metrics/--no-gpu-metrics",
                                         help="sample GPU metrics (PCIe throughput) when supported"),
        gpu_metrics_frequency: int = typer.Option(
            1000, "--gpu-metrics-frequency", help="GPU metrics samples per second (Hz)"),
        nsys_option: Optional[List[str]] = typer.Option(
            None, "--nsys-option",
            help="extra nsys profile option, e.g. --nsys-option=--trace=cuda,nvtx,osrt; "
                 "repeatable; replaces tracekit's default for the same option"),
    ) -> None:
        capture_main(command, output, force, nsys, iterations, gpu_metrics,
                     gpu_metrics_frequency, nsys_option)
