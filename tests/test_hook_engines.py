"""The capture hook on every offload engine of DeepSpeed 0.19.8 (issue 15 items 1-3).

Fake optimizer and engine classes built like DeepSpeed's (same method names and call order,
read from the installed source) give exact range trees; the coverage check is fed subclasses
that override phase methods with and without wrappers; the real DeepSpeed classes are checked
in a subprocess (every override of SuperOffload and ZenFlow wrapped, nothing reported
missing); the real SuperOffload and ZenFlow CPU optimizer workers run on the CPU in spawned
processes and their ``cpu_optimizer_step`` ranges are read from the hook's per-process log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from hook_recorder import HOOK_DIR, ROOT, TRAINING_PYTHONPATH, Recorder  # tests/ is on sys.path (conftest)

from tracekit.capture.hook import _tracekit_hook as hook


@pytest.fixture
def rec():
    r = Recorder()
    hook.set_emitter(r)
    saved = (list(hook._state.report["missing"]), list(hook._state.report["warnings"]),
             hook._state.current_iteration, hook._state.channel, hook._state.worker)
    yield r
    hook.set_emitter(hook.NvtxEmitter())
    (hook._state.report["missing"], hook._state.report["warnings"], hook._state.current_iteration,
     hook._state.channel, hook._state.worker) = saved


# --------------------------------------------------------------------------- fake ZeRO-3 family
def stage3_module():
    """A ZeRO-3 optimizer with DeepSpeed's phase methods and the call order of its step()."""

    class DeepSpeedZeroOptimizer_Stage3:
        offload_optimizer = True
        subgroup_to_device = {0: "cpu", 1: "cpu"}
        dtype = "bf16"

        def step(self):
            self.check_overflow()
            self._get_norm_groups()
            for sg in (0, 1):
                self.unscale_and_clip_grads(sg, 1.0)
                self._optimizer_step(sg)
                self._reassign_or_swap_out_partitioned_parameters(sg)

        def partition_grads(self, params, grads):
            pass

        def _get_norm_groups(self):
            return [1.0]

        def _optimizer_step(self, sub_group_id):
            pass

        def _reassign_or_swap_out_partitioned_parameters(self, sub_group_id):
            pass

        def unscale_and_clip_grads(self, sub_group_id, total_norm):
            pass

        def check_overflow(self, partition_gradients=True):
            return self.has_overflow(partition_gradients)

        def has_overflow(self, partition_gradients=True):
            return False

    return types.SimpleNamespace(DeepSpeedZeroOptimizer_Stage3=DeepSpeedZeroOptimizer_Stage3)


def test_stage3_update_has_overflow_and_unscale_ranges(rec):
    mod = stage3_module()
    hook.patch_module(hook.STAGE3_MODULE, mod)
    mod.DeepSpeedZeroOptimizer_Stage3().step()
    # check_overflow calls has_overflow: one overflow_check range, not two nested
    assert rec.tree() == ["overflow_check", "grad_norm",
                          "unscale_clip", "cpu_optimizer_step", "param_copy_back",
                          "unscale_clip", "cpu_optimizer_step", "param_copy_back"]


def test_coverage_check_names_unwrapped_overrides(rec, capsys):
    mod = stage3_module()
    hook.patch_module(hook.STAGE3_MODULE, mod)
    base = mod.DeepSpeedZeroOptimizer_Stage3

    class MyOffloadOptimizer(base):  # overrides two phase methods, like SuperOffload does
        def partition_grads(self, params, grads):
            pass

        def _reassign_or_swap_out_partitioned_parameters(self, sub_group_id):
            pass

        def helper(self):  # not a phase method of the base: not reported
            pass

    class Deeper(MyOffloadOptimizer):  # inherits the overrides: reported under their owner
        pass

    missing = hook.check_coverage(Deeper())
    assert missing == ["MyOffloadOptimizer.partition_grads",
                       "MyOffloadOptimizer._reassign_or_swap_out_partitioned_parameters"]
    assert set(missing) <= set(hook.report()["missing"])
    err = capsys.readouterr().err
    assert ("MyOffloadOptimizer.partition_grads overrides a phase method of "
            "DeepSpeedZeroOptimizer_Stage3 without a tracekit wrapper") in err
    assert hook.check_coverage(base()) == []  # the base itself is covered


