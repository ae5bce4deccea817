"""Start-up cost of ``tracekit analyze`` (issue 13, "lazy imports"): the command line coerces its
option values without pydantic, exactly as typer's own pydantic adapters would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ZERO3_CUT

typer_coercion = pytest.importorskip("typer._coercion")


def _commands():
    import typer.main

    from tracekit.cli import app

    group = typer.main.get_command(app)
    return group, group.commands


VALUES = {
    int: ["0", "7", "-3", "0002", "+2", " 2", "1.5", "abc", "", "1_000", "99999999999999999999999", 5],
    float: ["80", "2.5", "-1", "1e-1", "inf", "nan", ".5", "1.", "x", "", "0.001", 80.0, 3],
    str: ["update", "", "a b", "é"],
    Path: ["run.sqlite", "", "-", "dir/x.sqlite", Path("p")],
}


def _outcome(runtime, value, param, ctx):
    """``("ok", value, type)`` or ``("error", message)`` of one coercion."""
    import click

    try:
        out = runtime._coerce_value(value, param=param, ctx=ctx)
    except (click.BadParameter, typer_coercion.BadParameter) as exc:  # typer's vendored click or click
        return ("error", type(exc).__name__, exc.format_message())
    return ("ok", repr(out), type(out).__name__, [type(v).__name__ for v in out] if isinstance(out, list) else None)


def test_every_parameter_coerces_as_typers_adapter():
    """Each option of every command, on well-formed and malformed values: the quick coercion
    gives the value (and type) or the error message of typer's own pydantic adapter
    (``build_runtime_param``, which the quick one replaces)."""
    from typing import get_args, get_origin

    group, commands = _commands()
    checked = 0
    for name, cmd in commands.items():
        ctx = cmd.make_context(name, [], resilient_parsing=True)
        for p in cmd.params:
            quick = p._runtime_param
            if quick is None:
                continue
            assert type(quick).__name__ == "QuickRuntimeParam", (name, p.name)
            ann = p.type_descriptor.annotation
            base = get_args(ann)[0] if get_origin(ann) is list else ann
            slow = typer_coercion.build_runtime_param(p.type_descriptor)
            for v in VALUES.get(base, []):
                value = (v, v) if get_origin(ann) is list else v
                assert _outcome(quick, value, p, ctx) == _outcome(slow, value, p, ctx), (name, p.name, v)
                checked += 1
    assert checked > 200


def _run_analyze(typer_coercion_only: bool) -> tuple[str, str]:
    """(stdout, whether pydantic got imported) of ``tracekit analyze`` on the zero-3 cut in a fresh
    process; ``typer_coercion_only``: with typer's own command classes put back."""
    code = (
        "import sys, io, contextlib\n"
        "import tracekit.cli as cli\n"
        f"if {typer_coercion_only}:\n"
        "    from typer.core import TyperCommand, TyperGroup\n"
        "    for info in cli.app.registered_commands:\n"
        "        info.cls = TyperCommand\n"
        "    cli.app.registered_callback.cls = TyperGroup\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    rc = cli.main(['analyze', {str(ZERO3_CUT)!r}, '--no-cache', '--iteration', '2', '--bin-ms', '2',\n"
        "                  '--pcie-threshold', '70', '--section', 'overlap,sizes'])\n"
        "assert rc == 0, rc\n"
        "sys.stdout.write(out.getvalue())\n"
        "print('pydantic' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"COLUMNS": "80", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"})
    text, _, flag = res.stdout.rstrip("\n").rpartition("\n")
    return text, flag


def test_analyze_imports_no_pydantic():
    """A whole ``tracekit analyze TRACE --no-cache`` runs without importing pydantic (typer
    would build a TypeAdapter per option), and prints what it prints through typer's own
    coercion (which does import pydantic)."""
    quick, quick_pydantic = _run_analyze(False)
    plain, plain_pydantic = _run_analyze(True)
    assert (quick_pydantic, plain_pydantic) == ("False", "True")
    assert quick.count("\n") > 20
    assert quick == plain
