#!/usr/bin/env bash
# Cloud-cluster emulation on one machine: one network namespace per rank, joined by a
# bridge, every rank's link shaped with tc (rate, and delay where the kernel has netem),
# then gradcomm-bench (and the MPI / Gloo baselines) inside, one rank per namespace.
#
#   bench/cluster/run.sh --ranks 4 --rate 1gbit --delay 100us --sizes 1M,16M,100M \
#       --compressors none,topk:ratio=0.01,quant:bits=4 --baselines mpi,gloo --json out.json
#
# What it creates (names carry this script's pid, so parallel runs do not collide):
#   bridge gcbr<pid>, namespaces gcns<pid>_<r>, veth pairs gcv<pid>_<r> <-> eth0 (inside),
#   addresses 10.<a>.<b>.<r+1>/24 on a subnet no route on the host already uses.
# A trap removes all of it on exit, error, Ctrl-C or SIGTERM. Needs root, ip, tc.
#
# Shaping: each rank's eth0 egress is a token bucket (tbf) at --rate, so a rank can send
# at most RATE, like a NIC; the bridge itself is not a bottleneck. --delay adds a netem
# delay in front when the kernel has sch_netem; when it has not, the delay is NOT applied,
# the script says so, and every record carries "delay_applied": false.
#
# Output: per (size, compressor, impl) one record (gradcomm-bench's JSON plus rate, delay,
# ranks), all written to --json FILE as one list, and a table on stdout.
set -euo pipefail

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  cat <<EOF
Options:
  --ranks N            ranks, one namespace each (default 4)
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
iters=10 warmup=2 build=build json=cluster.json timeout_s=900
while [[ $# -gt 0 ]]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
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
[[ $EUID -eq 0 ]] || die "needs root (network namespaces, tc)"
command -v ip >/dev/null || die "'ip' not found (Debian: iproute2)"
command -v tc >/dev/null || die "'tc' not found (Debian: iproute2)"
[[ $ranks =~ ^[0-9]+$ && $ranks -ge 2 && $ranks -le 64 ]] || die "--ranks must be 2..64, got '$ranks'"
bench=$(realpath "$build/bench/gradcomm-bench") || die "no $build/bench/gradcomm-bench (build with -DGRADCOMM_BENCH=ON)"
[[ -x $bench ]] || die "$bench is not executable"
py=/usr/bin/python3
json=$(realpath -m "$json")
[[ $ranks -gt $(nproc) ]] && echo "run.sh: note: $ranks ranks on $(nproc) cores: ranks share cores (oversubscribed)" >&2

# ---- the emulated cluster -------------------------------------------------------------
tag=$$
bridge=gcbr$tag
ns() { echo "gcns${tag}_$1"; }
workdir=$(mktemp -d /tmp/gradcomm-cluster-XXXXXX)
created_ns=() created_links=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  # Ranks first (a killed run may have left some), then namespaces, links and bridge.
  for r in "${created_ns[@]}"; do
    ip netns pids "$r" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  for r in "${created_ns[@]}"; do ip netns del "$r" 2>/dev/null || true; done
  for l in "${created_links[@]}"; do ip link del "$l" 2>/dev/null || true; done
  rm -rf "$workdir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A /24 in 10.0.0.0/8 that nothing on the host routes yet.
subnet=""
for a in $(seq 200 250); do
  for b in $(seq 0 250); do
    if ! ip route show | grep -q "^10\.$a\.$b\."; then subnet="10.$a.$b"; break 2; fi
  done
done
[[ -n $subnet ]] || die "no free 10.x.y.0/24 subnet"

ip link add "$bridge" type bridge
created_links+=("$bridge")
ip link set "$bridge" up

# tbf needs a bucket of at least rate/HZ bytes to reach its rate, and more than one
# GSO super-packet (64 KiB) or it stalls; 4 ms of traffic, at least 256 KiB.
rate_bytes_per_s=$($py - "$rate" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(bit|bps)", sys.argv[1].lower())
if not m: sys.exit(f"run.sh: cannot parse --rate '{sys.argv[1]}' (use e.g. 1gbit, 10gbit)")
v = float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m[2]]
print(int(v / 8 if m[3] == "bit" else v))
EOF
)
burst=$(( rate_bytes_per_s / 250 )); (( burst < 262144 )) && burst=262144
delay_applied=false
for r in $(seq 0 $((ranks - 1))); do
  n=$(ns "$r")
  ip netns add "$n"
  created_ns+=("$n")
  ip link add "gcv${tag}_$r" type veth peer name eth0 netns "$n"
  created_links+=("gcv${tag}_$r")
  ip link set "gcv${tag}_$r" master "$bridge" up
  ip -n "$n" addr add "$subnet.$((r + 1))/24" dev eth0
  ip -n "$n" link set eth0 up
  ip -n "$n" link set lo up
  if [[ $delay != 0 ]] && ip netns exec "$n" tc qdisc add dev eth0 root handle 1: netem delay "$delay" 2>/dev/null; then
    ip netns exec "$n" tc qdisc add dev eth0 parent 1: handle 2: tbf rate "$rate" burst "$burst" latency 100ms
    delay_applied=true
  else
    ip netns exec "$n" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
  fi
done
if [[ $delay != 0 && $delay_applied == false ]]; then
  echo "run.sh: WARNING: this kernel has no sch_netem: --delay $delay is NOT applied (rate shaping only)" >&2
fi
echo "# cluster: $ranks namespaces on $subnet.0/24, per-rank egress $rate (tbf, burst $burst B)," \
     "delay $delay (applied: $delay_applied), $(nproc) cores" >&2

# ---- running the benchmark in it ------------------------------------------------------
run_id=0
# run_bench COMPRESSOR BASELINE SIZE -> appends records to $workdir/records.jsonl
run_bench() {
  local compressor=$1 baseline=$2 size=$3
  run_id=$((run_id + 1))
  # A port free in rank 0's namespace right now (the kernel picks it; a fixed
  # formula could land on a port a previous run's socket still holds).
  local port
  port=$(ip netns exec "$(ns 0)" $py -c 'import socket; s = socket.socket(); s.bind(("'"$subnet.1"'", 0)); print(s.getsockname()[1])')
  local token; token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local out="$workdir/run$run_id.json" pids=() r
  for r in $(seq 0 $((ranks - 1))); do
    ip netns exec "$(ns "$r")" env RANK="$r" WORLD_SIZE="$ranks" LOCAL_RANK="$r" \
      GRADCOMM_STORE="tcp://$subnet.1:$port" GRADCOMM_JOB_TOKEN="$token" \
      MASTER_ADDR="$subnet.1" MASTER_PORT=$((port + 1)) \
      UCX_NET_DEVICES=eth0 UCX_TCP_CM_REUSEADDR=y \
      GRADCOMM_BENCH_GLOO_HOST="$subnet.$((r + 1))" \
      OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0 \
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 \
      GRADCOMM_TIMEOUT_S="${GRADCOMM_TIMEOUT_S:-120}" \
      timeout --signal=KILL "$timeout_s" "$bench" -b "$size" -e "$size" -n "$iters" -w "$warmup" \
        --compressor "$compressor" --baseline "$baseline" --phases --json "$out" \
      >"$workdir/run$run_id.rank$r.log" 2>&1 &
    pids+=($!)
  done
  # The first rank to fail ends the run: the others get a few seconds to report
  # their own errors, then are killed, instead of waiting out their deadline.
  # (wait -n -p names the rank that ended, which then leaves the list: waiting on
  # an already-reaped pid would only print "no such job".)
  local failed=0 running=("${pids[@]}") ended p
  while ((${#running[@]} > 0)); do
    if ! wait -n -p ended "${running[@]}"; then failed=1; break; fi
    local still=()
    for p in "${running[@]}"; do [[ $p == "$ended" ]] || still+=("$p"); done
    running=("${still[@]}")
  done
  if ((failed)); then
    sleep 5
    kill -9 "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  if [[ $failed -ne 0 || ! -s $out ]]; then
    echo "run.sh: bench failed (compressor=$compressor baseline=$baseline size=$size); rank logs:" >&2
    tail -n 5 "$workdir"/run$run_id.rank*.log >&2
    return 1
  fi
  $py - "$out" "$workdir/records.jsonl" "$rate" "$delay" "$delay_applied" <<'EOF'
import json, sys
src, dst, rate, delay, applied = sys.argv[1:]
with open(dst, "a") as f:
    for rec in json.load(open(src)):
        rec.update(link_rate=rate, delay=delay, delay_applied=applied == "true")
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
: >"$workdir/records.jsonl"
status=0
for size in "${size_list[@]}"; do
  for c in "${comp_list[@]}"; do
    if [[ $c == none ]]; then
      # gradcomm's dense ring and each peer, measured in the same run (interleaved).
      for b in "${base_list[@]}"; do run_bench none "$b" "$size" || status=1; done
      [[ ${#base_list[@]} -eq 0 ]] && { run_bench none none "$size" || status=1; }
    else
      run_bench "$c" none "$size" || status=1
    fi
  done
done

$py - "$workdir/records.jsonl" "$json" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump(recs, open(sys.argv[2], "w"), indent=1)
print(f"# {len(recs)} records -> {sys.argv[2]}")
print(f"# {'size(B)':>10} {'impl':>9} {'compressor':<28} {'rate':>7} {'time(us)':>11} {'busbw':>7} "
      f"{'wire(B)':>11} {'encode':>9} {'decode':>9} {'comm':>10}")
for r in recs:
    ph = lambda k: f"{r[k]:9.0f}" if r.get(k) is not None else f"{'-':>9}"
    print(f"  {r['size_bytes']:>10} {r['impl']:>9} {r.get('compressor') or '-':<28} {r['link_rate']:>7} "
          f"{r['time_us']:11.1f} {r['busbw_gbps']:7.3f} {r.get('wire_bytes') or 0:11.0f} "
          f"{ph('encode_us')} {ph('decode_us')} {ph('comm_us'):>10}")
EOF
exit $status
