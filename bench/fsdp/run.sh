#!/usr/bin/env bash
# Compressed FSDP against dense FSDP over gloo on the emulated cluster (bench/cluster/netns.sh:
# one namespace per rank, each rank's egress shaped to --rate): the FSDP example
# (python_bindings/examples/fsdp.py, fully_shard, MLP 784-H-H-10 on Fashion-MNIST) per
# variant, rounds interleaved. Each run: epoch 1 (--steps steps) is the warm-up, epoch 2
# (--steps steps) is timed; the record is the example's epoch-2 JSON line (step time, and
# for gradcomm the group's counters: reduce-scatter bytes sent against a dense ring's).
#
#   bench/fsdp/run.sh --python VENV/bin/python --build build [--rate 1gbit] [--rounds 3]
#                     [--steps 40] [--hidden 2048,2048] [--out bench/results/fsdp-<date>]
#                     [--variants gloo,gradcomm:none,gradcomm:quant:bits=8,gradcomm:topk:ratio=0.01]
#
# Variants: gloo (dense FSDP over gloo), gradcomm:SPEC (FSDP on the "gradcomm" backend with
# set_compression(WORLD, SPEC); gradcomm:none is its dense transport alone).
# Output: OUT/records.jsonl, OUT/logs/, and the table (bench/fsdp/report.py) in OUT.md.
# Needs root, ip, tc, a torch >= 2 interpreter and a build of the package for it: BUILD/python-torch2
# (a build configured with -DGRADCOMM_TORCH2_PYTHON=VENV/bin/python), else BUILD/python.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
src=$(cd "$here/../.." && pwd -P)
variants=(gloo gradcomm:none gradcomm:quant:bits=8 gradcomm:topk:ratio=0.01)
py="" build="" rate=1gbit rounds=3 steps=40 hidden=2048,2048 out="$src/bench/results/fsdp-$(date +%F)"
while (($#)); do
  case $1 in
    --python) py=$2; shift 2 ;; --build) build=$(cd "$2" && pwd -P); shift 2 ;; --rate) rate=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;; --steps) steps=$2; shift 2 ;; --hidden) hidden=$2; shift 2 ;;
    --out) out=$2; shift 2 ;; --variants) IFS=, read -r -a variants <<<"$2"; shift 2 ;; *) echo "fsdp/run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $py && -n $build ]] || { echo "fsdp/run.sh: --python and --build are required" >&2; exit 2; }
package=$build/python
[[ -d $build/python-torch2/gradcomm ]] && package=$build/python-torch2
NETNS_PY=$py
# shellcheck source=../cluster/netns.sh
source "$src/bench/cluster/netns.sh"
mkdir -p "$out/logs"
records=$out/records.jsonl
: >"$records"
echo "$0 $*" >"$out/commands.txt"
netns_up 2 "$rate"
for round in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    tag=$(printf '%s' "r$round-$v" | tr -c 'A-Za-z0-9._=-' '_')
    port=$(netns_free_port)
    args=(--backend gloo)
    [[ $v == gradcomm:* ]] && args=(--backend gradcomm --compression "${v#gradcomm:}")
    pids=()
    for r in 0 1; do
      netns_exec "$r" MASTER_PORT="$port" PYTHONPATH="$package" PYTHONDONTWRITEBYTECODE=1 \
        timeout --signal=KILL 600 "$py" "$src/python_bindings/examples/fsdp.py" "${args[@]}" --epochs 2 \
          --max-steps "$steps" --hidden "$hidden" --json "$out/logs/$tag.jsonl" >"$out/logs/$tag.rank$r.log" 2>&1 &
      pids+=($!)
    done
    if netns_wait_ranks "${pids[@]}"; then
      tail -n 1 "$out/logs/$tag.jsonl" | "$py" -c "import json,sys; r=json.loads(sys.stdin.read()); \
r.update(variant='$v', round=$round, rate='$rate', hidden='$hidden'); print(json.dumps(r))" >>"$records"
      echo "fsdp/run.sh: $v round $round done"
    else
      echo "fsdp/run.sh: FAILED: $v round $round (logs: $out/logs/$tag.rank*.log)" >&2
      tail -n 15 "$out/logs/$tag.rank0.log" >&2 || true
    fi
  done
done
"$py" "$here/report.py" "$records" >"$out.md"
cat "$out.md"
