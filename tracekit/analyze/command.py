"""``tracekit analyze`` and ``tracekit trim``: the analysis layer's commands."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from tracekit.errors import TracekitError

PHASE_CHOICES = ("forward", "backward", "update", "other")


def check_phase_map_regexes(items: list[str]) -> None:
    """Raise :class:`TracekitError` for a ``--phase-map PHASE=REGEX`` whose regex the matcher
    (polars, Rust's ``regex`` crate) rejects though Python's ``re`` accepts it: look-around
    (``(?<=x)``), backreferences (``\\1``), possessive quantifiers. The syntax is that of
    https://docs.rs/regex/latest/regex/#syntax. Items without ``=`` are left to
    :func:`tracekit.analyze.phases.parse_phase_map`, which names them."""
    import polars as pl

    for item in items:
        _, sep, pattern = item.partition("=")
        if not sep or not pattern:
            continue
        try:
            pl.Series([""], dtype=pl.String).str.contains(f"(?:{pattern})")
        except Exception as exc:  # polars' ComputeError
            detail = " ".join(str(exc).split())
            raise TracekitError(
                f"--phase-map {item!r}: regular expression not supported by the matcher (Rust regex "
                f"syntax: no look-around, no backreferences): {detail[:160]}"
            ) from None


def register(app: typer.Typer) -> None:
    """Add ``analyze`` and ``trim`` to ``app``."""

    @app.command("analyze")
    def analyze(
        traces: Annotated[
            list[Path],
            typer.Argument(
                help="nsys SQLite export (nsys export --type sqlite); several, or a directory of "
                "them, for per-rank results and a summary across ranks",
                show_default=False,
            ),
        ],
        phase: Annotated[
            Optional[str],
            typer.Option(help="narrow to one phase (forward|backward|update|other) and break it down by sub-phase"),
        ] = None,
        iteration: Annotated[Optional[int], typer.Option(help="narrow to one iteration index")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the numbers as JSON")] = False,
        phase_map: Annotated[
            Optional[list[str]],
            typer.Option("--phase-map", help="PHASE=REGEX on NVTX range names (repeatable); overrides built-in names"),
        ] = None,
        gas: Annotated[
            Optional[int],
            typer.Option(help="gradient accumulation steps, used only when updates must be inferred"),
        ] = None,
        jobs: Annotated[
            Optional[int], typer.Option(help="worker processes for several traces (default: CPU count)")
        ] = None,
        dask: Annotated[
            Optional[str],
            typer.Option("--dask", help="run the per-trace work on this Dask scheduler (tcp://HOST:8786)"),
        ] = None,
        cache: Annotated[
            bool,
            typer.Option("--cache/--no-cache", help="keep a Parquet cache beside each trace (TRACE.tracekit-cache/)"),
        ] = True,
        ranks: Annotated[
            Optional[int], typer.Option("--ranks", help="ranks in the run (0..N-1), to report missing ones")
        ] = None,
        section: Annotated[
            Optional[list[str]],
            typer.Option("--section", help="transfer sections in detail, comma-separated: overlap, contention, "
                         "sizes, pageable, memory, timeline, pcie, opportunities (docs/transfers.md)"),
        ] = None,
        all_sections: Annotated[bool, typer.Option("--all", help="every transfer section")] = False,
        pcie_threshold: Annotated[
            float, typer.Option("--pcie-threshold", help="PCIe saturation threshold, % of the link (pcie section)")
        ] = 80.0,
        bin_ms: Annotated[float, typer.Option("--bin-ms", help="bin width of the copy throughput timeline, ms")] = 1.0,
        out: Annotated[
            Optional[Path], typer.Option("--out", help="write the frames of the selected sections to this directory")
        ] = None,
        out_format: Annotated[str, typer.Option("--format", help="file format for --out: csv or parquet")] = "csv",
        ds_config: Annotated[
            Optional[Path],
            typer.Option("--ds-config", help="the run's DeepSpeed JSON config (or capture manifest), for the "
                         "advice; default: NAME.json beside NAME.sqlite"),
        ] = None,
    ) -> None:
        """Break a DeepSpeed run into iterations and phases: time, GPU busy/idle, H2D/D2H copies."""
        from tracekit.analyze import multi

        if out is not None:  # before any analysis (issue 9, item 22)
            from tracekit.analyze.transfers import check_out

            check_out(out, out_format)
        if phase is not None and phase not in PHASE_CHOICES:
            raise TracekitError(f"--phase {phase!r}: choose one of {', '.join(PHASE_CHOICES)}")
        if gas is not None and gas < 1:
            raise TracekitError("--gas must be a positive integer")
        if jobs is not None and jobs < 1:
            raise TracekitError("--jobs must be a positive integer")
        # fields of tracekit.analyze.result.Options (a dict: a cached result needs no polars)
        from tracekit.analyze import sections as transfer_sections  # no polars: a cached result needs none

        sections = transfer_sections.parse_sections(section, all_sections)
        if as_json and not sections:  # --json carries every section but the (long) timeline
            sections = tuple(s for s in transfer_sections.SECTIONS if s != "timeline")
        if out is not None and not sections:
            sections = transfer_sections.SECTIONS
        if not 0 < pcie_threshold <= 100:
            raise TracekitError("--pcie-threshold must be in (0, 100]")
        if not (math.isfinite(bin_ms) and bin_ms > 0):  # nan and inf pass a plain `<= 0`
            raise TracekitError(f"--bin-ms {bin_ms}: must be a positive finite number of ms")
        if phase_map:
            check_phase_map_regexes(phase_map)
        options = dict(phase=phase, iteration=iteration, phase_map=phase_map, gas=gas, sections=sections,
                       pcie_threshold=pcie_threshold, bin_ms=bin_ms)
        from tracekit.analyze import dsconfig  # no polars

        if ds_config is not None or (len(traces) == 1 and traces[0].is_file()):
            # the config is part of the options, so a cached result is keyed on it too
            options["ds_config"] = dsconfig.load(traces[0], ds_config)
        if out is not None:
            from tracekit.analyze import transfers

            paths = multi.expand_inputs(traces)
            for path, dest in zip(paths, transfers.frame_dirs(paths, out)):
                try:
                    written = transfers.write_trace_frames(path, options, dest, out_format)
                except TracekitError:
                    if len(paths) == 1:
                        raise
                    continue  # a bad trace among several: analyze_many lists it below
                print(f"wrote {len(written)} files to {dest} ({path})", file=sys.stderr)
        if len(traces) > 1 or traces[0].is_dir() or dask or not traces[0].exists() and "*" in str(traces[0]):
            many = multi.analyze_many(traces, options, jobs=jobs, dask=dask, cache=cache, expected_ranks=ranks)
            if as_json:
                multi.write_json(many, sys.stdout)
            else:
                multi.render_many(many)
            failures = multi.failure_lines(many)
            if failures:  # every good trace is reported above; then the bad ones, one line each
                sys.stdout.flush()
                for line in failures[:-1]:
                    print(f"tracekit: error: {line}", file=sys.stderr)
                raise TracekitError(failures[-1])
            return
        if as_json and cache:
            text = multi.cached_json(traces[0], options)  # printed as stored, without parsing
            if text is not None:
                sys.stdout.write(text)
                return
        if as_json:
            result = multi.analyze_one(traces[0], options, cache=cache)
            multi.write_json(result, sys.stdout)  # rows one per line; fast on large results
            return
        if cache:  # the tables as printed before for this trace, options and terminal, if any
            view, text = multi.cached_view(traces[0], options, phase)
            if text is not None:
                sys.stdout.write(text)
                return
        result = multi.analyze_one(traces[0], options, cache=cache)
        from tracekit.analyze.render import render

        if cache and view is not None:
            text = multi.render_to_text(render, result, phase, view)
            sys.stdout.write(text)
            multi.store_view(traces[0], options, view, text)
            return
        render(result, phase=phase)

    @app.command("trim")
    def trim_cmd(
        src: Annotated[Path, typer.Argument(help="input nsys SQLite export (only read)")],
        dst: Annotated[Path, typer.Argument(help="output SQLite file")],
        iterations: Annotated[Optional[str], typer.Option(help="iterations to keep, A-B (inclusive)")] = None,
        time_range: Annotated[
            Optional[str],
            typer.Option("--time-range", help="keep a time window instead: A:B in seconds (41.5:82) or percent of the capture (50%:100%)"),
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
        print(f"wrote {dst} ({size / 1e6:.1f} MB, {kept} rows): "
              f"{f'iterations {iterations}' if iterations else f'time range {time_range}'}, "
              f"window {t0}..{t1} ns ({(t1 - t0) / 1e6:.1f} ms)")
