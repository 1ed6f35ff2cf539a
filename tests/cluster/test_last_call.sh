#!/usr/bin/env bash
# A rank that returns from its last call and exits does not take that call's last bytes
# with it (issue 42, item 3; transport.h, leave). Two ranks in network namespaces joined
# by a slow link (LAST_CALL_RATE, default 1mbit) run ONE allreduce of LAST_CALL_MB MiB
# (default 4: about 35 s at 1 Mbit/s) and exit at once: both must finish, with the exact
# sum. Before the fix the first rank to finish exited, its connection closed with bytes
# still queued for its peer, and the peer failed ~2 s later (PeerFailure: Endpoint
# timeout), 3 runs of 3. LAST_CALL_RUNS runs (default 1).
# Then a rank that really dies (SIGKILL mid-call) must still be a PeerFailure on the other.
# Skips (exit 77) where network namespaces cannot be made (not root, no netns support).
#   test_last_call.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
rate=${LAST_CALL_RATE:-1mbit} mib=${LAST_CALL_MB:-4} runs=${LAST_CALL_RUNS:-1}
source "$src/tests/cluster/lib.sh"
cluster_require_netns
fail() { cluster_fail_with_logs "$tmp" "$@"; }
tmp=$(mktemp -d)
source "$src/bench/cluster/netns.sh"
netns_at_exit "rm -rf '$tmp'"

# One allreduce of MIB MiB of (rank + 1), checked exactly, then the process ends (the
# package's atexit destroys the communicator). Prints "DONE <unix time>" after the call
# and "ERROR <class>: <message>" on an error.
cat >"$tmp/rank.py" <<'EOF'
import sys, time
import numpy as np
import gradcomm
mib = int(sys.argv[1])
gradcomm.init()
rank, size = gradcomm.rank(), gradcomm.size()
x = np.full(mib << 18, rank + 1, dtype=np.float32)
try:
    gradcomm.allreduce(x)
except gradcomm.Error as e:
    print(f"ERROR {type(e).__name__}: {e}", flush=True)
    sys.exit(2)
if not np.all(x == size * (size + 1) / 2):
    print("WRONG sum", flush=True)
    sys.exit(3)
print(f"DONE {time.time():.3f}", flush=True)
EOF

# run NAME [KILL_AFTER_S]: both ranks, at most 300 s; with KILL_AFTER_S, rank 0 is killed then.
run() {
  local name=$1 kill_after=${2:-} r port pids=()
  netns_up 2 "$rate" >/dev/null 2>&1 || fail "$name: netns_up"
  port=$(netns_free_port)
  for r in 0 1; do
    netns_exec "$r" GRADCOMM_STORE="tcp://$NETNS_SUBNET.1:$port" GRADCOMM_TIMEOUT_S=240 PYTHONPATH="$build/python" \
      timeout --signal=KILL 300 /usr/bin/python3 "$tmp/rank.py" "$mib" >"$tmp/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  if [[ -n $kill_after ]]; then
    sleep "$kill_after"
    for p in $(ip netns pids "$(netns_name 0)"); do
      [[ $(cat /proc/$p/comm 2>/dev/null) == python3 ]] && kill -KILL "$p"
    done
  fi
  for r in 0 1; do wait "${pids[$r]}"; codes[$r]=$?; done
  netns_down
}

for i in $(seq "$runs"); do
  start=$(date +%s)
  run "clean$i"
  for r in 0 1; do
    grep -q '^DONE' "$tmp/clean$i.$r.log" || fail "run $i: rank $r did not finish (exit ${codes[$r]})"
    ((codes[r] == 0)) || fail "run $i: rank $r exited ${codes[$r]}"
  done
  echo "run $i: $mib MiB at $rate: both ranks finished, exact ($(($(date +%s) - start)) s)"
done

run killed 5
grep -q '^ERROR PeerFailure' "$tmp/killed.1.log" || fail "killed: rank 1 did not raise PeerFailure (exit ${codes[1]})"
echo "killed: rank 0 killed mid-call; rank 1: $(grep -m1 '^ERROR' "$tmp/killed.1.log" | cut -c1-200)"
echo PASS
