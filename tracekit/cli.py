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


_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?[0-9]{1,15}(?:\.[0-9]{1,15})?")


def _quick_value(annotation, value, param, ctx):
    """``value`` (as click hands it over) coerced to ``annotation`` the way typer's pydantic
    adapter would, for the plain cases every tracekit option is (str, int, float, Path and
    lists of them, well-formed values); ``_SLOW`` for anything else, which goes to typer."""
    from pathlib import Path

    if annotation is str:
        return value if isinstance(value, str) else _SLOW
    if annotation is bool:
        return value if isinstance(value, bool) else _SLOW
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(value) if isinstance(value, str) and _INT.fullmatch(value) else _SLOW
    if annotation is float:
        if type(value) is float:
            return value
        return float(value) if isinstance(value, str) and _FLOAT.fullmatch(value) else _SLOW
    if annotation is Path and (isinstance(value, Path) or isinstance(value, str) and value):
        from typer._param_types import coerce_cli_path  # the existence/dash checks of typer itself

        return coerce_cli_path(Path(value), param.type_descriptor.parameter_info, path_type=Path,
                               param=param, ctx=ctx)
    return _SLOW


_SLOW = object()


def _quick_commands(app) -> None:
    """Let the commands coerce their plain option values without pydantic.

    typer (>= 0.2x) builds a pydantic ``TypeAdapter`` for every parameter of the command being
    run, even one left at its default; importing pydantic and building the adapters is about
    0.1 s of each ``tracekit analyze`` run (issue 13). The command class installed here gives
    each parameter a coercion that converts str/int/float/Path values (and lists of them) as
    the adapter would and hands every other case (a malformed number, an unusual type) to typer's
    own adapter, so that results and error messages stay typer's. Does nothing with a typer
    that lacks these internals."""
    try:
        from dataclasses import dataclass
        from typing import Any, get_args, get_origin

        from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
        from typer.core import TyperCommand, TyperGroup
    except ImportError:  # another typer: its own coercion throughout
        return

    @dataclass(frozen=True)
    class QuickRuntimeParam(RuntimeParam):
        descriptor: TypeDescriptor

        def _coerce_value(self, value: Any, param, ctx) -> Any:
            ann = self.annotation
            if get_origin(ann) is list and len(get_args(ann)) == 1 and isinstance(value, (list, tuple)):
                out = [_quick_value(get_args(ann)[0], v, param, ctx) for v in value]
                if not any(v is _SLOW for v in out):
                    return out
            elif get_origin(ann) is None:
                out = _quick_value(ann, value, param, ctx)
                if out is not _SLOW:
                    return out
            return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)

    def quicken(params) -> None:
        try:
            _quicken(params)
        except Exception:  # typer's internals changed shape: its own coercion for these
            pass

    def _quicken(params) -> None:
        for p in params:
            d = getattr(p, "type_descriptor", None)
            if d is None or getattr(p, "_runtime_param", 0) is not None or d.file_annotation is not None:
                continue
            pi = d.parameter_info
            if pi.parser is not None or pi.min is not None or pi.max is not None or pi.path_type is not None:
                continue
            p._runtime_param = QuickRuntimeParam(parameter_info=pi, annotation=d.annotation, descriptor=d)

    class Quick:
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            quicken(self.params)

        def get_help_option(self, ctx):  # --help, made when first asked for
            opt = super().get_help_option(ctx)
            if opt is not None:
                quicken([opt])
            return opt

    class QuickCommand(Quick, TyperCommand):
        pass

    class QuickGroup(Quick, TyperGroup):
        pass

    for info in app.registered_commands:
        if info.cls is None or info.cls is TyperCommand:
            info.cls = QuickCommand
    cb = app.registered_callback  # the root's --version: cls as @app.callback(cls=...) sets it
    if cb is not None and (cb.cls is None or cb.cls is TyperGroup or type(cb.cls).__name__ == "DefaultPlaceholder"):
        cb.cls = QuickGroup


def _register_all(app) -> None:
    from tracekit.analyze import command as analyze_command
    from tracekit.capture import command as capture_command
    from tracekit.render import report_command

    analyze_command.register(app)
    capture_command.register(app)
    report_command.register(app)
    _quick_commands(app)


#: value-less flags of ``analyze`` that :func:`_plain_analyze` parses itself: keyword of
#: :func:`tracekit.analyze.command.run_analyze` and value (the last one given wins, as in click)
_PLAIN_FLAGS = {"--json": ("as_json", True), "--no-cache": ("cache", False), "--cache": ("cache", True),
                "--all": ("all_sections", True), "--wide": ("wide", True), "--explain": ("explain", True)}


