#!/usr/bin/env bash
# PowerSGD's buffers from 4 KiB on (was 16 KiB) take halving + doubling: the demo's
# schedule (4 ranks, batch 32 per rank, lr 0.1, momentum 0.9, warm-up 0.5 epoch),
# 10 epochs, seeds 1 and 2 (SEEDS="3 4" for more), interleaved: dense, rank 4 with the new threshold, rank 4
# with the old one. OLD_LIB and NEW_LIB are directories holding a libgradcomm.so.0
# built at each threshold (the trainer's RUNPATH yields to LD_LIBRARY_PATH); the
# old one is src/collectives/powersgd_allreduce.cc with kMinHalvingBytes = 16 << 10.
# Usage: OLD_LIB=/tmp/lib-old NEW_LIB=/tmp/lib-new run.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")"
build=${1:-../../../build}
export OPENBLAS_NUM_THREADS=1
train() {  # name lib compressor seed
  LD_LIBRARY_PATH=$2 "$build/tools/gradcomm-run" -n 4 -- "$build/trainer/gradcomm-train" \
    --epochs 10 --batch-size 32 --lr 0.1 --momentum 0.9 --warmup-epochs 0.5 \
    --compressor "$3" --seed "$4" --log "$1.jsonl" > "$1.out" 2>&1 || echo "$1: failed"
  echo "$1: $(tail -1 "$1.out")"
}
for seed in ${SEEDS:-1 2}; do
  train "seed$seed-none" "$NEW_LIB" none "$seed"
  train "seed$seed-rank4-new" "$NEW_LIB" powersgd:rank=4 "$seed"
  train "seed$seed-rank4-old" "$OLD_LIB" powersgd:rank=4 "$seed"
done
