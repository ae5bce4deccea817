"""``tracekit capture``: profile an unmodified DeepSpeed training under Nsight Systems."""

from __future__ import annotations

from typing import List, Optional

import typer

CAPTURE_HELP = """Profile a training command under Nsight Systems with tracekit's NVTX phases.

    tracekit capture -o run -- deepspeed --num_gpus 1 train.py --deepspeed_config ds.json

Writes NAME.nsys-rep, NAME.sqlite (for tracekit analyze) and NAME.json (manifest).
Exits with the training's exit code; 3 when the training succeeded but the capture did not.

Multi-node or one nsys per rank: let the launcher start tracekit as each rank's program,
with --per-rank (outputs NAME.rankR.*), e.g.

    deepspeed --hostfile hosts --module tracekit.capture --per-rank -o runs/z3 -- python train.py ...
    torchrun --nproc-per-node 8 --no-python tracekit capture --per-rank -o runs/z3 -- python train.py ...
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
    per_rank: bool = False,
    local_rank: Optional[str] = None,
) -> int:
    """Run one capture; returns 0, or raises :class:`TracekitError` carrying the training's
    non-zero exit code (or 3 when the training succeeded but the capture failed).

    ``local_rank``: the ``--local_rank=N`` that the deepspeed launcher (deepspeed/launcher/
    launch.py) puts right after the program it starts, i.e. before tracekit's own options;
    it is handed on to the training command, which would have received it without tracekit."""
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
    command = list(command or [])
    if local_rank is not None and command:
        command.append(f"--local_rank={local_rank}")
    result = run_capture(command, settings, nsys, per_rank=per_rank)
    if result.exit_code != 0:
        if result.problems:
            message = "the capture is incomplete (see the lines above)" + (
                f"; manifest {result.manifest}" if result.manifest else "")
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
        per_rank: bool = typer.Option(
            False, "--per-rank",
            help="this is one rank of a job, started by the launcher: outputs NAME.rankR.* "
                 "(R from RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or SLURM_PROCID), GPU "
                 "metrics of this rank's GPU only; -o may also hold {rank}, {local_rank}, "
                 "{node_rank}, {host}"),
        local_rank: Optional[str] = typer.Option(
            None, "--local_rank", "--local-rank", hidden=True,
            help="set by the deepspeed launcher; passed on to the training command"),
    ) -> None:
        capture_main(command, output, force, nsys, iterations, gpu_metrics,
                     gpu_metrics_frequency, nsys_option, per_rank, local_rank)
