"""The runners of :mod:`tracekit.analyze.multi`: one trace's work per worker process
(``--jobs N``) or per task of an existing Dask cluster (``--dask ADDRESS``), its outcomes handed
back in input order with a bounded window ahead (streaming), and the resources that size the
workers (usable cores, available memory, the default ``--jobs``, one budget of threads).

What runs per trace is the caller's: :func:`_iter_processes` and :func:`_iter_dask` take the
work function (multi.py's :func:`~tracekit.analyze.multi.analyze_part` and
:func:`~tracekit.analyze.multi._analyze_on_dask_worker`), so this module imports nothing of the
analysis. A trace whose worker fails comes back as its TracekitError, never stopping the others.
"""

from __future__ import annotations

import os
from pathlib import Path

from tracekit.errors import TracekitError

#: How long ``--dask`` waits for the scheduler before giving up, seconds
#: (environment variable ``TRACEKIT_DASK_TIMEOUT`` overrides).
DASK_CONNECT_TIMEOUT_S = 10.0


def stream_window(slots: int) -> int:
    """How many traces may be asked for (running, or done and not yet handed on) ahead of the
    one the client waits on when each part is handed on in input order: twice the workers'
    slots, at least 2; so the parts held at once do not grow with the number of traces."""
    return max(2, 2 * slots)


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


def _iter_processes(paths: list[Path], opts, cache: bool, jobs: int, work, window: int | None = None):
    """Yield, in input order, ``work(path, opts, cache)`` (multi.py's
    :func:`~tracekit.analyze.multi.analyze_part`, or a test's function; picklable) for every path,
    run in ``jobs`` spawned worker processes sharing :func:`worker_threads`, at most ``window``
    (default: all) submitted ahead of the one being handed on; a failure is that path's
    TracekitError."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

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


def _iter_dask(address: str, paths: list[Path], work, kwargs: dict, streamed: bool = False):
    """Each trace's outcome from the Dask scheduler at ``address``, in input order: ``work(resolved
    path, path as given, **kwargs)`` run as a task (multi.py's
    :func:`~tracekit.analyze.multi._analyze_on_dask_worker`; a module-level function, pickled by
    reference), or the TracekitError of :func:`_dask_outcome`; each gathered once and then
    released on the cluster. ``streamed``: at most :func:`stream_window` of the workers' threads
    submitted ahead (else all at once, one ``client.map``). TracekitError (one line) from
    :func:`_dask_client` when the scheduler cannot be used."""
    client = _dask_client(address)
    try:
        kw = dict(kwargs, pure=False)
        if streamed:
            window = stream_window(sum(client.nthreads().values()))

            def submit(p: Path):
                return client.submit(work, str(p.resolve()), str(p), **kw)
        else:
            from collections import deque

            window = max(1, len(paths))
            futures = deque(client.map(work, [str(p.resolve()) for p in paths],
                                       [str(p) for p in paths], **kw))

            def submit(p: Path):
                return futures.popleft()  # handed over: released once fetched
        yield from _in_order(paths, submit, _dask_outcome, window)
    finally:
        client.close()

