#!/usr/bin/env bash
# bench/cluster/run.sh end to end on a tiny configuration: it must produce records for
# gradcomm and the peers, and leave no namespace, link or bridge behind -- after a
# normal run, after a failing run, and when interrupted (SIGINT / SIGTERM) mid-run.
# Skips (exit 77) where network namespaces cannot be made (not root, no netns support).
#   test_cluster_run.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
run=$src/bench/cluster/run.sh
source "$src/tests/cluster/lib.sh"
cluster_require_netns
fail() { echo "FAIL: $*"; exit 1; }
leftovers() { cluster_new_leftovers; }
cluster_snapshot
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# 1. A normal run: 3 ranks, dense (against Gloo) and one compressor.
"$run" --ranks 3 --rate 10gbit --sizes 64K --compressors "none;quant:bits=4" --baselines gloo \
  --iters 3 --warmup 1 --build "$build" --json "$tmp/out.json" >"$tmp/log" 2>&1 || { cat "$tmp/log"; fail "run failed"; }
/usr/bin/python3 - "$tmp/out.json" <<'PY' || fail "records wrong"
import json, sys
recs = json.load(open(sys.argv[1]))
impls = sorted((r["impl"], r["compressor"]) for r in recs)
assert ("gloo", "none") in impls or any(i == "gloo" for i, _ in impls), impls
assert ("gradcomm", "none") in impls and ("gradcomm", "quant:bits=4") in impls, impls
for r in recs:
    assert r["ranks"] == 3 and r["size_bytes"] == 65536 and r["link_rate"] == "10gbit", r
    assert r["time_us"] > 0, r
    if r["impl"] == "gradcomm": assert r["wrong"] in (None, 0), r
print("records ok:", impls)
PY
[[ -z $(leftovers) ]] || fail "left behind after a normal run: $(leftovers)"

# 2. A failing run (an invalid compressor spec): non-zero exit, nothing left behind.
if "$run" --ranks 2 --sizes 64K --compressors "nosuch" --baselines none --build "$build" \
     --json "$tmp/bad.json" >"$tmp/log2" 2>&1; then fail "an invalid spec succeeded"; fi
grep -q "bench failed" "$tmp/log2" || { cat "$tmp/log2"; fail "no failure message"; }
[[ -z $(leftovers) ]] || fail "left behind after a failing run: $(leftovers)"

# 3. Interrupted mid-run, by SIGINT and by SIGTERM.
for sig in INT TERM; do
  # (A background job of a script starts with SIGINT ignored; restore the default, as a
  # terminal's Ctrl-C would find it.)
  /usr/bin/python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
  "$run" --ranks 2 --rate 1gbit --sizes 64M --compressors none --baselines none --iters 50 \
    --build "$build" --json "$tmp/int.json" >"$tmp/log3" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [[ -n $(leftovers) ]] && break; sleep 0.1; done
  sleep 2
  kill -"$sig" "$pid"
  wait "$pid"; rc=$?
  [[ $rc -ne 0 ]] || fail "SIG$sig: run.sh exited 0"
  [[ -z $(leftovers) ]] || fail "left behind after SIG$sig: $(leftovers)"
  echo "SIG$sig: exit $rc, nothing left behind"
done
# 4. Ranks in separate namespaces stay on their shaped links: on one host gradcomm's UCX
#    prefers shared memory (sysv/posix, cma) and gradcomm its node segment, which namespaces
#    do not separate, so the cluster pins UCX_TLS=tcp,self and names each namespace a node.
#    Every rank must report TCP lanes to every peer, and each veth must carry at least the
#    ring's bytes of the 3 allreduces of 1 MiB (1 MiB each at N = 2).
(
  source "$src/bench/cluster/netns.sh"
  netns_up 2 1gbit >/dev/null 2>&1
  port=$(netns_free_port)
  before=$(netns_link_bytes)
  pids=()
  for r in 0 1; do
    netns_exec "$r" GRADCOMM_STORE="tcp://$NETNS_SUBNET.1:$port" GRADCOMM_LOG=info GRADCOMM_TIMEOUT_S=60 \
      timeout --signal=KILL 90 "$build/bench/gradcomm-bench" -b 1M -e 1M -n 2 -w 1 --baseline none \
      >"$tmp/lanes.$r" 2>&1 &
    pids+=($!)
  done
  netns_wait_ranks "${pids[@]}"
  after=$(netns_link_bytes)
  read -r -a b <<<"$before"; read -r -a a <<<"$after"
  for node in 0 1; do
    crossed=$((a[node] - b[node]))
    echo "node $node's link carried $crossed bytes"
    ((crossed >= 3 * 1048576)) || { echo "node $node's link carried only $crossed bytes"; exit 1; }
  done
) || { cat "$tmp"/lanes.*; fail "the lane check's run failed (or its bytes did not cross the links)"; }
for r in 0 1; do
  line=$(grep -o "ucx: rank $r reaches rank $((1 - r)) over .*" "$tmp/lanes.$r") || { cat "$tmp/lanes.$r"; fail "rank $r logged no lanes"; }
  echo "$line"
  [[ $line =~ over\ (tcp/[^\ ]+\ ?)+$ ]] || fail "rank $r is not on TCP alone in the cluster: $line"
done
[[ -z $(leftovers) ]] || fail "left behind after the lane check: $(leftovers)"

# 5. Nodes of two ranks (docs/two-levels.md): 2 x 2 at 1 Gbit/s, two levels and flat in one
#    run. Inside a node gradcomm reaches its peer over shared memory, across over TCP (its
#    lanes, no UCX_TLS); the veths count what crosses: two levels put 2/3 of the flat ring's
#    bytes on each node link (half the tensor each way, against the ring's 3/4), dense and
#    exact.
"$run" --nodes 2 --ranks-per-node 2 --rate 1gbit --sizes 4M --compressors none --baselines none \
  --hierarchies auto,off --check 1 --iters 3 --warmup 1 --build "$build" --json "$tmp/nodes.json" \
  >"$tmp/log5" 2>&1 || { cat "$tmp/log5"; fail "the nodes run failed"; }
/usr/bin/python3 - "$tmp/nodes.json" <<'PY' || { cat "$tmp/log5"; fail "nodes records wrong"; }
import json, sys
recs = {r["hierarchy"]: r for r in json.load(open(sys.argv[1]))}
two, flat = recs["auto"], recs["off"]
for r in (two, flat):
    assert r["nodes"] == 2 and r["ranks_per_node"] == 2 and r["ranks"] == 4, r
    assert r["wrong"] in (None, 0), r
    assert len(r["node_link_bytes_per_call"]) == 2, r
ratio = max(two["node_link_bytes_per_call"]) / max(flat["node_link_bytes_per_call"])
print(f"node link bytes per call: two levels {two['node_link_bytes_per_call']}, flat "
      f"{flat['node_link_bytes_per_call']}: {ratio:.3f}x")
assert 0.55 < ratio < 0.75, ratio
PY
[[ -z $(leftovers) ]] || fail "left behind after the nodes run: $(leftovers)"
echo PASS