def test_coverage_check_sees_per_instance_bindings(rec):
    mod = stage3_module()
    hook.patch_module(hook.STAGE3_MODULE, mod)
    opt = mod.DeepSpeedZeroOptimizer_Stage3()
    calls = []
    # ZeRO-3 ZenFlow with overlap_step binds these per instance (lambdas over module functions)
    opt.step = lambda closure=None: calls.append("step") or opt.wait_last_update_and_copy(set())
    opt.partition_grads = lambda params, grads: calls.append("partition_grads")
    opt.wait_last_update_and_copy = lambda timer_names: opt.zf_op.zenflow_adam_wait(0, 60)
    opt.zf_op = types.SimpleNamespace(zenflow_adam_wait=lambda ptr, t: calls.append("wait") or True,
                                      zenflow_adam_submit=lambda *a: calls.append("submit"))
    assert hook.check_coverage(opt) == [
        "DeepSpeedZeroOptimizer_Stage3.step (bound per instance)",
        "DeepSpeedZeroOptimizer_Stage3.partition_grads (bound per instance)"]
    wrapped = hook.instrument_instance(opt)
    assert sorted(wrapped) == sorted(f"DeepSpeedZeroOptimizer_Stage3.{n} (instance)" for n in
                                     ("step", "partition_grads", "wait_last_update_and_copy"))
    assert hook.check_coverage(opt) == []
    opt.partition_grads([], [])
    opt.step()
    assert calls == ["partition_grads", "step", "wait"]
    assert rec.tree() == ["grad_copy_to_host", "param_copy_back", "  cpu_update_wait"]
    assert opt.zf_op.zenflow_adam_submit is not None  # other attributes of the op still reachable
    assert hook.instrument_instance(opt) == []  # idempotent


# --------------------------------------------------------------------------- fake SuperOffload
def superoffload_module(base):
    """SuperOffloadOptimizer_Stage3's overrides in 0.19.8's call order (CPU sub-groups 0, 1
    were stepped by the worker during backward; sub-group 2 stays on the GPU)."""

    class SuperOffloadOptimizer_Stage3(base):
        subgroup_to_device = {0: "cpu", 1: "cpu", 2: "cuda:0"}

        def __init__(self):
            self.submitted = []

        def partition_grads(self, params, grads):
            pass

        def step(self, closure=None):
            self._wait_for_async_operations()
            self._overflow_check_and_loss_scale_update()
            self._get_norm_groups()
            for sg in (0, 1, 2):
                self.unscale_and_clip_grads(sg, 1.0)
                self._optimizer_step(sg)
                self._reassign_or_swap_out_partitioned_parameters(sg)

        def _overflow_check_and_loss_scale_update(self):
            self.check_overflow()

        def _optimizer_step(self, sub_group_id):
            pass

        def _reassign_or_swap_out_partitioned_parameters(self, sub_group_id):
            pass

        def _wait_for_async_operations(self, timeout_seconds=60):
            pass

        def _wait_for_single_async_result(self, event_type, timeout_seconds=60):
            pass

    return types.SimpleNamespace(SuperOffloadOptimizer_Stage3=SuperOffloadOptimizer_Stage3)


def test_superoffload_overrides_get_ranges_and_pass_coverage(rec):
    base_mod = stage3_module()
    hook.patch_module(hook.STAGE3_MODULE, base_mod)
    opt_cls = superoffload_module(base_mod.DeepSpeedZeroOptimizer_Stage3).SuperOffloadOptimizer_Stage3
    opt = opt_cls()
    assert len(hook.check_coverage(opt)) == 4  # before its module is patched: all four named
    hook._state.report["missing"].clear()
    names = hook.patch_module(hook.SUPEROFFLOAD_MODULE, types.SimpleNamespace(
        SuperOffloadOptimizer_Stage3=opt_cls))
    assert len(names) == 6
    assert hook.check_coverage(opt) == []
    opt.partition_grads([], [])
    opt.step()
    assert rec.tree() == ["grad_copy_to_host", "cpu_update_wait", "overflow_check", "grad_norm",
                          "unscale_clip", "param_copy_back",  # sg 0: stepped by the worker
                          "unscale_clip", "param_copy_back",  # sg 1
                          "unscale_clip", "optimizer_step", "param_copy_back"]  # sg 2 on the GPU


