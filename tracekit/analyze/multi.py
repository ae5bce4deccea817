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
"""

from __future__ import annotations

import glob
import os
import re
import threading
from pathlib import Path

from tracekit.errors import TracekitError

from tracekit.vocab import PHASES  # noqa: E402
#: How long ``--dask`` waits for the scheduler before giving up, seconds
#: (environment variable ``TRACEKIT_DASK_TIMEOUT`` overrides).
DASK_CONNECT_TIMEOUT_S = 10.0

_RANK_WORD = re.compile(r"(?i)(?:^|[^a-z])(?:rank|node|proc|process|worker|host)[-_.]?(\d+)")
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


def rank_numbers(paths: list[Path]) -> list[int | None]:
    """Rank (or node) number of each trace read from its file name, or None.

    A number after ``rank``, ``node``, ``proc``, ``process``, ``worker`` or ``host`` counts
    (``rank3.sqlite``, ``node_12.sqlite``); failing that, when two or more names differ only
    in their last number (``report_0``, ``report_1``, ``report_3``), that number.
    """
    stems = [p.name.split(".")[0] for p in paths]
    words = [_RANK_WORD.findall(s) for s in stems]
    if all(words):
        return [int(w[-1]) for w in words]
    if len(stems) >= 2:
        shapes = {re.sub(r"\d+(?=\D*$)", "#", s) for s in stems}
        nums = [re.findall(r"\d+", s) for s in stems]
        if len(shapes) == 1 and "#" in next(iter(shapes)) and all(nums):
            return [int(n[-1]) for n in nums]
    return [None] * len(paths)


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
            outcomes = _iter_processes(paths, opts, cache, n, want=want,
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


def stream_window(slots: int) -> int:
    """How many traces may be asked for (running, or done and not yet handed on) ahead of the
    one the client waits on when each part is handed on in input order: twice the workers'
    slots, at least 2; so the parts held at once do not grow with the number of traces."""
    return max(2, 2 * slots)


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


#: what a trace's failure says when the worker process analyzing it (or another one of the
#: pool, which takes the pool down with it) died
WORKER_DIED = "a worker process died while analyzing it (killed or aborted, often out of memory)"
#: the same for a worker of a Dask cluster (``KilledWorker``)
DASK_WORKER_DIED = ("a worker of the Dask cluster died while analyzing it (killed or aborted, often out of "
                    "memory); give the workers more memory (dask worker --memory-limit) or fewer threads each")


#: Peak resident memory of one trace's analysis, estimated from its size: a fixed part plus a
#: share of the file's bytes. Measured on the shared 624 MB ZeRO-3 trace and its 4x copy
#: (docs/performance.md, issue 13): 206-255 MiB at 624 MB, 317-347 MiB at 2.5 GB, with or
#: without ``--all``/``--json``; the estimate (440 MiB at 624 MB) stays above every measured run.
PEAK_FIXED_BYTES = 128 << 20
PEAK_PER_TRACE_BYTE = 0.5


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, else the CPU count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """Bytes of memory new processes can take now: ``MemAvailable`` of ``/proc/meminfo``,
    or less when this process's cgroup (v2 ``memory.max`` - ``memory.current``) allows less;
    None where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/self/cgroup") as fh:
            rel = next((ln.strip().split(":", 2)[2] for ln in fh if ln.startswith("0::")), None)
        if rel is not None:
            base = Path("/sys/fs/cgroup") / rel.lstrip("/")
            limit = (base / "memory.max").read_text().strip()
            if limit != "max":
                found.append(max(0, int(limit) - int((base / "memory.current").read_text().strip())))
    except (OSError, ValueError, StopIteration):
        pass
    return min(found) if found else None


