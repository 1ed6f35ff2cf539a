#!/usr/bin/env bash
# End-to-end DDP step time on the emulated cluster (bench/cluster/netns.sh): for each link
# rate, one namespace per rank, then every variant once per round, rounds interleaved, so
# drifts of the machine (other jobs, thermal, page cache) hit every variant alike.
#
#   bench/e2e/run.sh --ranks 4 --rates 1gbit,10gbit --rounds 3 --steps 30 --build build
#
# Variants (--variants, ';'- or ','-separated as in bench/cluster/run.sh):
#   gloo | fp16 | powersgd[:buckets=one|cap|default] | gradcomm:SPEC | backend:SPEC | compute
#                                                      bench/e2e/ddp_step.py, one rank per namespace
#                                                      (gradcomm:SPEC: gradcomm's DDP hook over a gloo
#                                                      group; backend:SPEC: DDP on init_process_group
#                                                      ("gradcomm") compressing with SPEC, no hook)
#   train:overlap | train:no-overlap                   BUILD/trainer/gradcomm-train (MLP 784-2048-2048-10,
#                                                      batch 64, --compressor topk:ratio=0.01)
# Nodes of several ranks (docs/two-levels.md): --nodes M --ranks-per-node L, a namespace per node
# holding its ranks (bench/cluster/netns.sh); --hierarchies auto,off runs every gradcomm variant
# (gradcomm:, backend:, train:) once per GRADCOMM_HIERARCHY value in each round. Every record
# carries the bytes each node put on its link per step (veth counters over the run).
# Every run has a deadline (--timeout); the first rank to fail ends its run, its log is shown,
# the run is recorded as failed and the next one starts. Output: OUT/records.jsonl (one JSON
# record per run), OUT/logs/, and the report (bench/e2e/report.py): OUT.md and OUT.png.
# Needs root, ip, tc; a Python with torch (/usr/bin/python3, Debian's torch 1.13, or --python, e.g.
# the torch 2.x venv of scripts/install-torch2-venv.sh); a build with trainer/ and the Python package.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
command_line=$(printf '%q ' "$0" "$@")
default_variants="gloo;fp16;powersgd;gradcomm:none;gradcomm:fp16;gradcomm:quant:bits=4;gradcomm:topk:ratio=0.01;train:overlap;train:no-overlap;compute"
usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  cat <<EOF
Options:
  --ranks N          ranks, one namespace each (default 4)
  --nodes M --ranks-per-node L   M namespaces of L ranks each (replaces --ranks)
  --hierarchies LIST GRADCOMM_HIERARCHY values for the gradcomm variants (default auto)
  --rates LIST       per-rank link rates, tc syntax, comma-separated (default 1gbit,10gbit)
  --rounds R         rounds; each runs every variant once (default 3)
  --steps S          timed steps per run (default 30)
  --warmup W         untimed steps first (default 5; the trainer runs one untimed epoch instead)
  --variants LIST    (default: $default_variants)
  --build DIR        build directory: trainer/, python/ (default build)
  --python PY        the interpreter the DDP variants run under (default /usr/bin/python3). With
                     torch >= 2 it imports BUILD/python-torch2 (GRADCOMM_TORCH2_PYTHON=PY at
                     configure time) where that exists, else BUILD/python. Debian's torch 1.13
                     runs its matrix products on OpenBLAS, about 3x slower per step here than
                     the PyPI wheel's MKL: the compute share of a step depends on this choice.
  --out DIR          records and logs; the report goes to DIR.md, DIR.png
                     (default bench/results/e2e-<date>)
  --timeout S        deadline of one run, every rank (default 300)
  --profile          per hook call timings in the gradcomm records (ddp_step.py --profile)
  --ddp-args "ARGS"  more ddp_step.py options for the DDP variants, e.g. "--eval 2000 --seed 2"
                     (test accuracy after the last step, in the records; see ddp_step.py --help)
EOF
}

ranks=4 rates=1gbit,10gbit rounds=3 steps=30 warmup=5 variants=$default_variants build=build
out="" timeout_s=300 profile="" ddp_args="" py=/usr/bin/python3 nodes=0 per_node=1 hierarchies=auto
while [[ $# -gt 0 ]]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --ranks-per-node) per_node=$2; shift 2 ;;
    --hierarchies) hierarchies=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --profile) profile=--profile; shift ;;
    --ddp-args) ddp_args=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "e2e/run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "e2e/run.sh: $*" >&2; exit 1; }
# A rank stuck where its peers are not prints its Python stacks before theirs time out
# (GRADCOMM_TIMEOUT_S=120 below) and the run is torn down: at 100 s, or at 90 % of a
# shorter --timeout.
if ((nodes > 0)); then
  [[ $per_node =~ ^[0-9]+$ && $per_node -ge 1 ]] || die "--ranks-per-node must be 1 or more, got '$per_node'"
  ranks=$((nodes * per_node))
