"""Many traces at once: one nsys export per rank or node, analyzed in parallel, then compared.

``tracekit analyze runs/*.sqlite`` (or ``tracekit analyze runs/``) runs the single-trace
analysis of :mod:`tracekit.analyze.result` on every export, in worker processes
(``--jobs N``) or on an existing Dask cluster (``--dask ADDRESS``), and adds a summary
across ranks (:func:`summarize_ranks`): the slowest rank, the spread of phase times, and ranks
missing from the numbering of the file names. When the traces are one run, each worker also
sends back its trace's run part (:mod:`tracekit.analyze.run_parts`) and the traces are joined
into one job (:mod:`tracekit.analyze.run_join`: clocks aligned, waiting ranks and host
contention across the files), ``analyze_many``'s ``"run"``.

A *rank* here is one (trace, process, device) row of a result's ``ranks`` list: a per-rank
export holds one, a per-node export one per GPU process.

Dask workers must see the traces at the same absolute paths as the client (a shared file
system); each worker opens its traces read-only and keeps their Parquet caches beside them
like a local run (:mod:`tracekit.analyze.trace.cache`).

This module holds the inputs, the per-trace work and :func:`analyze_many`; the runners (worker
processes, Dask, the workers' resources) are :mod:`tracekit.analyze.multi_runners` and the
summary across ranks :mod:`tracekit.analyze.multi_summary`, their names importable from here.
"""

from __future__ import annotations

import glob
import os
import re
import threading
from pathlib import Path

from tracekit.analyze import multi_runners
from tracekit.analyze.multi_runners import (  # noqa: F401  (the runners, importable from here too)
    DASK_CONNECT_TIMEOUT_S,
    DASK_WORKER_DIED,
    PEAK_FIXED_BYTES,
    PEAK_PER_TRACE_BYTE,
    WORKER_DIED,
    _dask_client,
    _dask_outcome,
    _in_order,
    _iter_processes,
    _stop_workers,
    available_memory,
    default_jobs,
    stream_window,
    usable_cores,
    worker_threads,
)
from tracekit.analyze.multi_summary import (  # noqa: F401  (the summary, importable from here too)
    _RANK_WORD,
    MAX_LISTED_MISSING,
    _slowest,
    _who,
    check_expected_ranks,
    listed_ranks,
    missing_ranges,
    rank_numbers,
    rank_rows,
    summarize_ranks,
)
from tracekit.errors import TracekitError

_GLOB_CHARS = re.compile(r"[*?\[]")


# ---------------------------------------------------------------------- inputs
def expand_inputs(items: list[str | Path]) -> list[Path]:
    """Turn command-line inputs into the list of traces to analyze, in a stable order.

    Each item is a trace file, a directory (its ``*.sqlite`` files, sorted by name, not
    recursive) or a glob pattern the shell did not expand (``'runs/*.sqlite'``). Duplicates
    (same resolved path) are kept once. Raises :class:`TracekitError` naming every item that
    is missing, a directory without ``.sqlite`` files, or a pattern matching nothing.
    """
    out: list[Path] = []
    bad: list[str] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.glob("*.sqlite") if q.is_file())
            if not found:
                bad.append(f"{p} (directory without .sqlite files)")
            out.extend(found)
        elif p.exists():
            out.append(p)
        elif _GLOB_CHARS.search(str(item)):
            found = sorted(Path(q) for q in glob.glob(str(item)) if Path(q).is_file())
            if not found:
                bad.append(f"{item} (no file matches)")
            out.extend(found)
        else:
            bad.append(f"{p} (no such file)")
    if bad:
        raise TracekitError(f"trace{'s' if len(bad) > 1 else ''} not found: {'; '.join(bad)}")
    seen: set[Path] = set()
    unique = []
    for p in out:
        r = p.resolve()
        if r not in seen:
            seen.add(r)
            unique.append(p)
    return unique



# ---------------------------------------------------------------------- one trace
def options_dict(options) -> dict:
    """The fields of :class:`tracekit.options.Options` that key a result, from an Options or a dict."""
    from tracekit.options import Options

    return Options.of(options).key()


def analyze_one(path: str | Path, options=None, cache: bool = True) -> dict:
    """Analyze one trace: the JSON-ready dict of :meth:`tracekit.analysis.Analysis.to_json`
    (:func:`tracekit.analysis.analyze`, the one pipeline; its result cache included).

    ``options`` is a :class:`tracekit.options.Options` or a dict of its fields. Raises
    :class:`TracekitError` for a trace that cannot be analyzed.
    """
    from tracekit.analysis import analyze
    from tracekit.options import Options

    a = analyze(path, Options.of(options, cache=cache))
    if getattr(_last, "keep", False):  # for the run part (:func:`_analyze_one_checked`), on this thread
        _last.analysis = a
    return a.to_json()


