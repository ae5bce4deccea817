"""The iteration channel: a rank tells its CPU optimizer worker processes the iteration.

Part of the hook package (see ``__init__``): standard library only.
"""

from __future__ import annotations

import os

from .core import _env_int, _state, _warn, _write_report

# --------------------------------------------------------------------------- iteration channel
ENV_CHANNEL = "TRACEKIT_ITERATION_CHANNEL"


class _IterationChannel:
    """An 8-byte shared file through which a rank tells its CPU optimizer workers the iteration.

    The rank (the writer) creates it when its engine is built, before DeepSpeed spawns any
    worker, and names it in ``TRACEKIT_ITERATION_CHANNEL=<pid>:<path>``; spawned children
    inherit the variable. A worker (the reader) opens it only when that pid is its parent.
    The writer publishes the iteration right before it hands work to the worker (SuperOffload's
    ``async_step``, ZenFlow's step submission), so the worker reads the iteration whose
    gradients it updates. -1 means "not known".
    """

    def __init__(self, path: str, create: bool) -> None:
        import mmap

        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.write(fd, (-1).to_bytes(8, "little", signed=True))
            self._map = mmap.mmap(fd, 8)
        finally:
            os.close(fd)
        self.path = path

    @classmethod
    def create(cls) -> "_IterationChannel":
        """A new channel owned by this process, announced in the environment."""
        import atexit
        import tempfile

        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix=f"tracekit-iteration-{os.getpid()}-", dir=folder)
        os.close(fd)
        channel = cls(path, create=True)
        os.environ[ENV_CHANNEL] = f"{os.getpid()}:{path}"
        atexit.register(_unlink_quietly, path)
        return channel

    @classmethod
    def open_parent(cls) -> "_IterationChannel | None":
        """The channel of this process's parent, or None when there is none."""
        owner, _, path = os.environ.get(ENV_CHANNEL, "").partition(":")
        if not owner.isdigit() or int(owner) != os.getppid() or not os.path.exists(path):
            return None
        return cls(path, create=False)

    def write(self, value: int) -> None:
        self._map[:8] = int(value).to_bytes(8, "little", signed=True)

    def read(self) -> int:
        return int.from_bytes(self._map[:8], "little", signed=True)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _publish_iteration() -> None:
    """Tell this rank's CPU optimizer workers which iteration the work handed to them is of."""
    channel = _state.channel
    if channel is not None and _state.current_iteration is not None:
        try:
            channel.write(_state.current_iteration)
        except Exception:
            pass


def _worker_iteration() -> str:
    channel = _state.channel
    if channel is None:
        return "?"
    try:
        value = channel.read()
    except Exception:
        return "?"
    return "?" if value < 0 else str(value)


def _become_worker(kind: str) -> None:
    """Mark this process as a CPU optimizer worker of ``kind`` and open its parent's channel."""
    _state.worker = kind
    _state.report["role"] = f"{kind} cpu optimizer worker"
    _state.report["parent_pid"] = os.getppid()
    _state.report.update(rank=_env_int("RANK"), local_rank=_env_int("LOCAL_RANK"),
                         world_size=_env_int("WORLD_SIZE"))
    try:
        _state.channel = _IterationChannel.open_parent()
    except Exception as exc:
        _warn(f"{kind} worker: cannot read the iteration channel ({exc!r}); ranges say it=?")
    if _state.channel is None:
        _warn(f"{kind} worker: no iteration channel from the parent; ranges say it=?")
    _write_report()