fi
export NETNS_RANKS_PER_NODE=$per_node
IFS=',' read -r -a hierarchy_list <<<"$hierarchies"
[[ $ranks =~ ^[0-9]+$ && $ranks -ge 2 && $ranks -le 64 ]] || die "--ranks must be 2..64, got '$ranks'"
for n in rounds steps timeout_s; do [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "--${n%_s} must be a positive integer"; done
[[ $warmup =~ ^[0-9]+$ ]] || die "--warmup must be an integer >= 0"
build=$(realpath "$build") || die "no build directory '$build'"
hang_dump_s=$((timeout_s * 9 / 10 < 100 ? timeout_s * 9 / 10 : 100))
out=$(realpath -m "${out:-$here/../results/e2e-$(date +%F)}")
torch_version=$("$py" -c 'import torch, numpy; print(torch.__version__)' 2>/dev/null) ||
  die "$py cannot import torch and numpy (Debian: python3-torch; or --python a venv's interpreter)"
# The package the DDP variants import: the torch 2.x build of the backend for a torch 2.x.
pkg_dir=$build/python
[[ ${torch_version%%.*} -ge 2 && -f $build/python-torch2/gradcomm/__init__.py ]] && pkg_dir=$build/python-torch2

# ';' always separates variants. Without one, ',' does, unless a piece is a bare key=value
# (then the ',' belonged to a spec: "gradcomm:quant:bits=4,bucket=512").
if [[ $variants == *";"* ]]; then
  IFS=';' read -r -a variant_list <<<"$variants"
else
  IFS=',' read -r -a variant_list <<<"$variants"
  for piece in "${variant_list[@]}"; do
    if [[ $piece == *=* && $piece != *:* ]]; then variant_list=("$variants"); break; fi
  done
fi
trainer=$build/trainer/gradcomm-train
for v in "${variant_list[@]}"; do
  case $v in
    gloo|fp16|powersgd|powersgd:buckets=*|compute) ;;
    gradcomm:?*) [[ -f $pkg_dir/gradcomm/__init__.py ]] ||
                   die "variant $v needs the Python package: no $pkg_dir/gradcomm (GRADCOMM_PYTHON)" ;;
    backend:?*) compgen -G "$pkg_dir/gradcomm/_gradcomm_torch*.so" >/dev/null ||
                   die "variant $v needs the torch backend: no $pkg_dir/gradcomm/_gradcomm_torch*.so (GRADCOMM_TORCH_BACKEND; torch 2.x: GRADCOMM_TORCH2_PYTHON)" ;;
    train:overlap|train:no-overlap) [[ -x $trainer ]] || die "variant $v needs $trainer" ;;
    *) die "unknown variant '$v' (gloo, fp16, powersgd, gradcomm:SPEC, backend:SPEC, train:overlap, train:no-overlap, compute)" ;;
  esac
done
IFS=',' read -r -a rate_list <<<"$rates"
# The trainer gets --no-overlap only where it has the flag; its record says which it was.
overlap_flag=false
trainer_help=$([[ -x $trainer ]] && "$trainer" --help 2>&1 || true)
[[ $trainer_help == *--no-overlap* ]] && overlap_flag=true
src_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
commit=$(git -C "${src_dir:-.}" describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)

source "$here/../cluster/netns.sh"
mkdir -p "$out/logs"
records=$out/records.jsonl
touch "$records"
echo "$command_line" >>"$out/commands.txt"
echo "# e2e: $ranks ranks ($per_node per node), hierarchies $hierarchies, rates $rates, $rounds round(s) x ${#variant_list[@]} variant(s), $steps timed steps," \
     "build $build ($commit), torch $torch_version ($py, package $pkg_dir), out $out" >&2

