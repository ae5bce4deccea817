"""``tracekit report``: the figures, their data, report.md and report.html of one trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from tracekit.cli.common import check_rank_gas
from tracekit.errors import TracekitError
from tracekit.textsafe import clean


def register(app: typer.Typer) -> None:
    """Add ``report`` to ``app``."""

    @app.command("report")
    def report_cmd(
        trace: Annotated[Path, typer.Argument(help="nsys SQLite export (nsys export --type sqlite)")],
        out: Annotated[Path, typer.Option("-o", "--out", help="output directory (created when missing)")] = Path(
            "tracekit-report"),
        rank: Annotated[int, typer.Option(help="rank to draw: 0-based index by pid, then device")] = 0,
        iteration: Annotated[
            Optional[int], typer.Option(help="iteration shown in time (figures 2 and 5); default: the median one")
        ] = None,
        fmt: Annotated[str, typer.Option("--format", help="vector format written beside each PNG: svg or pdf")] = "svg",
        phase_map: Annotated[
            Optional[list[str]],
            typer.Option("--phase-map", help="PHASE=REGEX on NVTX range names (repeatable); overrides the "
                         "built-in names of the phases it names"),
        ] = None,
        gas: Annotated[
            Optional[int], typer.Option(help="gradient accumulation steps, used only when updates must be inferred")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print what was written as JSON")] = False,
        ds_config: Annotated[
            Optional[Path],
            typer.Option("--ds-config", help="the run's DeepSpeed JSON config (or capture manifest), for the "
                         "advice; default: NAME.json beside NAME.sqlite"),
        ] = None,
        perfetto: Annotated[
            Optional[Path],
            typer.Option("--perfetto", help="also write a Chrome/Perfetto trace-event JSON to this file"),
        ] = None,
        cache: Annotated[
            bool, typer.Option("--cache/--no-cache", help="read and keep the report, the analysis and the query "
                               "frames in the trace's cache (TRACE.tracekit-cache/, as analyze does)")
        ] = True,
    ) -> None:
        """Write the figures (PNG + SVG/PDF; the per-rank one with two or more ranks), their data (CSV),
        report.md and report.html (self-contained, interactive)."""
        from tracekit.render import report_cache

        check_rank_gas(rank, gas)
        if fmt not in report_cache.FORMATS:
            raise TracekitError(f"--format {fmt!r}: choose {' or '.join(report_cache.FORMATS)}")
        report_cache.check_out(out, perfetto)  # before any work: where it writes can be written
        res = None
        if cache:  # the same report again: the stored files, without polars or matplotlib
            _tc, _key, res = report_cache.lookup_report(trace, out, perfetto, rank=rank, iteration=iteration, fmt=fmt,
                                                        phase_map=phase_map, gas=gas, ds_config=ds_config)
        if res is None:
            from tracekit.render.report import progress, write_report

            with progress(not as_json) as step:
                res = write_report(trace, out, rank=rank, iteration=iteration, fmt=fmt, phase_map=phase_map,
                                   gas=gas, ds_config=ds_config, step=step, perfetto=perfetto, cache=cache)
        if as_json:
            json.dump({"out_dir": str(res.out_dir), "report": str(res.out_dir / "report.md"),
                       "html": str(res.out_dir / "report.html"),
                       "perfetto": str(perfetto) if perfetto is not None else None,
                       "figures": {k: str(v) for k, v in res.figures.items()},
                       "files": [str(p) for p in res.files], "iteration": res.iteration,
                       "rank": {k: res.rank[k] for k in ("index", "pid", "device")}, "notes": res.notes},
                      sys.stdout, indent=1)
            sys.stdout.write("\n")
            return
        for note in res.notes:
            print(f"note: {note}", file=sys.stderr)
        print(f"wrote {clean(res.out_dir / 'report.md')}, {clean(res.out_dir / 'report.html')}"
              + (f", {clean(perfetto)}" if perfetto is not None else "") + f" and {len(res.figures)} figures "
              f"({len(res.files)} files) for pid {res.rank['pid']} GPU {res.rank['device']}, "
              f"iteration {res.iteration} shown in time")
