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

# module -> (class name, [method names]) that the hook wraps
HOOK_POINTS: dict[str, tuple[str, list[str]]] = {
    ENGINE_MODULE: ("DeepSpeedEngine", ["forward", "backward", "step"]),
    STAGE3_MODULE: (
        "DeepSpeedZeroOptimizer_Stage3",
        ["partition_grads", "_get_norm_groups", "_optimizer_step",
         "_reassign_or_swap_out_partitioned_parameters"],
    ),
    STAGE12_MODULE: (
        "DeepSpeedZeroOptimizer",
        ["step", "copy_grads_in_partition", "scaled_global_norm", "_optimizer_step",
         "_release_preflattened_grad_buffers"],
    ),
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


def _wrap_engine_backward(orig):
    @functools.wraps(orig)
    def backward(self, *args, **kwargs):
        try:
            boundary = bool(self.is_gradient_accumulation_boundary())
        except Exception:
            boundary = False
        _push("backward boundary" if boundary else "backward")
        try:
            return orig(self, *args, **kwargs)
        finally:
            _pop()

    return backward


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


# --------------------------------------------------------------------------- ZeRO
def _wrap_simple(orig, name_for):
    """Wrap ``orig`` in a range whose name ``name_for(self, *args)`` gives (None: no range)."""

    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        try:
            name = name_for(self, *args)
        except Exception:
            name = None
        if name is None:
            return orig(self, *args, **kwargs)
        _push(name)
        try:
            return orig(self, *args, **kwargs)
        finally:
            _pop()

    return wrapper


def _stage3_step_name(self, sub_group_id=None, *rest):
    if not getattr(self, "offload_optimizer", False):
        return "optimizer_step"
    devices = getattr(self, "subgroup_to_device", None)
    if isinstance(devices, dict) and sub_group_id in devices and devices[sub_group_id] != "cpu":
        return "optimizer_step"  # partial offload: this sub-group stays on the GPU
    return "cpu_optimizer_step"


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


_WRAPPERS = {
    (ENGINE_MODULE, "forward"): _wrap_engine_forward,
    (ENGINE_MODULE, "backward"): _wrap_engine_backward,
    (ENGINE_MODULE, "step"): _wrap_engine_step,
    (STAGE3_MODULE, "partition_grads"): lambda f: _wrap_simple(
        f, lambda self, *a: "grad_copy_to_host" if getattr(self, "offload_optimizer", False) else None),
    (STAGE3_MODULE, "_get_norm_groups"): lambda f: _wrap_simple(f, lambda self, *a: "grad_norm"),
    (STAGE3_MODULE, "_optimizer_step"): lambda f: _wrap_simple(f, _stage3_step_name),
    (STAGE3_MODULE, "_reassign_or_swap_out_partitioned_parameters"): lambda f: _wrap_simple(
        f, lambda self, *a: "param_copy_back"),
    (STAGE12_MODULE, "step"): _stage12_step_wrapper,
    (STAGE12_MODULE, "copy_grads_in_partition"): lambda f: _wrap_simple(
        f, lambda self, *a: "grad_copy_to_host" if getattr(self, "cpu_offload", False) else None),
    (STAGE12_MODULE, "scaled_global_norm"): lambda f: _wrap_simple(f, lambda self, *a: "grad_norm"),
    (STAGE12_MODULE, "_optimizer_step"): _stage12_optimizer_step_wrapper,
    (STAGE12_MODULE, "_release_preflattened_grad_buffers"): _stage12_release_wrapper,
}


def patch_module(module_name: str, module) -> list[str]:
    """Wrap the hook points of one DeepSpeed module; returns the ``Class.method`` names wrapped.

    Missing classes or methods are warnings (on stderr and in :func:`report`), never errors.
    Wrapping twice is a no-op.
    """
    class_name, methods = HOOK_POINTS[module_name]
    cls = getattr(module, class_name, None)
    wrapped: list[str] = []
    version = _deepspeed_version()
    if cls is None:
        _warn(f"DeepSpeed {version} has no {module_name}.{class_name}; its ranges will be missing")
        _state.report["missing"].append(f"{class_name}")
        return wrapped
    for method in methods:
        qualified = f"{class_name}.{method}"
        orig = cls.__dict__.get(method)
        if orig is None or not callable(orig):
            _warn(f"DeepSpeed {version} has no {qualified}; the range it marks will be missing")
            _state.report["missing"].append(qualified)
            continue
        if getattr(orig, _WRAPPED_FLAG, False):
            continue
        new = _WRAPPERS[(module_name, method)](orig)
        setattr(new, _WRAPPED_FLAG, True)
        setattr(cls, method, new)
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
    """Meta path finder that intercepts only the DeepSpeed modules in :data:`HOOK_POINTS`."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in HOOK_POINTS:
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
    for name in HOOK_POINTS:
        module = sys.modules.get(name)
        if module is not None:
            _safe_patch(name, module)
    sys.meta_path.insert(0, _DeepSpeedFinder())
