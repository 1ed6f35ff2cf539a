#!/usr/bin/env bash
# Builds the tests under sanitizers and runs them (issue [F]); .ci/run calls it after
# scripts/test.sh. Two builds, because ASan and TSan cannot share a process:
#   build-asan  GRADCOMM_SANITIZE=address,undefined: the unit, launcher, multi-process
#               and trainer tests (ranks, gradcomm-run and gradcomm-train instrumented
#               too: they are built in the same tree). Leaks, heap/stack misuse and UB
#               fail the test that caused them.
#   build-tsan  GRADCOMM_SANITIZE=thread: the tests where our threads share state: the
#               unit tests that run ranks as threads (in-process transport, UCX workers
#               per thread) or talk to the TCP store server's thread from client threads.
# Each also runs its canaries (tests/sanitizers/, label "sanitizer"): deliberate bugs
# that must fail, proving the instrumentation and the options below are in effect.
#
#   scripts/test-sanitizers.sh               both
#   scripts/test-sanitizers.sh asan          one of them (asan | tsan)
#   JOBS=2 CTEST_ARGS="-R Store" scripts/test-sanitizers.sh asan
# Multi-process tests are not run under TSan: their ranks are single-threaded but for
# the store server (covered in-process by the store unit tests) and the fault tests'
# deliberate std::exit from a side thread, which races with main by design.
# Dependencies come from scripts/install-deps.sh (scripts/test.sh runs it first).
# Exit status: nonzero when any build or test failed; both stages run regardless.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