# --------------------------------------------------------------------------- fake ZenFlow 1/2
def stage12_and_zenflow_modules():
    class DeepSpeedZeroOptimizer:
        cpu_offload = True
        dtype = "bf16"

        def step(self):
            self.scaled_global_norm()
            self._optimizer_step(0)
            self._release_preflattened_grad_buffers(0)

        def copy_grads_in_partition(self, param):
            pass

        def scaled_global_norm(self):
            return 1.0

        def _optimizer_step(self, group_no):
            if hasattr(self, "zenflow_cpu_optimizer_step"):
                self.zenflow_cpu_optimizer_step(group_no)

        def _release_preflattened_grad_buffers(self, i=None):
            pass

        def unscale_and_clip_grads(self, grad_groups_flat, total_norm):
            pass

        def check_overflow(self, partition_gradients=True):
            return self.has_overflow(partition_gradients)

        def has_overflow(self, partition_gradients=True):
            return False

    class ZenFlowZeroOptimizer(DeepSpeedZeroOptimizer):
        def selective_optimizer_step(self, closure=None):
            pass

    class ZenFlowZeroOptimizerSequential(ZenFlowZeroOptimizer):
        def zenflow_cpu_optimizer_step(self, group_no):
            pass

    class ZenFlowZeroOptimizerParallel(ZenFlowZeroOptimizer):
        micro_step = 0

        def step(self, closure=None):  # 0.19.8: overflow, norm, wait+copy, submit
            self.check_overflow()
            norm = self.scaled_global_norm()
            self.wait_last_update_and_copy()
            self.zenflow_cpu_optimizer_step(0, norm)

        def wait_last_update_and_copy(self):
            self._wait_for_optimizer_process()

        def _wait_for_optimizer_process(self):
            pass

        def zenflow_cpu_optimizer_step(self, now_state, scaled_global_grad_norm):
            self.unscale_and_clip_grads([None], scaled_global_grad_norm)

    stage12 = types.SimpleNamespace(DeepSpeedZeroOptimizer=DeepSpeedZeroOptimizer)
    zenflow = types.SimpleNamespace(ZenFlowZeroOptimizer=ZenFlowZeroOptimizer,
                                    ZenFlowZeroOptimizerSequential=ZenFlowZeroOptimizerSequential,
                                    ZenFlowZeroOptimizerParallel=ZenFlowZeroOptimizerParallel)
    return stage12, zenflow


class ChannelStub:
    def __init__(self):
        self.values = []

    def write(self, value):
        self.values.append(value)


def test_zenflow_parallel_and_sequential(rec):
    stage12, zenflow = stage12_and_zenflow_modules()
    hook.patch_module(hook.STAGE12_MODULE, stage12)
    assert hook.check_coverage(zenflow.ZenFlowZeroOptimizerParallel()) == [
        "ZenFlowZeroOptimizerParallel.step"]
    hook._state.report["missing"].clear()
    hook.patch_module(hook.ZENFLOW12_MODULE, zenflow)
    par = zenflow.ZenFlowZeroOptimizerParallel()
    assert hook.check_coverage(par) == []
    hook._state.channel = ChannelStub()
    hook._state.current_iteration = 7
    par.step()
    par.selective_optimizer_step()
    assert hook._state.channel.values == [7]  # the iteration handed to the worker at submit
    assert rec.tree() == ["overflow_check", "grad_norm", "param_copy_to_device", "  cpu_update_wait",
                          "cpu_optimizer_submit", "  unscale_clip", "selective_optimizer_step"]
    rec.events.clear()
    seq = zenflow.ZenFlowZeroOptimizerSequential()
    assert hook.check_coverage(seq) == []
    seq.step()
    assert rec.tree() == ["grad_norm", "cpu_optimizer_step", "param_copy_to_device"]


