"""The stored output of ``tracekit report`` and ``tracekit compare``: an identical second run
writes what the first one wrote, without polars, matplotlib or the trace (issue 13).

- ``report``: every file the report wrote into ``--out`` (figures, their data, ``report.md``,
  ``report.html``; and the ``--perfetto`` file) is one ``o-<sha1>.files`` entry of the trace's
  cache (:meth:`tracekit.analyze.trace.cache.TraceCache.put_files`), named by the report's
  options (:func:`report_key`) and the trace path as given; it also holds tracekit's code
  fingerprint, and one of another version is a miss (and is replaced: a development checkout
  does not pile up one 9 MB entry per edit). A hit writes the stored bytes into ``--out``: the
  files are byte-identical to the first run's.
- ``compare A B``: the comparison (the dict of ``--json``) is an ``r-<sha1>.json`` entry of
  A's cache, named by the options and both paths as given, holding the code fingerprint and
  B's trace identity (:func:`compare_key`): a changed A clears A's cache, a changed B or
  tracekit is a miss and the entry is replaced.

A miss reads through the same cache as ``tracekit analyze`` (the stored analysis result and
the Parquet frames of every query, :meth:`tracekit.render.data.ReportData.load`), so another
``--rank``, ``--iteration`` or ``--format`` mostly redraws.

Writing into ``--out`` (both on a hit and on a miss): the report's files are one
:class:`tracekit.output.OutputSet`. Each file goes to a temporary of tracekit's naming in the
same folder; once every file is written they are all renamed over their names (SIGINT and
SIGTERM held meanwhile). So a file of that name is replaced, never written through (a symbolic
link or hard link named like a report file is replaced by the new file; what it pointed to is
not touched), and an interrupted report, a full disk or an error leaves the earlier report
whole: the folder holds the old report or the new one, never a mix. Files of other names are
not touched. A temporary left by a killed report (``--out``, its ``data/``, the ``--perfetto``
file's folder, ``compare -o``) is removed by the next report writing there, by the trace
cache's own rule (:func:`tracekit.analyze.trace.cache.remove_stale_temporaries`: its pid gone
on this host, or untouched for an hour); a live report's temporaries and every other file are
kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = ("svg", "pdf")
#: what a report writes into its folder (a stored entry naming anything else is a miss)
REPORT_FILE = re.compile(r"(?:data/[0-9A-Za-z_]{1,64}\.csv|[0-9A-Za-z_]{1,64}\.(?:png|svg|pdf)"
                         r"|report\.md|report\.html)\Z")
#: member name of the ``--perfetto`` file in a stored report (never a report file's name)
PERFETTO_MEMBER = "_perfetto.json"


@dataclass
class ReportResult:
    """What :func:`tracekit.render.report.write_report` wrote: ``out_dir``, ``files`` (paths),
    ``figures`` (name -> png path), ``iteration`` (shown in the timeline figures), ``rank``
    (dict), ``notes``, and ``cached`` (True when the files came from the cache)."""

    out_dir: Path
    files: list[Path] = field(default_factory=list)
    figures: dict[str, Path] = field(default_factory=dict)
    iteration: int | None = None
    rank: dict | None = None
    notes: list[str] = field(default_factory=list)
    cached: bool = False


def check_out(out_dir: str | Path, perfetto: str | Path | None = None) -> None:
    """Check before any work that ``-o out_dir`` (and ``--perfetto perfetto``) can be written
    (:func:`tracekit.output.check_folder`, :func:`tracekit.output.check_file`): raises
    :class:`TracekitError` for a folder that is a file, is not writable or cannot be created, and
    a Perfetto path that is a folder or cannot be written. Creates nothing."""
    from tracekit.output import check_file, check_folder

    check_folder(out_dir, f"-o {out_dir}")
    if perfetto is not None:
        check_file(perfetto, f"--perfetto {perfetto}")


def prepare_dir(out_dir: str | Path, output, with_data: bool = True) -> Path:
    """Create ``out_dir`` (and parents, and ``data/`` with ``with_data``) when missing, as
    folders of the :class:`tracekit.output.OutputSet` ``output`` (removed again when the set is
    aborted and they are empty), and remove the stale temporaries a killed report left in them
    (:func:`clean_folder`); raises :class:`TracekitError` when it is a file, cannot be created or
    is not writable."""
    out = output.folder(out_dir, f"-o {out_dir}")
    if with_data:
        output.folder(out / "data", f"-o {out_dir}")
    return out


def clean_folder(folder: str | Path) -> list[str]:
    """Remove the temporaries of a set of output files (:class:`tracekit.output.OutputSet`)
    that a killed run left in ``folder`` and nothing else: the trace cache's rule,
    :func:`tracekit.analyze.trace.cache.remove_stale_temporaries` (tracekit's naming
    ``.tmp-tk-<pid>-<random>-<host>``, a regular file of ours, its pid gone on this host or
    untouched for an hour). Returns the names removed; never raises."""
    from tracekit.analyze.trace.cache import remove_stale_temporaries

    return remove_stale_temporaries(folder)


def add_perfetto(output, perfetto: str | Path, data: bytes) -> Path:
    """Put the ``--perfetto`` file (``data``) into the set ``output``: its folder created when
    missing (:meth:`tracekit.output.OutputSet.folder`), the file renamed in with the report's.
    Raises :class:`TracekitError` for a folder given as the file or one that cannot be written."""
    from tracekit.output import check_file

    p = Path(perfetto)
    label = f"--perfetto {p}"
    check_file(p, label)
    output.folder(p.parent, label)
    return output.add(p, data, label)


def _versions() -> dict:
    """Versions of the drawing libraries (their output is stored; tracekit's code fingerprint
    covers polars and numpy)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("matplotlib", "plotly"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _cache_of(trace: str | Path):
    """The trace's :class:`~tracekit.analyze.trace.cache.TraceCache` when usable, else None."""
    from tracekit.analyze.trace.cache import TraceCache

    p = Path(trace)
    if not p.is_file():
        return None
    try:
        tc = TraceCache(p)
    except OSError:
        return None
    return tc if tc.enabled else None


def beside(trace) -> dict:
    """sha1 (None when absent) of each path where a capture manifest of ``trace`` may lie
    (:func:`tracekit.analyze.trace.dsconfig.manifest_candidates`, the one rule that figure
    titles, ``report.html``'s configuration and the advice all follow): one appearing,
    changing or going is a miss, an earlier candidate appearing included (it then becomes the
    manifest)."""
    import hashlib

    from tracekit.analyze.trace.dsconfig import MAX_CONFIG_BYTES, manifest_candidates
    from tracekit.errors import TracekitError
    from tracekit.userfiles import read_limited

    out = {}
    for p in manifest_candidates(Path(trace)):
        try:
            if not p.is_file():
                out[p.name] = None
                continue
            size = p.stat().st_size
            if size > MAX_CONFIG_BYTES:  # ignored by every reader (dsconfig.read_manifest): not read here either
                out[p.name] = f"too large: {size}"
                continue
            out[p.name] = hashlib.sha1(read_limited(p, "capture manifest", MAX_CONFIG_BYTES)).hexdigest()
        except (OSError, TracekitError):
            out[p.name] = "unreadable"
    return out


def report_key(tc, trace, *, rank: int, iteration: int | None, fmt: str, phase_map, gas, ds_config: dict | None,
               dpi: int | None, html: bool, perfetto: bool) -> str:
    """The cache key of a report: its options (``ds_config`` as loaded: the config's content, so
    an edited config or manifest is a miss), whether a Perfetto file is written, the drawing
    libraries' versions and the trace path as given (the code fingerprint is checked inside
    the entry: :func:`cached_report`). The output folder is not part of it (nothing written
    depends on it)."""
    opts = {"command": "report", "rank": rank, "iteration": iteration, "fmt": fmt,
            "phase_map": list(phase_map) if phase_map else None, "gas": gas, "ds_config": ds_config, "dpi": dpi,
            "html": html, "perfetto": perfetto, "versions": _versions(), "beside": beside(trace)}
    return tc.output_key(opts, str(trace))


#: figures drawn for one iteration (the others depend on the rank only)
TIMED = ("2_iteration_timeline", "5_overlap_contention")


def figure_key(tc, trace, name: str, *, rank: int, iteration: int, fmt: str, phase_map, gas, ds_config: dict | None,
               dpi: int) -> str:
    """The key of one figure of a report (its PNG, vector file, CSV and frame): what it is drawn
    from (``iteration`` only for :data:`TIMED` figures), so that a report with another
    ``--iteration`` redraws only those."""
    opts = {"command": "report-figure", "figure": name, "rank": rank, "iteration": iteration if name in TIMED else None,
            "fmt": fmt, "phase_map": list(phase_map) if phase_map else None, "gas": gas, "ds_config": ds_config,
            "dpi": dpi, "versions": _versions(), "beside": beside(trace)}
    return tc.output_key(opts, str(trace))


def cached_figure(tc, key: str, name: str, fmt: str):
    """``(png, vector, csv, frame)`` of a figure stored by :func:`store_figure`, or None (also
    when its frame does not read back: a Rust panic of polars included)."""
    from tracekit.analyze.trace.cache import code_fingerprint

    hit = tc.get_files(key) if tc is not None else None
    if hit is None or hit[0].get("code") != code_fingerprint():
        return None
    files = dict(hit[1])
    want = (f"{name}.png", f"{name}.{fmt}", f"data/{name}.csv", "frame.parquet")
    if sorted(files) != sorted(want):
        return None
    from tracekit.analyze.trace.quiet import read_parquet

    frame = read_parquet(files["frame.parquet"])  # None when polars cannot read it (panic text hidden)
    if frame is None:
        return None
    return bytes(files[want[0]]), bytes(files[want[1]]), bytes(files[want[2]]), frame


def store_figure(tc, key: str, name: str, fmt: str, png: bytes, vector: bytes, csv: bytes, frame) -> None:
    """Keep one drawn figure (see :func:`figure_key`) in the trace cache ``tc``."""
    import io

    from tracekit.analyze.trace.cache import code_fingerprint

    buf = io.BytesIO()
    try:
        frame.write_parquet(buf, compression="zstd", compression_level=1, statistics=False)
    except Exception:
        return
    tc.put_files(key, {"code": code_fingerprint(), "figure": name},
                 [(f"{name}.png", png), (f"{name}.{fmt}", vector), (f"data/{name}.csv", csv),
                  ("frame.parquet", buf.getvalue())])


def lookup_report(trace, out_dir, perfetto=None, *, rank: int = 0, iteration: int | None = None, fmt: str = "svg",
                  phase_map=None, gas=None, ds_config=None, dpi: int | None = None, html: bool = True):
    """``(cache, key, result)`` of a report of ``trace`` with these options (as
    :func:`tracekit.render.report.write_report` takes them; ``ds_config`` a path or None):
    ``result`` is the :class:`ReportResult` of the stored files, already written into
    ``out_dir`` (and ``perfetto``), or None on a miss; ``cache`` and ``key`` are where the
    report is to be stored (both None when the trace has no usable cache). Needs neither
    polars nor matplotlib. Raises :class:`TracekitError` for a bad ``ds_config`` file and as
    :func:`cached_report` does."""
    from tracekit.analyze.trace.cache import code_fingerprint
    from tracekit.options import load_ds_config

    tc = _cache_of(trace)
    if tc is None:
        return None, None, None
    code_fingerprint()  # taken now, before anything is computed (stored with the files)
    key = report_key(tc, trace, rank=rank, iteration=iteration, fmt=fmt, phase_map=phase_map, gas=gas,
                     ds_config=load_ds_config(trace, ds_config), dpi=dpi, html=html, perfetto=perfetto is not None)
    return tc, key, cached_report(tc, key, out_dir, perfetto)


def cached_report(tc, key: str, out_dir: str | Path, perfetto: str | Path | None = None) -> ReportResult | None:
    """Write the report stored under ``key`` into ``out_dir`` (and its Perfetto file to
    ``perfetto``) and return what was written; None on a miss (nothing written then), or when
    the entry names a file a report never writes. The files are one
    :class:`tracekit.output.OutputSet`: all renamed in once all are written. Raises
    :class:`TracekitError` as :func:`check_out` and :func:`prepare_dir` do, and for a full disk
    (``disk full ...``: the earlier files are left as they were)."""
    hit = tc.get_files(key) if tc is not None else None
    if hit is None:
        return None
    from tracekit.analyze.trace.cache import code_fingerprint

    meta, files = hit
    names = [n for n, _ in files]
    want_perfetto = perfetto is not None
    if (meta.get("code") != code_fingerprint() or not all(REPORT_FILE.match(n) or n == PERFETTO_MEMBER for n in names)
            or (PERFETTO_MEMBER in names) != want_perfetto or not isinstance(meta.get("figures"), dict)
            or not all(isinstance(v, str) and v in names for v in meta["figures"].values())):
        return None
    from tracekit.output import OutputSet

    check_out(out_dir, perfetto)
    with OutputSet(f"-o {out_dir}") as output:  # renamed in together once all are written
        out = prepare_dir(out_dir, output)
        res = ReportResult(out_dir=out, iteration=meta.get("iteration"), rank=meta.get("rank"),
                           notes=list(meta.get("notes") or []), cached=True)
        for name, data in files:
            if name == PERFETTO_MEMBER:
                continue
            res.files.append(output.add(out / name, data))
        if want_perfetto:
            res.files.append(add_perfetto(output, perfetto, dict(files)[PERFETTO_MEMBER]))
    res.figures = {k: out / v for k, v in meta["figures"].items()}
    return res


def store_report(tc, key: str, res: ReportResult, files: list[tuple[str, bytes]]) -> None:
    """Keep the report ``res`` (``files``: ``[(name relative to the output folder, bytes)]``, the
    Perfetto file as :data:`PERFETTO_MEMBER`) under ``key`` in the trace cache ``tc``."""
    from tracekit.analyze.trace.cache import code_fingerprint

    meta = {"code": code_fingerprint(), "iteration": res.iteration, "rank": res.rank, "notes": res.notes,
            "figures": {k: v.relative_to(res.out_dir).as_posix() for k, v in res.figures.items()}}
    tc.put_files(key, meta, files)


# ---------------------------------------------------------------------- compare
def compare_key(tc, a, b, *, rank: int, phase_map, gas, ds_config_a: dict | None, ds_config_b: dict | None) -> str:
    """The name of ``compare A B``'s entry in A's cache ``tc``: the options (both configs as
    loaded) and both paths as given (:func:`compare_check` is stored inside)."""
    opts = {"command": "compare", "rank": rank, "phase_map": list(phase_map) if phase_map else None, "gas": gas,
            "ds_config_a": ds_config_a, "ds_config_b": ds_config_b, "b": str(b), "beside_a": beside(a),
            "beside_b": beside(b)}
    return tc.output_key(opts, str(a))


def compare_check(b) -> dict:
    """What a stored comparison must have been computed from besides its key: tracekit's code
    fingerprint and B's trace identity. Raises OSError when B cannot be stat-ed."""
    from tracekit.analyze.trace.cache import code_fingerprint, trace_identity

    return {"code": code_fingerprint(), "b_identity": trace_identity(Path(b))}


def lookup_compare(a, b, *, rank: int = 0, phase_map=None, gas=None, ds_config_a=None, ds_config_b=None):
    """``(cache of A, key, result)`` of ``compare A B`` with these options (``ds_config_a/_b``
    paths or None): ``result`` is the stored comparison dict or None; cache and key are None
    when A has no usable cache or B cannot be stat-ed. Needs neither polars nor matplotlib."""
    from tracekit.options import load_ds_config

    tc = _cache_of(a)
    if tc is None or not Path(b).is_file():
        return None, None, None
    try:
        key = compare_key(tc, a, b, rank=rank, phase_map=phase_map, gas=gas,
                          ds_config_a=load_ds_config(a, ds_config_a), ds_config_b=load_ds_config(b, ds_config_b))
        check = compare_check(b)
    except OSError:
        return None, None, None
    stored = tc.get_result(key)
    if not isinstance(stored, dict) or stored.get("check") != check or not isinstance(stored.get("compare"), dict):
        return tc, key, None
    return tc, key, stored["compare"]


def store_compare(tc, key: str, b, check: dict, result: dict) -> None:
    """Keep the comparison ``result`` under ``key`` in A's cache ``tc`` with ``check`` (the
    :func:`compare_check` taken before B was read; not stored when B changed meanwhile)."""
    try:
        if compare_check(b) != check:
            return
    except OSError:
        return
    tc.put_result(key, {"check": check, "compare": result})
