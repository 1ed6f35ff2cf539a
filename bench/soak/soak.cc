// gradcomm-soak: many small allreduces in one job, watching for leaks.
//
//   gradcomm-run -n 4 -- gradcomm-soak --iters 100000 --warmup 5000 --csv-dir DIR
//   (bench/soak/run.sh wraps this and prints the summary)
//
// Iteration i allreduces a persistent fp32 buffer of sizes[i % S] elements with
// compressors[(i / S) % C] (default 1..64 KiB x {none, topk}), and every
// --barrier-every iterations calls barrier(). Each rank samples its own VmRSS
// (/proc/self/status) and open descriptors (/proc/self/fd) at the end of the
// warm-up and every --sample-every iterations after it, and writes them to
// DIR/soak-rank<R>.csv.
//
// Pass (per rank): the largest RSS after the warm-up is within --rss-tolerance
// (10 %) of the RSS at the end of the warm-up, and the descriptor count never
// changes after it. The ranks exchange verdicts, rank 0 prints them, and every
// rank exits with the worst verdict: 0 pass, 1 leak, 2 wrong results (3: an error).
//
// The work is checked too, so a soak cannot pass by doing nothing: inputs are small
// integers, so with `none` the sum is exact and compared element by element with
// the closed form; and every rank folds every result into a running hash, which
// must be the same on all ranks (allgathered at each sample) - all ranks hold
// bitwise the same bytes after every allreduce, compressed ones included.
//
// --inject-leak-bytes B / --inject-fd-leak make the soak itself leak (B bytes per
// iteration; one descriptor per 100 iterations), so a test can show the detector
// catches what it claims to (ctest soak.detects_*).
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_list.h"  // base/: lists on command lines
#include "gradcomm/gradcomm.h"

namespace {

using namespace gradcomm;
using Clock = std::chrono::steady_clock;

// ---- what a sample reads ------------------------------------------------------

// VmRSS of this process in KiB (resident set: what a leak grows).
int64_t rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  throw std::runtime_error("no VmRSS line in /proc/self/status");
}

