#!/usr/bin/env bash
# Time to accuracy on the emulated cluster (issue [R]): gradcomm-train, one rank per network
# namespace (bench/cluster/netns.sh), for each link rate every variant once per round, rounds
# interleaved. A variant is a --compressor spec ("none" is the dense ring); each run logs one
# JSON line per epoch and rank 0's lines become the run's record. bench/tta/report.py then
# gives, per rate and variant, the training time (wall, evaluation excluded) until the test
# accuracy first reaches the target, the final accuracy and the bytes sent.
#
#   sudo bench/tta/run.sh --rates 1gbit,10gbit,unshaped --rounds 1 \
#     --variants "none;bf16;quant:bits=4,ef=1;topk:ratio=0.01;auto" --target 0.85
#   # -> bench/results/tta-<date>/records.jsonl, logs/; tta-<date>.md and .png
#
# Options: --ranks N (2), --rates LIST (1gbit,10gbit,unshaped; "unshaped": no tbf), --rounds R
# (1), --variants LIST (';'-separated specs), --target ACC (0.85), --epochs E (6),
# --train-args "ARGS" (the trainer's model and schedule; default below), --build DIR (build),
# --out DIR, --timeout S (900 per run). Top-k and auto runs add --momentum-correction (DGC's,
# where the layer's allreduce sparsifies: the conservative setting for top-k).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ranks=2 rates=1gbit,10gbit,unshaped rounds=1 target=0.85 epochs=6 build=build timeout_s=900 out=""
variants="none;bf16;quant:bits=4,ef=1;topk:ratio=0.01;auto"
# 15,000 training examples per epoch (235 steps of 2 x 32), the full test set, cosine schedule.
train_args="--hidden 512,256 --batch-size 32 --lr 0.1 --momentum 0.9 --warmup-epochs 0.5 --limit-train 15000 --threads 1 --seed 1"
while [[ $# -gt 0 ]]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --train-args) train_args=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tta/run.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
trainer=$build/trainer/gradcomm-train
[[ -x $trainer ]] || { echo "tta/run.sh: no $trainer (build it first)" >&2; exit 1; }
out=${out:-$here/../results/tta-$(date +%F)}
mkdir -p "$out/logs"
records=$out/records.jsonl
touch "$records"
echo "$0 $*" >>"$out/commands.txt"
IFS=';' read -r -a variant_list <<<"$variants"
IFS=',' read -r -a rate_list <<<"$rates"
commit=$(git -C "$here/../.." describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)

source "$here/../cluster/netns.sh"

run_variant() {  # run_variant SPEC ROUND
  local v=$1 round=$2 tag pids=() r failed=0 port token mc=()
  tag=$(printf '%s' "$NETNS_RATE-r$round-$v" | tr -c 'A-Za-z0-9._=-' '_')
  local logs=$out/logs/$tag
  rm -f "$logs".*
  [[ $v == topk:* || $v == auto || $v == auto:* ]] && mc=(--momentum-correction)
  port=$(netns_free_port)
  token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  for r in $(seq 0 $((ranks - 1))); do
    # shellcheck disable=SC2086
    netns_exec "$r" GRADCOMM_STORE="tcp://$NETNS_SUBNET.1:$port" GRADCOMM_JOB_TOKEN="$token" GRADCOMM_TIMEOUT_S=120 \
      GRADCOMM_LOG=info timeout --signal=KILL "$timeout_s" "$trainer" $train_args --epochs "$epochs" \
        --compressor "$v" "${mc[@]}" --log "$logs.rank{rank}.jsonl" >"$logs.rank$r.log" 2>&1 &
    pids+=($!)
  done
  netns_wait_ranks "${pids[@]}" || failed=1
  /usr/bin/python3 - "$logs.rank0.jsonl" "$records" "$v" "$NETNS_RATE" "$round" "$failed" "$load" "$commit" \
    "$train_args" "$(nproc)" <<'EOF'
import datetime, json, os, sys
src, dst, v, rate, rnd, failed, load, commit, args, cores = sys.argv[1:]
epochs = [json.loads(l) for l in open(src)] if os.path.exists(src) else []
rec = dict(variant=v, link_rate=rate, round=int(rnd), ok=failed == "0" and bool(epochs), epochs=epochs,
           loadavg_1m=float(load), commit=commit, train_args=args, cores=int(cores),
           date=datetime.datetime.now().isoformat(timespec="seconds"))
with open(dst, "a") as f:
    f.write(json.dumps(rec) + "\n")
last = epochs[-1] if epochs else {}
print(f"  {rate:>9} round {rnd} {v:<22} " + (f"acc {last['test_accuracy']:.4f} after {len(epochs)} epochs, "
      f"{sum(e['time_s'] - e['eval_s'] for e in epochs):.1f} s" if rec["ok"] else "FAILED"), file=sys.stderr)
EOF
  ((failed == 0)) || { echo "tta/run.sh: FAILED: $v at $NETNS_RATE (logs $logs.rank*.log)" >&2; tail -n 5 "$logs".rank*.log >&2; }
  return "$failed"
}

status=0
for rate in "${rate_list[@]}"; do
  netns_up "$ranks" "$rate"
  for round in $(seq 1 "$rounds"); do
    for v in "${variant_list[@]}"; do run_variant "$v" "$round" || status=1; done
  done
  netns_down
done
/usr/bin/python3 "$here/report.py" "$out" --target "$target" || status=1
exit $status