#: the Analysis of :func:`analyze_one` for :func:`_analyze_one_checked`'s run part, per thread (a
#: Dask worker runs several), kept only while that call runs
_last = threading.local()


def _analyze_one_checked(path: str, options, cache: bool, run_part: bool = False) -> dict:
    """:func:`analyze_one` for a worker: any failure comes back as a TracekitError naming the
    trace, on one line (out of memory: :func:`tracekit.memlimit.message`, exit code 2; a bug or
    a Rust panic of polars: exit code 1). ``run_part``: the result holds the trace's run part
    under ``"run_part"`` (:func:`tracekit.analyze.run_parts.run_part`, for the join of one run's
    exports; taken out by :func:`analyze_many`)."""
    try:
        _last.analysis, _last.keep = None, run_part
        try:
            result = analyze_one(path, options, cache)
            a = _last.analysis
        finally:
            _last.analysis, _last.keep = None, False
        if not run_part:
            return result
        from tracekit.analyze.run_parts import run_part as part_of

        if a is None or Path(a.path) != Path(path):  # analyze_one replaced (a test's hook)
            from tracekit.analysis import analyze
            from tracekit.options import Options

            a = analyze(path, Options.of(options, cache=cache))
        return {**result, "run_part": part_of(a)}
    except TracekitError:
        raise
    except BaseException as exc:  # Exception, or pyo3's PanicException (a BaseException)
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise  # KeyboardInterrupt, SystemExit
        from tracekit import memlimit

        if memlimit.is_memory_error(exc):
            raise TracekitError(f"{path}: {memlimit.message()}") from None
        first = (str(exc).splitlines() or [""])[0]
        raise TracekitError(f"{path}: analysis failed ({type(exc).__name__}: {first})", exit_code=1) from None


# ---------------------------------------------------------------------- many traces
#: What a worker sends back per trace (``want`` of :func:`analyze_many`): ``"result"`` the whole
#: result; ``"compact"`` only what the summary across ranks reads (:func:`compact_part`);
#: ``"json"`` that and the trace's ``--json`` text (:func:`trace_json_text`); ``"stream"`` the
#: whole result, handed to ``each`` and then let go (only its compact part is kept).
WANTS = ("result", "compact", "json", "stream")


