// What each compressor family provides to the collectives (wired in by issue B's
// communicator work). All work on fp32 values; CPU implementations here are the
// reference the CUDA ones are held to.
//
//  - DenseCodec (fp16, bf16, quant, qsgd, sign): fixed-size payloads, so the
//    compressed ring knows every message size in advance. A segment of a tensor
//    encodes exactly as the same elements do inside the whole tensor (bucket
//    boundaries and random streams are positions in the tensor, not the segment).
//  - Sparse (topk, randomk, sketch's heavy hitters): index/value payloads decoded
//    by scatter-add; indices in a payload are strictly increasing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "compressors/philox.h"
#include "compressors/spec.h"

namespace gradcomm::detail {

class DenseCodec {
 public:
  virtual ~DenseCodec() = default;
  // Exact payload size for n values (header included); depends only on n and the spec.
  virtual size_t encoded_bytes(int64_t n) const = 0;
  // Encodes in[0, n) into out[0, encoded_bytes(n)). Element i of the run is element
  // `first + i` of the tensor: it draws its random numbers at that position of
  // `rng`, and buckets are counted from `first` (which must be a multiple of alignment()).
  virtual void encode(const float* in, int64_t n, uint8_t* out, const PhiloxStream& rng, int64_t first) const = 0;
  // out[i] = decoded value i (decode) or out[i] += it (decode_add). CorruptPayload
  // when the payload is not a valid encoding of n values under this spec.
  virtual void decode(std::span<const uint8_t> payload, int64_t n, float* out) const = 0;
  virtual void decode_add(std::span<const uint8_t> payload, int64_t n, float* out) const = 0;
  // out[i] = decoded value i / divisor (divisor >= 1), bit for bit what decode and then
  // divide_inplace (base/reduce.h) give: the average's last step. This default does
  // exactly that; the bucketed codecs and the casts fold a power-of-two divisor into
  // their stores (x * 2^-k is x / 2^k), which saves a pass over the output.
  virtual void decode_average(std::span<const uint8_t> payload, int64_t n, float* out, int64_t divisor) const;
  // encode, and values[i] = what decode_average(the payload, n, ., divisor) gives, bit for
  // bit: the encoder's own result, as the ring's final owner and error feedback need it.
  // `values` may be `in` (each element is overwritten after it is read). This default
  // encodes, then decodes; quant fuses the two (the values come from the codes while the
  // bucket is in cache), saving the decode's pass over the payload and the output.
  virtual void encode_with_values(const float* in, int64_t n, uint8_t* out, const PhiloxStream& rng, int64_t first,
                                  float* values, int64_t divisor) const;
  // Ring segments must start at multiples of this (bucket size; 1 for casts).
  virtual int64_t alignment() const = 0;
};

// fp16, bf16, quant, qsgd, sign. InvalidArgument for other ids.
std::unique_ptr<DenseCodec> make_dense_codec(const CompressorSpec& spec);

// ---- sparse payloads ------------------------------------------------------------
// A selection of coordinates of an n-element vector, indices strictly increasing.
struct SparseVector {
  std::vector<uint64_t> indices;
  std::vector<float> values;
};

// How a sparse payload carries its entries: values as fp32, fp16 or bf16, indices raw
// (u32, or u64 from n = 2^32) or Elias–Fano coded (compressors/topk/sparse_code.h).
struct SparseFormat {
  ValueType values = ValueType::kFp32;
  bool coded = false;
};
// The format a top-k spec sends.
inline SparseFormat sparse_format(const CompressorSpec& spec) { return SparseFormat{spec.values, spec.coded_indices}; }

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
// SparseOutput::kZeroed: the caller promises out[0, n) is +0.0 already (top-k zeroes
// the gradient in its selection pass, topk_select_fold): the same result, but only the
// payloads' entries are read and written, not all n elements.
enum class SparseOutput : uint8_t { kFill, kZeroed };
void decode_sum_sparse(CompressorId id, std::span<const std::span<const uint8_t>> payloads, int64_t n, float* out,
                       int64_t divisor = 1, SparseOutput output = SparseOutput::kFill);

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

// Error feedback after a selection was sent: residual[indices[j]] keeps what the value
// type's rounding dropped from values[j] (sparse_code.h: sparse_rounding_residual; 0 for
// fp32), so only the rounding, not the value, is carried to the next step. The writes
// are scattered; each line is asked for some entries ahead, so their misses overlap.
void keep_sparse_rounding(float* residual, std::span<const uint64_t> indices, const float* values, ValueType type);

// k distinct indices of [0, n), increasing, the same for every caller with the same
// stream (random-k draws one stream per (seed, key, step), shared by all ranks).
std::vector<uint64_t> randomk_indices(int64_t n, int64_t k, const PhiloxStream& rng);

// ---- count sketch ------------------------------------------------------------------
// rows x cols table; row r hashes element i to a column and a sign drawn from
// `rng` (shared by all ranks), so tables of different ranks are summable.
class CountSketch {
 public:
  CountSketch(int rows, int cols, const PhiloxStream& rng);
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  // table[r * cols + h_r(i)] += s_r(i) * x[i] for all i in [0, n); table not cleared.
  void accumulate(const float* x, int64_t n, float* table) const;
  // estimate[i] = median over rows of s_r(i) * table[r * cols + h_r(i)].
  void estimate(const float* table, int64_t n, float* estimate) const;

 private:
  int rows_, cols_;
  PhiloxStream rng_;
};

}  // namespace gradcomm::detail
