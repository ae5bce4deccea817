"""Wrappers of the CPU optimizer workers' entry points (SuperOffload, ZenFlow).

Part of the hook package (see ``__init__``): standard library only.
"""

from __future__ import annotations

import functools
import os
import sys
import threading

from .channel import _become_worker, _worker_iteration
from .core import _pop, _push, _warn


# --------------------------------------------------------------------------- worker entry points
def _wrap_superoffload_worker(orig):
    @functools.wraps(orig)
    def superoffload_optimizer_worker(*args, **kwargs):
        try:
            _become_worker("superoffload")
        except Exception as exc:
            _warn(f"superoffload worker bookkeeping failed: {exc!r}")
        return orig(*args, **kwargs)

    return superoffload_optimizer_worker


class _ZenFlowRelay:
    """Puts a Python relay between ZenFlow's main process and its native optimizer loop.

    DeepSpeed 0.19.8's ZenFlow worker (``zenflow_optimizer_process``) runs the C++ loop
    ``zenflow_adam_run_worker`` on a shared control block (``struct ZenControl``: two
    process-shared semaphores ``cmd_ready`` and ``done``, then the command and the
    hyperparameters). No Python runs per step there, so the relay gives the native loop a
    private control block of the same layout and runs it on a thread; the process's main thread
    waits on the real ``cmd_ready``, copies the command, opens ``cpu_optimizer_step it=N sg=all``,
    posts the private ``cmd_ready``, waits for the private ``done``, closes the range and posts
    the real ``done``. The layout is checked against the block's size; any mismatch falls back
    to the unrelayed worker (with a warning).
    """

    SEM = 32  # sizeof(sem_t), glibc on 64-bit Linux
    SIZE = 21592  # sizeof(ZenControl) with ZEN_MAX_GROUPS 1024, ZEN_HP_PER_GROUP 5
    CMD = 64  # offsetof(ZenControl, cmd)
    CMD_EXIT = 1

    def __init__(self, ctrl) -> None:
        import ctypes

        import torch

        if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
            raise RuntimeError("the relay knows the control block of 64-bit Linux only")
        if ctrl.dtype != torch.uint8 or ctrl.numel() != self.SIZE:
            raise RuntimeError(f"control block of {ctrl.numel()} bytes, the relay knows {self.SIZE}")
        self._ctypes = ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for fn in ("sem_init", "sem_post", "sem_wait", "sem_timedwait"):
            getattr(libc, fn).restype = ctypes.c_int
        self._libc = libc
        self.real = ctrl
        self.private = torch.zeros(self.SIZE, dtype=torch.uint8)
        self._real = ctrl.data_ptr()
        self._priv = self.private.data_ptr()
        ctypes.memmove(self._priv + 2 * self.SEM, self._real + 2 * self.SEM, self.SIZE - 2 * self.SEM)
        for offset in (0, self.SEM):
            if libc.sem_init(ctypes.c_void_p(self._priv + offset), 1, 0) != 0:
                raise OSError(ctypes.get_errno(), "sem_init failed")

    def _wait(self, address: int, alive) -> bool:
        """Wait on the semaphore at ``address``; False when ``alive()`` turns false first."""
        ctypes = self._ctypes

        class timespec(ctypes.Structure):
            _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

        import time

        while True:
            deadline = time.time() + 1.0
            ts = timespec(int(deadline), int((deadline % 1) * 1e9))
            if self._libc.sem_timedwait(ctypes.c_void_p(address), ctypes.byref(ts)) == 0:
                return True
            if not alive():
                return False

    def _post(self, address: int) -> None:
        self._libc.sem_post(self._ctypes.c_void_p(address))

    def run(self, orig, groups, ready, *rest) -> None:
        """Run ``orig`` on the private block in a thread and relay the real block to it."""
        ctypes = self._ctypes
        failure: list = []

        def native():
            try:
                orig(groups, self.private, ready, *rest)
            except BaseException as exc:  # reported by the relay, as the unrelayed worker would
                failure.append(exc)

        thread = threading.Thread(target=native, name="zenflow-native-worker", daemon=True)
        thread.start()
        parent = os.getppid()
        parent_alive = lambda: thread.is_alive() and os.getppid() == parent  # noqa: E731
        while True:
            if not self._wait(self._real, parent_alive):
                break
            ctypes.memmove(self._priv + 2 * self.SEM, self._real + 2 * self.SEM,
                           self.SIZE - 2 * self.SEM)
            if ctypes.c_int.from_address(self._real + self.CMD).value == self.CMD_EXIT:
                self._post(self._priv)
                thread.join(timeout=30)
                break
            _push(f"cpu_optimizer_step it={_worker_iteration()} sg=all")
            self._post(self._priv)
            finished = self._wait(self._priv + self.SEM, thread.is_alive)
            _pop()
            if not finished:
                break
            self._post(self._real + self.SEM)
        if failure:
            raise failure[0]


def _wrap_zenflow_worker(orig):
    @functools.wraps(orig)
    def zenflow_optimizer_process(groups, ctrl, ready, *rest, **kwargs):
        try:
            _become_worker("zenflow")
            relay_off = os.environ.get("TRACEKIT_ZENFLOW_RELAY") == "0"
            relay = _ZenFlowRelay(ctrl) if not kwargs and not relay_off else None
        except Exception as exc:
            _warn(f"zenflow worker: no per-step ranges ({exc!r})")
            relay = None
        if relay is None:
            return orig(groups, ctrl, ready, *rest, **kwargs)
        return relay.run(orig, groups, ready, *rest)

    return zenflow_optimizer_process
