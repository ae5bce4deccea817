"""Constants, hook points, range emitters and the process-wide state of the hook.

Part of the hook package (see ``__init__``): standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import threading

DOMAIN = "tracekit"
ENV_ENABLE = "TRACEKIT_HOOK"
ENV_ITERATIONS = "TRACEKIT_ITERATIONS"
ENV_REPORT_DIR = "TRACEKIT_HOOK_REPORT_DIR"
ENV_LOG = "TRACEKIT_HOOK_LOG"

ENGINE_MODULE = "deepspeed.runtime.engine"
STAGE3_MODULE = "deepspeed.runtime.zero.stage3"
STAGE12_MODULE = "deepspeed.runtime.zero.stage_1_and_2"
PIPE_MODULE = "deepspeed.runtime.pipe.engine"
SUPEROFFLOAD_MODULE = "deepspeed.runtime.superoffload.superoffload_stage3"
SUPEROFFLOAD_UTILS_MODULE = "deepspeed.runtime.superoffload.superoffload_utils"
ZENFLOW12_MODULE = "deepspeed.runtime.zenflow.zenflow_stage_1_and_2"
ZENFLOW_UTILS_MODULE = "deepspeed.runtime.zenflow.zenflow_utils"
CPU_ADAM_MODULE = "deepspeed.ops.adam.cpu_adam"
OPT_SWAPPER_MODULE = "deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper"
PIPE_SWAPPER_MODULE = "deepspeed.runtime.swap_tensor.pipelined_optimizer_swapper"
PARAM_SWAPPER_MODULE = "deepspeed.runtime.swap_tensor.partitioned_param_swapper"

_SWAPPER_METHODS = ["swap_in_optimizer_state", "swap_out_optimizer_state", "swap_out_gradients"]

# module -> [(class name, [method names])] that the hook wraps (checked against DeepSpeed 0.19.8)
HOOK_POINTS: dict[str, list[tuple[str, list[str]]]] = {
    ENGINE_MODULE: [("DeepSpeedEngine", ["__init__", "forward", "backward", "step",
                                         "_backward_prologue", "_backward_epilogue"])],
    STAGE3_MODULE: [(
        "DeepSpeedZeroOptimizer_Stage3",
        ["step", "partition_grads", "_get_norm_groups", "_optimizer_step",
         "_reassign_or_swap_out_partitioned_parameters", "unscale_and_clip_grads",
         "check_overflow", "has_overflow"],
    )],
    STAGE12_MODULE: [(
        "DeepSpeedZeroOptimizer",
        ["step", "copy_grads_in_partition", "scaled_global_norm", "_optimizer_step",
         "_release_preflattened_grad_buffers", "unscale_and_clip_grads", "check_overflow",
         "has_overflow"],
    )],
    PIPE_MODULE: [("PipelineEngine", ["train_batch", "_exec_forward_pass", "_exec_backward_pass",
                                      "_exec_optimizer_step"])],
    SUPEROFFLOAD_MODULE: [(
        "SuperOffloadOptimizer_Stage3",
        ["step", "partition_grads", "_optimizer_step", "_reassign_or_swap_out_partitioned_parameters",
         "_wait_for_async_operations", "_wait_for_single_async_result"],
    )],
    SUPEROFFLOAD_UTILS_MODULE: [("SuperOffloadCPUOptimizer", ["async_step"])],
    ZENFLOW12_MODULE: [
        ("ZenFlowZeroOptimizer", ["selective_optimizer_step"]),
        ("ZenFlowZeroOptimizerSequential", ["zenflow_cpu_optimizer_step"]),
        ("ZenFlowZeroOptimizerParallel", ["step", "zenflow_cpu_optimizer_step",
                                          "wait_last_update_and_copy", "_wait_for_optimizer_process"]),
    ],
    CPU_ADAM_MODULE: [("DeepSpeedCPUAdam", ["step_subgroup", "rollback_subgroup"])],
    OPT_SWAPPER_MODULE: [("PartitionedOptimizerSwapper", list(_SWAPPER_METHODS))],
    PIPE_SWAPPER_MODULE: [("PipelinedOptimizerSwapper", list(_SWAPPER_METHODS))],
    PARAM_SWAPPER_MODULE: [("AsyncPartitionedParameterSwapper",
                            ["swap_in", "swap_out_and_release", "swap_out_partitioned_params",
                             "synchronize_reads", "synchronize_writes"])],
}

# module -> [function names]: module-level functions wrapped in place (the CPU optimizer
# workers' entry points: spawned children unpickle them by name, so they get the wrapper)
FUNCTION_HOOK_POINTS: dict[str, list[str]] = {
    SUPEROFFLOAD_UTILS_MODULE: ["superoffload_optimizer_worker"],
    ZENFLOW_UTILS_MODULE: ["zenflow_optimizer_process"],
}

_WRAPPED_FLAG = "__tracekit_wrapped__"


# --------------------------------------------------------------------------- emitters
class NvtxEmitter:
    """Push/pop ranges in the ``tracekit`` NVTX domain through the ``nvtx`` package.

    The domain is created at the first range, so that a tool injected later is seen.
    Without ``nvtx`` installed, one warning is printed and ranges are dropped.
    """

    def __init__(self) -> None:
        self._domain = None
        self._attrs: dict[str, object] = {}
        self._failed = False

    def _get_domain(self):
        if self._domain is None and not self._failed:
            try:
                import nvtx  # the optional dependency, tracekit[capture]

                self._domain = nvtx.get_domain(DOMAIN)
            except Exception as exc:
                self._failed = True
                _warn(f"the 'nvtx' package is not importable ({exc!r}); no tracekit ranges "
                      "will be recorded (pip install nvtx in the training environment)")
        return self._domain

    def push(self, message: str) -> None:
        """Open a range named ``message`` on the calling thread."""
        domain = self._get_domain()
        if domain is None:
            return
        attrs = self._attrs.get(message)
        if attrs is None:
            attrs = domain.get_event_attributes(message=message)
            if len(self._attrs) < 4096:
                self._attrs[message] = attrs
        domain.push_range(attrs)

    def pop(self) -> None:
        """Close the innermost range of the calling thread in this domain."""
        domain = self._get_domain()
        if domain is not None:
            domain.pop_range()


class LogEmitter:
    """Appends ``push <thread id> <message>`` / ``pop <thread id>`` lines to a file.

    Selected with ``TRACEKIT_HOOK_LOG=PATH`` (PATH may hold ``{pid}``): a way to see the
    ranges without nsys, used by the CPU tests. Each line is flushed as it is written.
    """

    def __init__(self, path: str) -> None:
        self._file = open(path.replace("{pid}", str(os.getpid())), "a", buffering=1)
        self._lock = threading.Lock()

    def push(self, message: str) -> None:
        with self._lock:
            self._file.write(f"push {threading.get_ident()} {message}\n")

    def pop(self) -> None:
        with self._lock:
            self._file.write(f"pop {threading.get_ident()}\n")


class CudaProfilerControl:
    """Calls ``torch.cuda.profiler.start()/stop()`` (cudaProfilerStart/Stop)."""

    def start(self) -> None:
        import torch

        torch.cuda.profiler.start()

    def stop(self) -> None:
        import torch

        torch.cuda.profiler.stop()


# --------------------------------------------------------------------------- state
class _State:
    def __init__(self) -> None:
        self.emitter = NvtxEmitter()
        self.profiler = CudaProfilerControl()
        self.window: tuple[int, int] | None = None
        self.profiler_started = False
        self.profiler_stopped = False
        self.report: dict = {"pid": os.getpid(), "argv": list(sys.argv), "wrapped": [],
                             "missing": [], "warnings": []}
        self.tls = threading.local()
        self.current_iteration: int | None = None  # the last ``iteration N`` opened here
        self.worker: str | None = None  # "superoffload" / "zenflow" inside a CPU optimizer worker
        self.channel = None  # _IterationChannel: this process's iteration for its workers


_state = _State()


def set_emitter(emitter) -> None:
    """Replace the range emitter (an object with ``push(message)`` and ``pop()``); for tests."""
    _state.emitter = emitter


def set_profiler_control(control) -> None:
    """Replace the object whose ``start()``/``stop()`` bound the capture range; for tests."""
    _state.profiler = control


def set_iteration_window(window: tuple[int, int] | None) -> None:
    """Set the ``(A, B)`` optimizer-step window (inclusive) that the capture range covers."""
    _state.window = window
    _state.profiler_started = False
    _state.profiler_stopped = False


def parse_iterations(text: str) -> tuple[int, int]:
    """Parse ``"A-B"`` (or ``"A"``) into 0-based inclusive optimizer steps; ValueError if bad."""
    parts = text.strip().split("-")
    if len(parts) == 1 and parts[0].isdigit():
        a = b = int(parts[0])
    elif len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        a, b = int(parts[0]), int(parts[1])
    else:
        raise ValueError(f"iterations must look like A-B with whole numbers, got {text!r}")
    if b < a:
        raise ValueError(f"iterations A-B need A <= B, got {text!r}")
    return a, b


def report() -> dict:
    """What this process's hook did: wrapped and missing points, versions, warnings."""
    return _state.report


def _warn(message: str) -> None:
    line = f"tracekit-hook: warning: {message}"
    sys.stderr.write(line + "\n")
    _state.report["warnings"].append(message)


def _write_report() -> None:
    folder = os.environ.get(ENV_REPORT_DIR)
    if not folder:
        return
    try:
        path = os.path.join(folder, f"hook-{os.getpid()}.json")
        tmp = path + ".part"
        with open(tmp, "w") as f:
            json.dump(_state.report, f, default=str)
        os.replace(tmp, path)
    except Exception:
        pass  # the report is a nicety; never disturb the training


def _push(message: str) -> None:
    try:
        _state.emitter.push(message)
    except Exception as exc:  # pragma: no cover - defensive
        _warn(f"NVTX push failed: {exc!r}")


def _pop() -> None:
    try:
        _state.emitter.pop()
    except Exception as exc:  # pragma: no cover - defensive
        _warn(f"NVTX pop failed: {exc!r}")


def _env_int(name: str):
    """The environment variable ``name`` as an int, or None when unset or not a whole number."""
    value = os.environ.get(name, "")
    return int(value) if value.lstrip("-").isdigit() else None
