#!/usr/bin/env bash
# The emulated-cluster measurements of docs/two-levels.md (issue 43), two levels against flat
# in the same runs (bench/cluster/run.sh --nodes M --ranks-per-node L --hierarchies auto,off):
#   1. 2 nodes x 2 ranks, 100 Mbit/s between nodes, 16 MiB, dense and quant:bits=4, checked;
#   2. 4 nodes x 2 ranks, 1 Gbit/s, 64 MiB, top-k 1 %;
#   3. a grid for the model (bench/cluster/scaling.py --measured-nodes): 2x2, 4x2 and 2x4 at
#      1 Gbit/s, 16 MiB, dense, quant:bits=4 and top-k 1 %.
# REPS runs of 1 and 2 (default 3). Writes OUT/*.json (default bench/results/two-levels-<date>).
#   bench/cluster/two_level_sweep.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/two-levels-$(date +%F)}
reps=${REPS:-3}
mkdir -p "$out"
run=bench/cluster/run.sh
for rep in $(seq "$reps"); do
  "$run" --nodes 2 --ranks-per-node 2 --rate 100mbit --sizes 16M --compressors "none;quant:bits=4" \
    --baselines none --hierarchies auto,off --check 1 --iters 5 --warmup 1 --json "$out/2x2-100mbit-$rep.json"
  "$run" --nodes 4 --ranks-per-node 2 --rate 1gbit --sizes 64M --compressors "topk:ratio=0.01" \
    --baselines none --hierarchies auto,off --iters 5 --warmup 1 --json "$out/4x2-1gbit-topk-$rep.json"
done
for shape in "2 2" "4 2" "2 4"; do
  read -r m l <<<"$shape"
  "$run" --nodes "$m" --ranks-per-node "$l" --rate 1gbit --sizes 16M \
    --compressors "none;quant:bits=4;topk:ratio=0.01" --baselines none --hierarchies auto,off --iters 3 --warmup 1 \
    --json "$out/grid-${m}x${l}-1gbit.json"
done
echo "two_level_sweep.sh: records in $out"
