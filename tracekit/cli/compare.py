"""``tracekit compare``: two runs per phase, sub-phase, config key and iteration (``--fail-above`` for CI)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from tracekit.cli.common import check_rank_gas
from tracekit.errors import TracekitError
from tracekit.textsafe import clean


def register(app: typer.Typer) -> None:
    """Add ``compare`` to ``app``."""

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

        check_rank_gas(rank, gas)
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
            print("wrote " + ", ".join(clean(p) for p in written))
        if slow:
            raise typer.Exit(1)
