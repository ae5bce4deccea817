"""The NVTX phase hook: which ranges it opens, where, and on which DeepSpeed functions.

Three levels: hand-made engine classes (exact range sequences, capture window); the
installed DeepSpeed (every hook point exists and gets wrapped); and a real DeepSpeed training
on the CPU (ZeRO-2 and ZeRO-3 with CPU offload), whose ranges are read from the hook's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hook_recorder import HOOK_DIR, ROOT, TRAINING_PYTHONPATH, Recorder  # tests/ is on sys.path (conftest)

from tracekit.capture.hook import _tracekit_hook as hook


class Profiler:
    def __init__(self, log):
        self.log = log

    def start(self):
        self.log.append(("push", "<profiler start>"))
        self.log.append(("pop",))

    def stop(self):
        self.log.append(("push", "<profiler stop>"))
        self.log.append(("pop",))


RANK = "rank 0 local_rank 0 world 1"  # the mark the engine's __init__ wrapper emits


def fake_engine_module(gas=2, fail_forward_at=None):
    class DeepSpeedEngine:
        training = True

        def __init__(self):
            self.global_rank, self.local_rank, self.world_size = 0, 0, 1
            self.global_steps = 0
            self.micro_steps = 0
            self.calls = 0

        def is_gradient_accumulation_boundary(self):
            return (self.micro_steps + 1) % gas == 0

        def forward(self, x):
            self.calls += 1
            if fail_forward_at is not None and self.calls == fail_forward_at:
                raise RuntimeError("boom")
            return x

        def backward(self, loss):
            return loss

        def step(self):
            if self.is_gradient_accumulation_boundary():
                self.global_steps += 1
            self.micro_steps += 1

    return types.SimpleNamespace(DeepSpeedEngine=DeepSpeedEngine)


@pytest.fixture
def rec():
    r = Recorder()
    hook.set_emitter(r)
    hook.set_profiler_control(Profiler(r.events))
    hook.set_iteration_window(None)
    yield r
    hook.set_emitter(hook.NvtxEmitter())
    hook.set_profiler_control(hook.CudaProfilerControl())
    hook.set_iteration_window(None)


def train(engine, steps, gas):
    for _ in range(steps):
        for _ in range(gas):
            engine.backward(engine.forward(1.0))
            engine.step()


def test_engine_sequence_gas2(rec):
    mod = fake_engine_module(gas=2)
    assert hook.patch_module(hook.ENGINE_MODULE, mod) == [
        "DeepSpeedEngine.__init__", "DeepSpeedEngine.forward", "DeepSpeedEngine.backward",
        "DeepSpeedEngine.step"]
    train(mod.DeepSpeedEngine(), steps=2, gas=2)
    one = ["  forward", "  backward", "  step (no update)", "  forward", "  backward boundary",
           "  update"]
    assert rec.tree() == [RANK, "iteration 0", *one, "iteration 1", *one]


def test_engine_sequence_gas1_and_eval_forward(rec):
    mod = fake_engine_module(gas=1)
    hook.patch_module(hook.ENGINE_MODULE, mod)
    e = mod.DeepSpeedEngine()
    e.training = False
    e.forward(0.0)  # evaluation forward: marked, but opens no iteration
    e.training = True
    train(e, steps=2, gas=1)
    assert rec.tree() == [RANK, "forward", "iteration 0", "  forward", "  backward boundary", "  update",
                          "iteration 1", "  forward", "  backward boundary", "  update"]


def test_patch_twice_is_noop(rec):
    mod = fake_engine_module()
    hook.patch_module(hook.ENGINE_MODULE, mod)
    assert hook.patch_module(hook.ENGINE_MODULE, mod) == []
    train(mod.DeepSpeedEngine(), steps=1, gas=2)
    assert rec.tree().count("  forward") == 2


def test_exception_keeps_ranges_balanced(rec):
    mod = fake_engine_module(fail_forward_at=2)
    hook.patch_module(hook.ENGINE_MODULE, mod)
    e = mod.DeepSpeedEngine()
    with pytest.raises(RuntimeError):
        train(e, steps=1, gas=2)
    # iteration 0 is still open (the training died inside it); everything below it closed
    pushes = sum(1 for ev in rec.events if ev[0] == "push")
    pops = sum(1 for ev in rec.events if ev[0] == "pop")
    assert pushes - pops == 1


def test_capture_window_starts_and_stops_profiler(rec):
    mod = fake_engine_module(gas=2)
    hook.patch_module(hook.ENGINE_MODULE, mod)
    hook.set_iteration_window((1, 2))
    train(mod.DeepSpeedEngine(), steps=4, gas=2)
    tops = [t for t in rec.tree() if not t.startswith(" ")]
    assert tops == [RANK, "iteration 0", "<profiler start>", "iteration 1", "iteration 2",
                    "<profiler stop>", "iteration 3"]


def test_parse_iterations():
    assert hook.parse_iterations("2-5") == (2, 5)
    assert hook.parse_iterations("3") == (3, 3)
    for bad in ("5-2", "a-b", "-1", "1-2-3", ""):
        with pytest.raises(ValueError):
            hook.parse_iterations(bad)


def test_missing_hook_points_warn_and_do_not_fail(rec, capsys):
    class DeepSpeedZeroOptimizer:  # an imagined DeepSpeed without most of the methods
        def step(self):
            return "stepped"

    mod = types.SimpleNamespace(DeepSpeedZeroOptimizer=DeepSpeedZeroOptimizer)
    wrapped = hook.patch_module(hook.STAGE12_MODULE, mod)
    assert wrapped == ["DeepSpeedZeroOptimizer.step"]
    err = capsys.readouterr().err
    for name in ("copy_grads_in_partition", "scaled_global_norm", "_optimizer_step",
                 "_release_preflattened_grad_buffers"):
        assert f"DeepSpeedZeroOptimizer.{name}; the range it marks will be missing" in err
    assert DeepSpeedZeroOptimizer().step() == "stepped"
    missing_class = hook.patch_module(hook.STAGE3_MODULE, types.SimpleNamespace())
    assert missing_class == []
    assert "DeepSpeedZeroOptimizer_Stage3" in capsys.readouterr().err


def stage12_module():
    class DeepSpeedZeroOptimizer:
        cpu_offload = True

        def step(self):
            for i in range(2):  # two parameter groups, as DeepSpeed's loop does
                self.scaled_global_norm() if i == 0 else None
                self._optimizer_step(i)
                self._release_preflattened_grad_buffers(i)

        def copy_grads_in_partition(self, param):
            pass

        def scaled_global_norm(self):
            return 1.0

        def _optimizer_step(self, i):
            pass

        def _release_preflattened_grad_buffers(self, i=None):
            pass

    return types.SimpleNamespace(DeepSpeedZeroOptimizer=DeepSpeedZeroOptimizer)


def test_stage12_offload_sub_steps(rec):
    mod = stage12_module()
    hook.patch_module(hook.STAGE12_MODULE, mod)
    opt = mod.DeepSpeedZeroOptimizer()
    opt.copy_grads_in_partition(object())
    opt.step()
    assert rec.tree() == ["grad_copy_to_host", "grad_norm", "cpu_optimizer_step",
                          "param_copy_to_device", "cpu_optimizer_step", "param_copy_to_device"]


def test_stage12_without_offload(rec):
    mod = stage12_module()
    mod.DeepSpeedZeroOptimizer.cpu_offload = False
    hook.patch_module(hook.STAGE12_MODULE, mod)
    opt = mod.DeepSpeedZeroOptimizer()
    opt.copy_grads_in_partition(object())
    opt.step()
    assert rec.tree() == ["grad_norm", "optimizer_step", "optimizer_step"]


def test_stage3_names(rec):
    class DeepSpeedZeroOptimizer_Stage3:
        offload_optimizer = True
        subgroup_to_device = {0: "cpu", 1: "cuda:0"}

        def partition_grads(self, a, b):
            pass

        def _get_norm_groups(self):
            pass

        def _optimizer_step(self, sub_group_id):
            pass

        def _reassign_or_swap_out_partitioned_parameters(self, sub_group_id):
            pass

    mod = types.SimpleNamespace(DeepSpeedZeroOptimizer_Stage3=DeepSpeedZeroOptimizer_Stage3)
    hook.patch_module(hook.STAGE3_MODULE, mod)
    o = DeepSpeedZeroOptimizer_Stage3()
    o.partition_grads([], [])
    o._get_norm_groups()
    o._optimizer_step(0)
    o._optimizer_step(1)  # partial offload: this sub-group is updated on the GPU
    o._reassign_or_swap_out_partitioned_parameters(0)
    assert rec.tree() == ["grad_copy_to_host", "grad_norm", "cpu_optimizer_step", "optimizer_step",
                          "param_copy_back"]


# --------------------------------------------------------------------------- installed DeepSpeed
def run_python(code: str, env_extra: dict, timeout=600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(HOOK_DIR), TRACEKIT_HOOK="1", **env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.deepspeed
def test_installed_deepspeed_has_every_hook_point(tmp_path):
    pytest.importorskip("deepspeed")
    # superoffload and the swappers are imported by DeepSpeed only when configured
    code = ("import deepspeed, _tracekit_hook as h, json; "
            "import deepspeed.runtime.superoffload.superoffload_stage3, "
            "deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper, "
            "deepspeed.runtime.swap_tensor.pipelined_optimizer_swapper, "
            "deepspeed.runtime.swap_tensor.partitioned_param_swapper; "
            "print(json.dumps(h.report()))")
    done = run_python(code, {"DS_ACCELERATOR": "cpu", "TRACEKIT_HOOK_REPORT_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    expected = sorted([f"{cls}.{m}" for points in hook.HOOK_POINTS.values() for cls, methods in points
                       for m in methods]
                      + [f"{mod}.{f}" for mod, fns in hook.FUNCTION_HOOK_POINTS.items() for f in fns])
    assert sorted(report["wrapped"]) == expected
    assert report["missing"] == [] and report["warnings"] == []
    import deepspeed

    assert report["deepspeed_version"] == deepspeed.__version__
    written = json.loads((tmp_path / f"hook-{report['pid']}.json").read_text())
    assert sorted(written["wrapped"]) == expected


@pytest.mark.deepspeed
def test_hook_off_without_env(tmp_path):
    pytest.importorskip("deepspeed")
    env = dict(os.environ, PYTHONPATH=str(HOOK_DIR), DS_ACCELERATOR="cpu")
    env.pop("TRACEKIT_HOOK", None)
    done = subprocess.run([sys.executable, "-c",
                           "import deepspeed.runtime.engine as e, sys; "
                           "print(hasattr(e.DeepSpeedEngine.forward, '__tracekit_wrapped__'), "
                           "'_tracekit_hook' in sys.modules)"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["False", "False"]


def test_sitecustomize_runs_the_one_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = 'yes'\n")
    env = dict(os.environ, PYTHONPATH=f"{HOOK_DIR}{os.pathsep}{other}", TRACEKIT_HOOK="1")
    done = subprocess.run([sys.executable, "-c",
                           "import os, sys; print(os.environ.get('SHADOWED_RAN'), "
                           "'_tracekit_hook' in sys.modules)"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["yes", "True"], done.stderr


CPU_CONFIG = {
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": False},
                          "overlap_comm": False, "contiguous_gradients": True},
}


def free_port() -> int:
    """A TCP port nobody listens on now (tests may run in parallel with other suites)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranges_from_log(path: Path) -> list[str]:
    """Indented range tree of the training thread from a TRACEKIT_HOOK_LOG file."""
    out, depth = [], 0
    for line in path.read_text().splitlines():
        parts = line.split(" ", 2)
        if parts[0] == "push":
            out.append("  " * depth + parts[2])
            depth += 1
        else:
            depth -= 1
    assert depth == 0
    return out


