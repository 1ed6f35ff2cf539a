#!/usr/bin/env bash
# The runs of run.sh again after a change: the compressors given as arguments.
set -euo pipefail
cd "$(dirname "$0")"
build=${BUILD:-../../../build}
export OPENBLAS_NUM_THREADS=1
for compressor in "$@"; do
  name=${compressor//[:=,]/-}
  "$build/tools/gradcomm-run" -n 4 -- "$build/trainer/gradcomm-train" \
    --epochs 10 --batch-size 32 --lr 0.1 --momentum 0.9 --warmup-epochs 0.5 \
    --compressor "$compressor" --log "$name.jsonl" > "$name.out" 2>&1 || echo "$compressor: failed"
  tail -1 "$name.out"
done