# --------------------------------------------------------------------------- pipeline, direct backward
def engine_modules(gas=2):
    class DeepSpeedEngine:
        training = True

        def __init__(self):
            self.global_rank, self.local_rank, self.world_size = 3, 1, 8
            self.global_steps = 0
            self.micro_steps = 0
            self._running_engine_backward = False
            self.optimizer = None

        def is_gradient_accumulation_boundary(self):
            return (self.micro_steps + 1) % gas == 0

        def forward(self, x):
            return x

        def backward(self, loss):
            self._running_engine_backward = True
            self._backward_prologue()
            self._backward_epilogue()
            self._running_engine_backward = False

        def step(self):
            pass

        def _backward_prologue(self):
            pass

        def _backward_epilogue(self):
            pass

        def _take_model_step(self):
            self.global_steps += 1

    class PipelineEngine(DeepSpeedEngine):
        def __init__(self, last_stage):
            super().__init__()
            self.last = last_stage

        def is_last_stage(self):
            return self.last

        def train_batch(self):  # 0.19.8: the schedule's instructions, then the optimizer step
            for _ in range(gas):
                self._exec_forward_pass(0)
                self._exec_backward_pass(0)
                self.micro_steps += 1
            self._exec_optimizer_step()

        def _exec_forward_pass(self, buffer_id):
            super().forward(1.0)

        def _exec_backward_pass(self, buffer_id):
            if self.is_last_stage():
                super().backward(1.0)

        def _exec_optimizer_step(self, lr_kwargs=None):
            self._take_model_step()

    return (types.SimpleNamespace(DeepSpeedEngine=DeepSpeedEngine),
            types.SimpleNamespace(PipelineEngine=PipelineEngine))


def test_pipeline_engine_iterations(rec, monkeypatch):
    monkeypatch.delenv(hook.ENV_CHANNEL, raising=False)
    engine, pipe = engine_modules(gas=2)
    hook.patch_module(hook.ENGINE_MODULE, engine)
    hook.patch_module(hook.PIPE_MODULE, pipe)
    for last in (True, False):
        rec.events.clear()
        e = pipe.PipelineEngine(last_stage=last)
        e.train_batch()
        e.train_batch()
        # the last stage's backward is DeepSpeedEngine.backward (boundary-aware); the other
        # stages' _exec_backward_pass runs autograd itself and gets the pipeline's range
        second = "  backward boundary" if last else "  backward"
        one = ["  forward", "  backward", "  forward", second, "  update"]
        assert rec.tree() == ["rank 3 local_rank 1 world 8", "iteration 0", *one, "iteration 1", *one]
    assert hook._state.report["rank"] == 3 and hook._state.report["local_rank"] == 1
    assert hook._state.report["world_size"] == 8


def test_direct_loss_backward_gets_a_range(rec, monkeypatch):
    monkeypatch.delenv(hook.ENV_CHANNEL, raising=False)
    engine, _ = engine_modules(gas=1)
    hook.patch_module(hook.ENGINE_MODULE, engine)
    e = engine.DeepSpeedEngine()
    e.forward(1.0)
    e._backward_prologue()  # what DeepSpeed's output hook calls when loss.backward() starts
    e._backward_epilogue()  # ... and its post-backward callback at the end
    e.backward(1.0)  # engine.backward: its own range only, the prologue adds none
    e.step()
    assert rec.tree() == ["rank 3 local_rank 1 world 8", "iteration 0", "  forward",
                          "  backward boundary", "  backward boundary", "  update"]


def test_iteration_channel_between_processes(tmp_path, monkeypatch):
    monkeypatch.delenv(hook.ENV_CHANNEL, raising=False)
    channel = hook._IterationChannel.create()
    try:
        owner, _, path = os.environ[hook.ENV_CHANNEL].partition(":")
        assert int(owner) == os.getpid() and os.path.exists(path)
        channel.write(41)
        code = ("import _tracekit_hook as h; c = h._IterationChannel.open_parent(); "
                "print(c.read() if c else None)")
        env = dict(os.environ, PYTHONPATH=str(HOOK_DIR))
        env.pop("TRACEKIT_HOOK", None)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.stdout.split() == ["41"], done.stderr
        # a grandchild (parent is not the owner) does not read it
        nested = subprocess.run([sys.executable, "-c",
                                 f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, "
                                 f"'-c', {code!r}]).returncode)"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert nested.stdout.split() == ["None"], nested.stderr
    finally:
        hook._unlink_quietly(channel.path)
        monkeypatch.delenv(hook.ENV_CHANNEL, raising=False)


# --------------------------------------------------------------------------- the real DeepSpeed
def run_script(tmp_path, body: str, timeout=900, **env_extra) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=TRAINING_PYTHONPATH, TRACEKIT_HOOK="1", DS_ACCELERATOR="cpu",
               **env_extra)
    env.pop(hook.ENV_CHANNEL, None)
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)


