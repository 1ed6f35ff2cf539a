#!/usr/bin/env bash
# One command for a machine with a GPU: builds for sm_90 and runs, within one time budget,
#   1. every CUDA test (ctest -L cuda); on a GPU machine a test that skips for want of a
#      device is a failure, since it would call a GPU path verified that never ran;
#   2. the GPU microbenchmarks: bench_cuda_dense / bench_cuda_sparse, torch.topk against
#      gradcomm's top-k (bench/cuda/torch_topk.py), and gradcomm-bench against ncclAllReduce;
#   3. a one-epoch GPU trainer run at 1 rank and at 2 ranks (2 ranks share the GPU through
#      the staged path), and one with DGC's momentum correction (masks written on the GPU);
# then writes bench/results/gpu-<date>.md: device, driver, toolchain, every command with its
# status, time and output tail (a copy, and the full log, go to $OUT when that is set).
#
#   scripts/gpu-check.sh prepare    here, with Debian's mirror: fills .gpu-deps/ (git-ignored)
#                                   with what a bare GPU machine lacks: the build dependencies
#                                   as .debs, nccl.h, and a Fashion-MNIST subset (about 30 MB)
#   scripts/gpu-check.sh [run] [--build-dir DIR] [--budget SECONDS] [--report FILE]
#                                   the check. DIR defaults to build-gpu (configured for sm_90,
#                                   Release, Python off); an existing CUDA build may be named
#                                   instead. The budget (default 540 s) covers everything;
#                                   each step has a cap (scaled by budget/540) and gets at
#                                   most what is left; a step cut short is a failure. Exit status: 0 only if every step passed.
#
# On the device tool: run(command="scripts/gpu-check.sh", carry=[".gpu-deps"]) after
# `scripts/gpu-check.sh prepare` here. Without a GPU the same command builds, runs the CUDA
# tests (which skip), and records the GPU steps as not run, so the script is exercised on
# every machine (ctest scripts.gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
src=$PWD
deps=$src/.gpu-deps

# ---- prepare ----------------------------------------------------------------------------
# Debian packages a bare CUDA image lacks: headers, libraries and CMake configs of UCX,
# OpenBLAS, fmt, GoogleTest, Google Benchmark, CLI11, nlohmann-json, OpenSSL and zlib, with the
# shared libraries they need at run time. Unpacked (dpkg -x) into .gpu-deps/root, never into /.
DEBS=(libucx-dev libucx0 libnuma1 librdmacm1 libibverbs1 libopenblas-dev libopenblas-pthread-dev
      libopenblas0-pthread libopenblas0 libgfortran5 libfmt-dev libfmt9 libgtest-dev libgmock-dev
      libbenchmark-dev libbenchmark1debian libcli11-dev nlohmann-json3-dev libssl-dev libssl3
      zlib1g-dev zlib1g)
TRAIN_SUBSET=12000  # training images carried (of 60000): the whole data set is 30 MB

prepare() {
  rm -rf "$deps" && mkdir -p "$deps/debs" "$deps/include" "$deps/fashion-mnist" || return 1
  (cd "$deps/debs" && apt-get download "${DEBS[@]}") || { echo "gpu-check: apt-get download failed"; return 1; }
  local nccl_h=/usr/local/cuda/include/nccl.h
  [[ -f $nccl_h ]] || nccl_h=/usr/include/nccl.h
  if [[ -f $nccl_h ]]; then cp "$nccl_h" "$deps/include/"; else echo "gpu-check: no nccl.h here to carry"; fi
  /usr/bin/python3 - "$deps/fashion-mnist" "$TRAIN_SUBSET" <<'EOF' || return 1
# The first N training images and labels (idx headers rewritten), the test split whole.
import gzip, shutil, struct, sys
out, n = sys.argv[1], int(sys.argv[2])
src = "/usr/share/datasets/fashion-mnist"
for name, row in (("train-images-idx3-ubyte.gz", 784), ("train-labels-idx1-ubyte.gz", 1)):
    data = gzip.open(f"{src}/{name}").read()
    ndim = data[3]
    header = bytearray(data[:4 + 4 * ndim])
    struct.pack_into(">I", header, 4, n)
    with gzip.open(f"{out}/{name}", "wb", compresslevel=9) as f:
        f.write(bytes(header) + data[len(header):len(header) + n * row])
for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
    shutil.copy(f"{src}/{name}", f"{out}/{name}")
EOF
  echo "gpu-check: prepared $(du -sh "$deps" | cut -f1) in $deps; on the GPU machine run"
  echo "  scripts/gpu-check.sh   (device tool: carry [\".gpu-deps\"])"
}

