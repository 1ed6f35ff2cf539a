// gradcomm-cpu-cost: what each phase of each compressor's host hot path costs one
// thread, per element, set against the bytes it must move.
//
//   gradcomm-cpu-cost --sizes 1M,4M,16M,64M --reps 5 --json out.json
//   valgrind --tool=callgrind --collect-atstart=no gradcomm-cpu-cost --sizes 1M --reps 1 --bandwidth-mib 0
//   (bench/cpu_cost/run.sh does both and writes the table; README.md explains the columns)
//
// Per phase and size: the median thread CPU time over --reps executions (after one
// untimed warm-up execution, so first-call costs and the allocator's first mmap are
// not charged), and the memory-traffic floor: the phase's bytes (phases.cc states the
// formula) over the memcpy bandwidth measured at the start of this run. The first
// timed execution is wrapped in CALLGRIND_TOGGLE_COLLECT and followed by
// CALLGRIND_DUMP_STATS_AT("compressor/phase/n"): under callgrind with
// --collect-atstart=no each dump holds exactly that one execution's instructions.
// Natively the client requests are a few no-op instructions.
//
// Single-threaded by design: CLOCK_THREAD_CPUTIME_ID counts this thread only, so
// run.sh pins OpenBLAS (PowerSGD's products) to one thread too.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <valgrind/callgrind.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli_list.h"  // base/: lists on command lines
#include "cpu_cost/phases.h"

namespace gradcomm::bench {
namespace {

double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// "1M" = 2^20, "4K" = 2^12, or a plain count.
int64_t parse_size(const std::string& text) {
  size_t used = 0;
  const int64_t base = std::stoll(text, &used);
  const std::string suffix = text.substr(used);
  if (suffix.empty()) return base;
  if (suffix == "K" || suffix == "k") return base << 10;
  if (suffix == "M" || suffix == "m") return base << 20;
  if (suffix == "G" || suffix == "g") return base << 30;
  throw CLI::ValidationError("--sizes", "unknown suffix in " + text);
}

// memcpy of `mib` MiB, touching 2x its bytes (read + write): the bandwidth the floor
// divides by. Buffers are filled first (page faults are not bandwidth); the median of
// `reps` thread-CPU-timed copies.
struct Bandwidth {
  double bytes_per_ns = 0;  // read + write bytes per ns
  double best_bytes_per_ns = 0;
};

Bandwidth measure_memcpy(int64_t mib, int reps) {
  const size_t bytes = static_cast<size_t>(mib) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    src[static_cast<size_t>(r) * 4096 % bytes] = static_cast<char>(r);
    const double t0 = thread_cpu_ns();
    std::memcpy(dst.data(), src.data(), bytes);
    t.push_back(thread_cpu_ns() - t0);
  }
  // Keep the copies observable.
  if (dst[bytes / 2] == 42) std::fputs("", stdout);
  Bandwidth b;
  b.bytes_per_ns = 2.0 * static_cast<double>(bytes) / median(t);
  b.best_bytes_per_ns = 2.0 * static_cast<double>(bytes) / *std::min_element(t.begin(), t.end());
  return b;
}

std::vector<float> normal_vector(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

struct Measured {
  double median_ns = 0, min_ns = 0;
};

Measured measure(const Phase& p, int64_t n, int reps) {
  if (p.reset) p.reset();
  p.run();  // warm-up
  const std::string tag = fmt::format("{}/{}/{}", p.compressor, p.name, n);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    if (p.reset) p.reset();
    const double t0 = thread_cpu_ns();
    if (r == 0) CALLGRIND_TOGGLE_COLLECT;
    p.run();
    if (r == 0) CALLGRIND_TOGGLE_COLLECT;
    t.push_back(thread_cpu_ns() - t0);
    if (r == 0) CALLGRIND_DUMP_STATS_AT(tag.c_str());
  }
  return Measured{median(t), *std::min_element(t.begin(), t.end())};
}

bool selected(const std::string& label, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  return std::any_of(only.begin(), only.end(), [&](const std::string& o) { return label.rfind(o, 0) == 0; });
}

}  // namespace
}  // namespace gradcomm::bench

