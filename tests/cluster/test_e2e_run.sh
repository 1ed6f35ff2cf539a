#!/usr/bin/env bash
# bench/e2e/run.sh smoke test: 2 ranks, one rate, one round, a few steps of DDP+gloo, the
# gradcomm hook and gradcomm-train must give records and a report; a failing variant must
# fail its run (non-zero exit, the record marked failed) without stopping the others; and
# nothing (namespace, link, bridge, rank process) may be left behind after a normal, a
# failing and an interrupted (SIGINT) run. Skips (exit 77) without root/netns or torch.
#   test_e2e_run.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$(realpath "$1") src=$(realpath "$2")
run=$src/bench/e2e/run.sh
source "$src/tests/cluster/lib.sh"
cluster_require_netns
/usr/bin/python3 -c 'import torch, numpy, matplotlib' 2>/dev/null || { echo "SKIP: /usr/bin/python3 lacks torch/numpy/matplotlib"; exit 77; }
[[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || { echo "SKIP: no Fashion-MNIST"; exit 77; }
variants="gloo"
[[ -f $build/python/gradcomm/__init__.py ]] && variants+=";gradcomm:topk:ratio=0.01"
[[ -x $build/trainer/gradcomm-train ]] && variants+=";train:overlap"
n_variants=$(tr ';' '\n' <<<"$variants" | wc -l)

fail() { echo "FAIL: $*"; exit 1; }
# (rank processes: only what the harness starts, not someone else's trainer on the machine)
harness_procs() { pgrep -af "$src/bench/e2e/ddp_step.py|$build/trainer/gradcomm-train --hidden 2048,2048"; }
leftovers() { cluster_new_leftovers harness_procs; }
[[ -z $(harness_procs) ]] || fail "harness processes running before the test: $(harness_procs)"
cluster_snapshot
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common=(--ranks 2 --rates 10gbit --rounds 1 --steps 3 --warmup 2 --timeout 60 --build "$build")

# 1. A normal run.
"$run" "${common[@]}" --variants "$variants" --out "$tmp/ok" >"$tmp/log1" 2>&1 || { cat "$tmp/log1"; fail "run failed"; }
/usr/bin/python3 - "$tmp/ok" "$n_variants" <<'PY' || { cat "$tmp/log1"; fail "records wrong"; }
import json, os, sys
d, n = sys.argv[1], int(sys.argv[2])
recs = [json.loads(l) for l in open(os.path.join(d, "records.jsonl"))]
assert len(recs) == n, f"{len(recs)} records, expected {n}"
for r in recs:
    assert r["ok"] and r["link_rate"] == "10gbit" and r["round"] == 1, r
    assert r["step_s_median"] > 0 and r["step_s_p90"] >= r["step_s_median"] * 0.999, r
    if r["variant"] == "gloo":
        assert len(r["step_s"]) == 3 and r["wire_bytes_per_step"] > 1e6, r   # ~23 MB of gradient a step
    if r["variant"].startswith("gradcomm:"):
        assert r["gradcomm_per_step"]["bytes_sent"] > 0, r
for f in (d + ".md", d + ".png"):
    assert os.path.getsize(f) > 0, f
print("records ok:", [r["variant"] for r in recs])
PY
[[ -z $(leftovers) ]] || fail "left behind after a normal run: $(leftovers)"

# 2. A failing variant (an unknown gradcomm compressor): its run fails, the next still runs.
if NETNS_GRACE_S=1 "$run" "${common[@]}" --variants "gradcomm:nosuch;gloo" --out "$tmp/bad" >"$tmp/log2" 2>&1; then
  fail "a failing variant exited 0"
fi
grep -q "FAILED: gradcomm:nosuch" "$tmp/log2" || { cat "$tmp/log2"; fail "no failure message"; }
grep -q '"variant": "gloo".*"ok": true' "$tmp/bad/records.jsonl" || { cat "$tmp/log2"; fail "the run after the failure is missing"; }
[[ -z $(leftovers) ]] || fail "left behind after a failing run: $(leftovers)"

# 3. Interrupted by SIGINT mid-run. (A background job of a script starts with SIGINT
# ignored; restore the default, as a terminal's Ctrl-C would find it.)
/usr/bin/python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
  "$run" "${common[@]}" --steps 200 --variants gloo --out "$tmp/int" >"$tmp/log3" 2>&1 &
pid=$!
for _ in $(seq 100); do pgrep -f "$src/bench/e2e/ddp_step.py" >/dev/null && break; sleep 0.1; done
sleep 2
kill -INT "$pid"
wait "$pid"; rc=$?
[[ $rc -ne 0 ]] || fail "SIGINT: run.sh exited 0"
[[ -z $(leftovers) ]] || fail "left behind after SIGINT: $(leftovers)"
echo "SIGINT: exit $rc, nothing left behind"
echo PASS
