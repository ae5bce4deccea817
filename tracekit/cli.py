"""The ``tracekit`` command line: one typer app; each command lives beside its layer.

Commands register themselves through a ``register(app)`` function in their own module so
that the two layers stay apart:

- ``analyze``, ``trim``        -> :mod:`tracekit.analyze.command`
- ``capture``                  -> :mod:`tracekit.capture.command`
- ``report``, ``compare``      -> :mod:`tracekit.report.command`

Any :class:`tracekit.errors.TracekitError` becomes one line on stderr and its exit code;
no traceback reaches the user.
"""

from __future__ import annotations

import os
import sys

import typer

from tracekit.errors import TracekitError

app = typer.Typer(
    name="tracekit",
    help="Measure DeepSpeed optimizer-offload costs (PCIe copies, CPU-bound updates) "
    "from Nsight Systems traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    from tracekit.analyze import command as analyze_command
    from tracekit.capture import command as capture_command
    from tracekit.report import command as report_command

    analyze_command.register(app)
    capture_command.register(app)
    report_command.register(app)


_register_all()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tracekit`` console script; returns the process exit code."""
    try:
        rv = app(args=argv, standalone_mode=False)
        if isinstance(rv, int):  # click returns a command's exit code instead of raising Exit
            return rv
    except TracekitError as exc:
        print(f"tracekit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:  # raised by commands that set their own exit code
        return exc.exit_code
    except KeyboardInterrupt:
        print("tracekit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # click usage errors and the like
        import click

        if isinstance(exc, click.exceptions.Abort):
            return 130
        if isinstance(exc, click.ClickException):
            exc.show()
            return 2
        if isinstance(exc, click.exceptions.Exit):
            return exc.exit_code
        if os.environ.get("TRACEKIT_DEBUG"):
            raise
        print(
            f"tracekit: internal error: {type(exc).__name__}: {exc} "
            "(rerun with TRACEKIT_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
