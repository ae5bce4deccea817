#!/usr/bin/env bash
# Records the what-if benchmark's runs (benchmarks/whatif/README.md) on one GPU, each under
# `tracekit capture` with 1 kHz GPU metrics (CAPTURE_OPTS=--no-gpu-metrics: none), one after the other, nothing else on the host.
# Run from a tree holding .device/ (wheels, libdw, a copy of tracekit in .device/tk):
#   RUNS="z3s_base z3s_pin ..." bash benchmarks/whatif/record.sh
# A run is NAME = <family>_<variant>; the families and variants are in mkcfg below (config) and
# model_of (model, steps). Writes to $OUT: record.log, manifests.tar (each run's manifest,
# DeepSpeed config and training output, appended right after its capture) and the exports,
# xz-compressed one after the other once the last capture is done (compressing while a capture
# runs loads the host and slows the captured run's CPU phases), tarred and split into 15 MB parts
# (exports.tar.part-aa, ...; re-join with cat). A run is skipped when it would not end, with the
# compression of the runs before it, inside LIMIT_S seconds (default 535) of the script's start.
set -u -o pipefail
OUT=${OUT:-$PWD/out}; W=${WORK:-/tmp/whatif}; mkdir -p "$OUT" "$W"
exec >>"$OUT/record.log" 2>&1
export PYTHONUNBUFFERED=1
TK=${TK_DIR:-$PWD/.device/tk}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl || exit 1
export PYTHONPATH=$TK:/tmp/site PATH=/tmp/site/bin:$PWD/.device/bin:$PATH LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; uptime
python3 -c "import torch, deepspeed, transformers; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__)"
time python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"
# FusedAdam's JIT build reads the arch list; torch 2.11 reports sm_90 as '9.0a', which DeepSpeed's
# builder cannot parse, so name the H200's arch plainly (and build it before the captures)
export TORCH_CUDA_ARCH_LIST=${FUSED_ARCH:-9.0}  # the machine sets it to 9.0a itself
case " ${RUNS:-} " in *_fused*) time python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()";; esac
numactl --hardware | head -3 || echo "numactl does not run: the bind variants will fail"
python3 -c "import psutil; print('cores: physical', psutil.cpu_count(logical=False), 'logical', psutil.cpu_count())"
SMALL="--hidden 768 --layers 12 --heads 12 --intermediate 2048 --seq 512"          # 134 M
LARGE="--hidden 2048 --layers 24 --heads 16 --intermediate 5504 --seq ${LARGE_SEQ:-1024}"  # 1.3 B
XL="--hidden 2560 --layers 32 --heads 32 --intermediate 6912 --seq ${XL_SEQ:-512}"  # 2.7 B
model_of() {  # NAME -> "ESTIMATED_S TIMEOUT_S STEPS MODEL..."
  case $1 in
    z3l_*) echo "${EST_L:-95} 200 ${STEPS_L:-10} $LARGE";;
    z3x_*) echo "${EST_X:-170} 300 ${STEPS_X:-9} $XL";;
    zf*) echo "${EST_ZF:-70} 170 ${ZF_STEPS:-40} $SMALL";;
    *) echo "${EST_S:-60} 160 ${STEPS_S:-10} $SMALL";;
  esac
}
launcher_of() {  # NAME -> extra options of the deepspeed launcher
  case $1 in
    *_bind) echo "--bind_cores_to_rank";;  # numactl -C <physical cores>, OMP_NUM_THREADS=<their count>
    *) echo "";;
  esac
}
mkcfg() {  # NAME -> $W/NAME.ds.json
  python3 - "$1" "$W/$1.ds.json" "$TK/examples" <<'PY'
import json, re, sys
name, path, ex = sys.argv[1:]
fam, var = name.split("_", 1)
var = re.sub(r"_r[0-9]+$", "", var)  # z3s_bf16_r2: the z3s_bf16 config recorded again
var = var.rstrip("0123456789") if var.startswith("base") else var
if fam in ("z3s", "z2s", "z3l", "z3x"):
    z = {"stage": 2 if fam == "z2s" else 3, "overlap_comm": True, "contiguous_gradients": True,
         "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0}},
           "zero_optimization": z, "steps_per_print": 1000, "wall_clock_breakdown": False,
           "fp16": {"enabled": True, "initial_scale_power": 8}}
    if var == "pin":
        z["offload_optimizer"]["pin_memory"] = True
    elif var == "bf16":
        del cfg["fp16"]; cfg["bf16"] = {"enabled": True}
    elif var == "nooffload":  # optimizer on the GPU: torch.optim.AdamW (as the earlier validated pair)
        del z["offload_optimizer"]; cfg["optimizer"]["params"]["torch_adam"] = True
    elif var.startswith("sg") and "r" in var:  # sg2e7r05: sub_group_size 2e7, offload_optimizer.ratio 0.5
        sg, ratio = var[2:].split("r")
        z["sub_group_size"] = int(float(sg))
        z["offload_optimizer"]["ratio"] = float("0." + ratio[1:]) if ratio.startswith("0") else float(ratio)
    elif var.startswith("sg"):  # sg1e8, sg2e7: sub_group_size
        z["sub_group_size"] = int(float(var[2:]))
    elif var == "fused":  # optimizer on the GPU: DeepSpeed's FusedAdam (the default without offload)
        del z["offload_optimizer"]
    elif var == "op":  # parameters offloaded too (ZeRO-3 only)
        z["offload_param"] = {"device": "cpu", "pin_memory": False}
    elif var == "oc0":
        z["overlap_comm"] = False
    elif var == "mb2":  # micro-batch 2 x gas 1: the same global batch as 1 x 2
        cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"] = 2, 1
    elif var not in ("base", "bind"):  # bind: the base config, the launcher binds cores (launcher_of)
        sys.exit(f"unknown variant {var}")
elif fam == "so":  # SuperOffload: examples/ds_superoffload.json
    cfg = json.load(open(f"{ex}/ds_superoffload.json"))
    if var == "noclip":
        cfg["gradient_clipping"] = 0.0
    elif var == "rb":
        cfg["zero_optimization"]["reduce_bucket_size"] = int(1e7)
    elif var != "base":
        sys.exit(f"unknown variant {var}")
elif fam == "zf":  # ZenFlow: examples/ds_zenflow.json
    cfg = json.load(open(f"{ex}/ds_zenflow.json"))
    zf = cfg["zero_optimization"]["zenflow"]
    if var == "topk05":
        zf["topk_ratio"] = 0.05
    elif var == "ui2":
        zf["update_interval"] = zf["select_interval"] = 2
    elif var != "base":
        sys.exit(f"unknown variant {var}")
else:
    sys.exit(f"unknown family {fam}")
json.dump(cfg, open(path, "w"), indent=1)
PY
}
dup=$(printf '%s\n' ${RUNS:?RUNS: the run names} | sort | uniq -d | tr '\n' ' ')
[ -n "$dup" ] && { echo "RUNS names a run twice ($dup): give each run its own name (z3l_base, z3l_base2)"; exit 2; }
DONE=""; ND=0
for name in ${RUNS:?RUNS: the run names}; do
  read -r est t steps model <<<"$(model_of "$name")"
  if [ $((SECONDS + est + 10 * (ND + 1))) -gt "${LIMIT_S:-535}" ]; then echo "skip $name: time ($SECONDS s)"; continue; fi
  mkcfg "$name" || continue
  echo; echo "=== [$SECONDS s] $name: $(tr -d '\n ' < "$W/$name.ds.json") $(launcher_of "$name") --steps $steps $model"; uptime
  timeout "$t" python3 -m tracekit.capture -o "$W/$name" ${CAPTURE_OPTS:---gpu-metrics-frequency 1000} -- \
    deepspeed --num_gpus 1 $(launcher_of "$name") "$TK/examples/train_llama.py" --deepspeed_config "$W/$name.ds.json" \
    --steps "$steps" $model > "$W/$name.out" 2>&1
  rc=$?
  grep -v '^\[20\|\] \[\|%  *\]' "$W/$name.out" | tail -18
  echo "$name exit=$rc at $SECONDS s"; ls -la "$W/$name".* 2>/dev/null
  files=""; for f in "$name.json" "$name.ds.json" "$name.out"; do [ -f "$W/$f" ] && files="$files $f"; done
  [ -n "$files" ] && tar -rf "$OUT/manifests.tar" -C "$W" $files
  [ -f "$W/$name.sqlite" ] && { DONE="$DONE $name"; ND=$((ND + 1)); }
done
for name in $DONE; do
  echo "[$SECONDS s] xz $name.sqlite"
  xz -T0 -6 -c "$W/$name.sqlite" > "$W/$name.sqlite.xz" || echo "xz $name failed"
done
[ -n "$DONE" ] && (cd "$W" && tar -cf - $(for n in $DONE; do echo "$n.sqlite.xz"; done) | split -b 15M - "$OUT/exports.tar.part-")
echo "[$SECONDS s] done:$DONE"; ls -la "$OUT"
