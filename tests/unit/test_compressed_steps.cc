// The engine's steps (src/compressed_allreduce.h), seen through primitives that only
// record what they are asked: for each family's collective, the order of folds,
// selections, exchanges and the average; the Philox streams (this rank's and the shared
// one); warm-up and min_numel going dense. The host and the device path run this same
// template, so what is pinned here is what both do. The expected sequences are written
// out from the engine's contract (docs/architecture.md, "Compression"), not derived
// from the engine.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "compressed_allreduce.h"
#include "compressors/spec.h"
#include "compressors/sketch/sketch.h"
#include "compressors/sparse/sparse.h"

namespace gradcomm::detail {
namespace {

std::string stream_name(const PhiloxStream& rng, uint64_t seed, uint64_t key_hash, uint64_t step, int rank) {
  if (rng.seed != seed) return "wrong seed";
  if (rng.stream == philox_stream_id(key_hash, step, rank)) return "mine";
  if (rng.stream == philox_stream_id(key_hash, step, -1)) return "shared";
  return "unknown stream";
}

// Records each primitive call as text; the streams by whose they are.
class Recorder {
 public:
  Recorder(uint64_t seed, uint64_t key_hash, uint64_t step, int rank)
      : seed_(seed), key_hash_(key_hash), step_(step), rank_(rank) {}

  struct Sketch {
    int r, c;
    int rows() const { return r; }
    int cols() const { return c; }
  };

  void fold_and_clear(float*, int64_t n) { log("fold_and_clear({})", n); }
  const float* accumulate_in_residual(const float* data, int64_t n) {
    log("accumulate_in_residual({})", n);
    return data;
  }
  void dense_allreduce(float*, int64_t n, ReduceOp op, uint32_t unit_base) {
    log("dense_allreduce({}, {}, units {:#x})", n, op == ReduceOp::kAvg ? "avg" : "sum", unit_base);
  }
  void codec_round_trip(float*, int64_t n, const PhiloxStream& rng) { log("codec_round_trip({}, {})", n, who(rng)); }
  void codec_ring(float*, int64_t n, const PhiloxStream& rng, int divisor) {
    log("codec_ring({}, {}, by {})", n, who(rng), divisor);
  }
  SparseAlgo sparse_algo(const SparseShape&, int64_t n) {
    log("sparse_algo({})", n);
    return SparseAlgo::kAllgather;
  }
  void select(float*, int64_t n, int64_t k, const PhiloxStream& rng) { log("select({}, k {}, {})", n, k, who(rng)); }
  void sparse_allreduce(SparseAlgo, const SparseShape&, float*, int64_t n, int64_t k, ReduceOp op) {
    log("sparse_allreduce({}, k {}, {})", n, k, op == ReduceOp::kAvg ? "avg" : "sum");
  }
  void draw(int64_t n, int64_t count, const PhiloxStream& rng) { log("draw({}, count {}, {})", n, count, who(rng)); }
  float* table_cells(SparseTable table) {
    log("table_cells({}x{})", table.rows, table.cols);
    return table_;
  }
  const float* table_accumulate(SparseTable, const PhiloxStream& rng, const float* data, int64_t n, float* cells) {
    log("table_accumulate({}, {}, {})", n, cells == table_ ? "its table" : "another table", who(rng));
    return data;
  }
  void table_recover(SparseTable, const PhiloxStream& rng, const float* cells, int64_t n, int64_t k) {
    log("table_recover({}, k {}, {}, {})", n, k, cells == table_ ? "its table" : "another table", who(rng));
  }
  void gather_sum_scatter(float*, const float*, int64_t n, ValueType type, uint32_t unit_base) {
    log("gather_sum_scatter({}, {}, units {:#x})", n, type == ValueType::kFp32 ? "fp32" : "16-bit", unit_base);
  }
  void keep_selection() { log("keep_selection"); }
  void low_rank(float*, int64_t n, ReduceOp op) { log("low_rank({}, {})", n, op == ReduceOp::kAvg ? "avg" : "sum"); }
  void check_payloads(int64_t n) { log("check_payloads({})", n); }
  void divide(float*, int64_t n, int ranks) { log("divide({}, by {})", n, ranks); }

  std::vector<std::string> calls;

 private:
  template <class... Args>
  void log(fmt::format_string<Args...> f, Args&&... args) {
    calls.push_back(fmt::format(f, std::forward<Args>(args)...));
  }
  std::string who(const PhiloxStream& rng) const { return stream_name(rng, seed_, key_hash_, step_, rank_); }

