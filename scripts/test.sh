#!/usr/bin/env bash
# Installs dependencies, configures, builds and runs the whole test suite, then the
# sanitizer stage (scripts/test-sanitizers.sh: the unit, launcher, multi-process and
# trainer tests again under ASan+UBSan, the threaded ones under TSan).
#   scripts/test.sh                 everything (about 45 minutes from a fresh clone on 2 cores with
#                                   the torch 2.x tests; docs/development.md, "Testing", says
#                                   what they add)
#   TORCH2=0 scripts/test.sh        without the torch 2.x tests (no venv, no download)
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
# The torch tests run on Debian's torch 1.13 and, in the same build, on the newest torch 2.x
# from the package index: a venv made once and reused (scripts/install-torch2-venv.sh), whose
# torch gets a second copy of the backend (GRADCOMM_TORCH2_PYTHON; ctest label torch2).
torch2_args=(-DGRADCOMM_TORCH2_PYTHON=) torch2_missing=0
if [[ ${TORCH2:-1} != 0 ]]; then
  if torch2_python=$(scripts/install-torch2-venv.sh | tail -n 1); then
    torch2_args=(-DGRADCOMM_TORCH2_PYTHON="$torch2_python")
  else
    torch2_missing=1
  fi
fi
# RelWithDebInfo's -O2 with line tables (-g1) instead of full debug info: the same
# code, stack traces still name file and line, and the C++ compiles a third faster
# (13.7 -> 9.3 s for test_multiproc.cc). CMAKE_ARGS can override it.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMM_TESTS=ON -DGRADCOMM_BENCH=ON \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  "${torch2_args[@]}" ${CMAKE_ARGS:-}
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

((torch2_missing)) && status=1
if ((${#plain_failed[@]})); then
  scripts/failed-output.sh "$build_dir"
  echo "test.sh: plain build: ${#plain_failed[@]} test(s) failed:"
  printf '  %s\n' "${plain_failed[@]}"
fi
((torch2_missing)) && echo "test.sh: FAILED: no torch 2.x venv (scripts/install-torch2-venv.sh), so the torch 2.x tests did not run; TORCH2=0 skips them"
echo "test.sh: $( ((status == 0)) && echo passed || echo FAILED )"
exit "$status"
