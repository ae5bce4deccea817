"""``tracekit analyze TRACE [flags]`` without typer (issue 13): :func:`tracekit.cli._plain_analyze`
hands :func:`tracekit.cli.analyze.run_analyze` exactly the keywords typer's own parsing gives
the command, leaves every other command line to typer, and the output and exit codes are
those of the typer path."""

import contextlib
import io
import subprocess
import sys

import pytest
from conftest import ZERO3_CUT

import tracekit.cli as cli


def _typer_kwargs(args):
    """The keywords typer's parsing passes to the ``analyze`` command for ``args`` (the command
    replaced by a spy; typer's own app)."""
    seen = {}
    app = cli.app
    info = next(c for c in app.registered_commands if c.name == "analyze")
    real = info.callback

    def spy(**kw):
        seen.update(kw)

    import functools

    info.callback = functools.wraps(real)(spy)
    try:
        rc = app(args=args, standalone_mode=False)
    finally:
        info.callback = real
    assert rc is None
    return seen


PLAIN = [
    ["analyze", str(ZERO3_CUT)],
    ["analyze", str(ZERO3_CUT), "--no-cache"],
    ["analyze", "--json", str(ZERO3_CUT), "--no-cache"],
    ["analyze", str(ZERO3_CUT), "--all", "--wide", "--no-cache", "--cache"],
    ["analyze", str(ZERO3_CUT), "--cache", "--no-cache", "--json", "--all"],
    ["analyze", "/no/such/trace.sqlite", "--json"],
]


@pytest.mark.parametrize("args", PLAIN)
def test_plain_forms_get_what_typer_passes(args):
    mine = cli._plain_analyze(args)
    assert mine is not None
    import inspect

    from tracekit.cli.analyze import run_analyze

    defaults = {k: p.default for k, p in inspect.signature(run_analyze).parameters.items() if k != "traces"}
    assert {**defaults, **mine} == _typer_kwargs(args)


@pytest.mark.parametrize("args", [
    ["analyze"], ["trim", str(ZERO3_CUT)], ["analyze", str(ZERO3_CUT), "--iteration", "1"],
    ["analyze", str(ZERO3_CUT), "--section", "overlap"], ["analyze", str(ZERO3_CUT), str(ZERO3_CUT)],
    ["analyze", "-"], ["analyze", ""], ["analyze", "--", str(ZERO3_CUT)], ["analyze", str(ZERO3_CUT), "--help"],
    ["analyze", str(ZERO3_CUT), "--json=1"], ["--version"], ["analyze", str(ZERO3_CUT), "--no-cach"],
])
def test_other_forms_go_to_typer(args):
    assert cli._plain_analyze(args) is None


def test_completion_request_goes_to_typer(monkeypatch):
    monkeypatch.setenv("_TRACEKIT_COMPLETE", "bash_complete")
    assert cli._plain_analyze(["analyze", str(ZERO3_CUT)]) is None


@pytest.mark.parametrize("flags", [["--no-cache"], ["--no-cache", "--json"], ["--no-cache", "--all", "--wide"]])
def test_output_and_exit_code_equal_the_typer_path(monkeypatch, flags):
    def run():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = cli.main(["analyze", str(ZERO3_CUT), *flags])
        return rc, out.getvalue()

    monkeypatch.setenv("COLUMNS", "100")
    plain = run()
    monkeypatch.setattr(cli, "_plain_analyze", lambda args: None)
    assert plain == run()
    assert plain[0] == 0 and plain[1].count("\n") > 20


def test_missing_trace_same_error_both_ways(monkeypatch, capsys):
    rc = cli.main(["analyze", "/no/such/trace.sqlite", "--no-cache"])
    plain = (rc, capsys.readouterr())
    monkeypatch.setattr(cli, "_plain_analyze", lambda args: None)
    rc = cli.main(["analyze", "/no/such/trace.sqlite", "--no-cache"])
    assert plain == (rc, capsys.readouterr())
    assert plain[0] == 2 and "no such file" in plain[1].err


def test_plain_run_imports_no_typer():
    code = ("import sys, io, contextlib\n"
            "import tracekit.cli as cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = cli.main(['analyze', {str(ZERO3_CUT)!r}, '--no-cache'])\n"
            "print(rc, 'typer' in sys.modules, 'click' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["0", "False", "False"]


@pytest.mark.parametrize("raised, rc_want, err_want", [
    (EOFError, 130, "\ntracekit: interrupted\n"),
    (KeyboardInterrupt, 130, "tracekit: interrupted\n"),
])
def test_end_of_input_and_interrupt_same_both_ways(monkeypatch, capsys, raised, rc_want, err_want):
    """The command body raising EOFError (input closed) or KeyboardInterrupt: the plain path
    ends as typer's main does (typer: a newline, then Abort, which main reports as an interrupt)."""
    from tracekit.cli import analyze as command

    def boom(*args, **kw):
        raise raised()

    monkeypatch.setattr(command, "run_analyze", boom)
    got = []
    for plain in (True, False):
        if not plain:
            monkeypatch.setattr(cli, "_plain_analyze", lambda args: None)
        rc = cli.main(["analyze", str(ZERO3_CUT), "--no-cache"])
        got.append((rc, capsys.readouterr().err))
    assert got[0] == got[1] == (rc_want, err_want)
