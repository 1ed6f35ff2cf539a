#!/usr/bin/env bash
# gradcomm-bench end to end under gradcomm-run (3 ranks, loopback): --check finds no
# wrong element for the dense ring, a sparsifier and a quantizer, on either timing
# input, for reduce_scatter (dense and quant:bits=8), for the Gloo peer (beside a dense and a
# compressed gradcomm), and on --buffers shared (alloc_shared: read in place past 16 KiB, path
# shm-direct); the JSON records say which input was timed; a bad
# --input is refused with a message that names it, and so is a size past 1 TiB.
#   test_bench.sh BUILD_DIR
set -uo pipefail
build=$1
run=$build/tools/gradcomm-run bench=$build/bench/gradcomm-bench
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

check() {  # check NAME INPUT BASELINE COMPRESSOR [OP [BUFFERS]]
  local name=$1 input=$2 baseline=$3 compressor=$4 op=${5:-allreduce} buffers=${6:-private}
  "$run" -n 3 --timeout 120 -- "$bench" --op "$op" -b 4K -e 1M -f 16 -n 2 -w 1 --check --phases \
    --input "$input" --baseline "$baseline" --compressor "$compressor" --buffers "$buffers" \
    --json "$tmp/$name.json" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "$name: gradcomm-bench failed"; }
  /usr/bin/python3 - "$tmp/$name.json" "$input" "$compressor" "$baseline" "$op" "$buffers" <<'PY' ||
import json, sys
path, want_input, compressor, baseline, op, buffers = sys.argv[1:]
recs = json.load(open(path))
sizes = sorted({r["size_bytes"] for r in recs})
# reduce_scatter's size is its input, rounded down to whole elements per rank (3 ranks)
want = [4096, 65536, 1048576] if op == "allreduce" else [s // 12 * 12 for s in (4096, 65536, 1048576)]
assert sizes == want, sizes
assert all(r["op"] == op for r in recs), {r["op"] for r in recs}
impls = {r["impl"] for r in recs}
assert "gradcomm" in impls and (baseline == "none" or baseline in impls), impls
for r in recs:
    assert r["input"] == want_input and r["compressor"] == compressor, r
    assert r["wrong"] == 0, r          # --check: every element within the compressor's bound
    assert r["time_us"] > 0, r
    if r["impl"] == "gradcomm":
        # on one host's segment a call sends nothing over the wire, its header neither
        assert (r["wire_bytes"] > 0 or r["path"].startswith("shm")) and r["encode_us"] >= 0 and r["comm_us"] >= 0, r
        if buffers == "shared":  # in place past a small call (16 KiB), through the slots below
            assert r["path"] == ("shm-direct" if r["size_bytes"] > 16384 else "shm"), r
print(path, "ok:", len(recs), "records")
PY
    fail "$name: records wrong"
}

check dense gradient gloo none
check topk pattern gloo "topk:ratio=0.01"  # the dense peer is checked exactly, not by top-k's bound
check topk_sample gradient none "topk:ratio=0.01,select=sample,values=fp16"
check quant gradient none "quant:bits=4"
# reduce_scatter, dense and compressed (its OpenMPI peer: test_nccl_compat.sh, under mpirun)
check rs_dense pattern none none reduce_scatter
check rs_quant gradient none "quant:bits=8" reduce_scatter
check shared pattern gloo none allreduce shared

if "$run" -n 1 -- "$bench" -b 1K -e 1K --input zeros >"$tmp/bad.log" 2>&1; then fail "--input zeros accepted"; fi
grep -q "input" "$tmp/bad.log" || { cat "$tmp/bad.log"; fail "no message naming --input"; }

# -b, -e and -i share one size parser and one bound, 1 TiB, however the size is written:
# past it, or unparsable, is refused with the same message before any work (a plain
# 9223372036854775807 was timed size by size until std::bad_alloc). The memory limit
# keeps a run that does start from taking the machine's memory.
for flag in -b -e -i; do
  for value in 9223372036854775807 1099511627777 1025G 8589934591G 1T; do
    case $flag in
      -b) args=(-b "$value" -e 8) ;;
      -e) args=(-b 8 -e "$value") ;;
      -i) args=(-b 8 -e 8 -f 1 -i "$value") ;;
    esac
    if (ulimit -v 4194304; exec env -i timeout 20 "$bench" "${args[@]}") >"$tmp/size.log" 2>&1; then
      fail "$flag $value accepted"
    fi
    grep -q -- "$flag '$value': expected bytes such as 8, 1K, 64M, 2G, at most 1024G" "$tmp/size.log" ||
      { cat "$tmp/size.log"; fail "$flag $value: no message naming the flag and the value"; }
  done
done
echo "PASS"
