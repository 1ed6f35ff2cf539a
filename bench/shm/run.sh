#!/bin/bash
# One host, dense collectives on the node's shared segment (docs/shared-memory.md) against
# OpenMPI (vader) and Gloo in the same runs, N = 2 and 4, and the memory-traffic floor.
#   bench/shm/run.sh BUILD OUT_DIR [ROUNDS]
# Writes OUT_DIR/<round>-<what>-n<N>.txt (gradcomm-bench tables) and copy-n<N>.txt.
set -euo pipefail
build=${1:?build dir}; out=${2:?out dir}; rounds=${3:-3}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
port=$((29700 + RANDOM % 200))
bench="$build/bench/gradcomm-bench"
mpi() {  # N, file, args...
  local n=$1 file=$2; shift 2
  port=$((port + 1))
  timeout 600 mpirun -n "$n" --oversubscribe --bind-to none -x GRADCOMM_STORE="tcp://127.0.0.1:$port" \
    "$bench" "$@" > "$file" 2>&1 || echo "failed: $file" >&2
}
for round in $(seq 1 "$rounds"); do
  for n in 2 4; do
    echo "round $round N=$n" >&2
    mpi "$n" "$out/$round-allreduce-mpi-n$n.txt" -b 8 -e 64M -f 4 -n 20 -w 3 --baseline mpi
    mpi "$n" "$out/$round-reduce_scatter-mpi-n$n.txt" --op reduce_scatter -b 64K -e 64M -f 4 -n 20 -w 3 --baseline mpi
    timeout 600 "$build/tools/gradcomm-run" -n "$n" "$bench" -b 8 -e 64M -f 4 -n 20 -w 3 --baseline gloo \
      > "$out/$round-allreduce-gloo-n$n.txt" 2>&1 || echo "failed: gloo n$n" >&2
    timeout 300 "$build/tools/gradcomm-run" -n "$n" -- /usr/bin/python3 "$(dirname "$0")/copy_floor.py" 16777216 20 \
      >> "$out/copy-n$n.txt" 2>&1 || true
  done
done
