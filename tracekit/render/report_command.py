"""``tracekit report`` and ``tracekit compare``: the figure layer's commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from tracekit.errors import TracekitError


def _check(rank: int, gas: int | None) -> None:
    if rank < 0:
        raise TracekitError("--rank must be 0 or more (ranks are numbered by pid, then device)")
    if gas is not None and gas < 1:
        raise TracekitError("--gas must be a positive integer")


def register(app: typer.Typer) -> None:
    """Add ``report`` and ``compare`` to ``app``."""

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
            typer.Option("--phase-map", help="PHASE=REGEX on NVTX range names (repeatable); overrides built-in names"),
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
            Optional[Path], typer.Option("--perfetto", help="also write a Chrome/Perfetto trace-event JSON to this file")
        ] = None,
        cache: Annotated[
            bool, typer.Option("--cache/--no-cache", help="read and keep the report, the analysis and the query "
                               "frames in the trace's cache (TRACE.tracekit-cache/, as analyze does)")
        ] = True,
    ) -> None:
        """Write the figures (PNG + SVG/PDF; the per-rank one with two or more ranks), their data (CSV),
        report.md and report.html (self-contained, interactive)."""
        from tracekit.render import report_cache

        _check(rank, gas)
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
        print(f"wrote {res.out_dir / 'report.md'}, {res.out_dir / 'report.html'}"
              + (f", {perfetto}" if perfetto is not None else "") + f" and {len(res.figures)} figures "
              f"({len(res.files)} files) for pid {res.rank['pid']} GPU {res.rank['device']}, "
              f"iteration {res.iteration} shown in time")

    @app.command("compare")
    def compare_cmd(
        a: Annotated[Path, typer.Argument(help="first nsys SQLite export (A, the baseline)")],
        b: Annotated[Path, typer.Argument(help="second nsys SQLite export (B)")],
        out: Annotated[
            Optional[Path], typer.Option("-o", "--out", help="also write compare.png/.svg/.json into this directory")
        ] = None,
        rank: Annotated[int, typer.Option(help="rank to compare in both: 0-based index by pid, then device")] = 0,
        fmt: Annotated[str, typer.Option("--format", help="vector format beside the PNG: svg or pdf")] = "svg",
        phase_map: Annotated[
            Optional[list[str]],
            typer.Option("--phase-map", help="PHASE=REGEX on NVTX range names (repeatable), for both traces"),
        ] = None,
        gas: Annotated[
            Optional[int], typer.Option(help="gradient accumulation steps, used only when updates must be inferred")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
        wide: Annotated[bool, typer.Option("--wide", help="every column (default: what fits 80 characters, "
                                           "or $COLUMNS)")] = False,
        fail_above: Annotated[
            Optional[float],
            typer.Option("--fail-above", help="exit 1 when a phase or the iteration (mean wall time per steady "
                         "iteration) got slower from A to B by more than this percent, and by at least 1 ms and more "
                         "than the iteration-to-iteration spread (for CI; also with --json)"),
        ] = None,
        ds_config_a: Annotated[
            Optional[Path], typer.Option("--ds-config-a", help="A's DeepSpeed JSON config (or capture manifest); "
                                         "default: NAME.json beside A")] = None,
        ds_config_b: Annotated[
            Optional[Path], typer.Option("--ds-config-b", help="B's DeepSpeed JSON config (or capture manifest); "
                                         "default: NAME.json beside B")] = None,
        cache: Annotated[
            bool, typer.Option("--cache/--no-cache", help="read and keep the comparison in A's cache and each "
                               "trace's analysis and query frames in its own (as analyze does)")
        ] = True,
    ) -> None:
        """Compare two runs per phase, update sub-phase, config key and iteration: time, bytes, overlap,
        pageable copies, memory peak, and the advice item that explains a difference."""
        from tracekit.analyze.trace.cache import dumps_strict
        from tracekit.render import compare as C
        from tracekit.render.report_cache import FORMATS, prepare_dir

        _check(rank, gas)
        if fmt not in FORMATS:
            raise TracekitError(f"--format {fmt!r}: choose {' or '.join(FORMATS)}")
        if fail_above is not None and not fail_above >= 0:
            raise TracekitError(f"--fail-above {fail_above:g}: give a percent >= 0")
        if out is not None:  # before any work
            from tracekit.output import check_folder

            check_folder(out, f"-o {out}")
        result = None
        if cache:  # the same comparison again: as stored, without polars or matplotlib
            from tracekit.render.report_cache import lookup_compare

            _tc, _key, result = lookup_compare(a, b, rank=rank, phase_map=phase_map, gas=gas, ds_config_a=ds_config_a,
                                               ds_config_b=ds_config_b)
        if result is None:
            from tracekit.render.report import progress

            with progress(not as_json, "tracekit compare") as step:
                result = C.compare_paths(a, b, rank=rank, phase_map=phase_map, gas=gas, step=step,
                                         ds_config_a=ds_config_a, ds_config_b=ds_config_b, cache=cache)
        slow = C.regressions(result, fail_above) if fail_above is not None else []
        if fail_above is not None:
            result["regressions"] = {"fail_above_pct": fail_above, "slower": slow}
        written = []
        if out is not None:  # one set of files, renamed in together once all are written, as report's
            from tracekit.output import OutputSet
            from tracekit.render import style as S

            with OutputSet(f"-o {out}") as output:
                d = prepare_dir(out, output, with_data=False)
                fig, _ = C.compare_figure(result)
                for ext in ("png", fmt):
                    image = S.figure_bytes(fig, ext, S.DPI if ext == "png" else None)
                    written.append(output.add(d / f"compare.{ext}", image))
                S.close(fig)
                written.append(output.add(d / "compare.json", (dumps_strict(result, indent=1) + "\n").encode("utf-8")))
        if as_json:
            sys.stdout.write(dumps_strict(result, indent=1) + "\n")  # strict JSON: inf (--fail-above inf) -> null
        else:
            C.render(result, wide=wide)
        for r in slow:
            print(f"regression: {r['what']} {r['a_ms']:,.1f} -> {r['b_ms']:,.1f} ms per iteration "
                  f"(mean per steady iteration, {r['pct']:+.1f}% > {fail_above:g}%)", file=sys.stderr)
        if written and not as_json:
            print("wrote " + ", ".join(str(p) for p in written))
        if slow:
            raise typer.Exit(1)
