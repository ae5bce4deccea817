"""Errors that reach the user as one line and a non-zero exit code."""

import sys


class TracekitError(Exception):
    """A problem with the user's input or environment, shown as one line.

    ``exit_code`` is what the CLI exits with (2 for bad input, as the analyze issue asks).
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class MissingDataError(TracekitError):
    """The trace lacks a table (or rows) that an analysis needs.

    The message names the table and the nsys option that records it.
    """


def click_exit_code(exc: BaseException) -> int | None:
    """Exit code for a click/typer exception raised in non-standalone mode, after printing
    its one-line message; None when ``exc`` is not one of theirs.

    typer >= 0.20 ships its own copy of click (``typer._click``) next to the standalone
    ``click`` package, so both hierarchies are recognised.
    """
    import click
    import typer

    click_errors: tuple[type, ...] = (click.ClickException,)
    aborts: tuple[type, ...] = (click.exceptions.Abort, getattr(typer, "Abort", click.exceptions.Abort))
    exits: tuple[type, ...] = (click.exceptions.Exit, typer.Exit)
    try:
        from typer._click import exceptions as typer_click

        click_errors += (typer_click.ClickException,)
    except ImportError:  # older typer uses click itself
        pass
    if isinstance(exc, exits):
        return exc.exit_code
    if isinstance(exc, aborts):
        print("tracekit: interrupted", file=sys.stderr)
        return 130
    if isinstance(exc, click_errors):
        if type(exc).__name__ != "NoArgsIsHelpError":  # the help text was printed already
            print(f"tracekit: error: {_usage_line(exc)}", file=sys.stderr)
        return 2
    return None


def _usage_line(exc) -> str:
    """One line for a click usage error: its message and where the usage is (``tracekit CMD
    --help``), instead of click's usage block (issue 9: bad input gets one line)."""
    message = " ".join(str(exc.format_message()).split())
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None) if ctx is not None else None
    where = f"{path} --help" if path else "tracekit --help"
    return f"{message} (see `{where}`)"
