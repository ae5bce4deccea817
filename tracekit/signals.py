"""SIGINT and SIGTERM: a clean stop, never a half-written output (issue 25).

``^C`` raises :class:`KeyboardInterrupt` (Python's own handler); :func:`install` makes SIGTERM
raise :class:`Terminated`, a subclass of it, so that both take the same clean-up path: worker
processes are stopped (:mod:`tracekit.analyze.multi`), the temporaries of an unfinished set of
output files are removed (:class:`tracekit.output.OutputSet`), and the command exits 130
(``tracekit: interrupted``) or 143 (``tracekit: terminated``). While a finished set of files is
renamed into place, both signals wait (:func:`deferred`), so the set is either all old or all
new. Under the memory guard the parent forwards both signals to its child
(:func:`tracekit.memlimit.run_guarded`), which acts on the first one only (:func:`install`
with ``once``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

#: the exit code of a command stopped by SIGTERM (128 + 15, what a shell reports)
EXIT_TERMINATED = 128 + signal.SIGTERM
#: the exit code of a command stopped by SIGINT (^C)
EXIT_INTERRUPTED = 128 + signal.SIGINT

_got: list[int] = []


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM once :func:`install` ran: a KeyboardInterrupt, so
    that everything that cleans up after ^C cleans up after SIGTERM too."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install(once: bool = False) -> None:
    """Make SIGTERM raise :class:`Terminated` in this (main) thread, unless SIGTERM is ignored
    (``nohup``-like parents keep it so). ``once``: after the first SIGINT or SIGTERM, both are
    ignored (the guarded child, which may get a ^C from the terminal and the same one forwarded
    by its parent: one clean stop, not a second interrupt inside the clean-up). Does nothing
    outside the main thread."""
    if not _main_thread():
        return
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_term_once if once else _on_term)
    if once and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_int_once)
    if once:
        _end_with_parent()


def _end_with_parent() -> None:
    """Linux: have the kernel send SIGTERM to this (guarded child) process when its parent dies,
    killed with no chance to pass a signal on (SIGKILL). Nothing elsewhere, or when it fails."""
    if not os.uname().sysname == "Linux":
        return
    try:
        import ctypes

        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before that: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)
    except Exception:  # noqa: BLE001 (no ctypes, no libc: the parent's forwarding still holds)
        pass


def _on_term(signum, frame) -> None:
    _got.append(signum)
    raise Terminated()


def _ignore_both() -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)


def _on_term_once(signum, frame) -> None:
    _ignore_both()
    _on_term(signum, frame)


def _on_int_once(signum, frame) -> None:
    _ignore_both()
    _got.append(signum)
    raise KeyboardInterrupt()


def terminated() -> bool:
    """Whether SIGTERM stopped this process (a :class:`Terminated` was raised)."""
    return signal.SIGTERM in _got


def exit_code(exc: BaseException | None = None) -> int:
    """143 when SIGTERM stopped the command (``exc`` a :class:`Terminated`, or one was raised
    and turned into another exception on the way), else 130."""
    return EXIT_TERMINATED if isinstance(exc, Terminated) or terminated() else EXIT_INTERRUPTED


def stop_line(code: int) -> str:
    """The one line for a command stopped by a signal (``code`` from :func:`exit_code`)."""
    return "tracekit: terminated" if code == EXIT_TERMINATED else "tracekit: interrupted"


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the block runs (the renames that put a finished set of
    files in place): a signal that arrives meanwhile takes effect once the block is done, by
    the handler that was in place before (raising there, or the default action). Python runs
    handlers in the main thread only, so holding them there is enough, whatever thread the
    signal landed on; outside the main thread nothing is held."""
    if not _main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum, frame) -> None:
        held.append(signum)

    old = {}
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            old[s] = signal.signal(s, hold)
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        if held:
            s = held[0]
            h = old.get(s)
            if callable(h):
                h(s, None)
            elif h == signal.SIG_DFL:
                os.kill(os.getpid(), s)