@pytest.mark.deepspeed
def test_real_offload_classes_are_covered(tmp_path):
    """Every optimizer class 0.19.8 can build for offload: its phase overrides are wrapped."""
    pytest.importorskip("deepspeed")
    done = run_script(tmp_path, """
        import json
        import deepspeed, _tracekit_hook as h
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
        from deepspeed.runtime.superoffload.superoffload_stage3 import SuperOffloadOptimizer_Stage3
        from deepspeed.runtime.zenflow import zenflow_stage_1_and_2 as zf
        from deepspeed.runtime.pipe.engine import PipelineEngine
        out = {}
        for cls in (DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3, SuperOffloadOptimizer_Stage3,
                    zf.ZenFlowZeroOptimizerSequential, zf.ZenFlowZeroOptimizerParallel):
            out[cls.__name__] = h.check_coverage(object.__new__(cls))
        # what the coverage check would name if the hook did not know SuperOffload
        so = SuperOffloadOptimizer_Stage3
        bare = type("Bare", (DeepSpeedZeroOptimizer_Stage3,),
                    {n: so.__dict__[n].__wrapped__ for n in ("step", "partition_grads")})
        out["bare"] = h.check_coverage(object.__new__(bare))
        out["flags"] = {f"{c.__name__}.{m}": bool(getattr(c.__dict__[m], "__tracekit_wrapped__", False))
                        for c, ms in ((so, ["step", "partition_grads", "_optimizer_step",
                                            "_reassign_or_swap_out_partitioned_parameters",
                                            "_wait_for_async_operations"]),
                                      (zf.ZenFlowZeroOptimizerParallel,
                                       ["step", "wait_last_update_and_copy", "_wait_for_optimizer_process",
                                        "zenflow_cpu_optimizer_step"]),
                                      (PipelineEngine, ["train_batch", "_exec_optimizer_step"]))
                        for m in ms}
        print(json.dumps(out))
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3",
                 "SuperOffloadOptimizer_Stage3", "ZenFlowZeroOptimizerSequential",
                 "ZenFlowZeroOptimizerParallel"):
        assert out[name] == [], name
    assert out["bare"] == ["Bare.step", "Bare.partition_grads"]
    assert all(out["flags"].values()), out["flags"]


SUPEROFFLOAD_WORKER = """
    import os, torch
    import _tracekit_hook as h
    from deepspeed.runtime.superoffload.superoffload_utils import SuperOffloadCPUOptimizer, ResultKeys

    if __name__ == "__main__":
        h._state.channel = h._IterationChannel.create()  # what the engine's __init__ does
        h._state.current_iteration = 3
        cfg = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False}
        opt = SuperOffloadCPUOptimizer([cfg], cpuadam_cores_perc=0.5, max_grad_numel=64, pin_memory=False)
        torch.manual_seed(0)
        p = torch.randn(64).share_memory_()
        g = torch.randn(64).share_memory_()
        ref = torch.nn.Parameter(p.clone())
        ref.grad = g.clone()
        torch.optim.AdamW([ref], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0).step()
        opt.async_step(0, 2, p, g, lr=1e-2)
        while (res := opt.get_result()) is None:
            pass
        diff = (res[ResultKeys.UPDATED_PARAM] - ref.detach()).abs().max().item()
        opt.close()
        print("maxdiff", diff, "worker", opt.cpuadam_process.pid)
