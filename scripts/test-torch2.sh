#!/usr/bin/env bash
# The torch tests on the newest torch 2.x alone: makes (or reuses) the venv
# (scripts/install-torch2-venv.sh), configures the build directory with it as
# GRADCOMM_TORCH2_PYTHON (the same build as scripts/test.sh's; its library objects are
# reused, only the backend is built again against the venv's torch, into
# <build>/python-torch2), builds that and runs the tests labelled torch2 (test_torch,
# test_torch_backend, test_torch2, test_torch2_fsdp under the venv's interpreter).
# scripts/test.sh runs the same tests among all the others.
#   scripts/test-torch2.sh                 (about 7 minutes on 2 cores with the venv made and
#                                          the library built; 4 more for the library)
#   BUILD_DIR=b scripts/test-torch2.sh     another build directory
# Exit status: 0 passed, 1 failed.
set -uo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
start=$SECONDS

if ! python=$(scripts/install-torch2-venv.sh | tail -n 1); then
  echo "test-torch2: FAILED: no torch 2.x venv (scripts/install-torch2-venv.sh)"
  exit 1
fi
set -e
# scripts/test.sh's configuration, plus the second torch.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMM_TESTS=ON -DGRADCOMM_BENCH=ON \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DGRADCOMM_TORCH2_PYTHON="$python" ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j"$jobs" --target gradcomm-python-torch2 gradcomm-run
set +e
status=0
(cd "$build_dir" && ctest --output-on-failure -j"$jobs" -L torch2) || status=1
echo "test-torch2: $( ((status == 0)) && echo passed || echo FAILED ) (torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null), $((SECONDS - start)) s)"
exit "$status"
