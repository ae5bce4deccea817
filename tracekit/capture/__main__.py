"""``python -m tracekit.capture -- COMMAND``: the capture command alone.

Same as ``tracekit capture`` but imports nothing from the analysis layer, for machines
where only the capture needs to run (polars not installed).
"""

from __future__ import annotations

import sys

import typer

from tracekit.errors import TracekitError, click_exit_code


def main(argv: list[str] | None = None) -> int:
    """Run ``capture`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    from tracekit.cli.capture import register

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)

    @app.callback()
    def _root() -> None:
        """tracekit capture layer."""

    args = ["capture", *(sys.argv[1:] if argv is None else argv)]
    try:
        rv = app(args=args, standalone_mode=False)
    except TracekitError as exc:
        from tracekit.textsafe import clean

        print(f"tracekit: error: {clean(str(exc))}", file=sys.stderr)  # paths as data (d08)
        return exc.exit_code
    except Exception as exc:
        code = click_exit_code(exc)
        if code is None:
            raise
        return code
    return rv if isinstance(rv, int) and not isinstance(rv, bool) else 0


if __name__ == "__main__":
    sys.exit(main())
