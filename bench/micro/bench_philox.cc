// Cost of philox_uniform16_blocks on each path (scalar, avx2, avx512), in thread CPU
// time, so that time the thread spends descheduled on a shared machine does not count
// (cache and frequency effects of neighbours still do: compare medians of
// interleaved runs, not single numbers).
//
//   time BLOCKS REPS   REPS rounds; each round times every path the CPU has once, in
//                      turn, on BLOCKS blocks in both of these forms:
//       chunked  calls of 128 blocks into one 4 KiB buffer, as the dense codecs'
//                fill_uniforms does (kDenseChunk = 1024 uniforms): output in L1;
//       one-call one call over a BLOCKS * 32-byte buffer: bound by memory writes when
//                that is larger than the caches; "memset" times a memset of the
//                same buffer, the floor for that form.
//     Prints ns per block (8 uniforms) per path and form: median, min, max.
//     Checks first that all paths give the same bits on the timed range.
//   count PATH BLOCKS  one chunked pass with callgrind instrumentation on around it
//                      (PATH scalar or avx2: valgrind's CPU has no AVX-512):
//       valgrind --tool=callgrind --instr-atstart=no build/bench/bench_philox count avx2 1048576
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>  // client requests: no-ops when not under callgrind
#else
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compressors/cpu_kernels.h"
#include "compressors/philox.h"

namespace gradcomm::detail {
namespace {

constexpr uint64_t kChunkBlocks = 128;  // fill_uniforms' 1024 uniforms
const PhiloxStream kStream{42, 0x0123456789ABCDEFull};

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Runs f with the kernels capped at `path`; "avx512" is the uncapped default.
template <class F>
void on_path(const std::string& path, F f) {
  std::optional<ScopedKernelCap> cap;
  if (path == "scalar") cap.emplace(ScopedKernelCap::kScalar);
  if (path == "avx2") cap.emplace(ScopedKernelCap::kAvx2);
  if (path != philox_uniform_blocks_path()) {
    std::fprintf(stderr, "path %s not available here (got %s)\n", path.c_str(), philox_uniform_blocks_path());
    std::exit(2);
  }
  f();
}

void chunked(uint64_t blocks, float* chunk) {
  for (uint64_t b = 0; b < blocks; b += kChunkBlocks) {
    philox_uniform16_blocks(kStream, b, std::min(kChunkBlocks, blocks - b), chunk);
  }
}

std::vector<std::string> paths_here() {
  std::vector<std::string> paths = {"scalar"};
  if (use_avx2_kernels()) paths.push_back("avx2");
  if (use_avx512_kernels()) paths.push_back("avx512");
  return paths;
}

int run_time(uint64_t blocks, int reps) {
  const std::vector<std::string> paths = paths_here();
  std::vector<float> big(8 * blocks), reference(8 * blocks);
  float chunk[8 * kChunkBlocks];
  on_path("scalar", [&] { philox_uniform16_blocks(kStream, 0, blocks, reference.data()); });
  for (const std::string& path : paths) {
    on_path(path, [&] { philox_uniform16_blocks(kStream, 0, blocks, big.data()); });
    if (std::memcmp(big.data(), reference.data(), big.size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "%s differs from scalar\n", path.c_str());
      return 1;
    }
  }
  struct Series {
    std::string name;
    std::vector<double> ns_per_block;
  };
  std::vector<Series> series;
  for (const std::string& path : paths) {
    series.push_back({path + " chunked", {}});
    series.push_back({path + " one-call", {}});
  }
  series.push_back({"memset one-call", {}});
  auto timed = [&](Series& s, auto f) {
    const double t0 = thread_seconds();
    f();
    s.ns_per_block.push_back(1e9 * (thread_seconds() - t0) / static_cast<double>(blocks));
  };
  for (int rep = 0; rep < reps; ++rep) {
    size_t k = 0;
    for (const std::string& path : paths) {
      on_path(path, [&] {
        timed(series[k++], [&] { chunked(blocks, chunk); });
        timed(series[k++], [&] { philox_uniform16_blocks(kStream, 0, blocks, big.data()); });
      });
    }
    timed(series[k], [&] { std::memset(big.data(), rep, big.size() * sizeof(float)); });
  }
  std::printf("%llu blocks (%llu uniforms), %d interleaved rounds, thread CPU time\n",
              static_cast<unsigned long long>(blocks), static_cast<unsigned long long>(8 * blocks), reps);
  std::printf("%-18s %12s %12s %12s %14s\n", "path", "median ns/blk", "min", "max", "median ns/unif");
  for (Series& s : series) {
    std::vector<double>& v = s.ns_per_block;
    std::sort(v.begin(), v.end());
    const double median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    std::printf("%-18s %12.3f %12.3f %12.3f %14.3f\n", s.name.c_str(), median, v.front(), v.back(), median / 8);
  }
  return 0;
}

int run_count(const std::string& path, uint64_t blocks) {
  float chunk[8 * kChunkBlocks];
  on_path(path, [&] {
    CALLGRIND_START_INSTRUMENTATION;
    chunked(blocks, chunk);
    CALLGRIND_STOP_INSTRUMENTATION;
  });
  std::printf("%s: %llu blocks\n", path.c_str(), static_cast<unsigned long long>(blocks));
  return 0;
}

}  // namespace
}  // namespace gradcomm::detail

int main(int argc, char** argv) {
  using namespace gradcomm::detail;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "time" && argc == 4) return run_time(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]));
  if (mode == "count" && argc == 4) return run_count(argv[2], std::strtoull(argv[3], nullptr, 10));
  std::fprintf(stderr, "usage: %s time BLOCKS REPS | count scalar|avx2 BLOCKS\n", argv[0]);
  return 2;
}
