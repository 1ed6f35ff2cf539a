#!/usr/bin/env bash
# Ranks 2 and 1 with PowerSGD's buffers on halving + doubling from 4 KiB, seed 1, the
# demo's schedule for 10 epochs: rank 2 at lr 0.1; rank 1 at lr 0.05, where it trains
# (at 0.1 it diverged on 2026-11-24, before this change). Dense at either lr is
# deterministic for a seed and was measured on 2026-11-24 (training-powersgd-2026-11-24).
# Usage: run-ranks.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")"
build=${1:-../../../build}
export OPENBLAS_NUM_THREADS=1
train() {  # name compressor lr
  "$build/tools/gradcomm-run" -n 4 -- "$build/trainer/gradcomm-train" \
    --epochs 10 --batch-size 32 --lr "$3" --momentum 0.9 --warmup-epochs 0.5 \
    --compressor "$2" --seed 1 --log "$1.jsonl" > "$1.out" 2>&1 || echo "$1: failed"
  echo "$1: $(tail -1 "$1.out")"
}
train seed1-rank2-new powersgd:rank=2 0.1
train seed1-rank1-lr005-new powersgd:rank=1 0.05
train seed1-rank1-new powersgd:rank=1 0.1
