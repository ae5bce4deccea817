"""Per-instance hooks (methods bound on the optimizer object) and the coverage check.

Part of the hook package (see ``__init__``): standard library only.
"""

from __future__ import annotations

from .channel import _publish_iteration
from .core import _WRAPPED_FLAG, HOOK_POINTS, _pop, _push, _state, _warn
from .zero import _passthrough, _wrap_simple


# --------------------------------------------------------------------------- per-instance hooks
def _instance_simple(bound, name_for):
    """Range wrapper for a callable bound on an instance (no ``self`` argument)."""
    inner = _wrap_simple(lambda _self, *a, **k: bound(*a, **k), lambda _self, *a: name_for(*a))

    def wrapper(*args, **kwargs):
        return inner(None, *args, **kwargs)

    return wrapper


class _WaitingOp:
    """Stands in for ZenFlow's loaded C++ op on one optimizer: ``zenflow_adam_wait`` in a
    ``cpu_update_wait`` range, every other attribute the op's own."""

    def __init__(self, op) -> None:
        self._op = op
        self.__tracekit_wrapped__ = True

    def zenflow_adam_wait(self, *args, **kwargs):
        _push("cpu_update_wait")
        try:
            return self._op.zenflow_adam_wait(*args, **kwargs)
        finally:
            _pop()

    def __getattr__(self, name):
        return getattr(self._op, name)


def _instance_wait_and_copy(opt, bound):
    def wait_last_update_and_copy(*args, **kwargs):
        op = getattr(opt, "zf_op", None)
        if op is not None and not isinstance(op, _WaitingOp):
            opt.zf_op = _WaitingOp(op)
        _push("param_copy_back")
        try:
            return bound(*args, **kwargs)
        finally:
            _pop()

    return wait_last_update_and_copy


def _instance_submit(opt, bound):
    def submit(*args, **kwargs):
        _publish_iteration()
        _push("cpu_optimizer_submit")
        try:
            return bound(*args, **kwargs)
        finally:
            _pop()

    return submit


# ZeRO-3 ZenFlow binds these on the instance (lambdas and partials in
# DeepSpeedZeroOptimizer_Stage3.create_zenflow_hooks / engine_stage3's epilogue): name -> factory
_INSTANCE_WRAPPERS = {
    "step": lambda opt, bound: _passthrough(bound),
    "partition_grads": lambda opt, bound: _instance_simple(
        bound, lambda *a: "grad_copy_to_host" if getattr(opt, "offload_optimizer", False) else None),
    "unscale_and_clip_grads": lambda opt, bound: _instance_simple(bound, lambda *a: "unscale_clip"),
    "wait_last_update_and_copy": _instance_wait_and_copy,
    "zenflow_cpu_optimizer_overlap_step": _instance_submit,
    "selective_optimizer_step": lambda opt, bound: _instance_simple(
        bound, lambda *a: "selective_optimizer_step"),
    "zenflow_cpu_optimizer_step": lambda opt, bound: _passthrough(bound),
}

# the base optimizer classes whose phase methods a subclass or an instance may override
_BASE_PHASES = {cls: methods for points in HOOK_POINTS.values() for cls, methods in points
                if cls in ("DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3")}


def _is_wrapped(obj) -> bool:
    if getattr(obj, _WRAPPED_FLAG, False):
        return True
    func = getattr(obj, "__func__", None) or getattr(obj, "func", None)  # bound method, partial
    return bool(func is not None and getattr(func, _WRAPPED_FLAG, False))


def instrument_instance(optimizer) -> list[str]:
    """Wrap the phase methods bound on ``optimizer`` itself (instance attributes).

    ZeRO-3 ZenFlow sets ``step``, ``partition_grads``, ``wait_last_update_and_copy``... on
    each optimizer instance, so class-level wrappers never see them. Returns the names wrapped.
    """
    done = []
    attrs = getattr(optimizer, "__dict__", {})
    for name, factory in _INSTANCE_WRAPPERS.items():
        bound = attrs.get(name)
        if bound is None or not callable(bound) or _is_wrapped(bound):
            continue
        try:
            new = factory(optimizer, bound)
            setattr(new, _WRAPPED_FLAG, True)
            setattr(optimizer, name, new)
        except Exception as exc:
            _warn(f"could not wrap {type(optimizer).__name__}.{name} (bound per instance): {exc!r}")
            continue
        qualified = f"{type(optimizer).__name__}.{name} (instance)"
        done.append(qualified)
        _state.report["wrapped"].append(qualified)
    return done


def check_coverage(optimizer) -> list[str]:
    """Phase methods that ``optimizer``'s class (or the instance) overrides without a wrapper.

    The phase methods are those the hook wraps on the ZeRO base class the optimizer derives
    from (``DeepSpeedZeroOptimizer`` or ``DeepSpeedZeroOptimizer_Stage3``). Each one found
    goes to the report's ``missing`` list and to a warning (printed by ``tracekit capture``):
    its range will not be recorded. Returns the ``Class.method`` names.
    """
    mro = type(optimizer).__mro__
    names = [k.__name__ for k in mro]
    base = next((n for n in names if n in _BASE_PHASES), None)
    if base is None:
        return []
    found = []
    attrs = getattr(optimizer, "__dict__", {})
    for method in _BASE_PHASES[base]:
        if method in attrs and callable(attrs[method]):
            if not _is_wrapped(attrs[method]):
                found.append(f"{type(optimizer).__name__}.{method} (bound per instance)")
            continue
        owner = next((k for k in mro if method in k.__dict__), None)
        if owner is None or owner.__name__ == base:
            continue  # the base's own method (wrapped at import, or already reported missing)
        if not _is_wrapped(owner.__dict__[method]):
            found.append(f"{owner.__name__}.{method}")
    for qualified in found:
        if qualified not in _state.report["missing"]:
            _state.report["missing"].append(qualified)
        _warn(f"{qualified} overrides a phase method of {base} without a tracekit wrapper; "
              "the range it marks will be missing")
    return found
