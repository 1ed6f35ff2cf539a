#!/usr/bin/env bash
# Installs dependencies, configures, builds and runs the whole test suite, then the
# sanitizer stage (scripts/test-sanitizers.sh: the unit, launcher, multi-process and
# trainer tests again under ASan+UBSan, the threaded ones under TSan).
#   scripts/test.sh                 everything (about 43 minutes from a fresh clone on 2 cores, plus
#                                   the torch 2.x stage: about 11 more, 2 of them the venv's download)
#   TORCH2=0 scripts/test.sh        without the torch 2.x stage (scripts/test-torch2.sh)
#   SANITIZERS=0 scripts/test.sh    the plain build's tests only (about 18 minutes)
#   BUILD_DIR=b scripts/test.sh     another build directory
#   CTEST_ARGS="-L unit" SANITIZERS=0 scripts/test.sh   a subset
# Every stage always runs; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

set -e
scripts/install-deps.sh
# RelWithDebInfo's -O2 with line tables (-g1) instead of full debug info: the same
# code, stack traces still name file and line, and the C++ compiles a third faster
# (13.7 -> 9.3 s for test_multiproc.cc). CMAKE_ARGS can override it.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMM_TESTS=ON -DGRADCOMM_BENCH=ON \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j"$jobs"
set +e
# mpirun refuses root without these; the MPI baseline in tests and benchmarks needs them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
plain_failed=()
if ! (cd "$build_dir" && ctest --output-on-failure -j"$jobs" ${CTEST_ARGS:-}); then
  status=1
  # ctest's own list of what failed this run; printed again at the very end, where a
  # log that keeps only its tail still shows it.
  mapfile -t plain_failed < "$build_dir/Testing/Temporary/LastTestsFailed.log" 2>/dev/null
fi
if [[ ${SANITIZERS:-1} != 0 ]]; then
  JOBS=$jobs scripts/test-sanitizers.sh || status=1
fi
# The torch tests again on the newest torch 2.x from the package index (Debian's is 1.13):
# a venv made once and reused, a second build directory (README, "PyTorch 2.x").
torch2_failed=0
JOBS=$jobs scripts/test-torch2.sh || { status=1; torch2_failed=1; }
if ((${#plain_failed[@]})); then
  scripts/failed-output.sh "$build_dir"
  echo "test.sh: plain build: ${#plain_failed[@]} test(s) failed:"
  printf '  %s\n' "${plain_failed[@]}"
fi
((torch2_failed)) && echo "test.sh: the torch 2.x stage (scripts/test-torch2.sh) failed"
echo "test.sh: $( ((status == 0)) && echo passed || echo FAILED )"
exit "$status"