jobs=${JOBS:-$(nproc)}
if (($# == 0)); then set -- asan tsan; fi
stages=("$@")
for stage in "${stages[@]}"; do
  if [[ $stage != asan && $stage != tsan ]]; then
    echo "test-sanitizers: unknown stage '$stage' (expected asan or tsan)" >&2
    exit 2
  fi
done
supp="$root/tests/sanitizers"

# Runtime options, exported before building too: gtest_discover_tests runs each test
# binary (--gtest_list_tests) at build time, and the ranks that gradcomm-run starts
# inherit them. The first report is fatal (halt_on_error) with exit status 66, which
# a multi-process test sees as a failed rank; abort_on_error=0 keeps it an exit, not
# a core dump. fast_unwind_on_malloc=0: allocation stacks through UCX (built without
# frame pointers) are complete, so lsan.supp can name UCX's functions (~10% slower).
common="print_summary=1:halt_on_error=1:abort_on_error=0:exitcode=66:handle_abort=1"
export ASAN_OPTIONS="$common:detect_leaks=1:fast_unwind_on_malloc=0:detect_stack_use_after_return=1"
ASAN_OPTIONS+=":strict_init_order=1:check_initialization_order=1:detect_odr_violation=2"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="$common:print_stacktrace=1"
export TSAN_OPTIONS="$common:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
# mpirun refuses root without these (nothing here uses MPI today; harmless).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# -O1 -g1, not RelWithDebInfo's -O2 -g: the optimization level the sanitizers' own
# docs recommend, and line tables are all a report's stack needs. It halves the
# compile (the ASan tree: 600 -> 350 s on 2 cores), which is most of CI's time here.
sanitizer_flags="-O1 -g1 -DNDEBUG"
configure() {  # configure DIR SANITIZERS
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMM_SANITIZE="$2" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$sanitizer_flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$sanitizer_flags" \
    -DGRADCOMM_CUDA=OFF -DGRADCOMM_PYTHON=OFF -DGRADCOMM_BENCH=OFF -DGRADCOMM_TESTS=ON ${CMAKE_ARGS:-}
}

# The unit test executables whose threads share state: ranks as threads
# (run_ranks*, run_on_segment), or threads of their own (store clients vs the server thread).
threaded_unit_targets() {
  local f
  for f in $(grep -l -E 'run_ranks|run_on_segment|std::thread' tests/unit/test_*.cc); do
    echo "unit_$(basename "$f" .cc)"
  done
}

status=0
summary=()
for stage in "${stages[@]}"; do
  start=$SECONDS
  case $stage in
    asan)
      dir=${ASAN_BUILD_DIR:-build-asan}
      configure "$dir" address,undefined || { status=1; summary+=("asan: configure FAILED"); continue; }
      # With bench, CUDA and Python off, "all" is exactly the chosen tests and the
      # programs they start (gradcomm-run, gradcomm-test-worker, gradcomm-train).
      targets=(all)
      labels='^(unit|multiproc|launcher|trainer|sanitizer)$'
      # Left to the plain stage: the allreduce matrix's 4M-element cases. The 1M cases
      # run the same chunked code paths (several chunks per step at every N); the 4M
      # ones took 159 s of the stage's 725 here. The >2 GiB ring (64-bit sizes: the same
      # code at other sizes runs here; 16-32 s and 2 GiB of shadowed memory under ASan).
      # The fault matrix's SIGSTOP cases: each waits out a deadline (6 s, idle) to reach
      # the timeout path, which the unit Timeout tests and MultiprocAsync's stopped peer
      # run here; every other fault kind of the matrix still runs under ASan.
      exclude='_FourMillion_|^RingAllreduceLarge\.|/sigstop_N'
      stage_env=()
      ;;
    tsan)
      dir=${TSAN_BUILD_DIR:-build-tsan}
      configure "$dir" thread || { status=1; summary+=("tsan: configure FAILED"); continue; }
      mapfile -t targets < <(threaded_unit_targets)
      targets+=(sanitizer_canary)
      labels='^(unit|sanitizer)$'
      # Left to the other stages: the >2 GiB ring (64-bit sizes; over 3 minutes and
      # past its 60 s deadline under TSan) and the 4M-element cases of the allreduce
      # matrix, which repeat the 1M cases' thread interplay at 4x the (slow) cost.
      # And the fp16 exactness sweep over sizes (60 s under TSan, the stage's long pole: its
      # threads interplay as every other compressed allreduce's here, which stay), and the
      # error-feedback stability sweep (500 steps per spec, 22 s plain: the same calls'
      # interplay again; its refusal tests stay).
      exclude='^RingAllreduceLarge\.|_FourMillion_|^CompressedAllreduce\.Fp16StaysWithinRoundingOfTheExactSum$|^EveryFamily/AcceptedSpec\.'
      # UCX's libucm patches madvise (memory events for its registration cache);
      # glibc calls madvise on a finished thread's stack, where the hook's
      # pthread_rwlock, intercepted by TSan for a thread it has already retired,
      # crashes (SIGSEGV in __tsan::MutexPreReadLock). Nothing here needs the cache.
      # TSan runs several times slower: tests that bound only how long the machine
      # takes (not a deadline they are about) stretch those bounds by this factor.
      stage_env=(UCX_MEM_EVENTS=no GRADCOMM_TEST_TIME_SCALE=4)
      ;;
  esac
  echo "test-sanitizers: $stage: building ${targets[*]} in $dir"
  if ! env "${stage_env[@]}" cmake --build "$dir" -j"$jobs" --target "${targets[@]}"; then
    echo "test-sanitizers: $stage: build failed" >&2
    summary+=("$stage: build FAILED")
    status=1
    continue
  fi
  # Unit executables this stage does not build leave a "<target>_NOT_BUILT" entry.
  if (cd "$dir" && env "${stage_env[@]}" ctest --output-on-failure --no-tests=error -j"$jobs" -L "$labels" \
    -E "_NOT_BUILT\$${exclude:+|$exclude}" ${CTEST_ARGS:-}); then
    summary+=("$stage: passed")
  else
    status=1
    summary+=("$stage: FAILED")
    scripts/failed-output.sh "$dir"
    while read -r line; do summary+=("  $line"); done < "$dir/Testing/Temporary/LastTestsFailed.log"
  fi
  echo "test-sanitizers: $stage: build + tests took $((SECONDS - start)) s"
done
printf 'test-sanitizers: %s\n' "${summary[@]}"
exit $status