def analyze_many(
    items: list[str | Path],
    options=None,
    jobs: int | None = None,
    dask: str | None = None,
    cache: bool = True,
    expected_ranks: int | None = None,
    want: str = "result",
    each=None,
) -> dict:
    """Analyze every trace of ``items`` (see :func:`expand_inputs`) and compare their ranks.

    Args:
        options: :class:`tracekit.analyze.result.Options` (or a dict of its fields), the same
            for every trace.
        jobs: worker processes (default: :func:`default_jobs`, what the cores, the memory and
            the number of traces allow); 1 runs in this process. The workers share one budget
            of threads (:func:`worker_threads`). Ignored with ``dask``.
        dask: address of a running Dask scheduler (``tcp://host:8786``); the per-trace work
            runs there.
        cache: use the per-trace Parquet / result cache.
        expected_ranks: how many ranks the run had (numbered 0..N-1), to report missing ones.
        want: what each worker sends back and this process keeps (:data:`WANTS`): ``"result"``
            (default) every trace's whole result, kept in ``traces``; ``"compact"``, ``"json"``
            and ``"stream"`` keep only :func:`compact_part` of each, so that this process's
            memory does not grow with the results (issue 13, item 6): with ``"json"`` and
            ``"stream"`` each trace's part (the compact part with the ``"json"`` text, or the
            whole result) is handed to ``each`` and then let go, and at most
            :func:`stream_window` traces are asked for ahead of the one ``each`` waits on.
        each: ``each(index, path, part)``, called in input order for every trace that could be
            analyzed, as its part arrives (``index`` into :func:`expand_inputs`'s list).

    Returns ``{"traces": [result (or compact part) per good trace, in input order], "failed":
    [{"trace": str, "error": str (one line, naming the trace), "exit_code": int}], "summary":
    summarize_ranks(...), "run": run_join.run_json(...) | None}`` (times in ns). ``run`` (None
    for a single trace) is the traces seen as one job: hosts, ranks per host, clock alignment,
    and host contention and waiting ranks computed across the files
    (:mod:`tracekit.analyze.run_join`), or the verdict that they are different runs. A trace
    that cannot be analyzed (not an nsys export, truncated, out of memory, a worker that died)
    does not stop the others: it is listed in ``failed`` and left out of the summary and the
    run (but not counted as a missing rank).

    Raises :class:`TracekitError` (one line): an input missing (:func:`expand_inputs`), an
    unreachable Dask scheduler, an ``expected_ranks`` below 1.
    """
    if want not in WANTS:
        raise ValueError(f"want={want!r}: choose one of {WANTS}")
    check_expected_ranks(expected_ranks)
    paths = expand_inputs(items)
    from tracekit.options import Options

    opts = Options.of(options)  # checked here, once; a frozen dataclass travels to the workers
    streamed = want in ("json", "stream")
    if dask is not None and not str(dask).strip():
        raise TracekitError(f"--dask {dask!r}: give the Dask scheduler's address (tcp://HOST:8786), or leave --dask out "
                            "to analyze here")
    rp = len(paths) > 1  # the run parts, for the join of one run's exports (issue 24)
    if dask:
        outcomes = _iter_dask(dask, paths, opts, cache, want, streamed, run_part=rp)
    else:
        import functools

        n = min(jobs, len(paths)) if jobs else default_jobs(paths)
        if n <= 1:
            outcomes = (_outcome(lambda p=p: analyze_part(str(p), opts, cache, want, run_part=rp)) for p in paths)
        else:
            outcomes = _iter_processes(paths, opts, cache, n,
                                       work=functools.partial(analyze_part, want=want, run_part=rp),
                                       window=stream_window(n) if streamed else None)
    results, good, failed, run_parts = [], [], [], []
    try:
        for i, (p, o) in enumerate(zip(paths, outcomes)):
            if isinstance(o, TracekitError):
                failed.append({"trace": str(p), "error": _named(p, o), "exit_code": o.exit_code})
                continue
            part = o.pop("run_part", None)
            if part is not None:
                run_parts.append(part)
            if each is not None:
                each(i, p, o)
            if want == "stream":
                o = compact_part(o)
            elif want == "json":
                o = {k: v for k, v in o.items() if k != "json"}
            results.append(o)
            good.append(p)
            del o  # the part handed to each() goes now, before the next one arrives
    finally:  # stopped early (an error in each(), ^C): the workers stop, the Dask client closes
        outcomes.close()
    summary = summarize_ranks(results, good, expected_ranks, failed=[Path(f["trace"]) for f in failed])
    run = None
    if rp:
        from tracekit.analyze import run_join

        names = [str(r.get("trace")) for r in results]
        run = run_join.run_json(run_parts if len(run_parts) == len(results) else [], names,
                                rank_numbers(good), summary["note"], summary["run_groups"])
    return {"traces": results, "failed": failed, "summary": summary, "run": run}


def compact_part(result: dict) -> dict:
    """The part of one trace's result that :func:`rank_rows` and :func:`summarize_ranks` read,
    in the result's own shape: ``{"trace", "ranks": [{"pid", "device", "iterations": [{"index",
    "complete", "unclosed" (when in the result), "phases": [{"phase", "wall_ns"}]}]}]}``
    (a few hundred bytes per iteration, against tens of MB for a whole ``--all`` result)."""
    ranks = []
    for r in result.get("ranks", []):
        its = []
        for it in r.get("iterations", []):
            d = {k: it[k] for k in ("index", "complete", "unclosed") if k in it}
            d["phases"] = [{"phase": ph["phase"], "wall_ns": ph["wall_ns"]} for ph in it.get("phases", [])]
            its.append(d)
        ranks.append({"pid": r["pid"], "device": r["device"], "iterations": its})
    return {"trace": result.get("trace"), "ranks": ranks}


def trace_json_text(result: dict) -> str:
    """``result`` as it stands in the ``"traces"`` list of ``tracekit analyze A B ... --json``
    (:func:`write_json`'s layout two levels deep, without the final newline); what
    :class:`ManyJson` writes."""
    from tracekit.analyze.trace.cache import format_json

    return format_json(result).rstrip("\n").replace("\n", "\n  ")


