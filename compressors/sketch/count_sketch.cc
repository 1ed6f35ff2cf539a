// Count sketch (Charikar, Chen, Farach-Colton 2002), as used by Sketched-SGD
// (Ivkin et al. 2019): a rows x cols table where row r adds s_r(i) * x[i] into
// column h_r(i). The hashes depend only on the PhiloxStream, so all ranks build
// summable tables: sum of tables = table of the summed vector.
//
// Hashing (FORMAT.md): row r has a 64-bit salt
//   salt_r = philox_bits(rng, 2r) | philox_bits(rng, 2r+1) << 32
// and element i (as u64) hashes to z = fmix64(i ^ salt_r), MurmurHash3's 64-bit
// finalizer (a bijection with full avalanche). Column h_r(i) = (hi32(z) * cols) >> 32,
// sign s_r(i) = +1 if bit 0 of z is 0 else -1. Integer multiplies, shifts and xors
// only, so a CUDA kernel computes the same columns and signs bit for bit.
//
// estimate: the median over rows of s_r(i) * table[r][h_r(i)]; with an even number
// of rows, the mean of the two middle values (computed as a/2 + b/2 in fp32, which
// cannot overflow).
#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "compressors/sketch/sketch.h"
#include "compressors/sketch/sketch_hash.h"  // hashes and the median, shared with gpu_sketch.cu
#include "gradcomm/errors.h"
#include "half.h"  // float_bits, bits_float

namespace gradcomm::detail {
namespace {

using sketch::apply_sign;
using sketch::column_of;
using sketch::element_hash;
using sketch::kMaxRows;
using sketch::row_salt;
using sketch::sort_small;

// Elements hashed per block before their table updates. Hashing a block first and
// then scattering keeps each store's address ready early; fused into one loop, the
// long hash chain in front of every store stalls the loads behind it.
constexpr int64_t kBlock = 512;
// estimate gathers one row at a time for this many elements, so while a row is
// being read only that row's pages need to stay in cache and TLB.
constexpr int64_t kEstimateBlock = 8192;

}  // namespace

CountSketch::CountSketch(int rows, int cols, const PhiloxStream& rng) : rows_(rows), cols_(cols), rng_(rng) {
  if (rows < 1 || rows > kMaxRows || cols < 1) {
    throw InvalidArgument(
        fmt::format("CountSketch: rows = {} must be in [1, {}] and cols = {} must be >= 1", rows, kMaxRows, cols));
  }
}

void CountSketch::accumulate(const float* x, int64_t n, float* table) const {
  const auto cols = static_cast<uint32_t>(cols_);
  uint32_t col[kBlock];
  float val[kBlock];
  // Row-major: one row of the table stays hot in cache while all of x passes.
  // Within a row the additions happen in index order.
  for (int r = 0; r < rows_; ++r) {
    const uint64_t salt = row_salt(rng_, r);
    float* row = table + static_cast<size_t>(r) * cols;
    for (int64_t base = 0; base < n; base += kBlock) {
      const int64_t len = std::min(kBlock, n - base);
      for (int64_t j = 0; j < len; ++j) {
        const uint64_t z = element_hash(salt, static_cast<uint64_t>(base + j));
        col[j] = column_of(z, cols);
        val[j] = apply_sign(z, x[base + j]);
      }
      for (int64_t j = 0; j < len; ++j) row[col[j]] += val[j];
    }
  }
}

void CountSketch::estimate(const float* table, int64_t n, float* estimate) const {
  const auto cols = static_cast<uint32_t>(cols_);
  const auto rows = static_cast<size_t>(rows_);
  uint64_t salts[kMaxRows];
  for (int r = 0; r < rows_; ++r) salts[r] = row_salt(rng_, r);
  // votes[r * kEstimateBlock + j]: row r's estimate of element base + j.
  std::vector<float> votes(rows * kEstimateBlock);
  std::vector<uint32_t> cell(kEstimateBlock);
  float v[kMaxRows];
  for (int64_t base = 0; base < n; base += kEstimateBlock) {
    const int64_t len = std::min(kEstimateBlock, n - base);
    for (size_t r = 0; r < rows; ++r) {
      const float* row = table + r * cols;
      float* out = votes.data() + r * kEstimateBlock;
      // Two loops for the same reason as in accumulate: hash first (column in bits
      // 0-30, sign in bit 31, as cols < 2^31), then gather with every address ready.
      for (int64_t j = 0; j < len; ++j) {
        const uint64_t z = element_hash(salts[r], static_cast<uint64_t>(base + j));
        cell[j] = column_of(z, cols) | (static_cast<uint32_t>(z & 1u) << 31);
      }
      for (int64_t j = 0; j < len; ++j) {
        out[j] = bits_float(float_bits(row[cell[j] & 0x7FFFFFFFu]) ^ (cell[j] & 0x80000000u));
      }
    }
    for (int64_t j = 0; j < len; ++j) {
      for (size_t r = 0; r < rows; ++r) v[r] = votes[r * kEstimateBlock + static_cast<size_t>(j)];
      sort_small(v, rows_);
      estimate[base + j] = sketch::median_of_sorted(v, rows_);
    }
  }
}

}  // namespace gradcomm::detail
