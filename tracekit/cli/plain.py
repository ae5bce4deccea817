"""``tracekit analyze TRACE [flags]`` without typer: the common forms parsed here.

Importing typer and building the commands is ~50 ms of CPU of a run (issue 13); the plain forms
(one trace, value-less flags) are parsed by :func:`plain_analyze` into exactly the keywords typer
would pass, and every other command line goes to typer. Imports only the standard library.
"""

from __future__ import annotations

import os
import sys

#: value-less flags of ``analyze`` that :func:`plain_analyze` parses itself: keyword of
#: :func:`tracekit.cli.analyze.run_analyze` and value (the last one given wins, as in click)
_PLAIN_FLAGS = {"--json": ("as_json", True), "--no-cache": ("cache", False), "--cache": ("cache", True),
                "--all": ("all_sections", True), "--wide": ("wide", True), "--explain": ("explain", True)}


def explain_args(args: list[str]) -> list[str]:
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


def plain_analyze(args: list[str]) -> dict | None:
    """The keywords of :func:`tracekit.cli.analyze.run_analyze` for ``analyze TRACE`` with
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


def run_plain(kwargs: dict):
    """:func:`tracekit.cli.analyze.run_analyze` with ``kwargs``, its exceptions turned into
    what typer's main (non-standalone) and :func:`tracekit.cli.main` make of them: an interrupt or end of
    input -> exit code 130 ("interrupted"), a broken pipe -> exit 1 with the streams pacified."""
    from tracekit.cli import analyze

    try:
        return analyze.run_analyze(**kwargs)
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
