#!/usr/bin/env bash
# The main job, for now: a 4-rank dense allreduce benchmark on the CPU path, with
# OpenMPI measured in the same run on the same sizes and every result checked
# against the exact sum (#wrong). The trainer (gradcomm-train) replaces this with a
# compressed training run once it exists.
#   scripts/demo.sh                   1 MiB .. 64 MiB, baseline OpenMPI
#   BASELINE=gloo scripts/demo.sh     Gloo instead
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
scripts/install-deps.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMM_BENCH=ON >/dev/null
cmake --build "$build_dir" -j"$(nproc)" --target gradcomm-run gradcomm-bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "$build_dir/tools/gradcomm-run" -n 4 -- "$build_dir/bench/gradcomm-bench" \
  -b 1M -e 64M -f 4 --check --baseline "${BASELINE:-mpi}"
