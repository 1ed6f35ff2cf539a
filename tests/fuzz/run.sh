#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for SECONDS.
#
#   tests/fuzz/run.sh SECONDS [TARGET...]     build, then fuzz each target (default: all)
#   tests/fuzz/run.sh --write-seeds [TARGET...]  regenerate tests/fuzz/corpus/<target>/
#
# Targets (one per kind of untrusted bytes; each file's top comment says what it
# feeds where and which invariants it checks):
#   fuzz_state            communicator state files (parse_state)
#   fuzz_checkpoint       trainer checkpoints (parse_checkpoint, then parse_state)
#   fuzz_payload_header   compressed payload headers and PayloadReader
#   fuzz_dense_decode     dense codecs (fp16, bf16, quant, qsgd, sign) on received payloads
#   fuzz_sparse_decode    sparse payloads (topk, randomk, sketch) decode-add
#   fuzz_spec             compressor spec strings
#   fuzz_wire_header      what peer ranks send: call headers, abort notices, GPU setup
#                         records, gathered block sizes, select=sample counts
#   fuzz_store_protocol   TCP store frames: requests (server side), greeting, welcome,
#                         responses (client side), ADD counters
#   fuzz_store_server     a live TcpStoreServer on 127.0.0.1 fed each input over a socket
#
# ctest runs `run.sh 5` as fuzz.smoke. Longer campaigns, e.g. ten minutes per target
# or one target for an hour:
#   tests/fuzz/run.sh 600
#   tests/fuzz/run.sh 3600 fuzz_store_server
# Each target starts from its committed seeds (tests/fuzz/corpus/<target>/, read
# only) plus a scratch corpus under the build folder ($BUILD/corpus/<target>/) that
# keeps what earlier runs found, so campaigns resume where they stopped. A crash,
# leak, UB report, timeout or out-of-memory stops that target: the input lands in
# $BUILD/artifacts/<target>-crash-<sha1> (or leak-, timeout-, oom-), the log in
# $BUILD/<target>.log. Reproduce with `$BUILD/<target> $BUILD/artifacts/<file>`;
# once fixed, commit the input as tests/fuzz/corpus/<target>/crash-<what>.
#
# The main build uses g++; these targets are built here, outside CMake, because
# libFuzzer needs clang. The library sources they need are compiled into one static
# archive, so a target pulls in only the objects it references. Objects are rebuilt
# when their source, any project header, or the flags change.
#
# Environment: CLANGXX (default clang++), GRADCOMM_FUZZ_BUILD (default
# tests/fuzz/build), GRADCOMM_FUZZ_JOBS (parallel compiles, default nproc),
# GRADCOMM_FUZZ_CXXFLAGS (extra compiler flags).
# Exit status: non-zero if clang++ is missing, any build fails or any target finds
# a crash.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${GRADCOMM_FUZZ_BUILD:-$here/build}
cxx=${CLANGXX:-clang++}
jobs=${GRADCOMM_FUZZ_JOBS:-$(nproc)}

all_targets=(fuzz_state fuzz_checkpoint fuzz_payload_header fuzz_dense_decode fuzz_sparse_decode fuzz_spec
             fuzz_wire_header fuzz_store_protocol fuzz_store_server)

usage() { echo "usage: $0 SECONDS [TARGET...] | --write-seeds [TARGET...]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
write_seeds=0
seconds=0
if [[ $1 == --write-seeds ]]; then
  write_seeds=1
elif [[ $1 =~ ^[0-9]+$ ]]; then
  seconds=$1
else
  usage
fi
shift
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "run.sh: unknown target $t (known: ${all_targets[*]})" >&2; exit 2; }
done

command -v "$cxx" >/dev/null || {
  echo "run.sh: $cxx not found: install clang and libclang-rt-dev (scripts/install-deps.sh does)" >&2
  exit 1
}

