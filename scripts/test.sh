#!/usr/bin/env bash
# Installs dependencies, configures, builds and runs the whole test suite.
#   scripts/test.sh                 everything (unit, launcher, multi-process, consumer, CUDA if built)
#   BUILD_DIR=b scripts/test.sh     another build directory
#   CTEST_ARGS="-L unit" scripts/test.sh   a subset
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

scripts/install-deps.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMM_TESTS=ON -DGRADCOMM_BENCH=ON \
  ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j"$jobs"
# mpirun refuses root without these; the MPI baseline in tests and benchmarks needs them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$build_dir"
ctest --output-on-failure -j"$jobs" ${CTEST_ARGS:-}
