#!/usr/bin/env bash
# Records the advice validation pairs on one GPU (see docs/advice.md): a baseline
# ZeRO-3 CPU-offload run and one run per single config change, same model and data,
# each under `tracekit capture`. Run from a tree holding .device/ (wheels, libdw, a
# copy of tracekit in .device/tk). Writes to $OUT: pairs.log, manifests.tar (each run's
# manifest, DeepSpeed config and training output, appended right after its capture) and the
# compressed exports NAME.sqlite.xz, made one after the other once the last capture is done
# (compressing while a capture runs loads the host and slows the captured run's CPU phases).
set -u -o pipefail
OUT=${OUT:-$PWD/out}; W=${WORK:-/tmp/pairs}; mkdir -p "$OUT" "$W"
# all output goes straight to the log (no process substitution: nothing to wait for)
exec >>"$OUT/pairs.log" 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl || exit 1
export PYTHONPATH=$PWD/.device/tk:/tmp/site PATH=/tmp/site/bin:$PATH LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
time python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"
MODEL=${MODEL:---hidden 1536 --layers 16 --heads 12 --intermediate 4096 --seq 1024}
STEPS=${STEPS:-5}
mkcfg() {  # name precision pin subgroup offload ratio
  python3 - "$W/$1.ds.json" "$2" "$3" "$4" "$5" "$6" <<'PY'
import json, sys
path, prec, pin, sg, off, ratio = sys.argv[1:]
z = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True}
if off == "cpu":
    z["offload_optimizer"] = {"device": "cpu", "pin_memory": pin == "true"}
    if ratio != "-":
        z["offload_optimizer"]["ratio"] = float(ratio)
if sg != "-":
    z["sub_group_size"] = int(float(sg))
# off != cpu (optimizer on the GPU): torch_adam, torch.optim.AdamW, as the validated nooffload pair
# ran it (DeepSpeed's FusedAdam JIT build failed on the recording machine; docs/advice.md)
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0,
                                                  **({"torch_adam": True} if off != "cpu" else {})}},
       "zero_optimization": z, "steps_per_print": 1000, "wall_clock_breakdown": False}
if prec == "fp16":
    cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
else:
    cfg["bf16"] = {"enabled": True}
json.dump(cfg, open(path, "w"), indent=1)
PY
}
PAIRS=${PAIRS:-"base:fp16:false:-:cpu:- pin:fp16:true:-:cpu:- bf16:bf16:false:-:cpu:- nooffload:fp16:false:-:none:- subgroup:fp16:false:2e7:cpu:- ratio:fp16:false:-:cpu:0.5"}
DONE=""
for spec in $PAIRS; do
  IFS=: read -r name prec pin sg off ratio <<<"$spec"
  [ "$SECONDS" -gt "${LIMIT_S:-470}" ] && { echo "skip $name: time"; continue; }
  mkcfg "$name" "$prec" "$pin" "$sg" "$off" "$ratio"
  echo; echo "=== [$SECONDS s] $name: $(tr -d '\n ' < "$W/$name.ds.json")"
  timeout 200 python3 -m tracekit.capture -o "$W/$name" --gpu-metrics-frequency 1000 -- \
    deepspeed --num_gpus 1 .device/tk/examples/train_llama.py --deepspeed_config "$W/$name.ds.json" \
    --steps $STEPS $MODEL > "$W/$name.out" 2>&1
  rc=$?
  grep -v '^\[20\|\] \[\|%  *\]' "$W/$name.out" | tail -25
  echo "$name exit=$rc at $SECONDS s"; ls -la "$W/$name".* 2>/dev/null
  # the manifest, config and training output reach $OUT now, whatever happens later
  files=""; for f in "$name.json" "$name.ds.json" "$name.out"; do [ -f "$W/$f" ] && files="$files $f"; done
  [ -n "$files" ] && tar -rf "$OUT/manifests.tar" -C "$W" $files
  [ -f "$W/$name.sqlite" ] && DONE="$DONE $name"
done
# compress after the last capture, one export at a time, in the foreground
for name in $DONE; do
  echo "[$SECONDS s] xz $name.sqlite"
  xz -T4 -6 -c "$W/$name.sqlite" > "$OUT/$name.sqlite.xz" || echo "xz $name failed"
done
ls -la "$OUT"
