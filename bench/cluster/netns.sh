# The emulated cluster, sourced by bench/cluster/run.sh and bench/e2e/run.sh (bash,
# `set -euo pipefail` in the caller): one network namespace per rank, joined by a bridge,
# every rank's egress shaped with tc.
#
#   source bench/cluster/netns.sh     # installs the cleanup trap
#   netns_up RANKS RATE [DELAY]       # bridge, namespaces, veth pairs, tbf (netem delay where the kernel has it);
#                                     # RATE "unshaped": no tbf (veth at the speed of the host's copies)
#                                     # NETNS_RANKS_PER_NODE=L (default 1) puts L ranks in each namespace: a
#                                     # node of RANKS / L (docs/two-levels.md), its link shaped at RATE
#   netns_link_bytes                  # bytes each node has sent on its link so far, "node0 node1 ..."
#   netns_exec R [VAR=value...] CMD   # CMD in rank R's namespace with the rank's environment
#   netns_free_port                   # a TCP port free on rank 0's address right now
#   netns_wait_ranks PID...           # wait for a run's ranks; the first to fail ends the run
#   netns_down                        # removes everything netns_up made (the trap calls it too)
#   netns_at_exit 'COMMAND'           # more cleanup for the trap (temporary directories)
#
# Names carry NETNS_TAG (default: the sourcing shell's pid; another number where names with that
# tag exist already), so parallel runs and stale leftovers do not collide:
# bridge gcbr<tag>, namespaces gcns<tag>_<r>, veth pairs gcv<tag>_<r> <-> eth0 (inside), addresses
# $NETNS_SUBNET.<r+1>/24 on a 10.x.y.0/24 no route on the host already uses.
#
# Shaping: each namespace's eth0 egress is a token bucket (tbf) at RATE, so a node sends at most
# RATE, like a NIC; the bridge is not a bottleneck.
#
# Nodes of several ranks (NETNS_RANKS_PER_NODE > 1): the ranks of a namespace are one node
# (GRADCOMM_NODE names it, LOCAL_RANK and LOCAL_WORLD_SIZE count within it) and gradcomm keeps
# shared memory inside it and TCP on eth0 between nodes by itself (its two UCX lanes), so
# UCX_TLS is not set; OpenMPI stays on tcp (its shared memory would cross namespaces). DELAY (tc syntax, 0 = none) puts a netem delay in
# front where the kernel has sch_netem; where it has not, NETNS_DELAY_APPLIED stays false and a
# warning says so.
#
# Cleanup: on exit, error, Ctrl-C (exit 130) or SIGTERM (exit 143) the trap kills every process
# left in the namespaces, deletes namespaces, links and bridge, runs the netns_at_exit commands,
# and exits with the script's status. Needs root, ip and tc.

NETNS_TAG=${NETNS_TAG:-$$}
NETNS_PY=${NETNS_PY:-/usr/bin/python3}
NETNS_RANKS_PER_NODE=${NETNS_RANKS_PER_NODE:-1}
NETNS_RANKS=0 NETNS_NODES=0 NETNS_RATE="" NETNS_DELAY=0 NETNS_DELAY_APPLIED=false NETNS_SUBNET="" NETNS_BURST=0
NETNS_RATE_BYTES=0
NETNS_GRACE_S=${NETNS_GRACE_S:-5}   # how long the other ranks get to report after one fails
_netns_made_ns=() _netns_made_links=() _netns_exit_cmds=()

netns_die() { echo "netns: $*" >&2; exit 1; }
netns_name() { echo "gcns${NETNS_TAG}_$1"; }            # of node (namespace) N
netns_node_of() { echo $(($1 / NETNS_RANKS_PER_NODE)); }  # the node of rank R
netns_ip() { echo "$NETNS_SUBNET.$(($(netns_node_of "$1") + 1))"; }  # rank R's address (its node's)
netns_at_exit() { _netns_exit_cmds+=("$1"); }

_netns_on_exit() {
  local status=$? c
  trap - EXIT INT TERM
  netns_down
  for c in "${_netns_exit_cmds[@]}"; do eval "$c" || true; done
  exit "$status"
}
trap _netns_on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# netns_rate_bytes RATE -> bytes per second of a tc rate ("1gbit", "100mbit", "125mbps").
netns_rate_bytes() {
  "$NETNS_PY" - "$1" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(bit|bps)", sys.argv[1].lower())
if not m: sys.exit(f"netns: cannot parse rate '{sys.argv[1]}' (use e.g. 1gbit, 10gbit)")
v = float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m[2]]
print(int(v / 8 if m[3] == "bit" else v))
EOF
}

