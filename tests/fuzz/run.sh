#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for SECONDS.
#
#   tests/fuzz/run.sh SECONDS [TARGET...]     build, then fuzz each target (default: all)
#   tests/fuzz/run.sh --write-seeds           regenerate tests/fuzz/corpus/<target>/
#
# The main build uses g++; these targets are built here, outside CMake, because
# libFuzzer needs clang. The library sources they need are compiled into one static
# archive, so a target pulls in only the objects it references. Objects are rebuilt
# when their source, any project header, or the flags change.
#
# Each target starts from its committed seeds (tests/fuzz/corpus/<target>/, read
# only) plus a scratch corpus under the build folder that keeps what earlier runs
# found. Crash inputs land in $BUILD/artifacts/. The decoder targets are built once
# their codecs exist (make_dense_codec / decode_add_sparse defined somewhere under
# compressors/); until then they are skipped, or fail with GRADCOMM_FUZZ_REQUIRE_ALL=1.
#
# Environment: CLANGXX (default clang++), GRADCOMM_FUZZ_BUILD (default
# tests/fuzz/build), GRADCOMM_FUZZ_JOBS (parallel compiles, default nproc),
# GRADCOMM_FUZZ_CXXFLAGS (extra compiler flags).
# Exit status: non-zero if any build fails or any target finds a crash.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${GRADCOMM_FUZZ_BUILD:-$here/build}
cxx=${CLANGXX:-clang++}
jobs=${GRADCOMM_FUZZ_JOBS:-$(nproc)}

all_targets=(fuzz_state fuzz_payload_header fuzz_spec fuzz_dense_decode fuzz_sparse_decode)

usage() { echo "usage: $0 SECONDS [TARGET...] | --write-seeds" >&2; exit 2; }
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

command -v "$cxx" >/dev/null || { echo "run.sh: $cxx not found" >&2; exit 1; }

# FMT_HEADER_ONLY: fmt is compiled into the targets, instrumented like the rest,
# instead of linking the g++-built libfmt.
flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -DFMT_HEADER_ONLY
       -I"$root/include" -I"$root/src" -I"$root" -I"$here")
# Extra flags for experiments, e.g. GRADCOMM_FUZZ_CXXFLAGS=-fno-sanitize=nonnull-attribute.
read -r -a extra <<< "${GRADCOMM_FUZZ_CXXFLAGS:-}"
flags+=("${extra[@]}")
lib_sources=(src/errors.cc src/types.cc src/state.cc src/env.cc src/logging.cc
             compressors/payload.cc compressors/registry.cc compressors/philox.cc)
while IFS= read -r f; do lib_sources+=("$f"); done < <(cd "$root" && find compressors -mindepth 2 -name '*.cc' | sort)

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
     [[ -z $(find "$root/include" "$root/src" "$root/compressors" "$here" -name "*.h" -newer "$obj" \
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
  xargs -P "$jobs" -I{} bash -c 'flags=($flags_str); compile_one "$@"' _ {}
objects=()
for src in "${lib_sources[@]}"; do objects+=("$build/obj/${src//\//_}.o"); done
rm -f "$build/libgradcomm_fuzz.a"
ar rcs "$build/libgradcomm_fuzz.a" "${objects[@]}"

# Whether the decoders a target exercises are defined yet (others write them).
defined() { grep -rqE "^[A-Za-z].*[ *&]$1\(" "$root/compressors" --include='*.cc'; }

status=0
for t in "${targets[@]}"; do
  case $t in
    fuzz_dense_decode) need=make_dense_codec ;;
    fuzz_sparse_decode) need=decode_add_sparse ;;
    fuzz_state | fuzz_payload_header | fuzz_spec) need= ;;
    *) echo "run.sh: unknown target $t (known: ${all_targets[*]})" >&2; exit 2 ;;
  esac
  if [[ -n $need ]] && ! defined "$need"; then
    if [[ ${GRADCOMM_FUZZ_REQUIRE_ALL:-0} == 1 ]]; then
      echo "run.sh: $t: $need is not defined under compressors/" >&2
      status=1
    else
      echo "run.sh: SKIP $t ($need is not defined under compressors/ yet)"
    fi
    continue
  fi
  echo "  LINK $t"
  "$cxx" "${flags[@]}" "$here/$t.cc" "$build/libgradcomm_fuzz.a" -o "$build/$t"

  if [[ $write_seeds == 1 ]]; then
    rm -rf "$here/corpus/$t" && mkdir -p "$here/corpus/$t"
    GRADCOMM_FUZZ_WRITE_SEEDS="$here/corpus/$t" "$build/$t"
    echo "run.sh: $t: wrote $(ls "$here/corpus/$t" | wc -l) seeds"
    continue
  fi

  mkdir -p "$build/corpus/$t" "$here/corpus/$t"
  echo "run.sh: fuzzing $t for ${seconds}s"
  log=$build/$t.log
  if ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
     UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
     "$build/$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=4096 \
       -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
       "$build/corpus/$t" "$here/corpus/$t" > "$log" 2>&1; then
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo '?')
    echo "run.sh: $t OK ($execs executions)"
  else
    echo "run.sh: $t FAILED; log $log, artifacts $build/artifacts/$t-*" >&2
    tail -n 60 "$log" >&2
    status=1
  fi
done
exit $status
