#!/usr/bin/env bash
# Records one capture per DeepSpeed offload engine on one GPU (issue 15 proof; docs/capture.md):
# SuperOffload, ZenFlow, ZeRO-3 offload_param, NVMe optimizer offload, the HF Trainer, and the
# advice pair `nooffload` (550 M model, docs/advice.md); `superoffload_noclip` is `superoffload`
# with `gradient_clipping: 0.0`, the changed run of the advice pair superoffload_no_clipping
# (`superoffload` keeps DeepSpeed's default, 1.0 since 0.19.3); `superoffload_rb` and
# `superoffload_noclip_rb` are that pair with `reduce_bucket_size` 1e7 (SO_STEPS: their steps). Run from a tree holding .device/
# (wheels, libdw, libaio debs, a copy of tracekit in .device/tk). Writes to $OUT: engines.log,
# manifests.tar (each run's manifest and training output, appended right after its capture) and
# NAME.sqlite.xz, compressed one after the other once the last capture is done (compressing
# while a capture runs loads the host and slows the captured run's CPU phases).
set -u -o pipefail
OUT=${OUT:-$PWD/out}; W=${WORK:-/tmp/engines}; mkdir -p "$OUT" "$W"
LOG="$OUT/engines.log"
export PYTHONUNBUFFERED=1
{
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl || exit 1
export PYTHONPATH=$PWD/.device/tk:/tmp/site PATH=/tmp/site/bin:$PATH LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
# libaio for DeepSpeed's async I/O op (NVMe offload), from Debian's packages
mkdir -p /tmp/aio && for f in .device/libaio*.deb; do dpkg -x $f /tmp/aio; done
cp -a /tmp/aio/usr/include/libaio.h /usr/include/ 2>/dev/null; cp -a /tmp/aio/usr/lib/x86_64-linux-gnu/libaio.so* /usr/lib/x86_64-linux-gnu/ 2>/dev/null; ldconfig 2>/dev/null
python3 -c "import torch, deepspeed, transformers; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__)"
python3 -c "import accelerate; print('accelerate', accelerate.__version__)"
time python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"
} >>"$LOG" 2>&1
DONE=""
# DeepSpeed 0.19.8's op builder cannot parse arch names such as 9.0a in TORCH_CUDA_ARCH_LIST
# (ValueError in compute_capability_args when it JIT-builds async_io for NVMe offload)
export TORCH_CUDA_ARCH_LIST=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
ONLY=${ONLY:-superoffload zenflow nooffload offload_param nvme hf_trainer}
SO_STEPS=${SO_STEPS:-5}
cap() {  # name timeout config script [args...]
  local name=$1 t=$2 cfg=$3 script=$4; shift 4
  case " $ONLY " in *" $name "*) ;; *) return;; esac
  [ "$SECONDS" -gt "${LIMIT_S:-500}" ] && { echo "skip $name: time" >>"$LOG"; return; }
  echo "=== [$SECONDS s] $name: $cfg $*" >>"$LOG"
  timeout "$t" python3 -m tracekit.capture -o "$W/$name" --gpu-metrics-frequency 1000 -- \
    deepspeed --num_gpus 1 "$script" --deepspeed_config "$cfg" "$@" > "$W/$name.out" 2>&1
  local rc=$?
  grep -v '^\[20\|\] \[\|%  *\]' "$W/$name.out" | tail -40 >>"$LOG"
  echo "$name exit=$rc at $SECONDS s" >>"$LOG"
  [ -f "$W/$name.json" ] && tar -rf "$OUT/manifests.tar" -C "$W" "$name.json" "$name.out"
  [ -f "$W/$name.sqlite" ] && DONE="$DONE $name"
}
TK=.device/tk/examples
cap superoffload 150 $TK/ds_superoffload.json $TK/train_llama.py --steps $SO_STEPS
# derived SuperOffload configs: NAME CLIP [REDUCE_BUCKET]; _rb: reduce_bucket_size 1e7 (= sub_group_size),
# so partition_grads runs during backward, not once at its end (the default bucket, 5e8, holds every gradient)
mkso() {
  python3 - $TK/ds_superoffload.json "$W/$1.ds.json" "$2" "${3:--}" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["gradient_clipping"] = float(sys.argv[3])  # 0.0: SuperOffload steps finished sub-groups during the boundary backward
if sys.argv[4] != "-":
    cfg["zero_optimization"]["reduce_bucket_size"] = int(float(sys.argv[4]))
json.dump(cfg, open(sys.argv[2], "w"), indent=1)
PY
}
mkso superoffload_noclip 0.0
cap superoffload_noclip 150 "$W/superoffload_noclip.ds.json" $TK/train_llama.py --steps $SO_STEPS
mkso superoffload_rb 1.0 1e7
cap superoffload_rb 150 "$W/superoffload_rb.ds.json" $TK/train_llama.py --steps $SO_STEPS
mkso superoffload_noclip_rb 0.0 1e7
cap superoffload_noclip_rb 150 "$W/superoffload_noclip_rb.ds.json" $TK/train_llama.py --steps $SO_STEPS
cap zenflow 150 $TK/ds_zenflow.json $TK/train_llama.py --steps 8
python3 - "$W/nooffload.ds.json" <<'PY'
import json, sys
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0, "torch_adam": True}},
       "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True},
       "steps_per_print": 1000, "wall_clock_breakdown": False,
       "fp16": {"enabled": True, "initial_scale_power": 8}}
json.dump(cfg, open(sys.argv[1], "w"), indent=1)
PY
cap nooffload 120 "$W/nooffload.ds.json" $TK/train_llama.py --steps 5 --hidden 1536 --layers 16 --heads 12 --intermediate 4096 --seq 1024
cap offload_param 120 $TK/ds_zero3_offload_param.json $TK/train_llama.py --steps 4
mkdir -p /tmp/tracekit-nvme
cap nvme 150 $TK/ds_zero3_nvme.json $TK/train_llama.py --steps 4
cap hf_trainer 120 $TK/ds_zero3_offload.json $TK/train_hf_trainer.py --steps 4
# compress after the last capture, one export at a time, in the foreground
for name in $DONE; do
  echo "[$SECONDS s] xz $name.sqlite" >>"$LOG"
  xz -T4 -6 -c "$W/$name.sqlite" > "$OUT/$name.sqlite.xz" 2>>"$LOG" || echo "xz $name failed" >>"$LOG"
done
ls -la "$OUT" >>"$LOG"
