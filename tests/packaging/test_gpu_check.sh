#!/usr/bin/env bash
# scripts/gpu-check.sh on a machine without a GPU, over this (CUDA) build: it must build
# (a no-op here), run every CUDA test executable (they skip), record each GPU step as not
# run, write a report that says so, and exit 0; a wrong argument must exit 2.
#   test_gpu_check.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
fail() { echo "FAIL: $*"; [[ -f ${report:-} ]] && cat "$report"; exit 1; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: this machine has a GPU (run scripts/gpu-check.sh itself)"; exit 77
fi
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
report=$tmp/report.md

"$src/scripts/gpu-check.sh" --build-dir "$build" --report "$report" >"$tmp/out" 2>&1 ||
  { cat "$tmp/out"; fail "exit $? without a GPU"; }
grep -q "^- device: none (0 GPU(s))" "$report" || fail "the report does not say there is no GPU"
grep -q "^| build | passed |" "$report" || fail "no passed build step"
grep -q "^| CUDA tests | passed |" "$report" || fail "no passed CUDA test step"
line=$(grep "^CUDA tests: " "$report") || fail "no CUDA test counts"
[[ $line =~ ^CUDA\ tests:\ ([0-9]+)\ passed,\ 0\ failed,\ ([0-9]+)\ skipped\ \(([0-9]+)\ for\ want ]] ||
  fail "counts unreadable: $line"
((BASH_REMATCH[1] > 0 && BASH_REMATCH[2] > 0 && BASH_REMATCH[3] == BASH_REMATCH[2])) ||
  fail "expected host-side passes and every skip for want of a device: $line"
for s in bench_cuda_dense "torch.topk vs gradcomm top-k" "gradcomm-bench vs ncclAllReduce" "trainer, 1 and 2 ranks"; do
  grep -q "^| $s.*| not run: no GPU on this machine |" "$report" || fail "'$s' not recorded as not run"
done
grep -q "^| bench_cuda_sparse without a GPU | passed |" "$report" || fail "the GPU benchmark's CPU side did not run"

"$src/scripts/gpu-check.sh" --no-such-flag >"$tmp/out" 2>&1
rc=$?
if ! { ((rc == 2)) && grep -q "unknown argument '--no-such-flag'" "$tmp/out"; }; then
  fail "a wrong argument gave exit $rc: $(cat "$tmp/out")"
fi
echo "OK gpu-check without a GPU: $line"
