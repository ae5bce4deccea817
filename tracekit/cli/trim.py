"""``tracekit trim``: a smaller valid export holding only some iterations (for fixtures)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from tracekit.textsafe import clean


def register(app: "typer.Typer") -> None:
    """Add ``trim`` to ``app``."""
    global typer  # module-level for typer, which evaluates the annotations below in this module's globals
    import typer

    @app.command("trim")
    def trim_cmd(
        src: Annotated[Path, typer.Argument(help="input nsys SQLite export (only read)")],
        dst: Annotated[Path, typer.Argument(help="output SQLite file")],
        iterations: Annotated[Optional[str], typer.Option(help="iterations to keep, A-B (inclusive)")] = None,
        time_range: Annotated[
            Optional[str],
            typer.Option("--time-range", help="keep a time window instead: A:B in seconds (41.5:82) "
                         "or percent of the capture (50%:100%)"),
        ] = None,
        drop: Annotated[Optional[list[str]], typer.Option(help="table to leave empty (repeatable)")] = None,
        keep_metrics: Annotated[
            Optional[str], typer.Option(help="keep only GPU_METRICS whose metric name matches this regex")
        ] = None,
        force: Annotated[bool, typer.Option(help="overwrite DST")] = False,
    ) -> None:
        """Write a smaller valid export holding only the given iterations (for fixtures)."""
        from tracekit.analyze.trim import trim

        out = trim(src, dst, iterations, drop=drop, keep_metrics=keep_metrics, force=force, time_range=time_range)
        t0, t1 = out["window_ns"]
        kept = sum(out["rows"].values())
        size = dst.stat().st_size
        print(f"wrote {clean(dst)} ({size / 1e6:.1f} MB, {kept} rows): "
              f"{f'iterations {iterations}' if iterations else f'time range {time_range}'}, "
              f"window {t0}..{t1} ns ({(t1 - t0) / 1e6:.1f} ms)")
