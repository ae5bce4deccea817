"""typer's option coercion without pydantic, for the plain types every tracekit option has.

typer (>= 0.2x) builds a pydantic ``TypeAdapter`` for every parameter of the command being run;
:func:`quick_commands` installs command classes whose parameters convert str/int/float/Path
values themselves and hand every other case to typer's own adapter.
"""

from __future__ import annotations

import re

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


def quick_commands(app) -> None:
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