def analyze_part(path: str, options, cache: bool, want: str = "result", name: str | None = None,
                 run_part: bool = False) -> dict:
    """What a worker sends back for one trace (``want``, see :data:`WANTS`): the whole result
    of :func:`_analyze_one_checked`, its :func:`compact_part`, or that with ``"json"``: the
    trace's text for ``--json`` (:func:`trace_json_text`). ``name``: the trace's path as the
    client spells it, in place of ``path`` in the result. ``run_part``: with the trace's run part
    under ``"run_part"`` (:func:`_analyze_one_checked`). Raises TracekitError as
    :func:`_analyze_one_checked`."""
    result = _analyze_one_checked(path, options, cache, run_part)
    rp = result.pop("run_part", None)
    if name is not None:
        result["trace"] = name
    if want in ("result", "stream"):
        return result if rp is None else {**result, "run_part": rp}
    part = compact_part(result)
    if rp is not None:
        part["run_part"] = rp
    if want == "json":
        part["json"] = trace_json_text(result)
    return part


class ManyJson:
    """``tracekit analyze A B ... --json`` written trace by trace: :meth:`trace` writes each
    trace's text (:func:`trace_json_text`) as it arrives, :meth:`close` the ``failed`` list and
    the summary; the text is the same as :func:`write_json` of the whole dict, which is never
    held."""

    _HEAD = '{\n "traces": []'

    def __init__(self, fh) -> None:
        self.fh, self.n = fh, 0

    def trace(self, text: str) -> None:
        """Write one trace's text (the next one of the ``"traces"`` list)."""
        self.fh.write(('{\n "traces": [' if not self.n else ",") + "\n  " + text)
        self.n += 1

    def close(self, failed: list, summary: dict, run: dict | None = None) -> None:
        """Write the end: the ``failed`` list, ``summary`` and ``run`` (:func:`analyze_many`'s;
        ``run`` left out when None)."""
        from tracekit.analyze.trace.cache import format_json

        tail = format_json({"traces": [], "failed": failed, "summary": summary,
                            **({"run": run} if run is not None else {})})
        assert tail.startswith(self._HEAD)
        self.fh.write(tail if not self.n else "\n ]" + tail[len(self._HEAD):])


def _named(path: Path, exc: TracekitError) -> str:
    """The first line of ``exc``'s message, starting with the trace's path when it does not name it."""
    from tracekit.userfiles import shown

    msg = (str(exc).splitlines() or [type(exc).__name__])[0]
    return msg if str(path) in msg or shown(path) in msg else f"{shown(path)}: {msg}"


def _outcome(call) -> dict | TracekitError:
    """``call()``, or the TracekitError it raised (one trace's failure does not stop the others)."""
    try:
        return call()
    except TracekitError as exc:
        return exc


def _analyze_on_dask_worker(path: str, name: str | None = None, options=None, cache: bool = True,
                            want: str = "result", run_part: bool = False) -> dict:
    """:func:`analyze_part` on a Dask worker (``name``: the path as the client spells it): a
    trace the client sees but the worker does not (no shared file system, another mount point)
    is named as such, with the host."""
    if not os.path.exists(path):
        import socket

        raise TracekitError(
            f"{name or path}: no such file on the Dask worker on {socket.gethostname()} (workers must see "
            "the traces at the same absolute paths as the client: a shared file system)"
        )
    return analyze_part(path, options, cache, want, name, run_part)




def _iter_dask(address: str, paths: list[Path], opts, cache: bool, want: str = "result", streamed: bool = False,
               run_part: bool = False):
    """Each trace's part (:func:`analyze_part` with ``want``, run by :func:`_analyze_on_dask_worker`)
    or TracekitError from the Dask scheduler at ``address``, in input order
    (:func:`tracekit.analyze.multi_runners._iter_dask`: streamed or all at once)."""
    return multi_runners._iter_dask(address, paths, _analyze_on_dask_worker,
                                    dict(options=opts, cache=cache, want=want, run_part=run_part), streamed)


def failure_lines(out: dict) -> list[str]:
    """One line per trace of :func:`analyze_many`'s dict that could not be analyzed, then one
    line saying how many failed of how many (empty when none failed). Plain text, for stderr."""
    failed = out.get("failed") or []
    if not failed:
        return []
    n = len(failed) + len(out.get("traces", []))
    good = n - len(failed)
    lines = [f["error"] for f in failed]
    rest = f"; the other {good} {'is' if good == 1 else 'are'} reported" if good else ""
    lines.append(f"{len(failed)} of {n} traces could not be analyzed (listed above){rest}")
    return lines


# ---------------------------------------------------------------------- JSON output
def write_json(obj, fh, indent: int = 1) -> None:
    """Write ``obj`` as JSON to ``fh`` in the layout of :func:`tracekit.analyze.trace.cache.format_json`
    (containers indented, rows one per line; many times faster than ``json.dump(indent=...)``)."""
    from tracekit.analyze.trace.cache import format_json

    fh.write(format_json(obj, indent))

