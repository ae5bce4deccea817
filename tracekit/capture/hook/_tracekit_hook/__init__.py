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
This package must import nothing but the standard library at import time. It is loaded two
ways: as the top-level ``_tracekit_hook`` in the training processes (``sitecustomize`` puts
its own folder, ``tracekit/capture/hook``, on ``sys.path``), and as ``tracekit.capture.hook._tracekit_hook`` by
tracekit and its tests; its modules therefore import each other relatively. The names below
are re-exported so that both keep one flat namespace:

- ``core``: constants, hook points, range emitters and the process-wide state of the hook.
- ``channel``: the iteration channel: a rank tells its CPU optimizer worker processes the iteration.
- ``zero``: wrappers of the ZeRO optimizers' phase methods (stage 1/2, stage 3, SuperOffload, ZenFlow).
- ``workers``: wrappers of the CPU optimizer workers' entry points (SuperOffload, ZenFlow).
- ``instance``: per-instance hooks (methods bound on the optimizer object) and the coverage check.
- ``engines``: wrappers of DeepSpeedEngine and PipelineEngine: iterations, forward, backward, step.
- ``install``: the wrapper tables, patching a DeepSpeed module, and the import hook that does it.
"""

from .channel import ENV_CHANNEL, _IterationChannel, _unlink_quietly
from .core import (
    CPU_ADAM_MODULE,
    DOMAIN,
    ENGINE_MODULE,
    ENV_ENABLE,
    ENV_ITERATIONS,
    ENV_LOG,
    ENV_REPORT_DIR,
    FUNCTION_HOOK_POINTS,
    HOOK_POINTS,
    OPT_SWAPPER_MODULE,
    PARAM_SWAPPER_MODULE,
    PIPE_MODULE,
    PIPE_SWAPPER_MODULE,
    STAGE3_MODULE,
    STAGE12_MODULE,
    SUPEROFFLOAD_MODULE,
    SUPEROFFLOAD_UTILS_MODULE,
    ZENFLOW12_MODULE,
    ZENFLOW_UTILS_MODULE,
    CudaProfilerControl,
    LogEmitter,
    NvtxEmitter,
    _state,
    _warn,
    parse_iterations,
    report,
    set_emitter,
    set_iteration_window,
    set_profiler_control,
)
from .install import install, patch_module
from .instance import check_coverage, instrument_instance
from .workers import _ZenFlowRelay
