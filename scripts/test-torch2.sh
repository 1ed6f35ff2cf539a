#!/usr/bin/env bash
# The Python and torch-backend tests on the newest torch 2.x: makes (or reuses) the
# venv (scripts/install-torch2-venv.sh), configures a second build directory with
# that venv's interpreter (build-torch2: the library, the bindings and the backend
# built against the venv's torch; tests on, benchmarks and CUDA off), builds only
# what the Python tests need and runs those that touch torch (test_torch, test_torch_backend,
# test_torch2, test_torch2_fsdp; the others test the same _gradcomm module as the main build).
#   scripts/test-torch2.sh                 (about 8 minutes on 2 cores with the venv made)
#   TORCH2=0 scripts/test-torch2.sh        skipped (exit 0, says so)
#   TORCH2_BUILD_DIR=b scripts/test-torch2.sh   another build directory
# Exit status: 0 passed (or skipped on request), 1 failed.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ ${TORCH2:-1} == 0 ]]; then
  echo "test-torch2: SKIPPED (TORCH2=0)"
  exit 0
fi
build_dir=${TORCH2_BUILD_DIR:-build-torch2}
jobs=${JOBS:-$(nproc)}
start=$SECONDS

if ! python=$(scripts/install-torch2-venv.sh | tail -n 1); then
  echo "test-torch2: FAILED: no torch 2.x venv (scripts/install-torch2-venv.sh)"
  exit 1
fi
set -e
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMM_TESTS=ON -DGRADCOMM_BENCH=OFF \
  -DGRADCOMM_CUDA=OFF -DGRADCOMM_TORCH_BACKEND=ON -DGRADCOMM_PYTHON_EXECUTABLE="$python" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j"$jobs" --target gradcomm-python gradcomm-run
set +e
status=0
(cd "$build_dir" && ctest --output-on-failure -j"$jobs" -L python -R '^python\.test_torch') || status=1
echo "test-torch2: $( ((status == 0)) && echo passed || echo FAILED ) (torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null), $((SECONDS - start)) s)"
exit "$status"
