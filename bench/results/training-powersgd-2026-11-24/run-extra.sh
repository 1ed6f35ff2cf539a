#!/usr/bin/env bash
# Rank 4 with every small allreduce bandwidth-optimal (GRADCOMM_SMALL_ALLREDUCE_BYTES=0:
# halving + doubling instead of recursive doubling), and a second seed of dense and rank 4.
set -euo pipefail
cd "$(dirname "$0")"
build=${BUILD:-../../../build}
export OPENBLAS_NUM_THREADS=1
train() {  # name, env..., -- trainer args
  local name=$1; shift
  env "$@" "$build/tools/gradcomm-run" -n 4 -- "$build/trainer/gradcomm-train" \
    --epochs 10 --batch-size 32 --lr 0.1 --momentum 0.9 --warmup-epochs 0.5 \
    --compressor "$compressor" --seed "$seed" --log "$name.jsonl" > "$name.out" 2>&1 || echo "$name: failed"
  tail -1 "$name.out"
}
compressor=powersgd:rank=4 seed=1 train small0-powersgd-rank-4 GRADCOMM_SMALL_ALLREDUCE_BYTES=0
compressor=none seed=2 train seed2-none GRADCOMM_X=1
compressor=powersgd:rank=4 seed=2 train seed2-powersgd-rank-4 GRADCOMM_X=1
