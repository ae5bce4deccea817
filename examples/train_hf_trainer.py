"""The same small LLaMA trained through the Hugging Face ``Trainer`` with a DeepSpeed config.

The ``Trainer`` builds the DeepSpeed engine itself (through ``accelerate``) and calls
``engine.backward`` / ``engine.step`` from its own loop, so this checks that ``tracekit
capture`` marks phases in a training the user did not write against DeepSpeed directly:

    tracekit capture -o hf -- deepspeed --num_gpus 1 examples/train_hf_trainer.py \
        --deepspeed_config examples/ds_zero3_offload.json --steps 4

Needs ``transformers`` and ``accelerate``. Random weights and random token ids: nothing is
downloaded. The ``if __name__ == "__main__":`` guard matters for engines that spawn worker
processes (SuperOffload, ZenFlow): the workers re-import this module.
"""

from __future__ import annotations

import argparse
import json


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
    p.add_argument("--output_dir", default="/tmp/tracekit-hf-trainer")
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    with open(args.deepspeed_config) as f:
        ds_config = json.load(f)
    micro = ds_config.get("train_micro_batch_size_per_gpu", 1)
    gas = ds_config.get("gradient_accumulation_steps", 1)
    bf16 = bool(ds_config.get("bf16", {}).get("enabled"))
    fp16 = bool(ds_config.get("fp16", {}).get("enabled"))

    class RandomTokens(torch.utils.data.Dataset):
        def __len__(self):
            return args.steps * gas * micro * 4

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, args.vocab, (args.seq,), generator=g)
            return {"input_ids": ids, "labels": ids}

    training_args = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=micro,
        gradient_accumulation_steps=gas, max_steps=args.steps, learning_rate=1e-4,
        bf16=bf16, fp16=fp16, deepspeed=ds_config, logging_steps=1, save_strategy="no",
        report_to=[], dataloader_num_workers=0)
    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.heads,
                         intermediate_size=args.intermediate, vocab_size=args.vocab,
                         max_position_embeddings=max(args.seq, 128))
    model = LlamaForCausalLM(config)
    Trainer(model=model, args=training_args, train_dataset=RandomTokens()).train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