if [[ ${1:-} == prepare ]]; then prepare; exit; fi
[[ ${1:-} == run ]] && shift

build=build-gpu budget=540 report=""
while (($#)); do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)"; exit 2 ;;
  esac
done
[[ $build == /* ]] || build=$src/$build
report=${report:-$src/bench/results/gpu-$(date -u +%F).md}
deadline=$((SECONDS + budget))
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
log=$work/gpu-check.log
: >"$log"

# ---- steps ------------------------------------------------------------------------------
# step NAME CAP -- COMMAND...: runs COMMAND with at most min(CAP, time left) seconds, its
# output in the log; records status, seconds and the output's tail for the report.
rows=() details=() failed=0
step() {
  local name=$1 cap=$2; shift 3
  local left=$((deadline - SECONDS)) t0=$SECONDS rc status out=$work/step.out
  cap=$((cap * budget / 540))  # the caps are for the default budget; a larger one scales them
  ((cap > left)) && cap=$left
  if ((cap < 5)); then
    rows+=("| $name | **not run: budget spent** | 0 |"); failed=1; return 1
  fi
  { echo; echo "==== $name: $*"; } >>"$log"
  timeout --kill-after=10 "$cap" "$@" >"$out" 2>&1
  rc=$?
  cat "$out" >>"$log"
  case $rc in
    0) status=passed ;;
    124|137) status="**FAILED: cut at ${cap} s**"; failed=1 ;;
    *) status="**FAILED (exit $rc)**"; failed=1 ;;
  esac
  rows+=("| $name | $status | $((SECONDS - t0)) |")
  details+=("### $name" "" '```' "\$ $*" "$(tail -n "${TAIL_LINES:-25}" "$out")" '```' "")
  return $rc
}
not_run() { rows+=("| $1 | not run: $2 | 0 |"); }

# ---- the machine ---------------------------------------------------------------------------
gpus=0 gpu_line="none" driver=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  gpu_line=$(nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader | head -n 1)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
fi
nvcc=/usr/local/cuda/bin/nvcc
command -v nvcc >/dev/null 2>&1 && nvcc=$(command -v nvcc)
toolchain="nvcc $("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'); $(c++ --version 2>/dev/null | head -n 1); $(cmake --version 2>/dev/null | head -n 1)"

# ---- dependencies a bare machine lacks (.gpu-deps, from `prepare`) -----------------------
cmake_extra=()
# GPU_CHECK_DEPS=always uses them on a machine that has its own (to test this part anywhere).
if [[ -d $deps/debs ]] && [[ ${GPU_CHECK_DEPS:-auto} == always || ! -f /usr/include/ucp/api/ucp.h ]]; then
  root=$deps/root
  if [[ ! -d $root ]]; then
    mkdir -p "$root" && for d in "$deps"/debs/*.deb; do dpkg -x "$d" "$root" || exit 1; done
    # UCX's CMake config names its prefix absolutely.
    sed -i "s|set(prefix \"/usr\")|set(prefix \"$root/usr\")|" "$root"/usr/lib/x86_64-linux-gnu/cmake/ucx/ucx-targets.cmake
  fi
  lib=$root/usr/lib/x86_64-linux-gnu
  # Debian's absolute symlinks (libz.so -> /lib/...) point into the unpacked tree instead.
  # (OpenBLAS's go through /etc/alternatives: BLAS_LIBRARIES and CPATH name its files.)
  for so in "$lib"/*.so; do
    target=$(readlink "$so") || continue
    [[ $target == /* && -e $root$target ]] && ln -sfn "$root$target" "$so"
  done
  export CMAKE_PREFIX_PATH=$root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export CPATH=$root/usr/include:$root/usr/include/x86_64-linux-gnu:$root/usr/include/x86_64-linux-gnu/openblas-pthread${CPATH:+:$CPATH}
  export LIBRARY_PATH=$lib:$lib/openblas-pthread:$root/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake_extra+=(-DBLAS_LIBRARIES="$lib/openblas-pthread/libopenblas.so" -DOPENSSL_ROOT_DIR="$root/usr"
                -DZLIB_ROOT="$root/usr")
fi
# nccl.h: the CUDA toolkit's, else the pip package's, else the one `prepare` carried.
if ! echo '#include <nccl.h>' | "$nvcc" -x cu -E - -o /dev/null >/dev/null 2>&1; then
  for inc in $(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "include"))' 2>/dev/null) \
             "$deps/include"; do
    [[ -f $inc/nccl.h ]] && { export CPATH=$inc${CPATH:+:$CPATH}; break; }
  done
fi
# libnccl.so.2 at run time: the loader's default, else the pip package's.
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
  nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [[ -f $nccl_lib ]] && export GRADCOMM_NCCL_LIBRARY=$nccl_lib
fi
# cuBLAS (PowerSGD) is opened at first use: the toolkit's, else the pip package's.
cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null)
for d in /usr/local/cuda/lib64 $cublas_dir; do
  [[ -d $d ]] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
done
data=/usr/share/datasets/fashion-mnist
[[ -f $data/train-images-idx3-ubyte.gz ]] || data=$deps/fashion-mnist

# ---- build ------------------------------------------------------------------------------
targets=(gradcomm-run gradcomm-bench gradcomm-train bench_cuda_dense bench_cuda_sparse)
if [[ ! -f $build/CMakeCache.txt ]]; then
  step configure 240 -- cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADCOMM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGRADCOMM_PYTHON=OFF -DGRADCOMM_TESTS=ON -DGRADCOMM_BENCH=ON "${cmake_extra[@]}"
fi
# A build with CUDA has the cuda_test_* targets.
mapfile -t cuda_tests < <(cd "$build" 2>/dev/null && ninja -t targets all 2>/dev/null |
                          sed -n 's/^\(cuda_test_[a-z_0-9]*\): phony$/\1/p')
if ((${#cuda_tests[@]} > 0)); then
  step build 420 -- cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" "${cuda_tests[@]}"
  built=$?
else
  not_run build "the build at $build has no CUDA"; failed=1; built=1
fi
bin() { echo "$build/$1"; }

# ---- 1. CUDA tests ---------------------------------------------------------------------------
# The test executables themselves, not ctest: ctest would write the build's Testing/ logs,
# which a ctest running this script (scripts.gpu_check) is writing too.
if ((built == 0)); then
  # shellcheck disable=SC2016  # (the inner script's own variables)
  step "CUDA tests" 300 -- bash -c 'rc=0; for t; do echo "==== $t"; "$t" --gtest_color=no || rc=1; done; exit $rc' \
    _ "${cuda_tests[@]/#/$build/tests/cuda/}"
  # gtest's summaries, e.g. "[  PASSED  ] 8 tests." and "[  SKIPPED ] 7 tests, listed below:"
  count() { awk -v k="$1" '$1 == "[" && $2 == k && $3 == "]" && $4 ~ /^[0-9]+$/ { n += $4 } END { print n + 0 }' "$work/step.out"; }
  nodev=$(grep -c '^no CUDA device' "$work/step.out")
  details+=("CUDA tests: $(count PASSED) passed, $(count FAILED) failed, $(count SKIPPED) skipped ($nodev for want of a device)." "")
  if ((gpus > 0 && nodev > 0)); then
    rows+=("| CUDA tests on a GPU machine | **FAILED: $nodev skipped with 'no CUDA device'** | 0 |"); failed=1
  fi
fi

# ---- 2. GPU microbenchmarks and 3. trainer ---------------------------------------------------
run=$(bin tools/gradcomm-run)
if ((built == 0 && gpus > 0)); then
  step "bench_cuda_dense" 90 -- "$(bin bench/bench_cuda_dense)"
  step "bench_cuda_sparse" 120 -- "$(bin bench/bench_cuda_sparse)"
  step "torch.topk vs gradcomm top-k" 120 -- python3 bench/cuda/torch_topk.py --bench "$(bin bench/bench_cuda_sparse)"
  # One GPU: ncclAllReduce needs a GPU per rank, so NCCL is compared at 1 rank (the path runs,
  # the kernels are timed) and 2 ranks share the GPU through the staged path.
  for c in none topk:ratio=0.01; do
    step "gradcomm-bench $c vs ncclAllReduce, 1 rank" 60 -- "$(bin bench/gradcomm-bench)" --device cuda \
      --baseline nccl -b 1M -e 64M -f 4 --check 1 --compressor "$c"
    step "gradcomm-bench $c, 2 ranks sharing the GPU (staged)" 60 -- "$run" -n 2 -- "$(bin bench/gradcomm-bench)" \
      --device cuda -b 1M -e 16M -f 4 --check 1 --compressor "$c"
  done
  for n in 1 2; do
    step "trainer, $n rank(s), 1 epoch on the GPU" 150 -- "$run" -n "$n" -- "$(bin trainer/gradcomm-train)" --device cuda \
      --data "$data" --epochs 1 --hidden 2048,2048 --batch-size 64 --compressor topk:ratio=0.01 --progress 0
  done
  # DGC's momentum correction: its masks come from Communicator::sent_mask on the device.
  step "trainer, 1 rank, momentum correction (device sent masks)" 90 -- "$run" -n 1 -- \
    "$(bin trainer/gradcomm-train)" --device cuda --data "$data" --epochs 1 --hidden 2048,2048 --batch-size 64 \
    --compressor topk:ratio=0.01 --momentum-correction --progress 0
else
  why="no GPU on this machine"; ((built == 0)) || why="the build failed"
  for s in bench_cuda_dense bench_cuda_sparse "torch.topk vs gradcomm top-k" "gradcomm-bench vs ncclAllReduce" \
           "trainer, 1 and 2 ranks, on the GPU" "trainer, momentum correction"; do not_run "$s" "$why"; done
  # Their CPU side still runs: each GPU benchmark says it found no device and exits 0.
  if ((built == 0)); then
    step "bench_cuda_sparse without a GPU" 30 -- "$(bin bench/bench_cuda_sparse)" --sizes 1M
  fi
  ((gpus > 0)) || echo "gpu-check: no GPU here: the GPU steps were not run" >>"$log"
fi

# ---- report -------------------------------------------------------------------------------
mkdir -p "$(dirname "$report")"
{
  echo "# gpu-check, $(date -u '+%F %H:%M') UTC"
  echo
  echo "- device: $gpu_line ($gpus GPU(s)); driver ${driver:-none}"
  echo "- host: $(uname -srm), $(nproc) cores; $toolchain"
  echo "- commit: $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$src" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "- command: \`scripts/gpu-check.sh --build-dir ${build#"$src"/} --budget $budget\`"
  echo "- result: $( ((failed)) && echo '**FAILED**' || echo 'every step passed')"
  echo
  echo "| step | status | seconds |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  printf '%s\n' "${details[@]}"
} >"$report"
if [[ -n ${OUT:-} ]]; then cp "$report" "$log" "$OUT/"; fi
echo "gpu-check: $( ((failed)) && echo FAILED || echo passed); report $report"
exit "$failed"
