"""How much tracekit's NVTX hook costs a DeepSpeed training step.

Two measurements:

``micro``  the cost of one wrapped call (forward/backward/step of an engine whose methods do
           nothing), with and without the hook, and of one NVTX push+pop pair in the
           ``tracekit`` domain. Run it under ``nsys profile -t nvtx`` to price the ranges
           with a tool attached (without one, NVTX calls are nearly free).
``train``  end to end: ``examples/train_llama.py`` run alternately without and with the hook
           (no nsys), median seconds per optimizer step after the warm-up steps.

    python benchmarks/hook_overhead.py micro
    python benchmarks/hook_overhead.py train --config examples/ds_zero2_offload.json --runs 2

Prints one JSON object (times in microseconds for ``micro``, seconds for ``train``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOK_DIR = ROOT / "tracekit" / "capture" / "hook"


def _fake_engine_module():
    class DeepSpeedEngine:
        training = True
        global_steps = 0
        micro_steps = 0

        def is_gradient_accumulation_boundary(self):
            return (self.micro_steps + 1) % 2 == 0

        def forward(self, x):
            return x

        def backward(self, loss):
            return loss

        def step(self, *_args):
            if self.is_gradient_accumulation_boundary():
                self.global_steps += 1
            self.micro_steps += 1

    return types.SimpleNamespace(DeepSpeedEngine=DeepSpeedEngine)


def micro(n: int) -> dict:
    """Microseconds per micro-step (forward+backward+step) without/with the hook, and per
    NVTX push+pop pair."""
    sys.path.insert(0, str(HOOK_DIR))
    import _tracekit_hook as hook

    plain = _fake_engine_module().DeepSpeedEngine()
    mod = _fake_engine_module()
    hook.patch_module(hook.ENGINE_MODULE, mod)
    wrapped = mod.DeepSpeedEngine()

    def loop(engine) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            engine.step(engine.backward(engine.forward(1.0)))
        return (time.perf_counter() - t0) / n * 1e6

    loop(plain), loop(wrapped)  # warm up
    t_plain = min(loop(plain) for _ in range(3))
    t_wrapped = min(loop(wrapped) for _ in range(3))

    emitter = hook.NvtxEmitter()
    t0 = time.perf_counter()
    for _ in range(n):
        emitter.push("forward")
        emitter.pop()
    t_pair = (time.perf_counter() - t0) / n * 1e6
    domain_type = type(emitter._domain).__name__  # DummyDomain when no NVTX tool is attached
    return {"mode": "micro", "calls": n, "nvtx_domain": domain_type,
            "us_per_microstep_plain": round(t_plain, 3), "us_per_microstep_hooked": round(t_wrapped, 3),
            "us_hook_per_microstep": round(t_wrapped - t_plain, 3),
            "us_per_nvtx_push_pop": round(t_pair, 3)}


STEP_LINE = re.compile(r"^step (\d+) loss \S+ time_s (\S+)", re.M)


def train(config: str, runs: int, steps: int, warmup: int, extra: list[str]) -> dict:
    """Median seconds per optimizer step without and with the hook (alternating runs)."""
    base = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", PYTHONUNBUFFERED="1")
    base.pop("TRACEKIT_HOOK", None)
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(runs):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):  # alternate the order
            env = dict(base)
            if mode == "on":
                env["TRACEKIT_HOOK"] = "1"
                env["PYTHONPATH"] = str(HOOK_DIR) + os.pathsep + env.get("PYTHONPATH", "")
            cmd = [sys.executable, str(ROOT / "examples" / "train_llama.py"), "--deepspeed_config",
                   config, "--steps", str(steps), *extra]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
                raise SystemExit(f"training run failed ({mode}, status {done.returncode})")
            got = [(int(s), float(t)) for s, t in STEP_LINE.findall(done.stdout)]
            times[mode] += [t for s, t in got if s >= warmup]
            print(f"run {r} hook {mode}: " + " ".join(f"{t:.3f}" for _, t in got), file=sys.stderr)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    return {"mode": "train", "config": config, "runs": runs, "steps": steps, "warmup": warmup,
            "s_per_step_off": times["off"], "s_per_step_on": times["on"],
            "median_s_off": round(off, 4), "median_s_on": round(on, 4),
            "overhead_percent": round((on - off) / off * 100, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("micro")
    m.add_argument("--calls", type=int, default=200000)
    t = sub.add_parser("train")
    t.add_argument("--config", default=str(ROOT / "examples" / "ds_zero2_offload.json"))
    t.add_argument("--runs", type=int, default=2)
    t.add_argument("--steps", type=int, default=6)
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("extra", nargs="*", help="extra train_llama.py arguments (after --)")
    args = p.parse_args(argv)
    if args.mode == "micro":
        result = micro(args.calls)
    else:
        result = train(args.config, args.runs, args.steps, args.warmup, args.extra)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
