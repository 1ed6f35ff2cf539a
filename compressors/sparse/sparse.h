// The sparse shape: what every sparsifier family (topk, randomk, sketch) shares, and
// what the compressed allreduce (src/compressed_allreduce.h) asks of one.
//
// Where a step's indices come from decides how the values travel (the family's
// Collective, family.h):
//   kSparseSelection   each rank selects its own (SparseOps::select): sparse payloads,
//                      exchanged and summed on arrival (src/collectives/sparse_allreduce.cc)
//   kSharedIndices     every rank draws the same (SparseOps::draw): a dense allreduce of
//                      the values there
//   kTableThenValues  a summable table (SparseOps::table, accumulate) is allreduced and
//                      picks them (recover); then as kSharedIndices
// A family fills a SparseOps (host) and a GpuSparseOps (gpu_sparse.h) with the calls of
// its kind; everything else -- error feedback, the payloads, the exchange, the average --
// is the shape's, written once for every family. docs/adding-a-compressor.md walks
// through a new sparsifier.
//
// Sparse payloads: index/value pairs decoded by scatter-add; indices in a payload are
// strictly increasing (FORMAT.md, "Sparse payload").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compressors/compressor_id.h"
#include "compressors/philox.h"

namespace gradcomm::detail {

struct CompressorSpec;  // spec.h

// How a magnitude selection picks (topk_select): exactly the k largest, or every element
// above a threshold estimated from a sample (DGC).
enum class TopkSelect : uint8_t { kExact = 0, kSample = 1 };
// How own selections are combined (src/collectives/sparse_allreduce.cc, where
// choose_sparse_algo resolves kAuto): every rank's payload to every rank, or the index
// space split among the ranks.
enum class SparseAlgo : uint8_t { kAuto = 0, kAllgather = 1, kReduceScatter = 2 };

// A selection of coordinates of an n-element vector, indices strictly increasing.
struct SparseVector {
  std::vector<uint64_t> indices;
  std::vector<float> values;
};

// How a sparse payload carries its entries: values as fp32, fp16 or bf16, indices raw
// (u32, or u64 from n = 2^32) or Elias–Fano coded (sparse_code.h).
struct SparseFormat {
  ValueType values = ValueType::kFp32;
  bool coded = false;
};

// Elements a selection takes from `numel`: `k` when given, else round(ratio x numel),
// within [1, max(numel, 1)]. The CPU and GPU paths both use this: the counts decide the
// selections, so they must agree to the element.
inline int64_t selection_count(double ratio, int64_t k, int64_t numel) {
  const int64_t c = k > 0 ? k : static_cast<int64_t>(std::llround(ratio * static_cast<double>(numel)));
  return std::clamp<int64_t>(c, 1, std::max<int64_t>(numel, 1));
}

// What a sparsifier's spec means to the shape.
struct SparseShape {
  double ratio = 0.0;        // a step selects ratio x elements (selection_count), or
  int64_t k = 0;             // k of them when k > 0
  SparseFormat format;       // kSparseSelection: the payloads' format
  bool exact_count = true;   // kSparseSelection: a payload holds exactly the count (else up to
                             // twice it: FORMAT.md's bounds for a sampled threshold)
  SparseAlgo algo = SparseAlgo::kAuto;  // kSparseSelection: the exchange
};

// A kTableThenValues family's table: rows x cols floats, summed across the ranks.
struct SparseTable {
  int rows = 0, cols = 0;
};

// A sparsifier family's calls on host memory. Each reads its family's keys from the spec;
// the ones its Collective does not use stay null (register_family checks).
struct SparseOps {
  // Every sparsifier.
  SparseShape (*shape)(const CompressorSpec& spec) = nullptr;
  // kSparseSelection: this rank's `count` entries (indices increasing, values fp32) of
  // acc = data + residual (data alone when residual is null), drawing from `rng` (this
  // rank's stream). With a residual, residual = acc and data = +0.0 afterwards (the zeroed
  // output decode_sum_sparse(..., kZeroed) expects); without, data is left as it was.
  SparseVector (*select)(const CompressorSpec& spec, float* data, float* residual, int64_t n, int64_t count,
                         const PhiloxStream& rng) = nullptr;
  // kSharedIndices: `count` distinct increasing indices of [0, n), the same on every rank
  // for the same `rng` (the stream every rank draws alike).
  std::vector<uint64_t> (*draw)(const CompressorSpec& spec, int64_t n, int64_t count,
                                const PhiloxStream& rng) = nullptr;
  // kTableThenValues: the table for a selection of `count`; table += the sketch of
  // acc[0, n) (hashes from `rng`, alike on every rank, so tables sum); the `count` indices
  // the summed table recovers, increasing.
  SparseTable (*table)(const CompressorSpec& spec, int64_t count) = nullptr;
  void (*accumulate)(const CompressorSpec& spec, SparseTable table, const PhiloxStream& rng, const float* acc,
                     int64_t n, float* cells) = nullptr;
  std::vector<uint64_t> (*recover)(const CompressorSpec& spec, SparseTable table, const PhiloxStream& rng,
                                   const float* cells, int64_t n, int64_t count) = nullptr;
};

// ---- sparse payloads (sparse_payload.cc) --------------------------------------------
// Payload bytes for `count` entries of an n-element vector; depends on nothing else.
size_t sparse_payload_bytes(int64_t n, int64_t count, SparseFormat format);
// Payload: header (id = the family writing it, the call's spec.id, which every decoder
// checks; param0/param1 = count low/high 32 bits, flags: sparse_code.h), the
// values, then the indices. See FORMAT.md. InvalidArgument for a selection the decoder
// would refuse (an index >= n, indices not strictly increasing, sizes that differ).
std::vector<uint8_t> encode_sparse(CompressorId id, int64_t n, const SparseVector& v, SparseFormat format);
// The same into out[0, sparse_payload_bytes(n, count, format)), for a selection already
// known to be valid (no checks).
void encode_sparse_into(CompressorId id, int64_t n, const SparseVector& v, SparseFormat format, uint8_t* out);
// The entries of a payload (values widened to fp32). CorruptPayload as decode_add_sparse.
SparseVector decode_sparse(CompressorId id, std::span<const uint8_t> payload, int64_t n);
// out[indices[j]] += values[j]. CorruptPayload on bad header, truncation, an index
// >= n or indices not strictly increasing; nothing is written before validation.
void decode_add_sparse(CompressorId id, std::span<const uint8_t> payload, int64_t n, float* out);
// out = the sum of the payloads, added in the order given to a zeroed output: bit for
// bit what zeroing out and calling decode_add_sparse on each payload in turn gives,
// in one sequential write of out. Every payload is validated before out is written
// (CorruptPayload naming the payload's position, "payload 1 of 3: ...", out untouched).
// With divisor > 1 every element is then divided by it (x / float(divisor), as the
// average's pass over the output would), tile by tile while the tile is in cache.
// SparseOutput::kZeroed: the caller promises out[0, n) is +0.0 already (a selection with
// a residual zeroes the data, SparseOps::select): the same result, but only the
// payloads' entries are read and written, not all n elements.
enum class SparseOutput : uint8_t { kFill, kZeroed };
void decode_sum_sparse(CompressorId id, std::span<const std::span<const uint8_t>> payloads, int64_t n, float* out,
                       int64_t divisor = 1, SparseOutput output = SparseOutput::kFill);

// Error feedback after a selection was sent: residual[indices[j]] keeps what the value
// type's rounding dropped from values[j] (sparse_code.h: sparse_rounding_residual; 0 for
// fp32), so only the rounding, not the value, is carried to the next step. The writes
// are scattered; each line is asked for some entries ahead, so their misses overlap.
void keep_sparse_rounding(float* residual, std::span<const uint64_t> indices, const float* values, ValueType type);

// ---- selection by magnitude (topk_select.cc) ------------------------------------------
// Top-k by magnitude of acc[0, n). exact: the k largest |acc|, ties to the lower
// index (radix select on |x|, no full sort). sample: DGC-style threshold estimated
// from a Philox-drawn sample, then every element with |acc| >= threshold; the count
// is variable, bounded as FORMAT.md documents. Indices come out increasing.
SparseVector topk_select(const float* acc, int64_t n, int64_t k, TopkSelect select, const PhiloxStream& rng);
// Error feedback's accumulation fused with the selection (as gpu_topk_select):
// acc = grad + residual, written into `residual` (acc = grad when residual is null),
// then topk_select(acc, n, k, select, rng). The same selection and residual, bit for
// bit, as accumulating and selecting apart; the selected coordinates are not zeroed.
// The exact select streams the input once when a sampled bound predicts the
// threshold (falling back to the radix passes when it does not).
SparseVector topk_select_accumulate(const float* grad, float* residual, int64_t n, int64_t k, TopkSelect select,
                                    const PhiloxStream& rng);
// topk_select_accumulate with a residual (not null), and then grad[0, n) = +0.0: the
// caller's buffer becomes a zeroed output for decode_sum_sparse(..., kZeroed). Where
// the selection streams the input (the sampled paths) the zeros are written in that
// same pass, while the lines are in cache; otherwise in a pass after.
SparseVector topk_select_fold(float* grad, float* residual, int64_t n, int64_t k, TopkSelect select,
                              const PhiloxStream& rng);

}  // namespace gradcomm::detail
