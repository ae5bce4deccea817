"""Running under a memory limit: one line that names the limit, never an abort (issue 9, d12).

Under an address-space limit (``ulimit -v``, ``prlimit --as``) or a data-segment limit
(``ulimit -d``) polars' Rust allocator may fail. Rust does not raise then: it prints
``memory allocation of N bytes failed`` and a backtrace and aborts the process (SIGABRT,
exit 134), which no Python handler can catch. Python's own allocation failures raise
:class:`MemoryError`.

So when such a limit is set, the commands that read traces (``analyze``, ``report``,
``compare``, ``trim``) run in a child process under the same limit (:func:`run_guarded`).
Its stdout is the parent's; its stderr is forwarded line by line, except the Rust abort
message and backtrace, and when the child dies of an allocation failure the parent prints
:func:`message` as the one error line and exits 2. Without a limit nothing changes (no child;
the machine's memory or a cgroup limit end in the kernel's OOM killer, which tracekit cannot
report). ``capture`` is never run this way (the training keeps its terminal).

Under a limit too tight for tracekit's libraries to load (``ulimit -v`` of a few hundred MB),
they fail in other ways, each also one line and exit 2: OpenBLAS (at numpy's import) prints
``OpenBLAS error: Memory allocation ...`` and exits 1 (the parent hides the line and reports the
limit; the child gets ``OPENBLAS_NUM_THREADS=1`` unless set, so that OpenBLAS reserves one
thread's buffers, not one per core), polars warns "Polars binary is missing!" and a later import
fails (the child turns that warning into an error), and an import may fail with any exception,
or the error handler itself run out of memory (:func:`prepare_child`: the line is made before,
and written with one ``write``). polars' jemalloc starts a background thread; when it cannot,
it says so and retries for ever, a million lines in 15 s while the command makes no progress:
the child gets ``_RJEM_MALLOC_CONF=background_thread:false`` unless set (dirty pages are then
returned by the allocating threads themselves; results do not change).

SIGINT and SIGTERM to the parent are passed on to the child, which stops cleanly on the first
(no half-written output, no temporary: :mod:`tracekit.signals`) and says so; the parent then
exits 130 or 143. On Linux the child also gets SIGTERM from the kernel when the parent is
killed outright (``PR_SET_PDEATHSIG``), so it never goes on writing alone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

try:  # imported now, at start-up: under a tight limit loading it later, when the memory ran out, fails
    import resource
except ImportError:  # not on POSIX
    resource = None

#: set in the child, so that it runs the command itself
CHILD_ENV = "TRACEKIT_MEMLIMIT_CHILD"
#: commands that read traces and run in a child under a limit
GUARDED = ("analyze", "report", "compare", "trim")
_RUST_ALLOC = b"memory allocation of "
#: how every line tracekit itself writes to stderr starts
_OWN = b"tracekit: "
#: lines of C libraries that ran out of memory and exit on their own (OpenBLAS at numpy's import,
#: the dynamic loader when a library's thread-local storage cannot be allocated)
_LIB_ALLOC = (b"OpenBLAS error: Memory allocation", b"OpenBLAS : Program is Terminated",
              b"BLAS : Program is Terminated", b"cannot allocate memory for thread-local data")
_JEMALLOC = b"<jemalloc>:"
#: the environment variable of polars' jemalloc (its symbols carry the ``_rjem_`` prefix)
_JEMALLOC_CONF = "_RJEM_MALLOC_CONF"
#: what :func:`allocator_defaults` sets: freed pages go back to the system at once, not after
#: jemalloc's 10 s decay, so that memory one stage (or one thread's arena) freed does not stay
#: resident while the next one allocates (issue 24: peak RSS of ``analyze --all`` on a 4x trace
#: 273-297 -> 260 MiB, on a 16x one 628 -> 606 MiB)
ALLOCATOR_CONF = "dirty_decay_ms:0,muzzy_decay_ms:0"
_ALLOC_TAIL = re.compile(rb"^\d+ bytes failed\s*$")
_PANIC = re.compile(rb"^thread '.*' (\(\d+\) )?panicked at ")
#: lines of the Rust runtime that follow an allocation failure or a panic
_TRACE_LINES = (b"stack backtrace:", b"note: ", b"skipping backtrace printing", b"fatal runtime error",
                b"thread caused non-unwinding panic", b" ", b"\t")


def current_limit() -> tuple[str, int] | None:
    """``(description, bytes)`` of the smallest finite soft limit among the address-space
    (``RLIMIT_AS``) and data-segment (``RLIMIT_DATA``) limits of this process, or None."""
    if resource is None:
        return None
    found = []
    for name, what in (("RLIMIT_AS", "address-space limit (ulimit -v, prlimit --as)"),
                       ("RLIMIT_DATA", "data-segment limit (ulimit -d)")):
        res = getattr(resource, name, None)
        if res is None:
            continue
        try:
            soft, _hard = resource.getrlimit(res)
        except (OSError, ValueError):
            continue
        if soft != resource.RLIM_INFINITY and soft > 0:
            found.append((soft, what))
    if not found:
        return None
    soft, what = min(found)
    return what, int(soft)


def _size(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.0f} MB"


#: what to do when out of memory, per command (each names only flags that command has)
_ADVICE = {
    "analyze": "analyze less at once: --section with the sections you need instead of --all, fewer traces "
               "per run, --jobs 1, or raise the limit",
    "report": "report a shorter cut of the trace (tracekit trim TRACE CUT.sqlite --iterations A-B), or raise "
              "the limit",
    "compare": "compare shorter cuts of the traces (tracekit trim TRACE CUT.sqlite --iterations A-B), or raise "
               "the limit",
    "trim": "keep fewer rows (--iterations with fewer iterations, --drop TABLE, --keep-metrics REGEX), or "
            "raise the limit",
}
#: the command being run (set by :func:`tracekit.cli.main`; else read from ``sys.argv``)
_command: str | None = None


def set_command(argv: list[str] | None) -> None:
    """Remember the command of ``argv`` (``analyze``, ``report``, ...) for :func:`message`."""
    global _command
    args = list(sys.argv[1:] if argv is None else argv)
    _command = args[0] if args and args[0] in _ADVICE else None


def message(limit: tuple[str, int] | None = None, command: str | None = None) -> str:
    """The one line for running out of memory: the limit (``limit``, else
    :func:`current_limit`) and what to do with ``command`` (default: the one being run, see
    :func:`set_command`; ``analyze``'s advice for an unknown one)."""
    limit = limit or current_limit()
    if command is None:
        command = _command
        if command is None and len(sys.argv) > 1 and sys.argv[1] in _ADVICE:
            command = sys.argv[1]
    where = f"under the {limit[0]} of {_size(limit[1])}" if limit else "(no ulimit is set: the machine's memory)"
    return f"out of memory {where}; {_ADVICE.get(command or 'analyze', _ADVICE['analyze'])}"


def start_message(limit: tuple[str, int]) -> str:
    """The one line for a limit too tight for tracekit's libraries (polars, numpy) to load."""
    return (f"out of memory under the {limit[0]} of {_size(limit[1])}: tracekit's libraries (polars, numpy) "
            f"could not be loaded; raise the limit")


def is_memory_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the process ran out of memory: :class:`MemoryError`, an
    :class:`OSError` with ``ENOMEM``, or an :class:`ImportError` of a compiled module that could
    not be mapped (``failed to map segment from shared object``, ``Cannot allocate memory``),
    which is how numpy or polars fail to load under a tight address-space limit; under such a
    limit also a thread that could not start (no room for its stack)."""
    import errno

    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    text = str(exc)
    if isinstance(exc, RuntimeError) and "can't start new thread" in text:  # no room for a thread stack
        return current_limit() is not None
    if type(exc).__name__ == "PanicException":  # polars' Rust code panicked (pyo3)
        if "memory allocation" in text or "Cannot allocate memory" in text:
            return True
        # a thread that could not start (EAGAIN: no room for its stack), unwrapped by a library
        spawn = "failed to spawn thread" in text or "Os { code: 11," in text
        return spawn and current_limit() is not None
    return isinstance(exc, ImportError) and ("failed to map segment" in text or "Cannot allocate memory" in text)


def failed_import(exc: BaseException) -> bool:
    """Whether ``exc``, under a memory limit, was raised while a module was being imported: its
    traceback (or that of an exception it was raised from or during) passes through a module's
    top-level code or the import machinery. That is how a compiled library that could not be
    loaded whole fails, in many ways (polars and numpy: ``SystemError``, ``ImportError``,
    polars' "binary is missing" warning made an error by :func:`prepare_child`). Never for a
    module that does not exist (``ModuleNotFoundError``); always False without a limit."""
    if current_limit() is None:
        return False
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError):
            return False
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code  # a module's own code runs only while it is imported
            if code.co_name == "<module>" or code.co_filename.startswith("<frozen importlib._bootstrap"):
                return True
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return False


def prepare_child() -> bytes | None:
    """Under a memory limit, get ready to fail in one line: polars' "Polars binary is missing!"
    warning (its compiled part could not be mapped) becomes an error, and the line for running
    out of memory is made now, as bytes for one ``os.write`` (:func:`write_line`), for when even
    the error handler runs out of memory. None without a limit (nothing is changed)."""
    limit = current_limit()
    if limit is None:
        return None
    import warnings

    warnings.filterwarnings("error", message="Polars binary is missing", category=UserWarning)
    return f"tracekit: error: {message(limit)}\n".encode()


def write_line(line: bytes) -> None:
    """Write ``line`` to stderr (fd 2) with no allocation beyond the call itself."""
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    try:
        os.write(2, line)
    except OSError:
        pass


def run_guarded(argv: list[str] | None = None) -> int | None:
    """Run the command of ``argv`` (default ``sys.argv[1:]``) in a child process when a memory
    limit is set and the command reads traces (see module doc); returns its exit code, or None
    when the caller should run the command itself (no limit, another command, or already the
    child)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get(CHILD_ENV) or not argv or argv[0] not in GUARDED:
        return None
    limit = current_limit()
    if limit is None:
        return None
    env = {**os.environ, CHILD_ENV: "1", **_library_env()}
    try:
        child = subprocess.Popen([sys.executable, "-m", "tracekit.cli", *argv], env=env, stderr=subprocess.PIPE)
    except OSError:  # cannot even start a child (no memory for it): run in this process, which has
        os.environ.update(_library_env())  # not loaded numpy or polars yet: the same settings hold
        return None
    saw_alloc = ""
    got: list[int] = []
    old = _forward_signals(child, got)
    try:
        saw_alloc = _forward(child.stderr)
        rc = child.wait()
    except KeyboardInterrupt:  # (a handler that could not be installed: SIGINT's default)
        _send(child, signal.SIGINT)
        got.append(signal.SIGINT)
        try:
            rc = child.wait(timeout=10)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            child.kill()
            rc = child.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if got:  # the child stopped cleanly (it says "interrupted" / "terminated" itself)
        stop = 128 + got[0]
        return stop if rc in (stop, -got[0]) else (rc if rc >= 0 else 128 - rc)
    if saw_alloc == "said" and rc != 0:  # its own error line is out; it may have crashed after it
        return rc if 0 < rc < 128 else 2
    if rc < 0 or (rc != 0 and saw_alloc):  # killed, or a library that ran out of memory and exited
        if saw_alloc or rc in (-signal.SIGABRT, -signal.SIGKILL, -signal.SIGSEGV):
            sys.stdout.flush()
            line = start_message(limit) if saw_alloc == "library" else message(limit, argv[0])
            print(f"tracekit: error: {line}", file=sys.stderr)
            return 2
        return 128 - rc
    return rc


def allocator_defaults(argv: list[str] | None = None) -> None:
    """Set ``_RJEM_MALLOC_CONF`` to :data:`ALLOCATOR_CONF` unless the user set it; jemalloc
    reads it once, when polars is loaded, so this runs before polars is imported (the CLI's
    entry), and does nothing once it is. Not for ``capture`` (``argv``, default ``sys.argv[1:]``):
    the training it runs inherits the environment."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["capture"]:
        return
    if _JEMALLOC_CONF not in os.environ and "polars" not in sys.modules:
        os.environ[_JEMALLOC_CONF] = ALLOCATOR_CONF


def _library_env() -> dict[str, str]:
    """The settings the libraries need under a tight limit, for those not set by the user:
    ``OPENBLAS_NUM_THREADS=1`` (one thread's buffers at numpy's import, not one per core) and
    no background thread for polars' jemalloc (see the module doc)."""
    env = {}
    if not any(k in os.environ for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")):
        env["OPENBLAS_NUM_THREADS"] = "1"
    conf = os.environ.get(_JEMALLOC_CONF)
    if conf is None or conf == ALLOCATOR_CONF:  # not the user's: tracekit's own, kept
        env[_JEMALLOC_CONF] = ("" if conf is None else conf + ",") + "background_thread:false"
    return env


def _send(child, sig: int) -> None:
    try:
        child.send_signal(sig)
    except OSError:
        pass


def _forward_signals(child, got: list[int]) -> dict:
    """Pass SIGINT and SIGTERM on to the guarded ``child`` (which acts on the first one only and
    cleans up: no temporaries, no half-written output; a ^C from the terminal reaches it
    directly too) and note them in ``got``; a second SIGTERM kills it. Returns the handlers
    replaced (nothing outside the main thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame) -> None:
        if signum == signal.SIGTERM and signal.SIGTERM in got:
            child.kill()  # asked twice: no more waiting for its clean-up
        got.append(signum)
        _send(child, signum)

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            old[sig] = signal.signal(sig, handler)
    return old


def _forward(stream) -> str:
    """Copy ``stream`` (the child's stderr) to ours line by line, leaving out Rust's
    allocation-failure message, C libraries' (:data:`_LIB_ALLOC`), jemalloc's complaints
    (``<jemalloc>: ...``, also cut from the end of the child's own line), a Rust panic's
    message (``thread '...' (ID) panicked at ...``, the blank line before it and the line after
    it; the child reports the panic itself, on one line) and the backtrace after either;
    returns what happened: ``"said"`` (the child's last line was its own ``tracekit: error:``),
    else ``"alloc"`` (Rust's allocation failure), ``"library"`` (only a C library's message, at
    start-up) or ``""`` (nothing seen). A line holding ``tracekit: `` (the child's
    own error or note) is always written, from there on, even when a dying thread's message was
    printed on the same line or a panic's message was expected next."""
    out = getattr(sys.stderr, "buffer", None)
    saw, in_trace, said = "", False, False
    skip_next = False
    held: list[bytes] = []
    for line in iter(stream.readline, b""):
        own = line.find(_OWN)
        if own >= 0:  # tracekit's own line, even glued to a dying thread's message: always shown
            text = line[own:].rstrip(b"\n")
            cut = text.find(_JEMALLOC)  # the allocator's complaint written into the middle of it
            _write(out, (text[:cut] if cut > 0 else text) + b"\n")
            held, in_trace, skip_next = [], False, False
            said = line.startswith(b"error: ", own + len(_OWN))
            continue
        # threads dying at once interleave their messages: look inside the line, and for the
        # tail of a message split across lines
        if _RUST_ALLOC in line or _ALLOC_TAIL.match(line):
            saw, in_trace = "alloc", True
            continue
        if line.startswith(_LIB_ALLOC):  # a C library out of memory, about to exit
            saw = saw or "library"
            continue
        if _JEMALLOC in line:  # the allocator's own complaints (e.g. no thread for it)
            continue
        if _PANIC.match(line):
            in_trace = skip_next = True
            held = []  # the blank line Rust prints before the panic
            continue
        if skip_next:  # the panic's message
            skip_next = False
            continue
        if in_trace and (line.startswith(_TRACE_LINES) or not line.strip()):
            continue
        in_trace = False
        if not line.strip():  # held until the next line shows it is not a panic's preamble
            held.append(line)
            continue
        for ln in (*held, line):
            _write(out, ln)
        held, said = [], False
    for ln in held:
        _write(out, ln)
    stream.close()
    if said:  # the child said what went wrong itself
        return "said"
    return saw


def _write(out, line: bytes) -> None:
    if out is not None:
        out.write(line)
        out.flush()
    else:
        sys.stderr.write(line.decode("utf-8", "replace"))
        sys.stderr.flush()