# ---- one run ------------------------------------------------------------------------------
# run_variant VARIANT ROUND [HIERARCHY]: starts every rank in its namespace, waits (first
# failure ends the run), appends one record to $records. Returns 1 when the run failed.
run_variant() {
  local v=$1 round=$2 hierarchy=${3:-auto} tag pids=() r failed=0 t0 port token before after
  tag=$(printf '%s' "$NETNS_RATE-r$round-$v-h$hierarchy" | tr -c 'A-Za-z0-9._=-' '_')
  local logs=$out/logs/$tag rec=$out/logs/$tag.json
  rm -f "$logs".* "$rec"
  port=$(netns_free_port)
  token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  t0=$EPOCHREALTIME
  before=$(netns_link_bytes)
  for r in $(seq 0 $((ranks - 1))); do
    if [[ $v == train:* ]]; then
      local extra=()
      [[ $v == train:no-overlap && $overlap_flag == true ]] && extra=(--no-overlap)
      # Epoch 1 is the warm-up; epoch 2 is timed. --steps steps per rank per epoch.
      netns_exec "$r" GRADCOMM_STORE="tcp://$NETNS_SUBNET.1:$port" GRADCOMM_JOB_TOKEN="$token" \
        GRADCOMM_HIERARCHY="$hierarchy" GRADCOMM_TIMEOUT_S=120 timeout --signal=KILL "$timeout_s" "$trainer" \
          --hidden 2048,2048 --batch-size 64 --compressor topk:ratio=0.01 --epochs 2 \
          --limit-train $((steps * ranks * 64)) --limit-test 1000 --threads 1 --seed 1 \
          --log "$logs.rank{rank}.jsonl" "${extra[@]}" >"$logs.rank$r.log" 2>&1 &
    else
      netns_exec "$r" MASTER_PORT="$port" PYTHONPATH="$pkg_dir" PYTHONDONTWRITEBYTECODE=1 \
        GRADCOMM_HIERARCHY="$hierarchy" GRADCOMM_TIMEOUT_S=120 GRADCOMM_E2E_HANG_DUMP_S=$hang_dump_s \
        timeout --signal=KILL "$timeout_s" \
          "$py" "$here/ddp_step.py" "$v" --warmup "$warmup" --steps "$steps" --out "$rec" $profile $ddp_args \
          >"$logs.rank$r.log" 2>&1 &
    fi
    pids+=($!)
  done
  netns_wait_ranks "${pids[@]}" || failed=1
  after=$(netns_link_bytes)
  local wall; wall=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  if [[ $v == train:* && $failed -eq 0 ]]; then
    "$py" "$here/train_record.py" "$v" "$ranks" "$overlap_flag" "$logs".rank*.jsonl >"$rec" || failed=1
  fi
  [[ -s $rec ]] || failed=1
  if ((failed)); then
    echo "e2e/run.sh: FAILED: $v at $NETNS_RATE, round $round; rank logs ($logs.rank*.log):" >&2
    for r in $(seq 0 $((ranks - 1))); do
      echo "---- rank $r" >&2; tail -n 15 "$logs.rank$r.log" >&2 || true
    done
    echo "{\"variant\": \"$v\"}" >"$rec"
  fi
  "$py" - "$rec" "$records" "$NETNS_RATE" "$round" "$failed" "$wall" "$load" "$commit" "$build" \
        "$NETNS_DELAY_APPLIED" "$(nproc)" "$hierarchy" "$NETNS_NODES" "$NETNS_RANKS_PER_NODE" "$before" "$after" \
        "$((warmup + steps))" <<'EOF'
import datetime, json, sys
(src, dst, rate, rnd, failed, wall, load, commit, build, delay, cores, hierarchy, nodes, per_node, before, after,
 steps) = sys.argv[1:]
rec = json.load(open(src))
rec.update(link_rate=rate, round=int(rnd), ok=failed == "0", run_wall_s=float(wall), loadavg_1m=float(load),
           commit=commit, build=build, delay_applied=delay == "true", cores=int(cores), hierarchy=hierarchy,
           nodes=int(nodes), ranks_per_node=int(per_node),
           date=datetime.datetime.now().isoformat(timespec="seconds"))
if not str(rec.get("variant", "")).startswith("train:"):  # DDP variants: warm-up + timed steps
    rec["node_link_bytes_per_step"] = [(int(a) - int(b)) / int(steps) for a, b in zip(after.split(), before.split())]
with open(dst, "a") as f:
    f.write(json.dumps(rec) + "\n")
med = rec.get("step_s_median")
print(f"  {rate:>7} round {rnd} {rec['variant']:<28} {hierarchy:>4} " +
      (f"step {med * 1e3:8.1f} ms (p90 {rec['step_s_p90'] * 1e3:.1f})" if rec["ok"] and med else "FAILED") +
      f"  [{float(wall):.0f} s]", file=sys.stderr)
EOF
  rm -f "$rec"  # its content is the record's, now in $records
  return "$failed"
}

status=0
for rate in "${rate_list[@]}"; do
  netns_up "$ranks" "$rate"
  for round in $(seq 1 "$rounds"); do
    for v in "${variant_list[@]}"; do
      case $v in
        gradcomm:*|backend:*|train:*)
          for h in "${hierarchy_list[@]}"; do run_variant "$v" "$round" "$h" || status=1; done ;;
        *) run_variant "$v" "$round" || status=1 ;;
      esac
    done
  done
  netns_down
done

/usr/bin/python3 "$here/report.py" "$out" || status=1
exit $status