netns_up() {
  local ranks=$1 rate=$2 delay=${3:-0} r n a b nodes
  [[ $EUID -eq 0 ]] || netns_die "needs root (network namespaces, tc)"
  command -v ip >/dev/null || netns_die "'ip' not found (Debian: iproute2)"
  command -v tc >/dev/null || netns_die "'tc' not found (Debian: iproute2)"
  [[ $ranks =~ ^[0-9]+$ && $ranks -ge 1 && $ranks -le 64 ]] || netns_die "ranks must be 1..64, got '$ranks'"
  [[ ${#_netns_made_ns[@]} -eq 0 ]] || netns_die "netns_up called twice without netns_down"
  [[ $NETNS_RANKS_PER_NODE =~ ^[0-9]+$ && $NETNS_RANKS_PER_NODE -ge 1 && $((ranks % NETNS_RANKS_PER_NODE)) -eq 0 ]] ||
    netns_die "ranks per node must divide the ranks ($ranks ranks, $NETNS_RANKS_PER_NODE per node)"
  nodes=$((ranks / NETNS_RANKS_PER_NODE))
  if [[ $rate == unshaped ]]; then NETNS_RATE_BYTES=0; else NETNS_RATE_BYTES=$(netns_rate_bytes "$rate"); fi
  # A /24 in 10.0.0.0/8 that nothing on the host routes yet.
  NETNS_SUBNET=""
  for a in $(seq 200 250); do
    for b in $(seq 0 250); do
      if ! ip route show | grep -q "^10\.$a\.$b\."; then NETNS_SUBNET="10.$a.$b"; break 2; fi
    done
  done
  [[ -n $NETNS_SUBNET ]] || netns_die "no free 10.x.y.0/24 subnet"

  # The bridge is the claim on the tag. A tag whose names are already there (another run, or
  # what a run killed by SIGKILL left) is not ours to reuse or remove: take another.
  local tries=0
  until ! ip netns list | grep -q "^gcns${NETNS_TAG}_" && ip link add "gcbr$NETNS_TAG" type bridge 2>/dev/null; do
    ((++tries <= 20)) || netns_die "no free name tag (gcbr<tag> exists for every tag tried)"
    NETNS_TAG=$$$((RANDOM % 100))
  done
  _netns_made_links+=("gcbr$NETNS_TAG")
  ip link set "gcbr$NETNS_TAG" up
  # tbf needs a bucket of at least rate/HZ bytes to reach its rate, and more than one
  # GSO super-packet (64 KiB) or it stalls; 4 ms of traffic, at least 256 KiB.
  NETNS_BURST=$((NETNS_RATE_BYTES / 250)); ((NETNS_BURST < 262144)) && NETNS_BURST=262144
  NETNS_DELAY_APPLIED=false
  for r in $(seq 0 $((nodes - 1))); do  # r: a node
    n=$(netns_name "$r")
    ip netns add "$n"
    _netns_made_ns+=("$n")
    ip link add "gcv${NETNS_TAG}_$r" type veth peer name eth0 netns "$n"
    _netns_made_links+=("gcv${NETNS_TAG}_$r")
    ip link set "gcv${NETNS_TAG}_$r" master "gcbr$NETNS_TAG" up
    ip -n "$n" addr add "$NETNS_SUBNET.$((r + 1))/24" dev eth0
    ip -n "$n" link set eth0 up
    ip -n "$n" link set lo up
    if [[ $rate == unshaped ]]; then
      :  # no qdisc of ours: the veth pair's own speed
    elif [[ $delay != 0 ]] && ip netns exec "$n" tc qdisc add dev eth0 root handle 1: netem delay "$delay" 2>/dev/null; then
      ip netns exec "$n" tc qdisc add dev eth0 parent 1: handle 2: tbf rate "$rate" burst "$NETNS_BURST" latency 100ms
      NETNS_DELAY_APPLIED=true
    else
      ip netns exec "$n" tc qdisc add dev eth0 root tbf rate "$rate" burst "$NETNS_BURST" latency 100ms
    fi
  done
  if [[ $delay != 0 && $NETNS_DELAY_APPLIED == false ]]; then
    echo "netns: WARNING: this kernel has no sch_netem: delay $delay is NOT applied (rate shaping only)" >&2
  fi
  NETNS_RANKS=$ranks NETNS_NODES=$nodes NETNS_RATE=$rate NETNS_DELAY=$delay
  echo "# cluster: $nodes namespaces of $NETNS_RANKS_PER_NODE rank(s) on $NETNS_SUBNET.0/24, per-node egress $rate" \
       "(tbf, burst $NETNS_BURST B), delay $delay (applied: $NETNS_DELAY_APPLIED), $(nproc) cores" >&2
}

# Kills every process inside the namespaces (a rank's `timeout` wrapper and what it started).
netns_kill_all() {
  local x
  for x in "${_netns_made_ns[@]}"; do
    ip netns pids "$x" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
}

# Removes what netns_up made; safe to call any number of times.
netns_down() {
  local x
  # Processes first (a killed run may have left some), then namespaces, links and bridge.
  netns_kill_all
  for x in "${_netns_made_ns[@]}"; do ip netns del "$x" 2>/dev/null || true; done
  for x in "${_netns_made_links[@]}"; do ip link del "$x" 2>/dev/null || true; done
  _netns_made_ns=() _netns_made_links=()
  NETNS_RANKS=0
}

# netns_exec R [VAR=value...] CMD ARGS...: runs in rank R's namespace (its node's) with RANK,
# WORLD_SIZE, LOCAL_RANK, MASTER_ADDR (rank 0's address), the transports pinned to eth0 and one
# thread per library (the ranks share the machine's cores); the caller's VAR=value come after
# these and may override them.
# The transports pinned to eth0: network namespaces do not separate /dev/shm or
# process_vm_readv, so UCX (gradcomm's, and OpenMPI's UCX pml) would reach a rank in
# another namespace by shared memory and cma and bypass the shaped link; UCX_TLS=tcp,self
# and OpenMPI's btl=tcp,self keep every byte on eth0. Every namespace is a node to gradcomm
# (GRADCOMM_NODE): its host name is the same in all of them, and ranks of one node would
# meet in a shared segment (docs/shared-memory.md) and bypass the link. (tests/cluster/
# test_cluster_run.sh checks the lanes gradcomm's ranks report and the bytes on the veths.)
netns_exec() {
  local r=$1 node lanes; shift
  node=$(netns_node_of "$r")
  if ((NETNS_RANKS_PER_NODE > 1)); then  # nodes of several ranks: gradcomm's lanes (see the top)
    lanes=(GRADCOMM_NODE="$(netns_name "$node")" LOCAL_RANK=$((r % NETNS_RANKS_PER_NODE))
           LOCAL_WORLD_SIZE="$NETNS_RANKS_PER_NODE")
  else
    lanes=(GRADCOMM_NODE="$(netns_name "$node")" LOCAL_RANK="$r" UCX_TLS=tcp,self)
  fi
  ip netns exec "$(netns_name "$node")" env RANK="$r" WORLD_SIZE="$NETNS_RANKS" "${lanes[@]}" \
    MASTER_ADDR="$NETNS_SUBNET.1" UCX_NET_DEVICES=eth0 UCX_TCP_CM_REUSEADDR=y GLOO_SOCKET_IFNAME=eth0 \
    OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0 \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 "$@"
}

# Bytes each node has put on its link so far (the host side of its veth receives them),
# space-separated in node order.
netns_link_bytes() {
  local r out=()
  for r in $(seq 0 $((NETNS_NODES - 1))); do
    out+=("$(cat "/sys/class/net/gcv${NETNS_TAG}_$r/statistics/rx_bytes" 2>/dev/null || echo 0)")
  done
  echo "${out[*]}"
}

# A port free on rank 0's address right now (the kernel picks it; a fixed formula could
# land on a port a previous run's socket still holds).
netns_free_port() {
  ip netns exec "$(netns_name 0)" "$NETNS_PY" -c \
    'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$NETNS_SUBNET.1"
}

# netns_wait_ranks PID...: 0 when every rank exited 0. The first rank to fail ends the
# run: the others get NETNS_GRACE_S seconds to report their own errors, then are killed,
# instead of waiting out their deadline. (wait -n -p names the rank that ended, which then
# leaves the list: waiting on an already-reaped pid would only print "no such job".)
netns_wait_ranks() {
  local pids=("$@") running=("$@") ended p still
  while ((${#running[@]} > 0)); do
    if ! wait -n -p ended "${running[@]}"; then
      sleep "$NETNS_GRACE_S"
      netns_kill_all
      wait "${pids[@]}" 2>/dev/null || true
      return 1
    fi
    still=()
    for p in "${running[@]}"; do [[ $p == "$ended" ]] || still+=("$p"); done
    running=("${still[@]}")
  done
}
