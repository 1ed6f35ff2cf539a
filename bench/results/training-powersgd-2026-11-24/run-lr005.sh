#!/usr/bin/env bash
# PowerSGD rank 1 diverged at lr 0.1 (run.sh); the same schedule at lr 0.05, with dense beside it.
set -euo pipefail
cd "$(dirname "$0")"
build=${BUILD:-../../../build}
export OPENBLAS_NUM_THREADS=1
for compressor in powersgd:rank=1 none powersgd:rank=2; do
  name=lr0.05-${compressor//[:=,]/-}
  "$build/tools/gradcomm-run" -n 4 -- "$build/trainer/gradcomm-train" \
    --epochs 10 --batch-size 32 --lr 0.05 --momentum 0.9 --warmup-epochs 0.5 \
    --compressor "$compressor" --log "$name.jsonl" > "$name.out" 2>&1 || echo "$compressor: failed"
  tail -1 "$name.out"
done