"""


def _log_lines(folder: Path, pid: int) -> list[str]:
    path = folder / f"{pid}.log"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.deepspeed
def test_real_superoffload_worker_emits_cpu_optimizer_step(tmp_path):
    """SuperOffload's real worker process (spawned, CPU Adam) marks the sub-group it updates."""
    pytest.importorskip("deepspeed")
    logs = tmp_path / "logs"
    logs.mkdir()
    done = run_script(tmp_path, SUPEROFFLOAD_WORKER, TRACEKIT_HOOK_LOG=str(logs / "{pid}.log"),
                      TRACEKIT_HOOK_REPORT_DIR=str(logs))
    if "CPUAdamBuilder" in done.stderr and done.returncode != 0:
        pytest.skip("DeepSpeed's CPU Adam op cannot be built here")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    words = done.stdout.split()
    diff, worker = float(words[words.index("maxdiff") + 1]), int(words[words.index("worker") + 1])
    assert diff < 1e-5  # the worker's update equals torch's AdamW step: it really ran
    lines = [line.split(" ", 2) for line in _log_lines(logs, worker)]
    assert [(w[0], w[2] if w[0] == "push" else None) for w in lines] == [
        ("push", "cpu_optimizer_step it=3 sg=2"), ("pop", None)]
    report = json.loads((logs / f"hook-{worker}.json").read_text())
    assert report["role"] == "superoffload cpu optimizer worker"


ZENFLOW_WORKER = """
    import os, sys, torch
    import _tracekit_hook as h
    from multiprocessing import get_context
    from deepspeed.ops.op_builder import CPUAdamBuilder
    from deepspeed.runtime.zenflow import zenflow_utils

    if __name__ == "__main__":
        h._state.channel = h._IterationChannel.create()  # what the engine's __init__ does
        op = CPUAdamBuilder().load()
        torch.manual_seed(0)
        param = torch.randn(256).share_memory_()
        grads = [torch.randn(256).share_memory_(), torch.randn(256).share_memory_()]
        stale = torch.zeros(256).share_memory_()
        ctrl = torch.zeros(op.zenflow_adam_ctrl_size(), dtype=torch.uint8).share_memory_()
        op.zenflow_adam_ctrl_init(ctrl.data_ptr(), 1)
        ctx = get_context("spawn")
        ready = ctx.Event()
        proc = ctx.Process(target=zenflow_utils.zenflow_optimizer_process,
                           args=([(param, grads[0], grads[1], stale)], ctrl, ready, [0], True), daemon=True)
        proc.start()
        assert ready.wait(timeout=300), "worker not ready"
        for step, it in ((1, 5), (2, 6)):
            h._state.channel.write(it)
            op.zenflow_adam_submit(ctrl.data_ptr(), step % 2, step, [1e-2], [0.9], [0.999], [1e-8], [0.0], [1])
            assert op.zenflow_adam_wait(ctrl.data_ptr(), 120), "no completion"
        op.zenflow_adam_ctrl_exit(ctrl.data_ptr())
        proc.join(60)
        torch.save({"param": param, "stale": stale}, sys.argv[1])
        print("exitcode", proc.exitcode, "worker", proc.pid)
"""


