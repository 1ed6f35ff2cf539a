#!/usr/bin/env bash
# Cloud-cluster emulation on one machine: one network namespace per rank, joined by a
# bridge, every rank's link shaped with tc (rate, and delay where the kernel has netem),
# then gradcomm-bench (and the MPI / Gloo baselines) inside, one rank per namespace.
#
#   bench/cluster/run.sh --ranks 4 --rate 1gbit --delay 100us --sizes 1M,16M,100M \
#       --compressors none,topk:ratio=0.01,quant:bits=4 --baselines mpi,gloo --json out.json
#
# The cluster comes from bench/cluster/netns.sh (shared with bench/e2e/run.sh): bridge
# gcbr<pid>, namespaces gcns<pid>_<r>, veth pairs gcv<pid>_<r> <-> eth0 (inside), addresses
# 10.<a>.<b>.<r+1>/24 on a subnet no route on the host already uses. Its trap removes all of
# it on exit, error, Ctrl-C or SIGTERM. Needs root, ip, tc.
#
# Shaping: each rank's eth0 egress is a token bucket (tbf) at --rate, so a rank can send
# at most RATE, like a NIC; the bridge itself is not a bottleneck. --delay adds a netem
# delay in front when the kernel has sch_netem; when it has not, the delay is NOT applied,
# the script says so, and every record carries "delay_applied": false.
#
# Nodes of several ranks (docs/two-levels.md): --nodes M --ranks-per-node L puts L ranks in each
# of M namespaces, one shaped link per node; gradcomm keeps shared memory inside a node and TCP
# between them. --hierarchies auto,off measures gradcomm over two levels and flat in the same run
# (GRADCOMM_HIERARCHY; each record says which), --schedules likewise GRADCOMM_SCHEDULE. Every
# record carries the bytes each node put on its link during its run, per call (the veth's counter
# over the run, divided by warm-up + timed + check calls: setup traffic is in it, a few KB).
#
# Output: per (size, compressor, impl) one record (gradcomm-bench's JSON plus rate, delay,
# ranks), all written to --json FILE as one list, and a table on stdout.
set -euo pipefail

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  cat <<EOF
Options:
  --ranks N            ranks, one namespace each (default 4)
  --nodes M --ranks-per-node L   M namespaces of L ranks each (M x L ranks; replaces --ranks)
  --hierarchies LIST   GRADCOMM_HIERARCHY values to run gradcomm with, e.g. auto,off (default auto)
  --schedules LIST     GRADCOMM_SCHEDULE values, e.g. ring,direct (default auto)
  --check N            gradcomm-bench's -c N: check each size N times (closed-form inputs; wrong counts in the records)
  --rate RATE          per-rank link rate, tc syntax: 1gbit, 10gbit, 25gbit (default 1gbit)
  --delay DELAY        one-way delay added per link, tc syntax: 50us, 1ms; 0 = none (default 0)
  --sizes LIST         message sizes, bytes with K/M/G (default 1M,16M,100M)
  --compressors LIST   gradcomm compressor specs, ';'- or ','-separated where unambiguous
                       (use ';' when a spec has ',' in it) (default none)
  --baselines LIST     mpi,gloo or none (default mpi,gloo); measured with the 'none' runs
  --iters N            timed iterations per size (default 10)
  --warmup N           warm-up iterations per size (default 2)
  --build DIR          build directory with tools/ and bench/ (default build)
  --json FILE          where to write the records (default cluster.json)
  --timeout S          per bench invocation (default 900)
EOF
}

ranks=4 rate=1gbit delay=0 sizes=1M,16M,100M compressors=none baselines=mpi,gloo
iters=10 warmup=2 build=build json=cluster.json timeout_s=900 nodes=0 per_node=1 hierarchies=auto schedules=auto check=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --ranks-per-node) per_node=$2; shift 2 ;;
    --hierarchies) hierarchies=$2; shift 2 ;;
    --schedules) schedules=$2; shift 2 ;;
    --check) check=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --compressors) compressors=$2; shift 2 ;;
    --baselines) baselines=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "run.sh: $*" >&2; exit 1; }
if ((nodes > 0)); then
  [[ $per_node =~ ^[0-9]+$ && $per_node -ge 1 ]] || die "--ranks-per-node must be 1 or more, got '$per_node'"
  ranks=$((nodes * per_node))
fi
[[ $ranks =~ ^[0-9]+$ && $ranks -ge 2 && $ranks -le 64 ]] || die "--ranks must be 2..64, got '$ranks'"
export NETNS_RANKS_PER_NODE=$per_node
bench=$(realpath "$build/bench/gradcomm-bench") || die "no $build/bench/gradcomm-bench (build with -DGRADCOMM_BENCH=ON)"
[[ -x $bench ]] || die "$bench is not executable"
py=/usr/bin/python3
json=$(realpath -m "$json")
[[ $ranks -gt $(nproc) ]] && echo "run.sh: note: $ranks ranks on $(nproc) cores: ranks share cores (oversubscribed)" >&2

# ---- the emulated cluster (bench/cluster/netns.sh: setup, the cleanup trap) ----------
source "$(dirname "${BASH_SOURCE[0]}")/netns.sh"
workdir=$(mktemp -d /tmp/gradcomm-cluster-XXXXXX)
netns_at_exit 'rm -rf "$workdir"'
netns_up "$ranks" "$rate" "$delay"

