"""``tracekit analyze``: one trace, several (a folder, a glob, Dask), tables, CSV, JSON or ``--out`` files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

from tracekit.errors import TracekitError
from tracekit.options import Options as _Options
from tracekit.textsafe import clean
from tracekit.vocab import PHASES as PHASE_CHOICES  # noqa: F401 (the phases --phase accepts)

_DEFAULTS = _Options()  # the defaults shown by --help are those of tracekit.options.Options
#: ``--format`` on stdout (as ``nsys stats --format``); with ``--out`` it names the file format
STDOUT_FORMATS = ("table", "csv", "md", "json")
FILE_FORMATS = ("csv", "parquet")


def _output_format(fmt: str | None, out, as_json: bool) -> str:
    """What goes to stdout: ``table``, ``csv``, ``md`` or ``json`` (``--json``). With ``--out``,
    ``--format`` names the file format and stdout gets the table (or JSON with ``--json``)."""
    if out is not None:
        if fmt is not None and fmt not in FILE_FORMATS:
            raise TracekitError(f"--format {fmt!r}: with --out choose {' or '.join(FILE_FORMATS)}")
        return "json" if as_json else "table"
    if fmt is None:
        return "json" if as_json else "table"
    if fmt not in STDOUT_FORMATS:
        raise TracekitError(f"--format {fmt!r}: choose {', '.join(STDOUT_FORMATS)} (csv or parquet with --out)")
    if as_json and fmt != "json":
        raise TracekitError(f"--json and --format {fmt}: choose one")
    return fmt


def _cached_text(path: Path, options, fmt: str, wide: bool) -> tuple[str | None, str | None]:
    """The output printed before for ``path``, ``options`` and this stdout, from the result
    cache: the JSON text, or the table/csv/md text stored per view (width, colours, NO_COLOR)."""
    from tracekit.analysis import cached_result_text

    if fmt == "json":
        return cached_result_text(path, options), None
    from tracekit.render import many as render_many

    view, text = render_many.cached_view(path, options, options.phase, wide=wide, fmt=fmt)
    return text, None


def _print(a, fmt: str, wide: bool, store: bool, explain=None) -> None:
    """Print :class:`tracekit.analysis.Analysis` ``a`` on stdout in ``fmt``; keep the text of a
    table view in the cache (``store``). ``explain``: True or an advice item's number
    (``--explain [N]``, never cached)."""
    if fmt == "json":
        a.write_json(sys.stdout)  # rows one per line, written piece by piece
        return
    from tracekit.render import many as render_many

    if explain is not None and fmt == "table":
        from tracekit.render.tables import render_text

        sys.stdout.write(render_text(a, fmt, wide, explain=explain))
        return
    text = render_many.render_to_text(a, fmt, wide)
    sys.stdout.write(text)
    if store:
        render_many.store_view(a.path, a.options, render_many.view_of(a.options.phase, wide, fmt), text)


def _write_out(a, out: Path, fmt: str, output=None):
    """``--out``: the files of one analysis, renamed in once all are written
    (:func:`tracekit.render.files.write_frames`); notes (sections skipped) and the summary line
    on stderr, so that stdout stays the table or the JSON. With ``output`` (an
    :class:`tracekit.output.OutputSet` of several traces' files) nothing is renamed in yet, and
    the summary line is returned, to be printed once the set is committed."""
    from tracekit.render.files import write_analysis

    written = write_analysis(a, out, fmt, output)
    for note in a.notes:
        print(f"note: {note}", file=sys.stderr)
    line = f"wrote {len(written)} files to {clean(out)} ({clean(a.path)})"
    if output is not None:
        return line
    print(line, file=sys.stderr)
    return None


def _many(traces, options, out, out_format: str, fmt: str, wide: bool, jobs, dask, ranks) -> None:
    """Several traces (or a directory, a glob, Dask): :func:`tracekit.analyze.multi.analyze_many`.
    Each trace's ``--json`` text and ``--out`` files are written as it arrives, in input order;
    this process keeps only the per-rank phase times the table and the summary read, so its
    memory does not grow with the results (issue 13, item 6)."""
    from tracekit.analyze import multi
    from tracekit.render import many as render_many

    stream = multi.ManyJson(sys.stdout) if fmt == "json" else None
    want, each = ("json", lambda i, path, part: stream.trace(part["json"])) if stream else ("compact", None)
    output = None
    lines: list[str] = []
    if out is not None:
        from tracekit.analysis import Analysis
        from tracekit.output import OutputSet
        from tracekit.render.files import frame_dirs

        dirs = frame_dirs(multi.expand_inputs(traces), out)
        output = OutputSet(f"--out {out}")  # every trace's files, renamed in at the end

        def each(i, path, result):  # the whole result, let go once written
            lines.append(_write_out(Analysis(path, options, result), dirs[i], out_format, output))
            if stream is not None:
                stream.trace(multi.trace_json_text(result))

        want = "stream"
    try:
        many = multi.analyze_many(traces, options, jobs=jobs, dask=dask, cache=options.cache,
                                  expected_ranks=ranks, want=want, each=each)
        if output is not None:
            output.commit()
    except BaseException:
        if output is not None:
            output.abort()  # an error, a full disk, ^C, SIGTERM: the earlier files stay
        raise
    for line in lines:
        print(line, file=sys.stderr)
    if stream is not None:
        stream.close(many["failed"], many["summary"], many.get("run"))
    elif fmt in ("csv", "md"):
        sys.stdout.write(render_many.many_text(many, fmt))
    else:
        render_many.render_many(many, wide=wide)
    failures = multi.failure_lines(many)
    if failures:  # every good trace is reported above; then the bad ones, one line each
        sys.stdout.flush()
        for line in failures[:-1]:
            print(f"tracekit: error: {line}", file=sys.stderr)
        raise TracekitError(failures[-1])


def check_phase_map_regexes(items: list[str]) -> None:
    """Raise :class:`TracekitError` (one line: the item and the matcher's own problem, e.g.
    ``unclosed group``) for a bad ``--phase-map PHASE=REGEX``; see
    :func:`tracekit.options.check_phase_map`, which :class:`tracekit.options.Options` runs too."""
    from tracekit.options import check_phase_map

    check_phase_map(items)


def _section_choices() -> str:
    from tracekit.analyze.sections import choices_help  # the registry; no polars

    return choices_help()


def run_analyze(traces: list[Path], phase: str | None = None, iteration: int | None = None, as_json: bool = False,
                phase_map: list[str] | None = None, gas: int | None = None, jobs: int | None = None,
                dask: str | None = None, cache: bool = True, ranks: int | None = None,
                section: list[str] | None = None, all_sections: bool = False,
                pcie_threshold: float = _DEFAULTS.pcie_threshold, bin_ms: float = _DEFAULTS.bin_ms,
                out: Path | None = None, out_format: str | None = None, wide: bool = False,
                ds_config: Path | None = None, explain: bool = False, explain_item: int | None = None) -> None:
    """``tracekit analyze`` with its options as :func:`register`'s command receives them from
    the command line (typer's coercion done: paths as :class:`~pathlib.Path`, numbers as int or
    float); the command calls it, and so does :func:`tracekit.cli.main` for the plain forms it
    parses without typer (``analyze TRACE`` with flags only, :mod:`tracekit.cli.plain`).
    ``explain`` (with ``explain_item``: only that advice item, 1-based) prints the advice's
    evidence and basis instead of the tables (``--explain [N]``)."""
    from tracekit.analyze import sections as transfer_sections  # no polars: a cached result needs none
    from tracekit.options import Options, load_ds_config

    fmt = _output_format(out_format, out, as_json)
    if explain_item is not None and not explain:
        raise TracekitError("--explain-item N: give it as --explain N")
    explain_arg = (explain_item if explain_item is not None else True) if explain else None
    if explain_arg is not None and (fmt != "table" or len(traces) != 1):
        odd = [t for t in traces[1:] if not Path(t).exists()] if len(traces) > 1 else []
        if fmt == "table" and explain_item is None and len(odd) == 1 and len(traces) == 2:  # `--explain abc`
            raise TracekitError(f"--explain takes an advice item number (1, 2, ...) or nothing; "
                                f"{str(odd[0])!r} is neither a number nor a trace")
        raise TracekitError("--explain: one trace, table output (not with --json, --format or several traces)")
    if out is not None:  # before any analysis (issue 9, item 22)
        from tracekit.render.files import check_out

        check_out(out, out_format or "csv")
    if jobs is not None and jobs < 1:
        raise TracekitError("--jobs must be a positive integer")
    if ranks is not None:
        from tracekit.analyze.multi import check_expected_ranks

        check_expected_ranks(ranks)
    if dask is not None and not dask.strip():  # "" was taken as no --dask at all (issue 25)
        raise TracekitError(f"--dask {dask!r}: give the Dask scheduler's address (tcp://HOST:8786), "
                            "or leave --dask out to analyze here")
    sections = transfer_sections.parse_sections(section, all_sections)
    if fmt == "json" and not sections:  # --json carries every section but the (long) timeline
        sections = tuple(s for s in transfer_sections.SECTIONS if s != "timeline")
    if out is not None and not sections:
        sections = transfer_sections.SECTIONS
    if phase_map:
        check_phase_map_regexes(phase_map)
    one = len(traces) == 1 and traces[0].is_file()
    options = Options(phase=phase, iteration=iteration, phase_map=tuple(phase_map) if phase_map else None,
                      gas=gas, sections=sections, pcie_threshold=pcie_threshold, bin_ms=bin_ms, cache=cache,
                      # the config is part of the options, so a cached result is keyed on it too
                      ds_config=load_ds_config(traces[0], ds_config) if ds_config is not None or one else None)
    if len(traces) > 1 or traces[0].is_dir() or dask or not traces[0].exists() and "*" in str(traces[0]):
        _many(traces, options, out, out_format or "csv", fmt, wide, jobs, dask, ranks)
        return
    path = traces[0]
    # printed as stored (JSON: without parsing; tables: per terminal view)
    if out is None and cache and explain_arg is None:
        text, key = _cached_text(path, options, fmt, wide)
        if text is not None:
            sys.stdout.write(text)
            return
    from tracekit.analysis import analyze

    a = analyze(path, options)
    if out is not None:
        _write_out(a, out, out_format or "csv")
    _print(a, fmt, wide, store=cache and out is None and explain_arg is None, explain=explain_arg)


def register(app: "typer.Typer") -> None:
    """Add ``analyze`` to ``app``."""
    global typer  # module-level for typer, which evaluates the annotations below in this module's globals
    import typer

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
            typer.Option("--phase-map", help="PHASE=REGEX on NVTX range names (repeatable); overrides the "
                         "built-in names of the phases it names"),
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
            typer.Option("--section", help="transfer sections in detail, comma-separated: "
                         f"{_section_choices()} (docs/transfers.md)"),
        ] = None,
        all_sections: Annotated[bool, typer.Option("--all", help="every transfer section")] = False,
        pcie_threshold: Annotated[
            float, typer.Option("--pcie-threshold", help="PCIe saturation threshold, % of the link (pcie section)")
        ] = _DEFAULTS.pcie_threshold,
        bin_ms: Annotated[
            float, typer.Option("--bin-ms", help="bin width of the copy throughput timeline, ms")
        ] = _DEFAULTS.bin_ms,
        out: Annotated[
            Optional[Path], typer.Option("--out", help="write the per-iteration phase table, the sub-phase table "
                                         "and the frames of the selected sections to this directory")
        ] = None,
        out_format: Annotated[
            Optional[str],
            typer.Option("--format", help="output format: table (default), csv, md or json on stdout; with --out, "
                         "the file format: csv (default) or parquet"),
        ] = None,
        wide: Annotated[bool, typer.Option("--wide", help="everything: config table, advice text, every phase "
                                           "and column (default: one screen that fits 80 columns, or "
                                           "$COLUMNS)")] = False,
        explain: Annotated[bool, typer.Option("--explain", help="--explain [N]: the evidence and basis of each "
                                              "advice item (or of item N)")] = False,
        explain_item: Annotated[Optional[int], typer.Option("--explain-item", hidden=True,
                                                            help="N of --explain N")] = None,
        ds_config: Annotated[
            Optional[Path],
            typer.Option("--ds-config", help="the run's DeepSpeed JSON config (or capture manifest), for the "
                         "advice; default: NAME.json beside NAME.sqlite"),
        ] = None,
    ) -> None:
        """Break a DeepSpeed run into iterations and phases: time, GPU busy/idle, H2D/D2H copies."""
        run_analyze(traces, phase=phase, iteration=iteration, as_json=as_json, phase_map=phase_map, gas=gas,
                    jobs=jobs, dask=dask, cache=cache, ranks=ranks, section=section, all_sections=all_sections,
                    pcie_threshold=pcie_threshold, bin_ms=bin_ms, out=out, out_format=out_format, wide=wide,
                    ds_config=ds_config, explain=explain, explain_item=explain_item)