@pytest.mark.deepspeed
def test_real_zenflow_worker_relay(tmp_path):
    """ZenFlow's real native worker loop, relayed: the same numbers as unrelayed, plus ranges."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    results = {}
    for relay in ("1", "0"):
        logs = tmp_path / f"logs{relay}"
        logs.mkdir()
        script_dir = tmp_path / f"run{relay}"
        script_dir.mkdir()
        (script_dir / "script.py").write_text(textwrap.dedent(ZENFLOW_WORKER))
        env = dict(os.environ, PYTHONPATH=TRAINING_PYTHONPATH, TRACEKIT_HOOK="1", DS_ACCELERATOR="cpu",
                   TRACEKIT_HOOK_LOG=str(logs / "{pid}.log"), TRACEKIT_ZENFLOW_RELAY=relay)
        env.pop(hook.ENV_CHANNEL, None)
        out = script_dir / "out.pt"
        done = subprocess.run([sys.executable, str(script_dir / "script.py"), str(out)], env=env,
                              capture_output=True, text=True, timeout=900, cwd=script_dir)
        if "CPUAdamBuilder" in done.stderr and done.returncode != 0:
            pytest.skip("DeepSpeed's CPU Adam op cannot be built here")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        words = done.stdout.split()
        assert words[words.index("exitcode") + 1] == "0"  # the relayed worker exits cleanly
        worker = int(words[words.index("worker") + 1])
        results[relay] = (torch.load(out), _log_lines(logs, worker))
    relayed, plain = results["1"], results["0"]
    for key in ("param", "stale"):
        assert torch.equal(relayed[0][key], plain[0][key]), key
    start = torch.manual_seed(0) and torch.randn(256)
    assert not torch.equal(relayed[0]["param"], start)  # the steps did update the parameters
    pushes = [line.split(" ", 2)[2] for line in relayed[1] if line.startswith("push")]
    assert pushes == ["cpu_optimizer_step it=5 sg=all", "cpu_optimizer_step it=6 sg=all"]
    assert sum(line.startswith("pop") for line in relayed[1]) == 2
    assert [line for line in plain[1] if line.startswith("push")] == []


def _tree(path: Path, allow_open=False) -> list[str]:
    out, depth = [], 0
    for line in path.read_text().splitlines():
        parts = line.split(" ", 2)
        if parts[0] == "push":
            out.append("  " * depth + parts[2])
            depth += 1
        else:
            depth -= 1
    assert depth == 0 or (allow_open and depth == 1), f"unbalanced ranges in {path}"
    return out


@pytest.mark.deepspeed
@pytest.mark.parametrize("overlap_step", [True, False])
def test_real_zenflow_training_on_cpu(tmp_path, overlap_step):
    """examples/train_llama.py (tiny) with ZenFlow on DeepSpeed's CPU accelerator, using
    examples/ds_zenflow.json with CPU-friendly changes (no pinning, update_interval 2)."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    import socket

    cfg = json.loads((ROOT / "examples" / "ds_zenflow.json").read_text())
    zero = cfg["zero_optimization"]
    zero["offload_optimizer"]["pin_memory"] = False
    zero["overlap_comm"] = False
    zero["zenflow"].update(update_interval=2, select_interval=2, overlap_step=overlap_step)
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    logs = tmp_path / "logs"
    logs.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=TRAINING_PYTHONPATH, TRACEKIT_HOOK="1", DS_ACCELERATOR="cpu",
               TRACEKIT_HOOK_LOG=str(logs / "{pid}.log"), TRACEKIT_HOOK_REPORT_DIR=str(logs),
               RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    env.pop(hook.ENV_CHANNEL, None)
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train_llama.py"),
                           "--deepspeed_config", str(tmp_path / "ds.json"), "--steps", "3",
                           "--hidden", "64", "--layers", "2", "--heads", "2", "--intermediate", "128",
                           "--vocab", "256", "--seq", "16"],
                          env=env, capture_output=True, text=True, timeout=1500, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "step 2 loss" in done.stdout
    # a worker may be stopped inside its last range: DeepSpeed does not wait for the last
    # overlapped update before the training exits (the daemon worker is terminated)
    trees = {int(p.stem): _tree(p, allow_open=True) for p in logs.glob("*.log") if p.stat().st_size}
    (main_pid,) = [pid for pid, t in trees.items() if t and t[0].startswith("rank ")]
    main = [x for x in trees[main_pid] if "grad_copy_to_host" not in x]
    # 2 layers * 9 tensors + embeddings, final norm, head: 21 per backward, 2 backwards, 3 steps
    assert sum("grad_copy_to_host" in x for x in trees[main_pid]) == 21 * 2 * 3
    head = ["  forward", "  backward", "  step (no update)", "  forward", "  backward boundary",
            "  update"]
    if overlap_step:
        # 0.19.8: step 0 starts the worker, step 1 skips the wait (first round), step 2 waits
        def update(wait):
            return ["    grad_norm", "    param_copy_to_device", *(["      cpu_update_wait"] if wait else []),
                    "    cpu_optimizer_submit", "      unscale_clip", "    selective_optimizer_step"]
        its = [update(False), update(False), update(True)]
    else:
        its = [["    overflow_check", "    grad_norm", "    unscale_clip", "    cpu_optimizer_step",
                "    param_copy_to_device", "    selective_optimizer_step"]] * 3
    expected = ["rank 0 local_rank 0 world 1"]
    for n, sub in enumerate(its):
        expected += [f"iteration {n}", *head, *sub]
    assert main == expected
    workers = {pid: t for pid, t in trees.items() if pid != main_pid and t}
    reports = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in logs.glob("hook-*.json")}
    assert reports[main_pid]["missing"] == [] and reports[main_pid]["warnings"] == []
    assert reports[main_pid]["optimizer_class"].endswith(
        "ZenFlowZeroOptimizerParallel" if overlap_step else "ZenFlowZeroOptimizerSequential")
    if overlap_step:
        (ranges,) = workers.values()
        # in order, one per update; step 2's update waited for step 0's (``done`` counts, and
        # step 1 skipped its wait); the later ones may be cut by the exit
        assert ranges in ([f"cpu_optimizer_step it={n} sg=all" for n in range(k)] for k in (1, 2, 3))
        (worker,) = workers
        assert reports[worker]["role"] == "zenflow cpu optimizer worker"
        assert reports[worker]["parent_pid"] == main_pid
    else:
        assert workers == {}


