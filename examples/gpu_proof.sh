#!/usr/bin/env bash
# The GPU session that made tests/fixtures' captures and the hook-overhead figure.
#
# Runs from the repository root on a machine with one NVIDIA GPU, Nsight Systems (here the
# copy inside Nsight Compute, found by tracekit's discovery), and the wheels of
# deepspeed, hjson, pydantic and nvtx in .device/whl plus libdw/libelf in .device/lib
# (see docs/capture.md). Writes compressed exports, manifests, the benchmark result and the
# log to $OUT (default ./out). Each step has a time limit; later steps are skipped when the
# whole run nears LIMIT_S seconds. PARTS selects steps (default: all of
# "nolib captures bench iters fail sigterm").
set -u -o pipefail
OUT=${OUT:-$PWD/out}
LIMIT_S=${LIMIT_S:-570}
W=${WORK:-/tmp/tracekit-proof}
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
PARTS=${PARTS:-nolib captures bench iters fail sigterm}
want() { case " $PARTS " in *" $1 "*) return 0;; *) return 1;; esac; }
left() { echo $(( LIMIT_S - SECONDS )); }
PIDS=""
step() { echo; echo "=== [$SECONDS s] $*"; }

step install
if [ -z "${SKIP_INSTALL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader
python3 -c "import torch, deepspeed, nvtx, transformers; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__)"
CAP="python3 -m tracekit.capture"
TRAIN="examples/train_llama.py"

if want nolib; then
  step "importer without libdw (expect the missing library to be named)"
  timeout 90 $CAP -o "$W/nolib" --no-gpu-metrics -- python3 -c "print('hello from the traced process')"
  echo "nolib exit=$?"; ls -la "$W"/nolib* 2>/dev/null
fi

export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}

step "build DeepSpeed's CPU Adam (JIT)"
time timeout 240 python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"

for z in zero3 zero2; do
  want captures || break
  step "capture $z"
  time timeout 240 $CAP -o "$W/$z" --gpu-metrics-frequency 1000 -- \
    deepspeed --num_gpus 1 $TRAIN --deepspeed_config examples/ds_${z}_offload.json --steps 4
  echo "$z exit=$?"; ls -la "$W"/$z.*
  cp "$W/$z.json" "$OUT/" 2>/dev/null
  (xz -T4 -6 -c "$W/$z.sqlite" > "$OUT/$z.sqlite.xz" && ls -la "$OUT/$z.sqlite.xz") &
  PIDS="$PIDS $!"
done

if want bench; then
step "hook overhead: micro-benchmark under nsys (NVTX tool attached)"
NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | tail -1)
timeout 90 "$NSYS" profile -t nvtx -s none --cpuctxsw=none --export=none -o "$W/micro" --force-overwrite=true \
  python3 benchmarks/hook_overhead.py micro --calls 100000 | tee "$W/micro.out"
timeout 30 python3 benchmarks/hook_overhead.py micro --calls 100000 | tee "$W/micro_notool.out"
fi

if want bench && [ "$(left)" -gt 200 ]; then
  step "hook overhead: training steps with and without the hook (ZeRO-2 offload, no nsys)"
  RUNS=2; [ "$(left)" -lt 300 ] && RUNS=1
  timeout $(( $(left) - 60 )) python3 benchmarks/hook_overhead.py train \
    --config examples/ds_zero2_offload.json --runs $RUNS --steps ${BENCH_STEPS:-6} --warmup ${BENCH_WARMUP:-2} \
    | tee "$W/train_bench.out"
fi
cat "$W"/micro.out "$W"/micro_notool.out "$W"/train_bench.out 2>/dev/null | grep '^{' > "$OUT/bench.jsonl"

if want iters && [ "$(left)" -gt 75 ]; then
  step "capture range: --iterations 1-2 (4 layers, ZeRO-2, no GPU metrics)"
  timeout $(( $(left) - 30 )) $CAP -o "$W/iters" --no-gpu-metrics --iterations 1-2 -- \
    deepspeed --num_gpus 1 $TRAIN --deepspeed_config examples/ds_zero2_offload.json --steps 4 --layers 4
  echo "iters exit=$?"
  python3 - "$W/iters.sqlite" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
rows = con.execute("""select coalesce(n.text, s.value), count(*) from NVTX_EVENTS n
  left join StringIds s on s.id = n.textId join NVTX_EVENTS d on d.eventType = 75
  and d.domainId = n.domainId and d.text = 'tracekit' where n.eventType = 59 group by 1""").fetchall()
print("iters tracekit ranges:", rows)
PY
fi
if want fail && [ "$(left)" -gt 25 ]; then
  step "training that exits with status 3"
  timeout $(( $(left) - 10 )) $CAP -o "$W/fail" --no-gpu-metrics -- python3 -c "import sys; sys.exit(3)"
  echo "fail exit=$?"
fi
if want sigterm && [ "$(left)" -gt 100 ]; then
  step "SIGTERM to tracekit during training (expect a finalized report and export)"
  $CAP -o "$W/sig" --no-gpu-metrics -- deepspeed --num_gpus 1 $TRAIN \
    --deepspeed_config examples/ds_zero2_offload.json --steps 500 --layers 4 &
  CPID=$!
  sleep 40; echo "sending SIGTERM to tracekit ($CPID) at $SECONDS s"; kill -TERM $CPID
  wait $CPID; echo "sigterm exit=$? at $SECONDS s"; ls -la "$W"/sig.* 2>/dev/null
  python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print('sig iterations:', c.execute(\"select count(*) from NVTX_EVENTS n join StringIds s on s.id=n.textId where s.value like 'iteration %'\").fetchone())" "$W/sig.sqlite"
fi
for p in $PIDS; do wait $p; done
step "pack extras"
ls -la "$W"
(cd "$W" && tar -cJf "$OUT/extras.tar.xz" --ignore-failed-read nolib.json iters.json iters.sqlite fail.json sig.json 2>/dev/null)
ls -la "$OUT"
