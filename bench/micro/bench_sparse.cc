// Sparse compressors on one CPU core: top-k (exact, sample) at ratios 0.01 and
// 0.001, alone and with error feedback's accumulation, random-k, count sketch
// accumulate + estimate, sparse encode/decode, the 4-payload decode of the allgather.
// Throughput is reported against the fp32 input (4 bytes per element), so the
// numbers compare directly with the wire bandwidth they save.
//
//   build-sparse/bench/bench_sparse --benchmark_filter=Topk
#include <benchmark/benchmark.h>

#include <random>
#include <span>
#include <vector>

#include "compressors/codec.h"
#include "compressors/randomk/randomk.h"
#include "compressors/sketch/sketch.h"
#include "compressors/sparse/sparse.h"

namespace gradcomm::detail {
namespace {

// Gradient-like input: heavy-tailed (Student t, 3 dof), fixed seed, cached per size.
const std::vector<float>& input(int64_t n) {
  static std::vector<float> x;
  if (static_cast<int64_t>(x.size()) != n) {
    x.resize(static_cast<size_t>(n));
    std::mt19937 gen(1);
    std::student_t_distribution<float> t(3.0f);
    for (auto& v : x) v = t(gen);
  }
  return x;
}

void set_bytes(benchmark::State& state, int64_t n) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * static_cast<int64_t>(sizeof(float)));
}

// Args: {n, 1/ratio}.
void topk(benchmark::State& state, TopkSelect select) {
  const int64_t n = state.range(0);
  const int64_t k = n / state.range(1);
  const auto& x = input(n);
  int64_t step = 0;
  size_t count = 0;
  for (auto _ : state) {
    SparseVector s = topk_select(x.data(), n, k, select, PhiloxStream{1, static_cast<uint64_t>(step++)});
    count = s.indices.size();
    benchmark::DoNotOptimize(s.indices.data());
  }
  state.counters["count/k"] = static_cast<double>(count) / static_cast<double>(k);
  set_bytes(state, n);
}
void BM_TopkExact(benchmark::State& state) { topk(state, TopkSelect::kExact); }
void BM_TopkSample(benchmark::State& state) { topk(state, TopkSelect::kSample); }

// Error feedback's step as the communicator runs it: acc = grad + residual fused into
// the select (topk_select_accumulate), then the selected coordinates zeroed in the
// residual. The same gradient every step, so the residual carries what was not sent.
void topk_ef(benchmark::State& state, TopkSelect select) {
  const int64_t n = state.range(0);
  const int64_t k = n / state.range(1);
  const auto& grad = input(n);
  std::vector<float> residual(static_cast<size_t>(n), 0.0f);
  int64_t step = 0;
  size_t count = 0;
  for (auto _ : state) {
    SparseVector s = topk_select_accumulate(grad.data(), residual.data(), n, k, select,
                                            PhiloxStream{1, static_cast<uint64_t>(step++)});
    for (uint64_t i : s.indices) residual[i] = 0.0f;
    count = s.indices.size();
    benchmark::DoNotOptimize(residual.data());
  }
  state.counters["count/k"] = static_cast<double>(count) / static_cast<double>(k);
  set_bytes(state, n);
}
void BM_TopkExactEF(benchmark::State& state) { topk_ef(state, TopkSelect::kExact); }
void BM_TopkSampleEF(benchmark::State& state) { topk_ef(state, TopkSelect::kSample); }

void BM_Randomk(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int64_t k = n / state.range(1);
  int64_t step = 0;
  for (auto _ : state) {
    auto idx = randomk_indices(n, k, PhiloxStream{1, static_cast<uint64_t>(step++)});
    benchmark::DoNotOptimize(idx.data());
  }
  set_bytes(state, n);
}

// Sketched-SGD shape: 5 rows, cols = n / 100 (a 0.05 compression of the table).
void BM_SketchAccumulateEstimate(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int rows = 5;
  const int cols = static_cast<int>(n / 100);
  const auto& x = input(n);
  const CountSketch sketch(rows, cols, PhiloxStream{1, 2});
  std::vector<float> table(static_cast<size_t>(rows) * static_cast<size_t>(cols));
  std::vector<float> est(static_cast<size_t>(n));
  for (auto _ : state) {
    std::fill(table.begin(), table.end(), 0.0f);
    sketch.accumulate(x.data(), n, table.data());
    sketch.estimate(table.data(), n, est.data());
    benchmark::DoNotOptimize(est.data());
  }
  set_bytes(state, n);
}

// range(1): 0 = fp32 values and raw indices (the old default), 1 = fp16 raw, 2 = bf16
// values and coded indices (top-k's default).
SparseFormat format_of(int64_t code) {
  return code == 0 ? SparseFormat{ValueType::kFp32, false}
         : code == 1 ? SparseFormat{ValueType::kFp16, false}
                     : SparseFormat{ValueType::kBf16, true};
}

// Encode + decode_add of a 1% selection (the top-k payload at ratio 0.01).
void BM_SparseEncodeDecode(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto& x = input(n);
  const SparseVector s = topk_select(x.data(), n, n / 100, TopkSelect::kExact, PhiloxStream{});
  const SparseFormat values = format_of(state.range(1));
  std::vector<float> out(static_cast<size_t>(n), 0.0f);
  for (auto _ : state) {
    const auto bytes = encode_sparse(CompressorId::kTopk, n, s, values);
    decode_add_sparse(CompressorId::kTopk, bytes, n, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  set_bytes(state, n);
}

// The sparse allgather's decode at N = 4: four 1 % payloads (random positions, so
// they overlap as different ranks' selections do) summed in rank order into the output.
void BM_SparseDecodeSum4(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto& x = input(n);
  const SparseFormat values = format_of(state.range(1));
  std::vector<std::vector<uint8_t>> payloads;
  for (uint64_t r = 0; r < 4; ++r) {
    SparseVector s;
    s.indices = randomk_indices(n, n / 100, PhiloxStream{7, r});
    for (uint64_t i : s.indices) s.values.push_back(x[i]);
    payloads.push_back(encode_sparse(CompressorId::kTopk, n, s, values));
  }
  const std::vector<std::span<const uint8_t>> spans(payloads.begin(), payloads.end());
  std::vector<float> out(static_cast<size_t>(n));
  for (auto _ : state) {
    decode_sum_sparse(CompressorId::kTopk, spans, n, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  set_bytes(state, n);
}

constexpr int64_t kM = 1 << 20;

void sizes_and_ratios(benchmark::internal::Benchmark* b) {
  for (int64_t n : {kM, 16 * kM, 64 * kM}) {
    for (int64_t inv : {100, 1000}) b->Args({n, inv});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
void sizes_and_value_types(benchmark::internal::Benchmark* b) {
  for (int64_t n : {kM, 16 * kM, 64 * kM}) {
    for (int64_t format : {0, 1, 2}) b->Args({n, format});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_TopkExact)->Apply(sizes_and_ratios);
BENCHMARK(BM_TopkSample)->Apply(sizes_and_ratios);
BENCHMARK(BM_TopkExactEF)->Apply(sizes_and_ratios);
BENCHMARK(BM_TopkSampleEF)->Apply(sizes_and_ratios);
BENCHMARK(BM_Randomk)->Apply(sizes_and_ratios);
BENCHMARK(BM_SketchAccumulateEstimate)->Arg(kM)->Arg(16 * kM)->Arg(64 * kM)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SparseEncodeDecode)->Apply(sizes_and_value_types);
BENCHMARK(BM_SparseDecodeSum4)->Apply(sizes_and_value_types);

}  // namespace
}  // namespace gradcomm::detail

BENCHMARK_MAIN();
