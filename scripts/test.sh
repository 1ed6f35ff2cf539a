#!/usr/bin/env bash
# Installs dependencies, configures, builds and runs the whole test suite, then the
# sanitizer stage (scripts/test-sanitizers.sh: the unit, launcher, multi-process and
# trainer tests again under ASan+UBSan, the threaded ones under TSan).
#   scripts/test.sh                 everything (about 30 minutes on 2 cores)
#   SANITIZERS=0 scripts/test.sh    the plain build's tests only (about 6 minutes)
#   BUILD_DIR=b scripts/test.sh     another build directory
#   CTEST_ARGS="-L unit" SANITIZERS=0 scripts/test.sh   a subset
# Both stages always run; the exit status is non-zero if either failed.
set -uo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

set -e
scripts/install-deps.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMM_TESTS=ON -DGRADCOMM_BENCH=ON \
  ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j"$jobs"
set +e
# mpirun refuses root without these; the MPI baseline in tests and benchmarks needs them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
(cd "$build_dir" && ctest --output-on-failure -j"$jobs" ${CTEST_ARGS:-}) || status=1
if [[ ${SANITIZERS:-1} != 0 ]]; then
  JOBS=$jobs scripts/test-sanitizers.sh || status=1
fi
exit "$status"
