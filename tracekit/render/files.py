"""``--out DIR``: the frames of an analysis as CSV or Parquet files, one per frame."""

from __future__ import annotations

import os
from pathlib import Path

from tracekit.errors import TracekitError


def check_out(out_dir: str | Path, fmt: str) -> None:
    """Check ``--out DIR --format FMT`` before any analysis: raises :class:`TracekitError` for
    an unknown format or a ``DIR`` that exists and is not a directory, exists and is not
    writable, or cannot be created (:func:`tracekit.output.check_folder`). Creates nothing."""
    from tracekit.output import check_folder

    if fmt not in ("csv", "parquet"):
        raise TracekitError(f"--format {fmt!r}: choose csv or parquet")
    check_folder(out_dir, f"--out {out_dir}")


def frame_dirs(paths: list[Path], out_dir: str | Path) -> list[Path]:
    """Where ``--out`` writes each trace's frames: ``out_dir`` itself for one trace, else one
    folder per trace named after its file name without ``.sqlite``; traces of the same file
    name in different folders get as many parent folder names as tell them apart, joined by
    ``-`` (``a/rank0.sqlite``, ``b/rank0.sqlite`` -> ``a-rank0``, ``b-rank0``), and a name
    that still repeats gets ``-2``, ``-3``, ... Returns one path per trace, all distinct."""
    out = Path(out_dir)
    paths = [Path(p) for p in paths]
    if len(paths) == 1:
        return [out]

    def stem(p: Path) -> str:
        return p.name[: -len(".sqlite")] if p.name.endswith(".sqlite") and p.name != ".sqlite" else p.name

    parts = [[*Path(os.path.abspath(p)).parent.parts[1:], stem(p)] for p in paths]
    names = []
    for i, mine in enumerate(parts):
        same = [q for j, q in enumerate(parts) if j != i and q[-1] == mine[-1]]
        k = 1
        while any(q[-k:] == mine[-k:] for q in same) and k < len(mine):
            k += 1
        names.append("-".join(mine[-k:]))
    seen: dict[str, int] = {}
    unique = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        unique.append(n if seen[n] == 1 else f"{n}-{seen[n]}")
    # a numbered name may itself collide with a real one: number until distinct
    taken: set[str] = set()
    final = []
    for n in unique:
        m, i = n, 2
        while m in taken:
            m, i = f"{n}-{i}", i + 1
        taken.add(m)
        final.append(out / m)
    return final


def write_frames(frames: dict, out_dir: str | Path, fmt: str = "csv", output=None) -> list[Path]:
    """Write each frame to ``out_dir/NAME.csv`` or ``.parquet``; returns the paths written.

    The files are one :class:`tracekit.output.OutputSet`, or part of ``output`` when given (the
    caller commits it: ``analyze DIR --out`` renames every trace's files in at the end): each
    file is written by polars to an exclusive temporary beside its name, and all are renamed in
    once every one is written, so a full disk, an error or an interrupt leaves the earlier files
    whole (old complete or new complete, never a mix). Raises :class:`TracekitError` for an
    unknown format, an ``out_dir`` that is a file or cannot be written, and a full disk
    (``disk full ...``)."""
    from tracekit.output import OutputSet

    check_out(out_dir, fmt)
    own = output is None
    output = OutputSet(f"--out {out_dir}") if own else output
    paths = []
    try:
        out = output.folder(out_dir, f"--out {out_dir}")
        for name, f in frames.items():
            p = out / f"{name}.{fmt}"
            output.add(p, f.write_csv if fmt == "csv" else f.write_parquet, f"--out {out_dir}")
            paths.append(p)
        if own:
            output.commit()
    except BaseException:
        output.abort()
        raise
    return paths


def write_analysis(analysis, out_dir: str | Path, fmt: str = "csv", output=None) -> list[Path]:
    """``--out DIR``: write the frames of an :class:`tracekit.analysis.Analysis` with
    :func:`write_frames`: ``phases`` (per rank, iteration, phase and micro-step: the numbers of
    ``--json``), ``totals`` (per rank and phase, whole trace), ``sub_phases`` (every phase by
    sub-phase, per iteration) and the frames of the selected sections (all by default;
    ``global_pid`` as the OS ``pid``). In CSV, a text cell starting with ``= + - @``, tab or CR
    gets a leading ``'`` (:func:`tracekit.textsafe.csv_frame`: no formula in a spreadsheet).
    Returns the paths written; the sections skipped for
    missing data are in ``analysis.notes`` (the caller prints them, on stderr). ``output``: the
    :class:`tracekit.output.OutputSet` the files join (see :func:`write_frames`)."""
    wanted = analysis.out_frame_names()
    frames = {"phases": analysis.phases, "totals": analysis.totals, "sub_phases": analysis.sub_phases}
    frames.update({k: v for k, v in analysis.section_frames().items() if k in wanted})
    if fmt == "csv":  # text cells that a spreadsheet would run as a formula: quoted (textsafe.csv_frame)
        from tracekit.textsafe import csv_frame

        frames = {k: csv_frame(v) for k, v in frames.items()}
    return write_frames(frames, out_dir, fmt, output)