# ---- running the benchmark in it ------------------------------------------------------
run_id=0
# run_bench COMPRESSOR BASELINE SIZE [HIERARCHY [SCHEDULE]] -> appends records to $workdir/records.jsonl
run_bench() {
  local compressor=$1 baseline=$2 size=$3 hierarchy=${4:-auto} schedule=${5:-auto} before after
  run_id=$((run_id + 1))
  local port; port=$(netns_free_port)
  local token; token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local out="$workdir/run$run_id.json" pids=() r failed=0
  before=$(netns_link_bytes)
  for r in $(seq 0 $((ranks - 1))); do
    netns_exec "$r" GRADCOMM_STORE="tcp://$NETNS_SUBNET.1:$port" GRADCOMM_JOB_TOKEN="$token" \
      GRADCOMM_HIERARCHY="$hierarchy" GRADCOMM_SCHEDULE="$schedule" \
      MASTER_PORT=$((port + 1)) GRADCOMM_BENCH_GLOO_HOST="$(netns_ip "$r")" \
      GRADCOMM_TIMEOUT_S="${GRADCOMM_TIMEOUT_S:-120}" \
      timeout --signal=KILL "$timeout_s" "$bench" -b "$size" -e "$size" -n "$iters" -w "$warmup" \
        --compressor "$compressor" --baseline "$baseline" --phases -c "$check" --json "$out" \
      >"$workdir/run$run_id.rank$r.log" 2>&1 &
    pids+=($!)
  done
  netns_wait_ranks "${pids[@]}" || failed=1
  after=$(netns_link_bytes)
  if [[ $failed -ne 0 || ! -s $out ]]; then
    echo "run.sh: bench failed (compressor=$compressor baseline=$baseline size=$size); rank logs:" >&2
    tail -n 5 "$workdir"/run$run_id.rank*.log >&2
    return 1
  fi
  $py - "$out" "$workdir/records.jsonl" "$rate" "$delay" "$NETNS_DELAY_APPLIED" "$hierarchy" "$schedule" \
    "$NETNS_NODES" "$NETNS_RANKS_PER_NODE" "$before" "$after" "$((iters + warmup + check))" <<'EOF'
import json, sys
src, dst, rate, delay, applied, hierarchy, schedule, nodes, per_node, before, after, calls = sys.argv[1:]
recs = json.load(open(src))
# The veths count the whole run: every record of it shares it (one size per run here).
link = [(int(a) - int(b)) / int(calls) for a, b in zip(after.split(), before.split())]
with open(dst, "a") as f:
    for rec in recs:
        rec.update(link_rate=rate, delay=delay, delay_applied=applied == "true", nodes=int(nodes),
                   ranks_per_node=int(per_node))
        if rec.get("impl") == "gradcomm":
            rec.update(hierarchy=hierarchy, schedule=schedule, node_link_bytes_per_call=link)
        f.write(json.dumps(rec) + "\n")
EOF
}

IFS=',' read -r -a size_list <<<"$sizes"
# ';' always separates specs. Without one, ',' does, unless a piece is a bare
# key=value (then the ',' belonged to a spec: "topk:ratio=0.01,select=sample").
if [[ $compressors == *";"* ]]; then
  IFS=';' read -r -a comp_list <<<"$compressors"
else
  IFS=',' read -r -a comp_list <<<"$compressors"
  for piece in "${comp_list[@]}"; do
    if [[ $piece == *=* && $piece != *:* ]]; then comp_list=("$compressors"); break; fi
  done
fi
IFS=',' read -r -a base_list <<<"$baselines"
IFS=',' read -r -a hier_list <<<"$hierarchies"
IFS=',' read -r -a sched_list <<<"$schedules"
: >"$workdir/records.jsonl"
status=0
for size in "${size_list[@]}"; do
  for c in "${comp_list[@]}"; do
    for h in "${hier_list[@]}"; do  # hierarchies and schedules interleaved within a size
      for sc in "${sched_list[@]}"; do
        if [[ $c == none ]]; then
          # gradcomm's dense ring and each peer, measured in the same run (interleaved).
          for b in "${base_list[@]}"; do run_bench none "$b" "$size" "$h" "$sc" || status=1; done
          [[ ${#base_list[@]} -eq 0 ]] && { run_bench none none "$size" "$h" "$sc" || status=1; }
        else
          run_bench "$c" none "$size" "$h" "$sc" || status=1
        fi
      done
    done
  done
done

$py - "$workdir/records.jsonl" "$json" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump(recs, open(sys.argv[2], "w"), indent=1)
print(f"# {len(recs)} records -> {sys.argv[2]}")
print(f"# {'size(B)':>10} {'impl':>9} {'compressor':<28} {'hier':>5} {'sched':>6} {'rate':>7} {'time(us)':>11} "
      f"{'busbw':>7} {'wire(B)':>11} {'encode':>9} {'decode':>9} {'comm':>10} {'wrong':>5}  node link bytes/call")
for r in recs:
    ph = lambda k: f"{r[k]:9.0f}" if r.get(k) is not None else f"{'-':>9}"
    links = " ".join(f"{b:.0f}" for b in r.get("node_link_bytes_per_call", []))
    print(f"  {r['size_bytes']:>10} {r['impl']:>9} {r.get('compressor') or '-':<28} {r.get('hierarchy', '-'):>5} "
          f"{r.get('schedule', '-'):>6} {r['link_rate']:>7} {r['time_us']:11.1f} {r['busbw_gbps']:7.3f} "
          f"{r.get('wire_bytes') or 0:11.0f} {ph('encode_us')} {ph('decode_us')} {ph('comm_us'):>10} "
          f"{r.get('wrong') if r.get('wrong') is not None else '-':>5}  {links}")
EOF
exit $status