  uint64_t seed_, key_hash_, step_;
  int rank_;
  float table_[1] = {};
};

constexpr uint64_t kKeyHash = 0x1234abcdULL;

// The calls one allreduce makes: `spec_text` on rank `rank` of `ranks`, `numel`
// elements, at a key's `step` (no key: step 0).
std::vector<std::string> steps(const std::string& spec_text, int64_t numel, int rank, int ranks, ReduceOp op,
                               uint64_t step = 0) {
  const CompressorSpec spec = parse_compressor_spec(spec_text);
  KeyState key;
  key.step = step;
  const CompressedCall call{spec, &key, kKeyHash, nullptr, rank, ranks};
  Recorder p(spec.seed, kKeyHash, step, rank);
  std::vector<float> data(1);
  compressed_allreduce(p, call, data.data(), numel, op);
  return p.calls;
}

using Calls = std::vector<std::string>;

TEST(CompressedSteps, NoneIsTheDenseAllreduceWithWhatTheResidualHolds) {
  EXPECT_EQ(steps("none", 1000, 0, 4, ReduceOp::kAvg),
            (Calls{"fold_and_clear(1000)", "dense_allreduce(1000, avg, units 0x0)"}));
}

TEST(CompressedSteps, WarmupStepsAndSmallTensorsGoDense) {
  const Calls dense{"fold_and_clear(1000)", "dense_allreduce(1000, sum, units 0x0)"};
  for (const char* spec : {"topk:ratio=0.01,warmup=3", "fp16:warmup=3", "powersgd:rank=2,warmup=3"}) {
    SCOPED_TRACE(spec);
    EXPECT_EQ(steps(spec, 1000, 1, 4, ReduceOp::kSum, 2), dense);   // step 2 < warmup 3
    EXPECT_NE(steps(spec, 1000, 1, 4, ReduceOp::kSum, 3), dense);   // compressed from step 3
  }
  EXPECT_EQ(steps("randomk:ratio=0.1,min_numel=1001", 1000, 0, 2, ReduceOp::kSum), dense);
  EXPECT_NE(steps("randomk:ratio=0.1,min_numel=1000", 1000, 0, 2, ReduceOp::kSum), dense);
}

// The ring applies the average itself (chunk by chunk, in cache): no divide after.
TEST(CompressedSteps, CodecRingFoldsThenRingsWithTheAverage) {
  EXPECT_EQ(steps("quant:bits=4", 4096, 2, 4, ReduceOp::kAvg),
            (Calls{"fold_and_clear(4096)", "codec_ring(4096, mine, by 4)", "check_payloads(4096)"}));
  EXPECT_EQ(steps("fp16", 4096, 2, 4, ReduceOp::kSum),
            (Calls{"fold_and_clear(4096)", "codec_ring(4096, mine, by 1)", "check_payloads(4096)"}));
}

TEST(CompressedSteps, OneRankStillKeepsOnlyWhatCompressionKeeps) {
  EXPECT_EQ(steps("qsgd:levels=4", 512, 0, 1, ReduceOp::kAvg),
            (Calls{"codec_round_trip(512, mine)", "check_payloads(512)", "divide(512, by 1)"}));
}

TEST(CompressedSteps, TopkSelectsWithItsOwnStreamAndTheExchangeAverages) {
  // k = 1% of 10000; the sparse exchange applies the average itself: no divide after.
  EXPECT_EQ(steps("topk:ratio=0.01", 10000, 3, 4, ReduceOp::kAvg),
            (Calls{"sparse_algo(10000)", "select(10000, k 100, mine)", "sparse_allreduce(10000, k 100, avg)",
                   "keep_selection", "check_payloads(10000)"}));
}

TEST(CompressedSteps, RandomkDrawsSharedIndicesAndSumsTheirValues) {
  EXPECT_EQ(steps("randomk:ratio=0.1", 1000, 1, 2, ReduceOp::kAvg),
            (Calls{"draw(1000, count 100, shared)", "accumulate_in_residual(1000)",
                   "gather_sum_scatter(1000, fp32, units 0x0)", "keep_selection", "check_payloads(1000)",
                   "divide(1000, by 2)"}));
}

TEST(CompressedSteps, SketchSumsItsTableThenTheValuesInTheSecondPhaseUnits) {
  const CompressorSpec spec = parse_compressor_spec("sketch:k=50,rows=3,values=fp16");
  const int cols = sketch_columns(spec.family<SketchParams>(), 50);
  EXPECT_EQ(steps("sketch:k=50,rows=3,values=fp16", 10000, 0, 3, ReduceOp::kSum),
            (Calls{fmt::format("table_cells(3x{})", cols), "table_accumulate(10000, its table, shared)",
                   fmt::format("dense_allreduce({}, sum, units 0x0)", 3 * cols),
                   "table_recover(10000, k 50, its table, shared)",
                   fmt::format("gather_sum_scatter(10000, 16-bit, units {:#x})", kSecondPhaseUnits), "keep_selection",
                   "check_payloads(10000)"}));
}

TEST(CompressedSteps, PowerSgdRunsItsOwnStepAndItsOwnAverage) {
  EXPECT_EQ(steps("powersgd:rank=2", 4096, 0, 2, ReduceOp::kAvg), (Calls{"low_rank(4096, avg)"}));
}

TEST(CompressedSteps, StreamsDependOnTheStepAndMineOnTheRank) {
  // The recorder names a stream by recomputing both ids for its own (step, rank): a
  // stream of another step or rank would show as "unknown stream".
  for (uint64_t step : {0, 1, 7}) {
    for (int rank : {0, 1, 2}) {
      const Calls calls = steps("topk:ratio=0.01,select=sample", 10000, rank, 3, ReduceOp::kSum, step);
      EXPECT_EQ(calls.at(1), "select(10000, k 100, mine)") << "step " << step << " rank " << rank;
    }
  }
}

}  // namespace
}  // namespace gradcomm::detail