@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", [2, 3])
def test_real_deepspeed_on_cpu(tmp_path, stage):
    """examples/train_llama.py (tiny) with DeepSpeed's CPU accelerator and CPU Adam offload."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    cfg = dict(CPU_CONFIG, zero_optimization=dict(CPU_CONFIG["zero_optimization"], stage=stage))
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    log = tmp_path / "hook.log"
    env = dict(os.environ, PYTHONPATH=TRAINING_PYTHONPATH, TRACEKIT_HOOK="1", TRACEKIT_HOOK_LOG=str(log),
               DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               TRACEKIT_HOOK_REPORT_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train_llama.py"),
                           "--deepspeed_config", str(tmp_path / "ds.json"), "--steps", "2",
                           "--hidden", "64", "--layers", "2", "--heads", "2", "--intermediate", "128",
                           "--vocab", "256", "--seq", "16"],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "step 1 loss" in done.stdout
    tree = ranges_from_log(log)
    if stage == 2:
        # 2 layers * 9 tensors + embeddings, final norm, head = 21 gradient copies per backward
        grads = ["    grad_copy_to_host"] * 21
        # ZeRO-1/2 checks for overflow with bf16 too (check_grad_overflow); ZeRO-3 only with fp16
        sub = ["    overflow_check", "    grad_norm", "    unscale_clip", "    cpu_optimizer_step",
               "    param_copy_to_device"]
    else:
        grads = ["    grad_copy_to_host"]
        sub = ["    grad_norm", "    unscale_clip", "    cpu_optimizer_step", "    param_copy_back"]
    one = ["  forward", "  backward", *grads, "  step (no update)", "  forward",
           "  backward boundary", *grads, "  update", *sub]
    assert tree == ["rank 0 local_rank 0 world 1", "iteration 0", *one, "iteration 1", *one]
    (report,) = [json.loads(p.read_text()) for p in tmp_path.glob("hook-*.json")]
    assert report["missing"] == [] and report["warnings"] == []
    assert (report["rank"], report["local_rank"], report["world_size"]) == (0, 0, 1)
    expected_class = {2: "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer",
                      3: "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3"}[stage]
    assert report["optimizer_class"] == expected_class


def test_missing_nvtx_package_warns_once_and_training_goes_on(tmp_path):
    (tmp_path / "nvtx.py").write_text("raise ImportError('no nvtx here')\n")
    code = ("import _tracekit_hook as h\n"
            "for _ in range(3):\n"
            "    h._state.emitter.push('forward'); h._state.emitter.pop()\n"
            "print('still running', h.report()['warnings'])\n")
    env = dict(os.environ, PYTHONPATH=f"{HOOK_DIR}{os.pathsep}{tmp_path}", TRACEKIT_HOOK="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("still running")
    assert done.stderr.count("the 'nvtx' package is not importable") == 1
    assert "pip install nvtx" in done.stderr
