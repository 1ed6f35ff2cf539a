# Shared by the cluster tests (sourced): whether they can run here, how they fail, and
# what "left behind" means.
#   cluster_require_netns         exit 77 (ctest's skip) where network namespaces cannot be made
#   cluster_fail_with_logs DIR MESSAGE...   FAIL, with the tail of every *.log in DIR
#
# The emulated cluster's names are gcns<tag>_<r>, gcbr<tag> and gcv<tag>_<r>. A machine can
# hold some already that no test of ours made -- a run killed with SIGKILL (a CI job's
# timeout) cannot clean up, and CI hosts may share one network stack across jobs. Those are
# reported, never failed on and never touched: a test fails only on names that were not
# there when it started.
#   cluster_snapshot              remember what is there now (call once, before the test)
#   cluster_new_leftovers [EXTRA] names that appeared since, plus EXTRA's output lines
cluster_names() { { ip netns list; ip -o link show; } | grep -oE "gcns[0-9]+_[0-9]+|gcbr[0-9]+|gcv[0-9]+_[0-9]+" | sort -u || true; }
cluster_snapshot() {
  _cluster_before=$(cluster_names)
  [[ -z $_cluster_before ]] || echo "note: already on this machine, not made by this test (ignored):" $_cluster_before
}
cluster_new_leftovers() {
  comm -13 <(printf '%s\n' "$_cluster_before") <(cluster_names) | sed '/^$/d'
  if (($#)); then "$@" || true; fi
}
cluster_require_netns() {
  if [[ $EUID -ne 0 ]] || ! ip netns add "gctestprobe$$" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces here (needs root and netns support)"; exit 77
  fi
  ip netns del "gctestprobe$$"
}
cluster_fail_with_logs() {
  local dir=$1 f; shift
  echo "FAIL: $*"
  for f in "$dir"/*.log; do echo "== $f"; tail -n "${CLUSTER_LOG_LINES:-60}" "$f"; done
  exit 1
}