# fmt is compiled here too (fmt_once.cc), instrumented like the rest, instead of
# linking the g++-built libfmt.
flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/base" -I"$root/src" -I"$root" -I"$here")
# Extra flags for experiments, e.g. GRADCOMM_FUZZ_CXXFLAGS=-fno-sanitize=nonnull-attribute.
read -r -a extra <<< "${GRADCOMM_FUZZ_CXXFLAGS:-}"
flags+=("${extra[@]}")
# Host code only: the CUDA codecs' host halves (compressors/*/gpu_*.cc) need the CUDA
# headers and have no CPU path to fuzz.
lib_sources=(base/errors.cc base/types.cc src/state.cc base/env.cc base/logging.cc src/wire.cc src/gpu_plan.cc base/half_bulk.cc
             base/reduce.cc
             transport/ucx/ucx_wire.cc trainer/checkpoint.cc
             store/tcp_store_protocol.cc store/tcp_store_server.cc store/tcp_store_client.cc
             store/socket_util.cc store/auth.cc tests/fuzz/fmt_once.cc)
# Every host source of the compressors layer, found rather than listed, so a new file
# there cannot leave this build short of a symbol.
while IFS= read -r f; do lib_sources+=("$f"); done < <(cd "$root" && find compressors -name '*.cc' \
                                                        ! -name 'gpu_*' | sort)

mkdir -p "$build/obj" "$build/artifacts" "$build/corpus"
# Flags changed since the last build: start over.
if [[ ! -f $build/flags || "$(cat "$build/flags")" != "$cxx ${flags[*]}" ]]; then
  rm -f "$build"/obj/*.o
  echo "$cxx ${flags[*]}" > "$build/flags"
fi

# Compiles one source into obj/ unless its object is newer than it and every header.
compile_one() {
  local src=$1 obj=$build/obj/${1//\//_}.o
  if [[ -f $obj && $obj -nt $root/$src ]] &&
     [[ -z $(find "$root/include" "$root/base" "$root/src" "$root/compressors" "$root/transport" "$root/trainer" "$here" \
                -name "*.h" -newer "$obj" \
                -print -quit) ]]; then
    return 0
  fi
  echo "  CXX $src"
  "$cxx" "${flags[@]}" -c "$root/$src" -o "$obj"
}
export -f compile_one
export build root here cxx
export flags_str="${flags[*]}"

echo "run.sh: compiling ${#lib_sources[@]} library sources with $cxx"
# xargs runs a fresh bash per file: pass the flags as one string and split it there.
printf '%s\n' "${lib_sources[@]}" |
  xargs -P "$jobs" -I{} bash -c 'flags=($flags_str); compile_one "$@"' _ {} ||
  { echo "run.sh: library sources do not compile with $cxx" >&2; exit 1; }
objects=()
for src in "${lib_sources[@]}"; do objects+=("$build/obj/${src//\//_}.o"); done
rm -f "$build/libgradcomm_fuzz.a"
ar rcs "$build/libgradcomm_fuzz.a" "${objects[@]}"

status=0
for t in "${targets[@]}"; do
  echo "  LINK $t"
  # Every target must build: a missing one fails the run (and fuzz.smoke).
  if ! "$cxx" "${flags[@]}" "$here/$t.cc" "$build/libgradcomm_fuzz.a" -lcrypto -pthread -o "$build/$t"; then
    echo "run.sh: $t does not build" >&2
    status=1
    continue
  fi

  if [[ $write_seeds == 1 ]]; then
    # Regression inputs (crash-*) stay; the generated seeds are rewritten.
    mkdir -p "$here/corpus/$t"
    find "$here/corpus/$t" -maxdepth 1 -type f ! -name 'crash-*' -delete
    GRADCOMM_FUZZ_WRITE_SEEDS="$here/corpus/$t" "$build/$t"
    echo "run.sh: $t: wrote $(ls "$here/corpus/$t" | wc -l) seeds"
    continue
  fi

  mkdir -p "$build/corpus/$t" "$here/corpus/$t"
  echo "run.sh: fuzzing $t for ${seconds}s"
  log=$build/$t.log
  if ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
     LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan.supp:print_suppressions=0} \
     UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
     "$build/$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=4096 \
       -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
       "$build/corpus/$t" "$here/corpus/$t" > "$log" 2>&1; then
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo '?')
    rate=$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo '?')
    echo "run.sh: $t OK ($execs executions, $rate/s)"
  else
    echo "run.sh: $t FAILED; log $log, artifacts $build/artifacts/$t-*" >&2
    tail -n 60 "$log" >&2
    status=1
  fi
done
exit $status