int main(int argc, char** argv) {
  using namespace gradcomm::bench;
  CLI::App app{"gradcomm-cpu-cost: per-phase CPU time, memory-traffic floor and (under callgrind) "
               "instructions of the compressors' host hot paths"};
  std::string size_text = "1M,4M,16M,64M";
  int reps = 5;
  int64_t bandwidth_mib = 256;
  std::string only_text;
  std::string json_path;
  app.add_option("--sizes", size_text, "fp32 element counts (K/M/G = 2^10/2^20/2^30), comma-separated");
  app.add_option("--reps", reps, "timed executions per phase (median); the first is the callgrind one")
      ->check(CLI::PositiveNumber);
  app.add_option("--bandwidth-mib", bandwidth_mib, "memcpy buffer for the floor's bandwidth; 0 skips (callgrind)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--only", only_text, "compressor labels to run, by prefix (e.g. topk,quant)");
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);

  // Not CLI11's delimiter, which drops empty elements.
  std::vector<int64_t> sizes;
  std::vector<std::string> only;
  try {
    for (const std::string& s : gradcomm::detail::split_list("--sizes", size_text)) sizes.push_back(parse_size(s));
    if (!only_text.empty()) only = gradcomm::detail::split_list("--only", only_text);
  } catch (const std::exception& e) {  // a bad list, or a size parse_size refuses
    fmt::print(stderr, "gradcomm-cpu-cost: {}\n", e.what());
    return 2;
  }
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());

  const bool under_valgrind = RUNNING_ON_VALGRIND != 0;
  Bandwidth bw;
  if (bandwidth_mib > 0) bw = measure_memcpy(bandwidth_mib, 5);
  fmt::print("# gradcomm-cpu-cost: reps {}, memcpy {} MiB: {:.2f} GB/s read+write (median; best {:.2f}){}\n", reps,
             bandwidth_mib, bw.bytes_per_ns, bw.best_bytes_per_ns,
             under_valgrind ? " [under valgrind: CPU times are not native]" : "");

  // One input of the largest size; smaller sizes use its prefix.
  const std::vector<float> grad = normal_vector(largest, 1);
  const std::vector<float> other = normal_vector(largest, 2);

  nlohmann::json out;
  out["reps"] = reps;
  out["under_valgrind"] = under_valgrind;
  out["memcpy_mib"] = bandwidth_mib;
  out["memcpy_bytes_per_ns"] = bw.bytes_per_ns;
  out["memcpy_best_bytes_per_ns"] = bw.best_bytes_per_ns;
  out["not_measured"] = not_measured();
  nlohmann::json rows = nlohmann::json::array();

  fmt::print("{:<32} {:<18} {:>9} {:>9} {:>9} {:>7}  {}\n", "compressor", "phase", "n", "cpu ns/e", "floor ns/e",
             "cpu/fl", "traffic");
  for (const Group& group : all_groups()) {
    if (!selected(group.label, only)) continue;
    for (const int64_t n : sizes) {
      const Inputs in{grad.data(), other.data(), n};
      const std::vector<Phase> phases = group.build(in);
      for (const Phase& p : phases) {
        const Measured m = measure(p, n, reps);
        const double dn = static_cast<double>(n);
        const double floor_ns = bw.bytes_per_ns > 0 ? p.bytes / bw.bytes_per_ns : 0.0;
        const double cpu_e = m.median_ns / dn, floor_e = floor_ns / dn;
        fmt::print("{:<32} {:<18} {:>9} {:>9.3f} {:>9.3f} {:>7.1f}  {}\n", p.compressor, p.name, n, cpu_e, floor_e,
                   floor_e > 0 ? cpu_e / floor_e : 0.0, p.traffic);
        std::fflush(stdout);
        rows.push_back({{"compressor", p.compressor},
                        {"phase", p.name},
                        {"n", n},
                        {"cpu_ns_median", m.median_ns},
                        {"cpu_ns_min", m.min_ns},
                        {"cpu_ns_per_elem", cpu_e},
                        {"bytes", p.bytes},
                        {"floor_ns_per_elem", floor_e},
                        {"traffic", p.traffic},
                        {"note", p.note},
                        {"callgrind_tag", fmt::format("{}/{}/{}", p.compressor, p.name, n)}});
      }
    }
  }
  out["phases"] = rows;
  for (const std::string& s : not_measured()) fmt::print("# not measured: {}\n", s);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(1) << "\n";
  }
  return 0;
}
