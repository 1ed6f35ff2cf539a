#!/usr/bin/env bash
# A cut-off host is a PeerFailure within GRADCOMM_LINK_TIMEOUT_S, not a TimeoutError at the
# deadline (issue 30 item 11b; transport/ucx/ucx_link_watch.h), and only a cut-off host is:
# 3 ranks in network namespaces (TCP, as on a cluster) run 1M-float allreduces in a loop.
#   1. permanent cut: rank 2's link goes down mid-loop (the bridge port: packets vanish, no
#      reset). Every rank must raise PeerFailure naming the evidence, within the limit plus
#      a few seconds of the cut, with the deadline far away (120 s);
#   2. a cut that heals within the limit (2 s against 6 s): every rank finishes every call,
#      and the sums are exact;
#   3. a stopped rank (SIGSTOP for twice the limit, then SIGCONT): its kernel still
#      acknowledges, so no PeerFailure: every rank finishes every call, exactly.
# Skips (exit 77) where network namespaces cannot be made (not root, no netns support).
#   test_link_partition.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
source "$src/tests/cluster/lib.sh"
cluster_require_netns
fail() { cluster_fail_with_logs "$tmp" "$@"; }
tmp=$(mktemp -d)
source "$src/bench/cluster/netns.sh"
netns_at_exit "rm -rf '$tmp'"

# The rank: allreduces of 1M ones until `calls` are done; after each, the exact sum is
# checked. Prints "call i" as it goes and, on an error, "ERROR <class> <unix time>: <message>".
cat >"$tmp/rank.py" <<'EOF'
import sys, time
import numpy as np
import gradcomm
calls = int(sys.argv[1])
gradcomm.init()
size = gradcomm.size()
try:
    for i in range(calls):
        x = np.ones(1 << 20, dtype=np.float32)
        gradcomm.allreduce(x)
        if not np.all(x == size):
            print(f"WRONG sum at call {i}", flush=True)
            sys.exit(3)
        print(f"call {i}", flush=True)
        time.sleep(0.05)
except gradcomm.Error as e:
    print(f"ERROR {type(e).__name__} {time.time():.3f}: {e}", flush=True)
    sys.exit(2)
print("DONE", flush=True)
EOF

LIMIT=6
# run CASE CALLS DISTURB: starts the 3 ranks, waits until every rank has done 10 calls,
# runs DISTURB (a shell function; it sets cut_at), then waits for the ranks (at most 150 s).
run() {
  local name=$1 calls=$2 disturb=$3 r port pids=()
  netns_up 3 10gbit >/dev/null 2>&1 || fail "$name: netns_up"
  port=$(netns_free_port)
  for r in 0 1 2; do
    netns_exec "$r" GRADCOMM_STORE="tcp://$NETNS_SUBNET.1:$port" GRADCOMM_TIMEOUT_S=120 \
      GRADCOMM_LINK_TIMEOUT_S=$LIMIT PYTHONPATH="$build/python" \
      timeout --signal=KILL 150 /usr/bin/python3 "$tmp/rank.py" "$calls" >"$tmp/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 600); do
    local ready=0
    for r in 0 1 2; do grep -q "^call 9$" "$tmp/$name.$r.log" 2>/dev/null && ready=$((ready + 1)); done
    ((ready == 3)) && break
    sleep 0.1
  done
  ((ready == 3)) || fail "$name: the ranks did not get going"
  "$disturb"
  for r in 0 1 2; do wait "${pids[$r]}"; codes[$r]=$?; done
  netns_down
}

# 1. A permanent cut.
cut_forever() { cut_at=$(date +%s.%N); ip link set "gcv${NETNS_TAG}_2" down; }
run cut 100000 cut_forever
for r in 0 1 2; do
  line=$(grep -m1 '^ERROR' "$tmp/cut.$r.log") || fail "cut: rank $r raised nothing (exit ${codes[$r]})"
  echo "cut: rank $r: ${line:0:220}"
  [[ $line == "ERROR PeerFailure "* ]] || fail "cut: rank $r raised something else than PeerFailure"
  [[ $line == *"acknowledged nothing"* ]] || fail "cut: rank $r's PeerFailure does not give the evidence"
  at=$(sed -E 's/^ERROR [A-Za-z]+ ([0-9.]+):.*/\1/' <<<"$line")
  after=$(awk -v a="$at" -v c="$cut_at" 'BEGIN { printf "%.1f", a - c }')
  echo "cut: rank $r failed $after s after the cut (limit $LIMIT s, deadline 120 s)"
  awk -v d="$after" -v l="$LIMIT" 'BEGIN { exit !(d >= l - 1 && d <= l + 8) }' ||
    fail "cut: rank $r failed $after s after the cut, not within [$((LIMIT - 1)), $((LIMIT + 8))] s"
done

# 2. A cut that heals within the limit.
cut_and_heal() { ip link set "gcv${NETNS_TAG}_2" down; sleep 2; ip link set "gcv${NETNS_TAG}_2" up; }
run heal 60 cut_and_heal
for r in 0 1 2; do
  grep -q '^DONE' "$tmp/heal.$r.log" || fail "heal: rank $r did not finish (exit ${codes[$r]})"
done
echo "heal: a 2 s cut healed; every rank finished its 60 calls, exact"

# 3. A stopped rank is not a cut-off host.
stop_and_continue() {
  local pid
  pid=$(ip netns pids "$(netns_name 2)" | while read -r p; do
          [[ $(cat /proc/$p/comm 2>/dev/null) == python3 ]] && echo "$p"; done | head -n 1)
  [[ -n $pid ]] || fail "stop: no python3 in rank 2's namespace"
  kill -STOP "$pid"; sleep $((2 * LIMIT)); kill -CONT "$pid"
}
run stop 60 stop_and_continue
for r in 0 1 2; do
  grep -q '^DONE' "$tmp/stop.$r.log" || fail "stop: rank $r did not finish (exit ${codes[$r]})"
done
echo "stop: rank 2 stopped for $((2 * LIMIT)) s; every rank finished its 60 calls, exact"
echo PASS