def _explain_args(args: list[str]) -> list[str]:
    """``analyze ... --explain N`` (or ``--explain=N``) as ``--explain --explain-item N``: the
    optional value of ``--explain [N]``, which typer cannot declare; N is a number."""
    if not args or args[0] != "analyze":
        return args
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--explain=") and a != "--explain=":
            out += ["--explain", "--explain-item", a.split("=", 1)[1]]
        elif a == "--explain" and i + 1 < len(args) and args[i + 1].isdigit():
            out += ["--explain", "--explain-item", args[i + 1]]
            i += 1
        else:
            out.append(a)
        i += 1
    return out


def _plain_analyze(args: list[str]) -> dict | None:
    """The keywords of :func:`tracekit.analyze.command.run_analyze` for ``analyze TRACE`` with
    nothing but the flags of :data:`_PLAIN_FLAGS` (the common forms), exactly as typer would pass
    them; None for any other command line, which goes to typer (issue 13: importing typer and
    building the commands is ~50 ms of CPU of a run). The trace must pass typer's own path
    check unchanged: missing (typer passes it on) or readable; an empty name, ``-``, an option,
    ``--``, a second argument or a shell-completion request go to typer."""
    if len(args) < 2 or args[0] != "analyze" or any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None
    kwargs: dict = {}
    traces = []
    rest = iter(args[1:])
    for a in rest:
        if a == "--explain-item":
            n = next(rest, "")
            if not n.isdigit():
                return None
            kwargs["explain_item"] = int(n)
        elif a in _PLAIN_FLAGS:
            k, v = _PLAIN_FLAGS[a]
            kwargs[k] = v
        elif not a or a.startswith("-"):
            return None
        else:
            traces.append(a)
    if len(traces) != 1:
        return None
    try:
        os.stat(traces[0])
    except OSError:
        pass  # typer: a path that does not exist is passed on (the command says so)
    except ValueError:  # (a NUL in the name): typer's
        return None
    else:
        if not os.access(traces[0], os.R_OK):
            return None  # typer's "is not readable"
    from pathlib import Path

    return {"traces": [Path(traces[0])], **kwargs}


def _click():
    """The click typer uses, with its ``utils``: typer's bundled copy (``typer._click``,
    typer >= 0.20), else the standalone click."""
    import importlib

    for name in ("typer._click", "click"):
        try:
            importlib.import_module(name + ".utils")
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("typer's click")


def _run_plain(kwargs: dict):
    """:func:`tracekit.analyze.command.run_analyze` with ``kwargs``, its exceptions turned into
    what typer's main (non-standalone) and :func:`main` make of them: an interrupt or end of
    input -> exit code 130 ("interrupted"), a broken pipe -> exit 1 with the streams pacified."""
    from tracekit.analyze.command import run_analyze

    try:
        return run_analyze(**kwargs)
    except EOFError:  # typer: a newline, then Abort, which main reports as an interrupt (130)
        print(file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        from tracekit import signals

        return signals.exit_code()
    except OSError as e:
        import errno

        if e.errno == errno.EPIPE:
            PacifyFlushWrapper = _click().utils.PacifyFlushWrapper
            sys.stdout = PacifyFlushWrapper(sys.stdout)
            sys.stderr = PacifyFlushWrapper(sys.stderr)
            sys.exit(1)
        raise


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` as one line: line breaks (of polars' and SQLite's multi-line
    messages) and the blanks around them become one space, other control characters (from
    trace text) a visible escape."""
    text = re.sub(r"\s*[\r\n]+\s*", " ", str(exc)).strip()
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _path_error_line(exc: BaseException) -> str | None:
    """The one line for an OS error that a user's path causes wherever it is first touched
    (a path over the system's limit, ``ENAMETOOLONG``, or a symlink loop): the path as given and
    shortened (:func:`tracekit.userfiles.os_error`), not the 4 kB name twice over; None for
    any other exception."""
    import errno

    if isinstance(exc, OSError) and exc.errno in (errno.ENAMETOOLONG, errno.ELOOP) and exc.filename is not None:
        from tracekit.userfiles import os_error

        return _one_line(os_error(exc.filename, exc))
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tracekit`` console script; returns the process exit code."""
    from tracekit import memlimit

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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
