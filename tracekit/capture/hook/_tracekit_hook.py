"""NVTX phase ranges for DeepSpeed training, injected without changing the user's script.

Loaded by tracekit's ``sitecustomize`` when ``TRACEKIT_HOOK=1``. When DeepSpeed's engine and
ZeRO optimizer modules are imported, their methods are wrapped so that the training thread
pushes and pops NVTX ranges in the ``tracekit`` domain:

==========================  ===============================================================
range message               where
==========================  ===============================================================
``iteration N``             from the first training ``forward`` after the previous optimizer
                            step to the end of the ``engine.step()`` that updates; N is
                            ``engine.global_steps`` before the update (0-based)
``forward``                 ``DeepSpeedEngine.forward``
``backward`` /              ``DeepSpeedEngine.backward``; ``backward boundary`` when
``backward boundary``       ``engine.is_gradient_accumulation_boundary()`` is true
``update``                  ``DeepSpeedEngine.step`` at an accumulation boundary
``step (no update)``        ``DeepSpeedEngine.step`` between boundaries (no optimizer work)
``grad_copy_to_host``       ZeRO-1/2 offload: ``DeepSpeedZeroOptimizer.copy_grads_in_partition``
                            (one per parameter, during backward); ZeRO-3 offload:
                            ``DeepSpeedZeroOptimizer_Stage3.partition_grads``
``grad_norm``               ``DeepSpeedZeroOptimizer.scaled_global_norm`` /
                            ``DeepSpeedZeroOptimizer_Stage3._get_norm_groups``
``cpu_optimizer_step``      ``_optimizer_step`` of either optimizer (DeepSpeedCPUAdam.step) when
                            the optimizer is offloaded; ``optimizer_step`` otherwise
``param_copy_to_device``    ZeRO-1/2 offload: from the end of ``_optimizer_step`` to
                            ``_release_preflattened_grad_buffers`` (fp32 -> bf16 on the host,
                            then the copy to the GPU), inline code in ``step``
``param_copy_back``         ZeRO-3: ``_reassign_or_swap_out_partitioned_parameters``
==========================  ===============================================================

Other engines (SuperOffload, ZenFlow, the pipeline engine, direct ``loss.backward()``, the NVMe
swappers), the CPU optimizer workers' ``cpu_optimizer_step it=N sg=S`` ranges, the ``rank R
local_rank L world W`` mark, ``overflow_check``, ``unscale_clip`` and ``cpu_update_wait``: see
:data:`HOOK_POINTS`, :data:`FUNCTION_HOOK_POINTS` and docs/capture.md ("Hook points per engine").
When the engine is built, :func:`check_coverage` reports every phase method that the optimizer's
class or instance overrides without a wrapper (``missing`` in the report, and a warning).

With ``TRACEKIT_ITERATIONS=A-B`` the hook calls ``torch.cuda.profiler.start()`` just before
``iteration A`` opens and ``torch.cuda.profiler.stop()`` just after ``iteration B`` closes
(for ``nsys --capture-range=cudaProfilerApi``).

A hook point that the installed DeepSpeed lacks is a warning naming it, never an error.
With ``TRACEKIT_HOOK_REPORT_DIR`` set, each process that wraps DeepSpeed writes
``hook-<pid>.json`` there (versions, wrapped and missing points, DeepSpeed config).
This module must import nothing but the standard library at import time.
"""

from __future__ import annotations

import functools
import importlib.abc
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


def _env_int(name: str):
    value = os.environ.get(name, "")
    return int(value) if value.lstrip("-").isdigit() else None


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
            qualified = f"{class_name}.{method}"
            orig = cls.__dict__.get(method)
            if orig is None or not callable(orig):
                _warn(f"DeepSpeed {version} has no {qualified}; the range it marks will be missing")
                _state.report["missing"].append(qualified)
                continue
            if getattr(orig, _WRAPPED_FLAG, False):
                continue
            new = _WRAPPERS[(class_name, method)](orig)
            setattr(new, _WRAPPED_FLAG, True)
            setattr(cls, method, new)
            wrapped.append(qualified)
            _state.report["wrapped"].append(qualified)
    for function in FUNCTION_HOOK_POINTS.get(module_name, []):
        qualified = f"{module_name}.{function}"
        orig = getattr(module, function, None)
        if orig is None or not callable(orig):
            _warn(f"DeepSpeed {version} has no {qualified}; the worker's ranges will be missing")
            _state.report["missing"].append(qualified)
            continue
        if getattr(orig, _WRAPPED_FLAG, False):
            continue
        new = _FUNCTION_WRAPPERS[(module_name, function)](orig)
        setattr(new, _WRAPPED_FLAG, True)
        setattr(module, function, new)
        wrapped.append(qualified)
        _state.report["wrapped"].append(qualified)
    return wrapped


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
