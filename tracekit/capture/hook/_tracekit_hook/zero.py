"""Wrappers of the ZeRO optimizers' phase methods (stage 1/2, stage 3, SuperOffload, ZenFlow).

Part of the hook package (see ``__init__``): standard library only.
"""

from __future__ import annotations

import functools

from .channel import _publish_iteration, _worker_iteration
from .core import _pop, _push, _state


# --------------------------------------------------------------------------- ZeRO
def _wrap_simple(orig, name_for):
    """Wrap ``orig`` in a range whose name ``name_for(self, *args)`` gives (None: no range).

    A range is not reopened inside itself on the same thread (``check_overflow`` calls
    ``has_overflow``: one ``overflow_check``).
    """

    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        try:
            name = name_for(self, *args)
        except Exception:
            name = None
        tls = _state.tls
        open_names = getattr(tls, "open_names", None)
        if open_names is None:
            open_names = tls.open_names = []
        if name is None or name in open_names:
            return orig(self, *args, **kwargs)
        open_names.append(name)
        _push(name)
        try:
            return orig(self, *args, **kwargs)
        finally:
            _pop()
            open_names.pop()

    return wrapper


def _named(name):
    return lambda f: _wrap_simple(f, lambda self, *a: name)


def _passthrough(orig):
    """A wrapper without a range: marks an override whose phases are ranges of its callees."""

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        return orig(*args, **kwargs)

    return wrapper


def _stage3_step_name(self, sub_group_id=None, *rest):
    if not getattr(self, "offload_optimizer", False):
        return "optimizer_step"
    devices = getattr(self, "subgroup_to_device", None)
    if isinstance(devices, dict) and sub_group_id in devices and devices[sub_group_id] != "cpu":
        return "optimizer_step"  # partial offload: this sub-group stays on the GPU
    return "cpu_optimizer_step"


def _superoffload_step_name(self, sub_group_id=None, *rest):
    # SuperOffload's _optimizer_step only steps GPU sub-groups; the CPU ones were stepped by
    # the worker during backward (its own cpu_optimizer_step ranges)
    devices = getattr(self, "subgroup_to_device", None)
    if isinstance(devices, dict) and devices.get(sub_group_id) == "cpu":
        return None
    return "optimizer_step"


def _stage12_step_wrapper(orig):
    @functools.wraps(orig)
    def step(self, *args, **kwargs):
        tls = _state.tls
        tls.in_stage12_step = True
        try:
            return orig(self, *args, **kwargs)
        finally:
            if getattr(tls, "param_copy_open", False):
                tls.param_copy_open = False
                _pop()
            tls.in_stage12_step = False

    return step


def _stage12_optimizer_step_wrapper(orig):
    @functools.wraps(orig)
    def _optimizer_step(self, *args, **kwargs):
        offload = bool(getattr(self, "cpu_offload", False))
        tls = _state.tls
        if getattr(tls, "param_copy_open", False):  # a previous group's copy range
            tls.param_copy_open = False
            _pop()
        _push("cpu_optimizer_step" if offload else "optimizer_step")
        try:
            result = orig(self, *args, **kwargs)
        finally:
            _pop()
        if offload and getattr(tls, "in_stage12_step", False):
            # DeepSpeed copies fp32 -> bf16 buffer -> GPU inline in step(), right after this
            # call and before _release_preflattened_grad_buffers(i): bracket that stretch.
            _push("param_copy_to_device")
            tls.param_copy_open = True
        return result

    return _optimizer_step


def _stage12_release_wrapper(orig):
    @functools.wraps(orig)
    def _release_preflattened_grad_buffers(self, *args, **kwargs):
        tls = _state.tls
        if getattr(tls, "param_copy_open", False):
            tls.param_copy_open = False
            _pop()
        return orig(self, *args, **kwargs)

    return _release_preflattened_grad_buffers


def _submit_wrapper(orig):
    """A hand-over of work to a CPU optimizer worker: publish the iteration, then submit."""

    def name_for(self, *args):
        _publish_iteration()
        return "cpu_optimizer_submit"

    return _wrap_simple(orig, name_for)


def _async_step_wrapper(orig):
    @functools.wraps(orig)
    def async_step(self, *args, **kwargs):
        _publish_iteration()
        return orig(self, *args, **kwargs)

    return async_step


def _worker_step_name(kind_word):
    def name_for(self, subgroup_id=None, *rest):
        if _state.worker is None:
            return None  # the in-process CPU Adam: the caller's cpu_optimizer_step covers it
        return f"{kind_word} it={_worker_iteration()} sg={subgroup_id}"

    return name_for
