// Encode and decode throughput of the CPU dense codecs (one thread), in bytes of
// fp32 input per second. Input: N(0, 1) values, so every bucket has a real range.
//
//   build-dense/bench/bench_dense_codecs --benchmark_filter=Encode
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/dense_codec_spec.h"
#include "compressors/spec.h"

namespace gradcomm::detail {
namespace {

struct Case {
  const char* name;
  CompressorSpec spec;
};

CompressorSpec make_spec(CompressorId id, int bits = 0, Rounding round = Rounding::kStochastic, int levels = 0) {
  CompressorSpec s = dense_codec_spec(id, bits, round, levels, 512);  // the registry's default bucket
  s.seed = 42;
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> c = {
      {"fp16", make_spec(CompressorId::kFp16)},
      {"bf16", make_spec(CompressorId::kBf16)},
      {"qsgd_s16", make_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, 16)},
      {"sign", make_spec(CompressorId::kSign)},
  };
  for (int bits : {1, 2, 4, 8}) {
    c.push_back({nullptr, make_spec(CompressorId::kQuant, bits, Rounding::kStochastic)});
    c.push_back({nullptr, make_spec(CompressorId::kQuant, bits, Rounding::kNearest)});
  }
  return c;
}

std::string case_name(const Case& c) {
  if (c.name) return c.name;
  const auto& p = c.spec.family<QuantParams>();
  return "quant_b" + std::to_string(p.bits) + (p.round == Rounding::kNearest ? "_nearest" : "_stochastic");
}

// One shared input of the largest size; smaller runs use its prefix.
const std::vector<float>& input(int64_t n) {
  static std::vector<float> data;
  if (static_cast<int64_t>(data.size()) < n) {
    std::mt19937 gen(1);
    std::normal_distribution<float> dist;
    data.resize(static_cast<size_t>(n));
    for (float& v : data) v = dist(gen);
  }
  return data;
}

void bench_encode(benchmark::State& state, CompressorSpec spec) {
  const int64_t n = state.range(0);
  const auto codec = make_dense_codec(spec);
  const float* in = input(n).data();
  std::vector<uint8_t> payload(codec->encoded_bytes(n));
  uint64_t step = 0;
  for (auto _ : state) {
    codec->encode(in, n, payload.data(), PhiloxStream{spec.seed, step++}, 0);
    benchmark::DoNotOptimize(payload.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 4);
  state.counters["ratio"] = static_cast<double>(n * 4) / static_cast<double>(payload.size());
}

void bench_decode(benchmark::State& state, CompressorSpec spec) {
  const int64_t n = state.range(0);
  const auto codec = make_dense_codec(spec);
  std::vector<uint8_t> payload(codec->encoded_bytes(n));
  codec->encode(input(n).data(), n, payload.data(), PhiloxStream{spec.seed, 0}, 0);
  std::vector<float> out(static_cast<size_t>(n));
  for (auto _ : state) {
    codec->decode(payload, n, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 4);
}

const bool registered = [] {
  for (const Case& c : cases()) {
    for (auto [kind, fn] : {std::pair{"Encode", &bench_encode}, std::pair{"Decode", &bench_decode}}) {
      benchmark::RegisterBenchmark((std::string(kind) + "/" + case_name(c)).c_str(), fn, c.spec)
          ->Arg(int64_t{1} << 20)
          ->Arg(int64_t{1} << 24)
          ->Arg(int64_t{1} << 26)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

}  // namespace
}  // namespace gradcomm::detail

BENCHMARK_MAIN();
