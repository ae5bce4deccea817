"""The ``tracekit`` command line: one typer app; each command lives beside its layer.

Commands register themselves through a ``register(app)`` function in their own module so
that the two layers stay apart:

- ``analyze``, ``trim``        -> :mod:`tracekit.analyze.command`
- ``capture``                  -> :mod:`tracekit.capture.command`
- ``report``, ``compare``      -> :mod:`tracekit.render.report_command`

Any :class:`tracekit.errors.TracekitError` becomes one line on stderr and its exit code;
no traceback reaches the user.
"""

from __future__ import annotations

import os
import re
import sys

import typer

from tracekit.errors import TracekitError, click_exit_code

app = typer.Typer(
    name="tracekit",
    help="Measure DeepSpeed optimizer-offload costs (PCIe copies, CPU-bound updates) "
    "from Nsight Systems traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from tracekit import __version__

        print(f"tracekit {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="print tracekit's version and exit",
                                 callback=_version, is_eager=True),
) -> None:
    """Measure DeepSpeed optimizer-offload costs (PCIe copies, CPU-bound updates) from Nsight
    Systems traces."""


def _register_all() -> None:
    from tracekit.analyze import command as analyze_command
    from tracekit.capture import command as capture_command
    from tracekit.render import report_command

    analyze_command.register(app)
    capture_command.register(app)
    report_command.register(app)


_register_all()


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` as one line: line breaks (of polars' and SQLite's multi-line
    messages) and the blanks around them become one space, other control characters (from
    trace text) a visible escape."""
    text = re.sub(r"\s*[\r\n]+\s*", " ", str(exc)).strip()
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tracekit`` console script; returns the process exit code."""
    from tracekit import memlimit

    guarded = memlimit.run_guarded(argv)  # under a memory limit: a child, one line if it runs out
    if guarded is not None:
        return guarded
    try:
        rv = app(args=argv, standalone_mode=False)
    except TracekitError as exc:
        print(f"tracekit: error: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tracekit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if memlimit.is_memory_error(exc):  # MemoryError, or a library that could not be mapped
            print(f"tracekit: error: {memlimit.message()}", file=sys.stderr)
            return 2
        code = click_exit_code(exc)  # usage errors of click/typer: their message, exit 2
        if code is not None:
            return code
        if os.environ.get("TRACEKIT_DEBUG"):
            raise
        print(
            f"tracekit: internal error: {type(exc).__name__}: {_one_line(exc)} "
            "(rerun with TRACEKIT_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1
    except BaseException as exc:  # a Rust panic in polars (pyo3's PanicException) is no Exception
        if type(exc).__name__ != "PanicException" or os.environ.get("TRACEKIT_DEBUG"):
            raise
        if memlimit.is_memory_error(exc):
            print(f"tracekit: error: {memlimit.message()}", file=sys.stderr)
            return 2
        print(f"tracekit: internal error: PanicException: {_one_line(exc)} (rerun with TRACEKIT_DEBUG=1 for "
              "the traceback, and please report it)", file=sys.stderr)
        return 1
    # without standalone mode typer returns the code of an Exit (130 for Ctrl-C) instead of raising
    if isinstance(rv, int) and not isinstance(rv, bool):
        if rv == 130:
            print("tracekit: interrupted", file=sys.stderr)
        return rv
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
