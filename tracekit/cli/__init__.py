"""The ``tracekit`` command line: one typer app, one module per command.

- :mod:`.analyze` ``tracekit analyze``; :mod:`.trim` ``tracekit trim``;
  :mod:`.capture` ``tracekit capture``; :mod:`.report` ``tracekit report``;
  :mod:`.compare` ``tracekit compare``: each a ``register(app)`` that adds its command
- :mod:`.plain`: ``analyze TRACE [flags]`` parsed without typer (the common forms)
- :mod:`.quick`: typer's option coercion without pydantic
- :mod:`.common`: what several commands share (the one-line error messages, checks)

:func:`main` (the console script, ``python -m tracekit`` and ``python -m tracekit.cli``) runs
the plain form or the typer app. Any :class:`tracekit.errors.TracekitError` becomes one line on
stderr and its exit code; no traceback reaches the user. This package imports only the standard
library and :mod:`tracekit.errors` until a command runs (``python -m tracekit.capture`` imports
:mod:`.capture` through it on machines without polars).
"""

from __future__ import annotations

import os
import sys

from tracekit.cli.common import one_line as _one_line
from tracekit.cli.common import path_error_line as _path_error_line
from tracekit.cli.plain import explain_args as _explain_args
from tracekit.cli.plain import plain_analyze as _plain_analyze
from tracekit.cli.plain import run_plain as _run_plain
from tracekit.errors import TracekitError, click_exit_code

_APP = None


def _build_app():
    """The typer app with every command registered (typer is imported here: the plain
    ``analyze TRACE [flags]`` forms never need it, see :func:`_plain_analyze`)."""
    import typer

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

    _register_all(app)
    return app


def __getattr__(name: str):
    """``tracekit.cli.app``: the typer app, built on first use."""
    if name == "app":
        global _APP
        if _APP is None:
            _APP = _build_app()
        return _APP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_all(app) -> None:
    """Every command, in the order ``--help`` lists them, with the quick coercion."""
    from tracekit.cli import analyze, capture, compare, quick, report, trim

    for command in (analyze, trim, capture, report, compare):
        command.register(app)
    quick.quick_commands(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tracekit`` console script; returns the process exit code."""
    from tracekit import memlimit

    memlimit.allocator_defaults(argv)  # (before polars is imported: jemalloc reads it then)
    memlimit.set_command(argv)
    guarded = memlimit.run_guarded(argv)  # under a memory limit: a child, one line if it runs out
    if guarded is not None:
        return guarded
    last_line = memlimit.prepare_child()  # under a limit: the line, made before memory runs out
    if last_line is None:
        return _main(argv)
    try:
        return _main(argv)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:  # the handlers of _main ran out of memory themselves
        if os.environ.get("TRACEKIT_DEBUG"):
            raise
        memlimit.write_line(last_line)
        return 2


def _main(argv: list[str] | None) -> int:
    from tracekit import memlimit, output, signals

    args = _explain_args(list(sys.argv[1:] if argv is None else argv))
    if args and args[0] in memlimit.GUARDED:  # the commands that write outputs (capture handles its own)
        signals.install(once=bool(os.environ.get(memlimit.CHILD_ENV)))  # SIGTERM cleans up as ^C does
    output.checked_stdout()  # a full disk under stdout raises, never a silently cut output
    try:
        plain = _plain_analyze(args)
        rv = _run_plain(plain) if plain is not None else __getattr__("app")(args=args, standalone_mode=False)
        sys.stdout.flush()  # what is still buffered: its failure is reported here, not at exit
    except TracekitError as exc:
        print(f"tracekit: error: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        code = signals.exit_code(exc)
        print(signals.stop_line(code), file=sys.stderr)
        return code
    except Exception as exc:
        if output.is_disk_full(exc) or output.is_size_limit(exc):
            output.drop_stdout()  # (the rest of the output goes nowhere: no second failure at exit)
            full = "disk full" if output.is_disk_full(exc) else "file size limit (ulimit -f) reached"
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else _one_line(exc)
            where = f" writing {output.stdout_name()}" if output.stdout_failed() else ""
            print(f"tracekit: error: {full}{where}: {why}; the output is incomplete: free some space or "
                  "write elsewhere", file=sys.stderr)
            return 2
        if memlimit.failed_import(exc):  # under a limit: a library that could not be loaded whole
            print(f"tracekit: error: {memlimit.start_message(memlimit.current_limit())}", file=sys.stderr)
            return 2
        if memlimit.is_memory_error(exc):  # MemoryError, or a library that could not be mapped
            print(f"tracekit: error: {memlimit.message()}", file=sys.stderr)
            return 2
        line = _path_error_line(exc)
        if line is not None:
            print(f"tracekit: error: {line}", file=sys.stderr)
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
        if rv == 130 or rv == signals.EXIT_TERMINATED and signals.terminated():  # typer's 130 for both
            rv = signals.exit_code()
            print(signals.stop_line(rv), file=sys.stderr)
        return rv
    return 0