def default_jobs(paths: list[Path], cores: int | None = None, memory: int | None = -1) -> int:
    """Worker processes for ``paths`` when ``--jobs`` is not given: at most one per trace, one
    per usable core (:func:`usable_cores`), and as many as the available memory
    (:func:`available_memory`, ``memory`` bytes when given; None = unknown, no bound) holds at
    the estimated peak of the largest trace (``PEAK_FIXED_BYTES + PEAK_PER_TRACE_BYTE x file
    size``); at least 1."""
    cores = cores or usable_cores()
    n = min(cores, len(paths))
    memory = available_memory() if memory == -1 else memory
    if memory is not None and paths:
        largest = max((p.stat().st_size for p in paths if p.exists()), default=0)
        peak = PEAK_FIXED_BYTES + PEAK_PER_TRACE_BYTE * largest
        n = min(n, int(memory // peak))
    return max(1, n)


def worker_threads(jobs: int, cores: int | None = None) -> dict[str, str]:
    """The environment that gives ``jobs`` worker processes one budget of threads: each gets
    ``cores // jobs`` (at least 1) for polars' pool (``POLARS_MAX_THREADS``) and at most 2 of
    them for reading GPU_METRICS (``TRACEKIT_READ_THREADS``), so that workers x threads stays
    within the cores. Values the user set in the environment are kept."""
    each = max(1, (cores or usable_cores()) // max(1, jobs))
    want = {"POLARS_MAX_THREADS": str(each), "TRACEKIT_READ_THREADS": str(min(2, each))}
    return {k: os.environ.get(k, v) for k, v in want.items()}


def _in_order(paths: list[Path], submit, fetch, window: int):
    """Yield ``fetch(path, handle)`` for every path in input order, where ``handle =
    submit(path)`` and at most ``window`` paths are submitted and not yet fetched; the next
    ones are submitted before each outcome is yielded, so the workers keep busy meanwhile."""
    from collections import deque

    pending: deque = deque()
    rest = iter(paths)

    def top_up() -> None:
        while len(pending) < window:
            p = next(rest, None)
            if p is None:
                return
            pending.append((p, submit(p)))

    top_up()
    while pending:
        p, handle = pending.popleft()
        out = fetch(p, handle)
        del handle  # a Dask future released: the worker lets the part go
        top_up()
        yield out


def _iter_processes(paths: list[Path], opts, cache: bool, jobs: int, work=None, want: str = "result",
                    window: int | None = None):
    """Yield, in input order, ``work(path, opts, cache)`` (default :func:`analyze_part` with
    ``want``) for every path, run in ``jobs`` spawned worker processes sharing
    :func:`worker_threads`, at most ``window`` (default: all) submitted ahead of the one being
    handed on; a failure is that path's TracekitError."""
    import functools
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    work = work or functools.partial(analyze_part, want=want)
    window = max(window or len(paths), jobs)  # >= jobs: every worker is spawned in the first batch

    def died(p: Path) -> TracekitError:
        from tracekit import memlimit

        limit = memlimit.current_limit()
        advice = memlimit.message(limit) if limit else "retry with --jobs 1 or fewer traces"
        return TracekitError(f"{p}: {WORKER_DIED}; {advice}")

    # spawn, not fork: polars' thread pool does not survive a fork. The workers inherit the
    # thread budget from the environment at spawn time (during the first submits below).
    ctx = multiprocessing.get_context("spawn")
    budget = worker_threads(jobs)
    saved = {k: os.environ.get(k) for k in budget}
    futures = []

    def submit(p: Path):
        try:
            f = pool.submit(work, str(p), opts, cache)
        except BrokenProcessPool:  # a worker died: this trace is not run either
            return None
        futures.append(f)
        return f

    def fetch(p: Path, f):
        if f is None:
            return died(p)
        try:
            return f.result()
        except TracekitError as exc:
            return exc
        except BrokenProcessPool:
            return died(p)
        finally:
            if f is not None:
                futures.remove(f)

    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        os.environ.update(budget)
        try:
            ordered = _in_order(paths, submit, fetch, window)
            first = next(ordered, None)  # the first batch (every worker) spawned with the budget
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        try:
            if first is not None:
                yield first
                del first
                yield from ordered
        except BaseException:  # stopped early (an error in each(), ^C, SIGTERM, closed)
            for f in futures:  # the traces not started are not run
                f.cancel()
            if futures:  # and the running ones are not waited for: their workers end now
                _stop_workers(pool)
            raise
        finally:
            for f in futures:
                f.cancel()


def _stop_workers(pool) -> None:
    """End the worker processes of the ProcessPoolExecutor ``pool`` (SIGTERM, then SIGKILL
    after 2 s) instead of letting its shutdown wait for the traces they are analyzing: a
    command stopped early (^C, SIGTERM, an error while writing) leaves no worker behind. Uses
    the executor's process table (``_processes``; Python 3.14 has ``terminate_workers``)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        try:
            p.terminate()
        except (OSError, ValueError, AttributeError):
            pass
    for p in procs:
        try:
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join(1)
        except (OSError, ValueError, AttributeError, AssertionError):
            pass


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


def _dask_outcome(path: Path, future) -> dict | TracekitError:
    """The result of one trace's Dask task, or the TracekitError saying why there is none: the
    analysis failed (its own one-line error), the worker died while running it (Dask's
    ``KilledWorker``, after the scheduler's ``allowed-failures`` retries), the worker cannot
    import tracekit, or the task was lost (exit code 1)."""
    try:
        return future.result()
    except TracekitError as exc:
        return exc
    except Exception as exc:  # raised on the worker or by the scheduler; never stops the others
        name = type(exc).__name__
        first = (str(exc).splitlines() or [""])[0]
        if name == "KilledWorker":
            return TracekitError(f"{path}: {DASK_WORKER_DIED}", exit_code=1)
        if isinstance(exc, ImportError):
            return TracekitError(f"{path}: the Dask worker cannot import {exc.name or first} (install "
                                 "tracekit[dask], the client's version, on every worker)", exit_code=1)
        return TracekitError(f"{path}: the Dask task failed ({name}: {first})", exit_code=1)


def _dask_client(address: str):
    """A client of the Dask scheduler at ``address`` that has a worker; TracekitError (one
    line) for a missing extra, a bad address, an unreachable scheduler or one without workers."""
    try:
        from distributed import Client
    except ImportError:
        raise TracekitError(
            "--dask needs the dask extra: pip install 'tracekit[dask]'"
        ) from None
    timeout = float(os.environ.get("TRACEKIT_DASK_TIMEOUT", DASK_CONNECT_TIMEOUT_S))
    try:
        from distributed.comm import parse_address
        from distributed.comm.registry import backends

        scheme, location = parse_address(address)
        if scheme not in backends or not location:
            raise ValueError("expected SCHEME://HOST:PORT such as tcp://HOST:8786")
    except Exception as exc:  # checked before Client(), which leaves a half-made client behind
        raise TracekitError(f"--dask {address}: not a Dask scheduler address ({exc})") from None
    try:
        client = Client(address, timeout=timeout, set_as_default=False)
    except Exception as exc:  # OSError/TimeoutError (unreachable), ValueError (bad address)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TracekitError(f"--dask {address}: cannot reach the Dask scheduler ({reason})") from None
    try:  # a scheduler without workers would hold the tasks forever
        client.wait_for_workers(1, timeout=timeout)
    except Exception:
        client.close()
        raise TracekitError(f"--dask {address}: the Dask scheduler has no workers (waited "
                            f"{timeout:g} s; start them with dask worker {address})") from None
    return client


def _iter_dask(address: str, paths: list[Path], opts, cache: bool, want: str = "result", streamed: bool = False,
               run_part: bool = False):
    """Each trace's part (:func:`analyze_part` with ``want``) or TracekitError from the Dask
    scheduler at ``address``, in input order, each gathered once and then released on the
    cluster. ``streamed``: at most :func:`stream_window` of the workers' threads submitted
    ahead (else all at once, one ``client.map``)."""
    client = _dask_client(address)
    try:
        kw = dict(options=opts, cache=cache, want=want, run_part=run_part, pure=False)
        if streamed:
            window = stream_window(sum(client.nthreads().values()))

            def submit(p: Path):
                return client.submit(_analyze_on_dask_worker, str(p.resolve()), str(p), **kw)
        else:
            from collections import deque

            window = max(1, len(paths))
            futures = deque(client.map(_analyze_on_dask_worker, [str(p.resolve()) for p in paths],
                                       [str(p) for p in paths], **kw))

            def submit(p: Path):
                return futures.popleft()  # handed over: released once fetched
        yield from _in_order(paths, submit, _dask_outcome, window)
    finally:
        client.close()


# ---------------------------------------------------------------------- summary
def rank_rows(results: list[dict], paths: list[Path] | None = None) -> list[dict]:
    """One row per rank of every result: ``{"trace", "rank" (from the file name or None),
    "pid", "device", "iterations" (count), "complete_iterations", "iteration_ns" (sum of the
    iterations' phase wall times), "mean_iteration_ns", "phase_ns": {phase: sum over the
    iterations of that phase's wall time}, "per_iteration": [{"index", "wall_ns"}],
    "unclosed_iterations": [index]}`` (ns). Iterations with a phase range that never closed
    (``unclosed`` in the result; their wall time stops at the capture's last activity) are
    listed in ``unclosed_iterations`` and left out of every other field."""
    paths = paths or [Path(r["trace"]) for r in results]
    numbers = rank_numbers(list(paths))
    rows = []
    for result, number in zip(results, numbers):
        ranks = result.get("ranks", [])
        for r in ranks:
            phase_ns = {p: 0 for p in PHASES}
            per_it = {}
            complete = 0
            unclosed = []
            for it in r.get("iterations", []):
                if it.get("unclosed"):
                    unclosed.append(int(it["index"]))
                    continue
                wall = 0
                for ph in it["phases"]:
                    phase_ns[ph["phase"]] = phase_ns.get(ph["phase"], 0) + int(ph["wall_ns"])
                    wall += int(ph["wall_ns"])
                per_it[int(it["index"])] = wall
                complete += bool(it.get("complete"))
            total = sum(per_it.values())
            rows.append(
                {
                    "trace": result.get("trace"),
                    "rank": number if len(ranks) == 1 else None,
                    "node": number if len(ranks) > 1 else None,
                    "pid": r["pid"],
                    "device": r["device"],
                    "iterations": len(per_it),
                    "complete_iterations": complete,
                    "iteration_ns": total,
                    "mean_iteration_ns": total / len(per_it) if per_it else None,
                    "phase_ns": phase_ns,
                    "per_iteration": [{"index": i, "wall_ns": w} for i, w in sorted(per_it.items())],
                    "unclosed_iterations": unclosed,
                }
            )
    return rows


def _who(row: dict) -> dict:
    return {k: row[k] for k in ("trace", "rank", "pid", "device")}


def _slowest(vals: list[tuple], spreads: dict | None = None) -> int | None:
    """Index of the largest of ``vals`` ([(ns, index)], the first of equal values, as ``max``
    picks) when it differs from the runner-up (:func:`tracekit.analyze.significance.slowest`)."""
    from tracekit.analyze.significance import slowest

    order = {k: n for n, (_, k) in enumerate(vals)}
    # significance.slowest breaks ties towards the later item: list them last-first
    return slowest(sorted(vals, key=lambda t: -order[t[1]]), spreads=spreads)


#: at most this many missing rank numbers are listed one by one (``missing_ranks`` of
#: :func:`summarize_ranks`); ``missing_rank_ranges`` holds them all
MAX_LISTED_MISSING = 10_000


def check_expected_ranks(expected_ranks: int | None) -> None:
    """Raise :class:`~tracekit.errors.TracekitError` (one line, exit 2) unless ``expected_ranks``
    (``--ranks N``: the run's ranks are 0..N-1) is None or a positive integer."""
    if expected_ranks is None:
        return
    if isinstance(expected_ranks, bool) or not isinstance(expected_ranks, int) or expected_ranks < 1:
        raise TracekitError(f"--ranks {expected_ranks!r}: give the number of ranks in the run, a positive "
                            "integer N (ranks 0..N-1)")


def missing_ranges(present, upto: int) -> list[tuple[int, int]]:
    """The numbers of 0..upto-1 absent from ``present`` (ints; those outside the span are
    ignored) as sorted inclusive ``(first, last)`` ranges; time and memory grow with
    ``len(present)``, not with ``upto``."""
    out = []
    nxt = 0
    for n in sorted(n for n in set(present) if 0 <= n < upto):
        if n > nxt:
            out.append((nxt, n - 1))
        nxt = n + 1
    if nxt < upto:
        out.append((nxt, upto - 1))
    return out


def listed_ranks(ranges, limit: int) -> list[int]:
    """The first ``limit`` numbers of inclusive ``(first, last)`` ``ranges``."""
    out: list[int] = []
    for a, b in ranges:
        take = min(b - a + 1, limit - len(out))
        if take <= 0:
            break
        out.extend(range(a, a + take))
    return out


def summarize_ranks(
    results: list[dict], paths: list[Path] | None = None, expected_ranks: int | None = None,
    failed: list[Path] | None = None,
) -> dict:
    """Compare the ranks of several results (times in ns). ``failed``: traces that could not be
    analyzed; their rank numbers do not count as missing.

    Returns::

        {"traces": int, "ranks": int, "rank_rows": rank_rows(...),
         "iterations": {"min": int, "max": int},
         "slowest_rank": {"trace", "rank", "pid", "device", "mean_iteration_ns"} | None,
         "per_phase": {PHASE: {"min_ns", "max_ns", "mean_ns", "spread_ns", "spread_share",
                               "slowest": {"trace", "rank", "pid", "device"}}},
         "per_iteration": [{"index", "ranks", "min_ns", "max_ns", "spread_ns", "slowest"}],
         "missing_ranks": [int], "missing_ranks_count": int, "missing_rank_ranges": [[first, last]],
         "ranks_without_iterations": [{"trace", "rank", "pid", "device"}],
         "one_run": bool, "run_groups": [[trace path]], "note": str | None,
         "run": run_groups.run_view(...) | None (None for different runs)}

    ``one_run`` is False when the traces are exports of different runs
    (:mod:`tracekit.analyze.run_groups`, the one-run rule); then ``note`` says so in one line,
    ``per_phase`` and ``per_iteration`` are empty and ``slowest_rank`` is None (the per-trace
    ``rank_rows`` stay); ``run_groups`` lists the traces of each run.

    ``per_phase`` compares each rank's phase time summed over its iterations; ``spread_ns`` is
    max - min and ``spread_share`` spread / mean (None when the mean is 0). The slowest rank
    has the longest mean iteration. A ``slowest`` (and ``slowest_rank``) is named only when it
    differs from the runner-up by the one rule of a comparative claim
    (:func:`tracekit.analyze.significance.slowest`: >= 1 ms, >= 5 %, and for the mean
    iteration beyond either rank's iteration-to-iteration spread); else it is None. ``per_iteration`` compares ranks at equal iteration
    indices. ``missing_ranks``: numbers absent from 0..max of the ranks read from file names
    (:func:`rank_numbers`), or from 0..expected_ranks-1 when given, the first
    :data:`MAX_LISTED_MISSING` of them; ``missing_ranks_count`` how many there are and
    ``missing_rank_ranges`` all of them as inclusive ranges (:func:`missing_ranges`: the work
    grows with the ranks present, not with ``expected_ranks``). Raises
    :class:`~tracekit.errors.TracekitError` for an ``expected_ranks`` below 1.
    """
    from tracekit.analyze.significance import spread as spread_of

    rows = rank_rows(results, paths)
    timed = [r for r in rows if r["iterations"]]
    per_phase = {}
    for phase in PHASES:
        vals = [(r["phase_ns"].get(phase, 0), i) for i, r in enumerate(timed)]
        if not vals or not any(v for v, _ in vals):
            continue
        walls = [v for v, _ in vals]
        mx = max(vals, key=lambda t: t[0])
        mean = sum(walls) / len(walls)
        spread = max(walls) - min(walls)
        slow = _slowest(vals)
        per_phase[phase] = {
            "min_ns": min(walls),
            "max_ns": mx[0],
            "mean_ns": mean,
            "spread_ns": spread,
            "spread_share": spread / mean if mean else None,
            "slowest": None if slow is None else _who(timed[slow]),
        }
    per_iteration = []
    walls_of = [{d["index"]: d["wall_ns"] for d in r["per_iteration"]} for r in timed]
    indices = sorted({i for w in walls_of for i in w})
    for idx in indices:
        vals = [(w[idx], k) for k, w in enumerate(walls_of) if idx in w]
        mx = max(vals, key=lambda t: t[0])
        slow = _slowest(vals)
        per_iteration.append(
            {
                "index": idx,
                "ranks": len(vals),
                "min_ns": min(v for v, _ in vals),
                "max_ns": mx[0],
                "spread_ns": mx[0] - min(v for v, _ in vals),
                "slowest": None if slow is None else _who(timed[slow]),
            }
        )
    from tracekit.analyze import run_groups

    trace_paths = list(paths or [Path(r["trace"]) for r in results])
    idents = [run_groups.identity(p) for p in trace_paths]
    groups = run_groups.group(idents) if len(trace_paths) > 1 else [list(range(len(trace_paths)))]
    run_note = run_groups.note(groups, trace_paths)
    run = None if run_note else run_groups.run_view(idents, rows)
    if run_note:  # different runs: per-trace rows only, no comparison across them
        per_phase, per_iteration, timed = {}, [], []
    slowest = None
    if timed:
        # the rank with the longest mean iteration, when it stands out from the next beyond
        # either's iteration-to-iteration spread
        k = _slowest([(r["mean_iteration_ns"], i) for i, r in enumerate(timed)],
                     {i: spread_of(w.values()) for i, w in enumerate(walls_of)})
        if k is not None:
            s = timed[k]
            slowest = _who(s) | {"mean_iteration_ns": s["mean_iteration_ns"]}
    numbers = {r["rank"] if r["rank"] is not None else r["node"] for r in rows} - {None}
    if failed:
        all_paths = list(paths or [Path(r["trace"]) for r in results]) + list(failed)
        numbers |= set(rank_numbers(all_paths)[-len(failed):]) - {None}
    check_expected_ranks(expected_ranks)
    upto = expected_ranks if expected_ranks else (max(numbers) + 1 if numbers else 0)
    gaps = missing_ranges(numbers, upto)
    count = sum(b - a + 1 for a, b in gaps)
    counts = [r["iterations"] for r in rows]
    return {
        "traces": len(results),
        "ranks": len(rows),
        "rank_rows": rows,
        "iterations": {"min": min(counts, default=0), "max": max(counts, default=0)},
        "slowest_rank": slowest,
        "per_phase": per_phase,
        "per_iteration": per_iteration,
        "missing_ranks": listed_ranks(gaps, MAX_LISTED_MISSING),
        "missing_ranks_count": count,
        "missing_rank_ranges": [[a, b] for a, b in gaps],
        "ranks_without_iterations": [_who(r) for r in rows if not r["iterations"]],
        "one_run": run_note is None,
        "run_groups": [[str(trace_paths[i]) for i in g] for g in groups],
        "note": run_note,
        "run": run,
    }


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

