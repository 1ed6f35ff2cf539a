#!/usr/bin/env bash
# Runs gradcomm-cpu-cost natively (thread CPU time, memory-traffic floor) and under
# callgrind (instructions), one after the other, and writes the merged markdown table
# and JSON (bench/cpu_cost/README.md).
#
#   bench/cpu_cost/run.sh OUT.md [OUT.json]
#
# Environment: BIN (default build-cc/bench/gradcomm-cpu-cost), SIZES (native,
# default 1M,4M,16M,64M), CG_SIZES (callgrind, default 1M,4M: callgrind runs some
# 50x slower, and instructions per element do not depend on n beyond small fixed
# costs, which the two sizes show), REPS (default 5), ONLY (compressor prefixes),
# TREE (how the header names the tree the binary was built from).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
md=${1:?usage: run.sh OUT.md [OUT.json]}
json=${2:-${md%.md}.json}
bin=${BIN:-$root/build-cc/bench/gradcomm-cpu-cost}
sizes=${SIZES:-1M,4M,16M,64M}
cg_sizes=${CG_SIZES:-1M,4M}
reps=${REPS:-5}
only=()
[[ -n "${ONLY:-}" ]] && only=(--only "$ONLY")

# One thread everywhere: CLOCK_THREAD_CPUTIME_ID sees only the calling thread, and
# callgrind would serialize a pool anyway.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# What else ran (the CPU times share caches and memory bandwidth with it).
busy=$(ps -eo pcpu=,comm= --sort=-pcpu | head -4 | awk '{printf "%s%s %s%%", (NR > 1 ? ", " : ""), $2, $1}')
# OpenBLAS picks its kernel from CPUID, which valgrind virtualizes: record both picks.
blas_core() { OPENBLAS_VERBOSE=2 "$@" --sizes 4K --reps 1 --bandwidth-mib 0 --only powersgd 2>&1 |
              sed -n 's/^Core: //p' | head -1; }
core_native=$(blas_core "$bin")
core_valgrind=$(blas_core valgrind -q "$bin")

native_cmd=("$bin" --sizes "$sizes" --reps "$reps" --json "$tmp/native.json" "${only[@]}")
echo "+ ${native_cmd[*]}" >&2
"${native_cmd[@]}" | tee "$tmp/native.txt" >&2

cg_cmd=(valgrind --tool=callgrind --collect-atstart=no "--callgrind-out-file=$tmp/cg.%p"
        "$bin" --sizes "$cg_sizes" --reps 1 --bandwidth-mib 0 "${only[@]}")
echo "+ ${cg_cmd[*]}" >&2
"${cg_cmd[@]}" > "$tmp/callgrind.txt" 2>&1 || { tail -20 "$tmp/callgrind.txt" >&2; exit 1; }
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

bw=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["memcpy_bytes_per_ns"])' "$tmp/native.json")
# The tree the binary was built from (TREE overrides, e.g. for a build of an exported commit).
tree=${TREE:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo '?')}
header="## gradcomm-cpu-cost — $(date -u +%Y-%m-%dT%H:%MZ), tree $tree

- native: \`${native_cmd[*]/$tmp\//}\`
- callgrind: \`${cg_cmd[*]/$tmp\//}\`
- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(grep -c ^processor /proc/cpuinfo) cores; load average $load_before before, $load_after after
- busiest processes at the start: $busy
- OpenBLAS kernel (PowerSGD's products): ${core_native:-?} natively, ${core_valgrind:-?} under valgrind
- memcpy bandwidth (read + write bytes, 256 MiB, median of 5): $bw GB/s
- Ir/e: callgrind instructions per element, one execution; CPU ns/e: median thread CPU time over $reps executions;
  floor ns/e: the traffic formula's bytes / memcpy bandwidth; CPU/floor at the largest size."
python3 "$here/report.py" --native "$tmp/native.json" --callgrind-dir "$tmp" --md "$md" --json "$json" \
  --header "$header"
echo "wrote $md and $json" >&2
