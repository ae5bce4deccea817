"""The wrapper tables, patching a DeepSpeed module, and the import hook that does it.

Part of the hook package (see ``__init__``): standard library only.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

from .core import (
    _WRAPPED_FLAG,
    ENV_ITERATIONS,
    ENV_LOG,
    FUNCTION_HOOK_POINTS,
    HOOK_POINTS,
    SUPEROFFLOAD_UTILS_MODULE,
    ZENFLOW_UTILS_MODULE,
    LogEmitter,
    _state,
    _warn,
    _write_report,
    parse_iterations,
    set_emitter,
    set_iteration_window,
)
from .engines import (
    _pipe_backward_name,
    _wrap_backward_epilogue,
    _wrap_backward_prologue,
    _wrap_engine_backward,
    _wrap_engine_forward,
    _wrap_engine_init,
    _wrap_engine_step,
    _wrap_train_batch,
)
from .workers import _wrap_superoffload_worker, _wrap_zenflow_worker
from .zero import (
    _async_step_wrapper,
    _named,
    _passthrough,
    _stage3_step_name,
    _stage12_optimizer_step_wrapper,
    _stage12_release_wrapper,
    _stage12_step_wrapper,
    _submit_wrapper,
    _superoffload_step_name,
    _worker_step_name,
    _wrap_simple,
)

# --------------------------------------------------------------------------- tables
_COPY_TO_HOST_12 = lambda f: _wrap_simple(  # noqa: E731
    f, lambda self, *a: "grad_copy_to_host" if getattr(self, "cpu_offload", False) else None)
_COPY_TO_HOST_3 = lambda f: _wrap_simple(  # noqa: E731
    f, lambda self, *a: "grad_copy_to_host" if getattr(self, "offload_optimizer", False) else None)

# (class name, method) -> wrapper factory
_WRAPPERS = {
    ("DeepSpeedEngine", "__init__"): _wrap_engine_init,
    ("DeepSpeedEngine", "forward"): _wrap_engine_forward,
    ("DeepSpeedEngine", "backward"): _wrap_engine_backward,
    ("DeepSpeedEngine", "step"): _wrap_engine_step,
    ("DeepSpeedEngine", "_backward_prologue"): _wrap_backward_prologue,
    ("DeepSpeedEngine", "_backward_epilogue"): _wrap_backward_epilogue,
    ("DeepSpeedZeroOptimizer_Stage3", "step"): _passthrough,
    ("DeepSpeedZeroOptimizer_Stage3", "partition_grads"): _COPY_TO_HOST_3,
    ("DeepSpeedZeroOptimizer_Stage3", "_get_norm_groups"): _named("grad_norm"),
    ("DeepSpeedZeroOptimizer_Stage3", "_optimizer_step"): lambda f: _wrap_simple(f, _stage3_step_name),
    ("DeepSpeedZeroOptimizer_Stage3", "_reassign_or_swap_out_partitioned_parameters"):
        _named("param_copy_back"),
    ("DeepSpeedZeroOptimizer_Stage3", "unscale_and_clip_grads"): _named("unscale_clip"),
    ("DeepSpeedZeroOptimizer_Stage3", "check_overflow"): _named("overflow_check"),
    ("DeepSpeedZeroOptimizer_Stage3", "has_overflow"): _named("overflow_check"),
    ("DeepSpeedZeroOptimizer", "step"): _stage12_step_wrapper,
    ("DeepSpeedZeroOptimizer", "copy_grads_in_partition"): _COPY_TO_HOST_12,
    ("DeepSpeedZeroOptimizer", "scaled_global_norm"): _named("grad_norm"),
    ("DeepSpeedZeroOptimizer", "_optimizer_step"): _stage12_optimizer_step_wrapper,
    ("DeepSpeedZeroOptimizer", "_release_preflattened_grad_buffers"): _stage12_release_wrapper,
    ("DeepSpeedZeroOptimizer", "unscale_and_clip_grads"): _named("unscale_clip"),
    ("DeepSpeedZeroOptimizer", "check_overflow"): _named("overflow_check"),
    ("DeepSpeedZeroOptimizer", "has_overflow"): _named("overflow_check"),
    ("PipelineEngine", "train_batch"): _wrap_train_batch,
    ("PipelineEngine", "_exec_forward_pass"): _passthrough,  # DeepSpeedEngine.forward marks it
    ("PipelineEngine", "_exec_backward_pass"): lambda f: _wrap_simple(f, _pipe_backward_name),
    ("PipelineEngine", "_exec_optimizer_step"): _named("update"),
    ("SuperOffloadOptimizer_Stage3", "step"): _passthrough,
    ("SuperOffloadOptimizer_Stage3", "partition_grads"): _named("grad_copy_to_host"),
    ("SuperOffloadOptimizer_Stage3", "_optimizer_step"):
        lambda f: _wrap_simple(f, _superoffload_step_name),
    ("SuperOffloadOptimizer_Stage3", "_reassign_or_swap_out_partitioned_parameters"):
        _named("param_copy_back"),
    ("SuperOffloadOptimizer_Stage3", "_wait_for_async_operations"): _named("cpu_update_wait"),
    ("SuperOffloadOptimizer_Stage3", "_wait_for_single_async_result"): _named("cpu_update_wait"),
    ("SuperOffloadCPUOptimizer", "async_step"): _async_step_wrapper,
    ("ZenFlowZeroOptimizer", "selective_optimizer_step"): _named("selective_optimizer_step"),
    ("ZenFlowZeroOptimizerSequential", "zenflow_cpu_optimizer_step"): _passthrough,
    ("ZenFlowZeroOptimizerParallel", "step"): _stage12_step_wrapper,
    ("ZenFlowZeroOptimizerParallel", "zenflow_cpu_optimizer_step"): _submit_wrapper,
    ("ZenFlowZeroOptimizerParallel", "wait_last_update_and_copy"): _named("param_copy_to_device"),
    ("ZenFlowZeroOptimizerParallel", "_wait_for_optimizer_process"): _named("cpu_update_wait"),
    ("DeepSpeedCPUAdam", "step_subgroup"):
        lambda f: _wrap_simple(f, _worker_step_name("cpu_optimizer_step")),
    ("DeepSpeedCPUAdam", "rollback_subgroup"):
        lambda f: _wrap_simple(f, _worker_step_name("cpu_optimizer_rollback")),
    ("PartitionedOptimizerSwapper", "swap_in_optimizer_state"): _named("swap_in"),
    ("PartitionedOptimizerSwapper", "swap_out_optimizer_state"): _named("swap_out"),
    ("PartitionedOptimizerSwapper", "swap_out_gradients"): _named("grad_swap_out"),
    ("PipelinedOptimizerSwapper", "swap_in_optimizer_state"): _named("swap_in"),
    ("PipelinedOptimizerSwapper", "swap_out_optimizer_state"): _named("swap_out"),
    ("PipelinedOptimizerSwapper", "swap_out_gradients"): _named("grad_swap_out"),
    ("AsyncPartitionedParameterSwapper", "swap_in"): _named("param_swap_in"),
    ("AsyncPartitionedParameterSwapper", "swap_out_and_release"): _named("param_swap_out"),
    ("AsyncPartitionedParameterSwapper", "swap_out_partitioned_params"): _named("param_swap_out"),
    ("AsyncPartitionedParameterSwapper", "synchronize_reads"): _named("param_swap_in_wait"),
    ("AsyncPartitionedParameterSwapper", "synchronize_writes"): _named("param_swap_out_wait"),
}

_FUNCTION_WRAPPERS = {
    (SUPEROFFLOAD_UTILS_MODULE, "superoffload_optimizer_worker"): _wrap_superoffload_worker,
    (ZENFLOW_UTILS_MODULE, "zenflow_optimizer_process"): _wrap_zenflow_worker,
}


# --------------------------------------------------------------------------- patching
def patch_module(module_name: str, module) -> list[str]:
    """Wrap the hook points of one DeepSpeed module; returns the names wrapped.

    Class methods come as ``Class.method``, module functions as ``module.function``.
    Missing classes, methods or functions are warnings (on stderr and in :func:`report`),
    never errors. Wrapping twice is a no-op.
    """
    wrapped: list[str] = []
    version = _deepspeed_version()
    for class_name, methods in HOOK_POINTS.get(module_name, []):
        cls = getattr(module, class_name, None)
        if cls is None:
            _warn(f"DeepSpeed {version} has no {module_name}.{class_name}; its ranges will be missing")
            _state.report["missing"].append(f"{class_name}")
            continue
        for method in methods:
            _wrap_one(cls, method, cls.__dict__.get(method), _WRAPPERS[(class_name, method)],
                      f"{class_name}.{method}", "the range it marks", version, wrapped)
    for function in FUNCTION_HOOK_POINTS.get(module_name, []):
        _wrap_one(module, function, getattr(module, function, None), _FUNCTION_WRAPPERS[(module_name, function)],
                  f"{module_name}.{function}", "the worker's ranges", version, wrapped)
    return wrapped


def _wrap_one(owner, name: str, orig, make, qualified: str, what: str, version: str, wrapped: list[str]) -> None:
    """Replace ``owner.name`` (``orig``: the class's own attribute or the module's function) by
    ``make(orig)``, flagged as wrapped, and note it in ``wrapped`` and the report; missing (or
    not callable) is a warning that ``what`` will be missing; already wrapped is a no-op."""
    if orig is None or not callable(orig):
        _warn(f"DeepSpeed {version} has no {qualified}; {what} will be missing")
        _state.report["missing"].append(qualified)
        return
    if getattr(orig, _WRAPPED_FLAG, False):
        return
    new = make(orig)
    setattr(new, _WRAPPED_FLAG, True)
    setattr(owner, name, new)
    wrapped.append(qualified)
    _state.report["wrapped"].append(qualified)


def _deepspeed_version() -> str:
    ds = sys.modules.get("deepspeed")
    version = getattr(ds, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as _v

            version = _v("deepspeed")
        except Exception:
            version = "unknown"
    return str(version)


def _safe_patch(module_name: str, module) -> None:
    try:
        patch_module(module_name, module)
    except Exception as exc:
        _warn(f"could not wrap {module_name}: {exc!r}")
    _state.report["deepspeed_version"] = _deepspeed_version()
    torch = sys.modules.get("torch")
    _state.report["torch_version"] = str(getattr(torch, "__version__", "unknown"))
    _write_report()


_HOOKED_MODULES = set(HOOK_POINTS) | set(FUNCTION_HOOK_POINTS)


# --------------------------------------------------------------------------- import hook
class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then wraps the module's hook points."""

    def __init__(self, loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _safe_patch(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


class _DeepSpeedFinder(importlib.abc.MetaPathFinder):
    """Meta path finder that intercepts only the DeepSpeed modules the hook wraps."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _HOOKED_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


_installed = False


def install() -> None:
    """Activate the hook in this process (idempotent).

    Reads ``TRACEKIT_ITERATIONS`` (``A-B``) for the capture range; a malformed value is a
    warning and disables the capture range.
    """
    global _installed
    if _installed:
        return
    _installed = True
    log_path = os.environ.get(ENV_LOG)
    if log_path:
        try:
            set_emitter(LogEmitter(log_path))
        except OSError as exc:
            _warn(f"{ENV_LOG}: cannot open {log_path!r}: {exc}; using NVTX")
    text = os.environ.get(ENV_ITERATIONS)
    if text:
        try:
            set_iteration_window(parse_iterations(text))
        except ValueError as exc:
            _warn(f"{ENV_ITERATIONS}: {exc}; recording all iterations")
    for name in _HOOKED_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            _safe_patch(name, module)
    sys.meta_path.insert(0, _DeepSpeedFinder())
