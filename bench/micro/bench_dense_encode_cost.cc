// Cost of the CPU dense codecs per element, in the two units a shared 2-core VM can
// report honestly: instructions (under callgrind, which are not noisy) and wall time
// next to the memory floor measured in the same process.
//
//   count CASE N   encodes (or, for CASE "decode_*", decodes) N elements once with
//                  callgrind instrumentation on around that call only:
//       valgrind --tool=callgrind --instr-atstart=no bench_dense_encode_cost count quant_b4 1048576
//     instructions / N is the cost per element ("collected" in callgrind's summary).
//   time N REPS    ns/element of every case (best of REPS), and the bandwidth of a
//                  256 MiB memcpy (bytes read + written per second).
//   digest         an FNV-1a hash of the payload of every (case, size, first) in a
//                  matrix that covers partial buckets, NaN/Inf buckets and odd offsets:
//                  two builds that print the same lines encode byte-identically.
//
// CASE: fp16 bf16 sign qsgd_s16 quant_b{1,2,4,8} (stochastic) quant_b{1,2,4,8}_nearest,
// each with bucket 512 (the registry default), or decode_<case>.
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>  // client requests: no-ops when not under callgrind
#else
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/spec.h"
#include "compressors/dense_codec_spec.h"
#include "compressors/quantize/quantize.h"

namespace gradcomm::detail {
namespace {

CompressorSpec make_spec(CompressorId id, int bits, Rounding round, int levels, int64_t bucket) {
  CompressorSpec s = dense_codec_spec(id, bits, round, levels, bucket);
  s.seed = 42;
  return s;
}

// The spec a case name stands for; id kNone when the name is unknown.
CompressorSpec spec_of(const std::string& name, int64_t bucket = 512) {
  if (name == "fp16") return make_spec(CompressorId::kFp16, 0, Rounding::kStochastic, 0, bucket);
  if (name == "bf16") return make_spec(CompressorId::kBf16, 0, Rounding::kStochastic, 0, bucket);
  if (name == "sign") return make_spec(CompressorId::kSign, 0, Rounding::kStochastic, 0, bucket);
  if (name == "qsgd_s16") return make_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, 16, bucket);
  if (name == "qsgd_s3") return make_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, 3, bucket);
  for (int bits : {1, 2, 4, 8}) {
    const std::string base = "quant_b" + std::to_string(bits);
    if (name == base) return make_spec(CompressorId::kQuant, bits, Rounding::kStochastic, 0, bucket);
    if (name == base + "_nearest") return make_spec(CompressorId::kQuant, bits, Rounding::kNearest, 0, bucket);
  }
  return CompressorSpec{};
}

const char* const kCases[] = {"quant_b1", "quant_b2",         "quant_b4", "quant_b8", "quant_b4_nearest",
                              "qsgd_s16", "sign",             "fp16",     "bf16",     "decode_quant_b4",
                              "decode_qsgd_s16", "decode_sign"};

// N(0, 1) values, as bench_dense_codecs uses.
std::vector<float> normal_input(int64_t n) {
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(gen);
  return x;
}

// One encoder or decoder call on a prepared input; what `count` and `time` run.
struct Job {
  std::unique_ptr<DenseCodec> codec;
  bool decode = false;
  int64_t n = 0;
  const float* in = nullptr;
  std::vector<uint8_t> payload;
  std::vector<float> out;
  uint64_t step = 0;

  void run() {
    if (decode) {
      codec->decode(payload, n, out.data());
    } else {
      codec->encode(in, n, payload.data(), PhiloxStream{42, step++}, 0);
    }
  }
};

