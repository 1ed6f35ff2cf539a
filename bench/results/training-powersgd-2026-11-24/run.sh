#!/usr/bin/env bash
# Fashion-MNIST, 4 ranks, scripts/demo.sh's schedule (batch 32 per rank, lr 0.1,
# momentum 0.9, warm-up 0.5 epoch), 10 epochs: dense against PowerSGD at ranks 4, 2, 1.
# Usage: bench/results/training-powersgd-2026-11-24/run.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")"
build=${1:-../../../build}
export OPENBLAS_NUM_THREADS=1
for compressor in none powersgd:rank=4 powersgd:rank=2 powersgd:rank=1; do
  name=${compressor//[:=,]/-}
  "$build/tools/gradcomm-run" -n 4 -- "$build/trainer/gradcomm-train" \
    --epochs 10 --batch-size 32 --lr 0.1 --momentum 0.9 --warmup-epochs 0.5 \
    --compressor "$compressor" --log "$name.jsonl" > "$name.out" 2>&1
  tail -2 "$name.out"
done