// Open descriptors; the directory stream's own descriptor is counted each time, so
// the count is consistent between samples.
int64_t open_fds() {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// ---- the work -----------------------------------------------------------------

// Rank r's input for iteration `it`: (r + 1) * v with v a small integer in -6..6,
// so any sum over ranks and elements is exact in fp32.
float base_value(int64_t i, int64_t it) { return static_cast<float>((i * 7 + it) % 13 - 6); }

uint64_t fold(uint64_t hash, const float* data, int64_t numel) {
  // FNV-1a over 32-bit words: cheap, and any differing bit changes it.
  for (int64_t i = 0; i < numel; ++i) hash = (hash ^ std::bit_cast<uint32_t>(data[i])) * 1099511628211ull;
  return hash;
}

struct Sample {
  int64_t iteration;
  double elapsed_s;
  int64_t rss_kib;
  int64_t fds;
  double iters_per_s;  // since the previous sample
};

struct Options {
  int64_t iters = 100'000;
  int64_t warmup = 5'000;
  int64_t sample_every = 1'000;
  int64_t barrier_every = 500;
  std::string sizes = "256,1024,4096,16384";  // fp32 elements: 1, 4, 16, 64 KiB
  std::string compressors = "none;topk:ratio=0.01";
  double rss_tolerance = 0.10;
  std::string csv_dir = ".";
  int64_t inject_leak_bytes = 0;
  bool inject_fd_leak = false;
};

// The deliberate leaks of --inject-*; released at exit, after the last sample.
struct InjectedLeaks {
  std::vector<std::unique_ptr<char[]>> blocks;
  std::vector<int> fds;
  ~InjectedLeaks() {
    for (int fd : fds) ::close(fd);
  }
};

int run(const Options& opt) {
  auto comm = Communicator::create();
  const int rank = comm->rank(), n = comm->size();
  const std::vector<int64_t> sizes = detail::parse_int_list("--sizes", opt.sizes);
  const std::vector<std::string> compressors = detail::split_list("--compressors", opt.compressors, ';');
  for (int64_t numel : sizes) {
    if (numel < 1) throw InvalidArgument(fmt::format("gradcomm-soak: --sizes '{}': {} is not a size", opt.sizes, numel));
  }

  // Buffers are allocated once: a soak measures the library, not this loop.
  std::vector<std::vector<float>> buffers;
  for (int64_t numel : sizes) buffers.emplace_back(static_cast<size_t>(numel));
  std::vector<CompressOptions> options(compressors.size() * sizes.size());
  for (size_t c = 0; c < compressors.size(); ++c) {
    for (size_t s = 0; s < sizes.size(); ++s) {
      options[c * sizes.size() + s] = {compressors[c], fmt::format("soak/{}/{}", c, sizes[s]), nullptr};
    }
  }
  const float rank_scale = static_cast<float>(rank + 1);
  const float sum_scale = static_cast<float>(n * (n + 1) / 2);

  std::vector<Sample> samples;
  int64_t running_hash = static_cast<int64_t>(14695981039346656037ull);  // int64: a dtype allgather takes
  int64_t wrong = 0, hash_mismatches = 0;
  auto start = Clock::now();
  auto last_time = start;
  int64_t last_iter = 0;
  auto take_sample = [&](int64_t iteration) {
    // Every rank must agree on every byte it received so far.
    std::vector<int64_t> hashes(static_cast<size_t>(n));
    comm->allgather(TensorView::of(&running_hash, 1), TensorView::of(hashes.data(), n));
    for (int64_t h : hashes) hash_mismatches += h != running_hash;
    auto now = Clock::now();
    double since_last = std::chrono::duration<double>(now - last_time).count();
    samples.push_back({iteration, std::chrono::duration<double>(now - start).count(), rss_kib(), open_fds(),
                       since_last > 0 ? static_cast<double>(iteration - last_iter) / since_last : 0});
    last_time = now;
    last_iter = iteration;
  };

  InjectedLeaks injected;
  take_sample(0);
  for (int64_t it = 0; it < opt.iters; ++it) {
    if (opt.inject_leak_bytes > 0) {
      injected.blocks.push_back(std::make_unique<char[]>(static_cast<size_t>(opt.inject_leak_bytes)));
      std::memset(injected.blocks.back().get(), 1, static_cast<size_t>(opt.inject_leak_bytes));  // resident
    }
    if (opt.inject_fd_leak && it % 100 == 0) injected.fds.push_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    const size_t s = static_cast<size_t>(it % static_cast<int64_t>(sizes.size()));
    const size_t c = static_cast<size_t>((it / static_cast<int64_t>(sizes.size())) %
                                         static_cast<int64_t>(compressors.size()));
    std::vector<float>& x = buffers[s];
    const int64_t numel = sizes[s];
    for (int64_t i = 0; i < numel; ++i) x[i] = rank_scale * base_value(i, it);
    comm->allreduce(TensorView::of(x.data(), numel), ReduceOp::kSum, options[c * sizes.size() + s]);
    if (compressors[c] == "none") {
      for (int64_t i = 0; i < numel; ++i) wrong += x[i] != sum_scale * base_value(i, it);
    } else {
      for (int64_t i = 0; i < numel; ++i) wrong += !std::isfinite(x[i]);
    }
    running_hash = static_cast<int64_t>(fold(static_cast<uint64_t>(running_hash), x.data(), numel));
    if (opt.barrier_every > 0 && (it + 1) % opt.barrier_every == 0) comm->barrier();
    const int64_t done = it + 1;
    if (done == opt.warmup || (done > opt.warmup && (done - opt.warmup) % opt.sample_every == 0) ||
        done == opt.iters) {
      if (samples.back().iteration != done) take_sample(done);
    }
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - start).count();

  // ---- verdict ------------------------------------------------------------------
  std::filesystem::create_directories(opt.csv_dir);
  auto csv_path = std::filesystem::path(opt.csv_dir) / fmt::format("soak-rank{}.csv", rank);
  std::ofstream csv(csv_path);
  csv << "rank,iteration,phase,elapsed_s,rss_kib,open_fds,iters_per_s\n";
  const Sample* baseline = nullptr;
  for (const auto& sample : samples) {
    if (!baseline && sample.iteration >= opt.warmup) baseline = &sample;
    csv << fmt::format("{},{},{},{:.3f},{},{},{:.1f}\n", rank, sample.iteration,
                       sample.iteration < opt.warmup ? "warmup" : "steady", sample.elapsed_s, sample.rss_kib,
                       sample.fds, sample.iters_per_s);
  }
  if (!csv) throw std::runtime_error(fmt::format("gradcomm-soak: cannot write {}", csv_path.string()));
  if (!baseline) throw InvalidArgument("gradcomm-soak: --warmup must be below --iters");

  int64_t rss_max = baseline->rss_kib, fds_min = baseline->fds, fds_max = baseline->fds;
  for (const auto& sample : samples) {
    if (sample.iteration < baseline->iteration) continue;
    rss_max = std::max(rss_max, sample.rss_kib);
    fds_min = std::min(fds_min, sample.fds);
    fds_max = std::max(fds_max, sample.fds);
  }
  const double growth = static_cast<double>(rss_max - baseline->rss_kib) / static_cast<double>(baseline->rss_kib);
  bool leak = growth > opt.rss_tolerance || fds_min != fds_max;
  int64_t verdict = wrong > 0 || hash_mismatches > 0 ? 2 : leak ? 1 : 0;

  std::string line = fmt::format(
      "rank {}: {} iterations in {:.1f} s ({:.0f}/s); RSS after warm-up {} KiB, max {} KiB ({:+.1f} %), final {} "
      "KiB; fds {}..{}; {} wrong values, {} hash mismatches: {}",
      rank, opt.iters, total_s, static_cast<double>(opt.iters) / total_s, baseline->rss_kib, rss_max,
      100 * growth, samples.back().rss_kib, fds_min, fds_max, wrong, hash_mismatches,
      verdict == 0 ? "PASS" : verdict == 1 ? "FAIL (leak)" : "FAIL (wrong results)");
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);

  std::vector<int64_t> verdicts(static_cast<size_t>(n));
  comm->allgather(TensorView::of(&verdict, 1), TensorView::of(verdicts.data(), n));
  int64_t worst = *std::max_element(verdicts.begin(), verdicts.end());
  if (rank == 0) std::printf("SOAK %s (ranks %d, verdicts 0=pass 1=leak 2=wrong)\n", worst == 0 ? "PASS" : "FAIL", n);
  return static_cast<int>(worst);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"gradcomm-soak: many small allreduces; RSS and descriptors must stay flat"};
  app.add_option("--iters", opt.iters, "allreduces per rank")->check(CLI::PositiveNumber);
  app.add_option("--warmup", opt.warmup, "iterations before the baseline sample")->check(CLI::NonNegativeNumber);
  app.add_option("--sample-every", opt.sample_every, "iterations between samples after the warm-up")
      ->check(CLI::PositiveNumber);
  app.add_option("--barrier-every", opt.barrier_every, "iterations between barriers (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--sizes", opt.sizes, "fp32 element counts, comma-separated");
  app.add_option("--compressors", opt.compressors, "compressor specs, ';'-separated");
  app.add_option("--rss-tolerance", opt.rss_tolerance, "allowed RSS growth after the warm-up (0.10 = 10 %)");
  app.add_option("--csv-dir", opt.csv_dir, "where each rank writes soak-rank<R>.csv");
  app.add_option("--inject-leak-bytes", opt.inject_leak_bytes, "leak this many bytes per iteration (detector test)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--inject-fd-leak", opt.inject_fd_leak, "leak a descriptor every 100 iterations (detector test)");
  CLI11_PARSE(app, argc, argv);
  if (opt.warmup >= opt.iters) {
    std::fprintf(stderr, "gradcomm-soak: --warmup %lld must be below --iters %lld\n",
                 static_cast<long long>(opt.warmup), static_cast<long long>(opt.iters));
    return 3;
  }
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradcomm-soak: %s\n", e.what());
    return 3;
  }
}
