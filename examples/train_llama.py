"""Small LLaMA-style training with DeepSpeed, for ``tracekit capture`` demonstrations.

The model is a ``transformers`` ``LlamaForCausalLM`` built from a config with random weights
(nothing is downloaded); the data are random token ids. The training loop is the plain one
(``loss = engine(...)``, ``engine.backward(loss)``, ``engine.step()``) with no NVTX of its own:
every ``tracekit`` range comes from tracekit's hook.

    deepspeed --num_gpus 1 examples/train_llama.py --deepspeed_config examples/ds_zero3_offload.json
    tracekit capture -o run -- deepspeed --num_gpus 1 examples/train_llama.py \
        --deepspeed_config examples/ds_zero2_offload.json --steps 4

Prints one line per optimizer step: ``step N loss L time_s T`` (T = wall seconds of that step's
micro-steps, measured after the loss is read back, which synchronizes the device).
"""

from __future__ import annotations

import argparse
import json
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--deepspeed_config", required=True, help="DeepSpeed JSON config file")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (default 4)")
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=512, help="sequence length in tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator
    from transformers import LlamaConfig, LlamaForCausalLM

    with open(args.deepspeed_config) as f:
        ds_config = json.load(f)
    deepspeed.init_distributed()
    torch.manual_seed(args.seed)
    accel = get_accelerator()
    device = torch.device(accel.current_device_name())

    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.heads,
                         intermediate_size=args.intermediate, vocab_size=args.vocab,
                         max_position_embeddings=max(args.seq, 128))
    stage = ds_config.get("zero_optimization", {}).get("stage", 0)
    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = LlamaForCausalLM(config)
    else:
        model = LlamaForCausalLM(config)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config)
    gas = engine.gradient_accumulation_steps()
    micro_batch = engine.train_micro_batch_size_per_gpu()
    gen = torch.Generator().manual_seed(args.seed + engine.global_rank)
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    if engine.global_rank == 0:
        print(f"model parameters {n_params} zero_stage {stage} gas {gas} "
              f"micro_batch {micro_batch} seq {args.seq}", flush=True)

    engine.train()
    for step in range(args.steps):
        t0 = time.perf_counter()
        for _ in range(gas):
            ids = torch.randint(0, args.vocab, (micro_batch, args.seq), generator=gen).to(device)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        value = float(loss.item())
        dt = time.perf_counter() - t0
        if engine.global_rank == 0:
            print(f"step {step} loss {value:.4f} time_s {dt:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
