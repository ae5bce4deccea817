"""``tracekit capture`` (placeholder registration; the capture issue fills it in)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the ``capture`` command to ``app``."""

    @app.command(
        "capture",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def capture(ctx: typer.Context) -> None:
        """Profile a training command under Nsight Systems: tracekit capture -- deepspeed train.py ..."""
        from tracekit.errors import TracekitError

        raise TracekitError("capture is not implemented yet")