Job make_job(const std::string& name, const std::vector<float>& x) {
  Job j;
  j.decode = name.rfind("decode_", 0) == 0;
  const CompressorSpec spec = spec_of(j.decode ? name.substr(7) : name);
  if (spec.id == CompressorId::kNone) {
    std::fprintf(stderr, "unknown case %s\n", name.c_str());
    std::exit(2);
  }
  j.codec = make_dense_codec(spec);
  j.n = static_cast<int64_t>(x.size());
  j.in = x.data();
  j.payload.resize(j.codec->encoded_bytes(j.n));
  if (j.decode) {
    j.codec->encode(x.data(), j.n, j.payload.data(), PhiloxStream{42, 0}, 0);
    j.out.resize(x.size());
  }
  return j;
}

int run_count(const std::string& name, int64_t n) {
  const std::vector<float> x = normal_input(n);
  Job j = make_job(name, x);
  j.run();  // warm: pages faulted in, dispatch decided
  CALLGRIND_ZERO_STATS;
  CALLGRIND_START_INSTRUMENTATION;
  j.run();
  CALLGRIND_STOP_INSTRUMENTATION;
  std::printf("%s n=%lld done\n", name.c_str(), static_cast<long long>(n));
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_time(int64_t n, int reps) {
  const std::vector<float> x = normal_input(n);
  constexpr size_t kCopyBytes = size_t{256} << 20;
  std::vector<char> src(kCopyBytes, 1), dst(kCopyBytes, 0);
  double best_copy = std::numeric_limits<double>::infinity();
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), kCopyBytes);
    best_copy = std::min(best_copy, seconds_since(t0));
  }
  const double copy_gbs = 2.0 * kCopyBytes / best_copy / 1e9;
  std::printf("memcpy 256 MiB: %.2f GB/s read+written (%.3f ns per fp32 read)\n", copy_gbs, 4.0 / copy_gbs);
  for (const char* name : kCases) {
    Job j = make_job(name, x);
    j.run();
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      j.run();
      best = std::min(best, seconds_since(t0));
    }
    std::printf("%-18s %7.3f ns/element\n", name, best * 1e9 / static_cast<double>(n));
  }
  return 0;
}

uint64_t fnv1a(const uint8_t* p, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

int run_digest() {
  const char* const names[] = {"quant_b1", "quant_b2", "quant_b4", "quant_b8", "quant_b1_nearest",
                               "quant_b2_nearest", "quant_b4_nearest", "quant_b8_nearest", "qsgd_s16",
                               "qsgd_s3", "sign"};
  std::vector<float> x = normal_input(5000);
  x[700] = std::numeric_limits<float>::quiet_NaN();  // poisons bucket 1 of bucket 512
  x[1900] = std::numeric_limits<float>::infinity();
  x[2100] = -0.0f;
  for (int k = 2600; k < 3100; ++k) x[k] = 0.25f;  // a constant run
  x[4000] = 3e38f, x[4001] = -3e38f;               // a range that overflows
  for (const char* name : names) {
    for (int64_t bucket : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{512}, int64_t{1000}}) {
      const auto codec = make_dense_codec(spec_of(name, bucket));
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{13}, int64_t{511}, int64_t{1025}, int64_t{5000}}) {
        for (int64_t first : {int64_t{0}, bucket, 3 * bucket, bucket * ((int64_t{1} << 34) / bucket - 3)}) {
          std::vector<uint8_t> p(codec->encoded_bytes(n));
          codec->encode(x.data() + (5000 - n), n, p.data(), PhiloxStream{0x1234567887654321ull, 99}, first);
          std::printf("%s bucket=%lld n=%lld first=%lld %016llx\n", name, static_cast<long long>(bucket),
                      static_cast<long long>(n), static_cast<long long>(first),
                      static_cast<unsigned long long>(fnv1a(p.data(), p.size())));
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace gradcomm::detail

int main(int argc, char** argv) {
  using namespace gradcomm::detail;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "count" && argc == 4) return run_count(argv[2], std::atoll(argv[3]));
  if (mode == "time" && argc == 4) return run_time(std::atoll(argv[2]), std::atoi(argv[3]));
  if (mode == "digest") return run_digest();
  std::fprintf(stderr, "usage: %s count CASE N | time N REPS | digest\n", argv[0]);
  return 2;
}
