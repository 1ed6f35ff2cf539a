#!/usr/bin/env bash
# The cluster-emulation sweep of bench/results/cluster-<date>.md: ranks x link rate x
# size x compressor, each cell from bench/cluster/run.sh (one namespace per rank).
#   bench/cluster/sweep.sh [OUT_DIR]          (default bench/results/cluster-$(date +%F))
# Environment: RANKS="2 4 8" RATES="1gbit 10gbit 25gbit" SIZES=1M,16M,100M,256M
#              DELAY=50us ITERS=5 BUILD=build COMPRESSORS="none;topk:ratio=0.01;..." (";"-separated)
# Then: /usr/bin/python3 bench/cluster/report.py OUT_DIR  (table, plots, model check).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/cluster-$(date +%F)}
mkdir -p "$out"
ranks_list=${RANKS:-"2 4 8"}
rates=${RATES:-"1gbit 10gbit 25gbit"}
sizes=${SIZES:-1M,16M,100M,256M}
delay=${DELAY:-50us}
iters=${ITERS:-5}
build=${BUILD:-build}
compressors=${COMPRESSORS:-"none;topk:ratio=0.01;topk:ratio=0.001;topk:ratio=0.01,select=sample,values=fp16;quant:bits=4;sign;fp16;sketch:rows=3,cols=65536,ratio=0.01;randomk:ratio=0.01"}
{
  echo "date: $(date -Is)"
  echo "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "ranks: $ranks_list; rates: $rates; sizes: $sizes; delay: $delay; iters: $iters"
  echo "compressors: $compressors"
} >"$out/sweep-info.txt"
for n in $ranks_list; do
  for rate in $rates; do
    f="$out/n${n}-${rate}.json"
    if [[ -s $f ]]; then echo "# have $f"; continue; fi
    echo "# N=$n rate=$rate"
    bench/cluster/run.sh --ranks "$n" --rate "$rate" --delay "$delay" --sizes "$sizes" \
      --compressors "$compressors" --baselines mpi,gloo --iters "$iters" --warmup 1 \
      --build "$build" --json "$f.tmp" 2>&1 | tee "$out/n${n}-${rate}.log" ||
      echo "# N=$n rate=$rate: some runs failed (see $out/n${n}-${rate}.log); keeping the records that came out"
    [[ -s $f.tmp ]] && mv "$f.tmp" "$f"
  done
done
