"""Wrappers of DeepSpeedEngine and PipelineEngine: iterations, forward, backward, step.

Part of the hook package (see ``__init__``): standard library only.
"""

from __future__ import annotations

import functools
import threading

from .channel import _IterationChannel
from .core import _env_int, _pop, _push, _state, _warn, _write_report
from .instance import check_coverage, instrument_instance


# --------------------------------------------------------------------------- engine
def _is_update_step(engine) -> bool:
    """True when this ``engine.step()`` call will run the optimizer."""
    managed = getattr(engine, "managed_gradient_accumulation", None)
    if callable(managed) and not managed():
        return True  # unmanaged accumulation: every step() is the boundary
    return bool(engine.is_gradient_accumulation_boundary())


def _open_iteration(engine) -> None:
    if getattr(engine, "_tracekit_iteration", None) is not None:
        return
    n = int(getattr(engine, "global_steps", 0))
    window = _state.window
    if window is not None and not _state.profiler_started and window[0] <= n <= window[1]:
        try:
            _state.profiler.start()
            _state.profiler_started = True
        except Exception as exc:
            _warn(f"cudaProfilerStart failed: {exc!r}")
    engine._tracekit_iteration = n
    _state.current_iteration = n
    _push(f"iteration {n}")


def _close_iteration(engine) -> None:
    n = getattr(engine, "_tracekit_iteration", None)
    if n is None:
        return
    engine._tracekit_iteration = None
    _pop()
    window = _state.window
    if (window is not None and _state.profiler_started and not _state.profiler_stopped
            and n >= window[1]):
        try:
            _state.profiler.stop()
            _state.profiler_stopped = True
        except Exception as exc:
            _warn(f"cudaProfilerStop failed: {exc!r}")


def _record_config(engine) -> None:
    if "deepspeed_config" in _state.report:
        return
    config = getattr(getattr(engine, "_config", None), "_param_dict", None)
    _state.report["deepspeed_config"] = config if isinstance(config, dict) else None
    try:
        import torch

        if torch.cuda.is_available():
            _state.report["gpu"] = torch.cuda.get_device_name()
    except Exception:
        pass
    _write_report()


def _rank_info(engine) -> dict:
    """``rank``, ``local_rank``, ``world_size`` of this process (engine attributes, else env)."""
    info = {}
    for key, attr, env in (("rank", "global_rank", "RANK"), ("local_rank", "local_rank", "LOCAL_RANK"),
                           ("world_size", "world_size", "WORLD_SIZE")):
        value = getattr(engine, attr, None)
        info[key] = int(value) if isinstance(value, int) else _env_int(env)
    return info


def _engine_started(engine) -> None:
    """After ``DeepSpeedEngine.__init__``: rank mark, optimizer class, per-instance hooks, coverage."""
    info = _rank_info(engine)
    _state.report.update(info)
    fmt = lambda v: "?" if v is None else v  # noqa: E731
    _push(f"rank {fmt(info['rank'])} local_rank {fmt(info['local_rank'])} "
          f"world {fmt(info['world_size'])}")
    _pop()
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is not None:
        cls = type(optimizer)
        _state.report["optimizer_class"] = f"{cls.__module__}.{cls.__qualname__}"
        instrument_instance(optimizer)
        check_coverage(optimizer)
    _write_report()


def _wrap_engine_init(orig):
    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        if _state.channel is None:
            try:
                _state.channel = _IterationChannel.create()
            except Exception as exc:
                _warn(f"cannot create the iteration channel for CPU optimizer workers: {exc!r}")
        result = orig(self, *args, **kwargs)
        if not getattr(self, "_tracekit_started", False):
            self._tracekit_started = True
            try:
                _engine_started(self)
            except Exception as exc:
                _warn(f"engine start bookkeeping failed: {exc!r}")
        return result

    return __init__


def _wrap_engine_forward(orig):
    @functools.wraps(orig)
    def forward(self, *args, **kwargs):
        _record_config(self)
        if getattr(self, "training", True):
            _open_iteration(self)
        _push("forward")
        try:
            return orig(self, *args, **kwargs)
        finally:
            _pop()

    return forward


def _backward_name(engine) -> str:
    try:
        boundary = bool(engine.is_gradient_accumulation_boundary())
    except Exception:
        boundary = False
    return "backward boundary" if boundary else "backward"


def _wrap_engine_backward(orig):
    @functools.wraps(orig)
    def backward(self, *args, **kwargs):
        _push(_backward_name(self))
        try:
            return orig(self, *args, **kwargs)
        finally:
            _pop()

    return backward


def _wrap_backward_prologue(orig):
    """``loss.backward()`` called directly (no ``engine.backward``): open the backward range."""

    @functools.wraps(orig)
    def _backward_prologue(self, *args, **kwargs):
        if (not getattr(self, "_running_engine_backward", True)
                and getattr(self, "_tracekit_direct_backward", None) is None):
            _push(_backward_name(self))
            self._tracekit_direct_backward = threading.get_ident()
        return orig(self, *args, **kwargs)

    return _backward_prologue


def _wrap_backward_epilogue(orig):
    @functools.wraps(orig)
    def _backward_epilogue(self, *args, **kwargs):
        try:
            return orig(self, *args, **kwargs)
        finally:
            opened = getattr(self, "_tracekit_direct_backward", None)
            if opened is not None:
                self._tracekit_direct_backward = None
                if opened == threading.get_ident():
                    _pop()
                else:  # a push/pop range cannot be closed from another thread
                    _warn_once("direct-backward-thread",
                               "loss.backward(): DeepSpeed's backward epilogue ran on another thread "
                               "than its prologue; the direct backward range stays open there")

    return _backward_epilogue


def _wrap_engine_step(orig):
    @functools.wraps(orig)
    def step(self, *args, **kwargs):
        try:
            update = _is_update_step(self)
        except Exception:
            update = False
        _push("update" if update else "step (no update)")
        try:
            return orig(self, *args, **kwargs)
        finally:
            _pop()
            if update:
                _close_iteration(self)

    return step


_warned_once: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned_once:
        _warned_once.add(key)
        _warn(message)


# --------------------------------------------------------------------------- pipeline engine
def _wrap_train_batch(orig):
    """``PipelineEngine.train_batch``: one iteration (its micro-batches and the optimizer step)."""

    @functools.wraps(orig)
    def train_batch(self, *args, **kwargs):
        _record_config(self)
        _open_iteration(self)
        try:
            return orig(self, *args, **kwargs)
        finally:
            _close_iteration(self)

    return train_batch


def _pipe_backward_name(self, *args):
    # the last stage calls DeepSpeedEngine.backward (which marks itself); others run autograd
    try:
        if self.is_last_stage():
            return None
    except Exception:
        pass
    return "backward"