@pytest.mark.deepspeed
def test_real_zero3_offload_param_example_on_cpu(tmp_path):
    """examples/ds_zero3_offload_param.json (unpinned) trains on the CPU with the ZeRO-3 tree:
    parameters offloaded to CPU memory (not NVMe) use no swapper, so no swap ranges."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    import socket

    cfg = json.loads((ROOT / "examples" / "ds_zero3_offload_param.json").read_text())
    zero = cfg["zero_optimization"]
    zero["offload_optimizer"]["pin_memory"] = zero["offload_param"]["pin_memory"] = False
    zero["overlap_comm"] = False
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    log = tmp_path / "hook.log"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=TRAINING_PYTHONPATH, TRACEKIT_HOOK="1", DS_ACCELERATOR="cpu",
               TRACEKIT_HOOK_LOG=str(log), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.pop(hook.ENV_CHANNEL, None)
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train_llama.py"),
                           "--deepspeed_config", str(tmp_path / "ds.json"), "--steps", "2",
                           "--hidden", "64", "--layers", "2", "--heads", "2", "--intermediate", "128",
                           "--vocab", "256", "--seq", "16"],
                          env=env, capture_output=True, text=True, timeout=1500, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    one = ["  forward", "  backward", "    grad_copy_to_host", "  step (no update)", "  forward",
           "  backward boundary", "    grad_copy_to_host", "  update", "    grad_norm",
           "    unscale_clip", "    cpu_optimizer_step", "    param_copy_back"]
    assert _tree(log) == ["rank 0 local_rank 0 world 1", "iteration 0", *one, "iteration 1", *one]


def test_nvme_swapper_sub_phases(rec):
    class PartitionedOptimizerSwapper:
        def swap_in_optimizer_state(self, parameter, async_parameter=None):
            pass

        def swap_out_optimizer_state(self, parameter, async_swap=False):
            pass

        def swap_out_gradients(self, parameter, gradient_offsets, gradient_tensors):
            pass

    class AsyncPartitionedParameterSwapper:
        def swap_in(self, params, async_op=True, swap_in_buffers=None):
            pass

        def swap_out_and_release(self, params, async_op=False, force_buffer_release=False):
            pass

        def swap_out_partitioned_params(self, dst_fp16_params, src_fp32_params):
            pass

        def synchronize_reads(self):
            pass

        def synchronize_writes(self):
            pass

    assert len(hook.patch_module(hook.OPT_SWAPPER_MODULE, types.SimpleNamespace(
        PartitionedOptimizerSwapper=PartitionedOptimizerSwapper))) == 3
    assert len(hook.patch_module(hook.PARAM_SWAPPER_MODULE, types.SimpleNamespace(
        AsyncPartitionedParameterSwapper=AsyncPartitionedParameterSwapper))) == 5
    opt, par = PartitionedOptimizerSwapper(), AsyncPartitionedParameterSwapper()
    # ZeRO-3's _prepare_sub_group / _release_sub_group around one sub-group's CPU step
    opt.swap_in_optimizer_state(None)
    opt.swap_out_optimizer_state(None)
    opt.swap_out_gradients(None, [], [])
    par.swap_in([])
    par.synchronize_reads()
    par.swap_out_and_release([])
    par.swap_out_partitioned_params([], [])
    par.synchronize_writes()
    assert rec.tree() == ["swap_in", "swap_out", "grad_swap_out", "param_swap_in", "param_swap_in_wait",
                          "param_swap_out", "param_swap_out", "param_swap_out_wait"]


def test_zenflow_relay_refuses_an_unknown_control_block():
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="control block of 100 bytes"):
        hook._ZenFlowRelay(torch.zeros(100, dtype=torch.uint8))
    with pytest.raises(RuntimeError):
        hook._ZenFlowRelay(torch.zeros(hook._ZenFlowRelay.SIZE, dtype=torch.float32))
