// blockmax: the worked example of a sparsifier in docs/adding-a-compressor.md, a whole
// family with its own selection in one header. A step cuts the tensor into `count`
// equal blocks (count = round(ratio x n), at least 1; block b is [b n / count,
// (b + 1) n / count)) and sends, of each, the one element of largest magnitude (ties to
// the lower index). That is its selection and nothing else: it runs on top-k's
// collective shape (Collective::kSparseSelection), so the sparse payloads, their
// exchange and sum, error feedback, warm-up, min_numel and the average are the shape's
// (compressors/sparse/sparse.h, src/compressed_allreduce.h), and need no change.
//
// A block's maximum spreads a step's selection over the whole tensor, where top-k may
// take all its entries from one layer; it is written here for reading, not shipped.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "compressors/family.h"
#include "compressors/sparse/sparse.h"
#include "compressors/spec.h"

namespace gradcomm::example {

using detail::CompressorId;
using detail::CompressorSpec;

constexpr auto kBlockmaxId = static_cast<CompressorId>(204);  // an id no built-in uses

// The family's own key, its block of the spec.
struct BlockmaxParams final : detail::FamilyParams {
  static constexpr const char* kName = "blockmax's keys";
  double ratio = 0;  // blocks per element, (0, 1]
};

constexpr std::string_view kBlockmaxKeys[] = {"ratio", "ef", "min_numel", "warmup", "seed", "values"};

inline std::shared_ptr<const detail::FamilyParams> parse_blockmax(const detail::SpecReader& reader,
                                                                  CompressorSpec& /*common*/) {
  const auto ratio = reader.take("ratio");
  if (!ratio) reader.fail("blockmax: key 'ratio' is required (a number in (0, 1])");
  auto p = std::make_shared<BlockmaxParams>();
  p->ratio = reader.parse_ratio("ratio", *ratio);
  return p;
}

inline std::string canonical_blockmax(const CompressorSpec& spec) {
  return fmt::format("ratio={},", spec.family<BlockmaxParams>().ratio);
}

// What the shape needs to know: how many entries a step sends (one per block), and how
// they travel (raw indices; values as the spec's `values`). Exactly `count` entries
// every step, so the exchange knows every payload's size in advance.
inline detail::SparseShape blockmax_shape(const CompressorSpec& spec) {
  detail::SparseShape shape;
  shape.ratio = spec.family<BlockmaxParams>().ratio;
  shape.format = detail::SparseFormat{spec.values, /*coded=*/false};
  shape.exact_count = true;
  shape.algo = detail::SparseAlgo::kAllgather;
  return shape;
}

// The selection, under SparseOps::select's contract: of acc = data (+ residual), with a
// residual left holding acc and data zeroed; without one, data untouched.
inline detail::SparseVector blockmax_select(const CompressorSpec& /*spec*/, float* data, float* residual, int64_t n,
                                            int64_t count, const detail::PhiloxStream& /*rng: no draws*/) {
  const float* acc = data;
  if (residual != nullptr) {
    for (int64_t i = 0; i < n; ++i) residual[i] += data[i];
    acc = residual;
  }
  detail::SparseVector out;
  out.indices.reserve(static_cast<size_t>(count));
  out.values.reserve(static_cast<size_t>(count));
  for (int64_t b = 0; b < count; ++b) {
    const int64_t lo = b * n / count, hi = (b + 1) * n / count;
    int64_t best = lo;
    for (int64_t i = lo + 1; i < hi; ++i) {
      if (std::fabs(acc[i]) > std::fabs(acc[best])) best = i;
    }
    if (hi > lo) {
      out.indices.push_back(static_cast<uint64_t>(best));
      out.values.push_back(acc[best]);
    }
  }
  if (residual != nullptr) std::fill(data, data + n, 0.0f);
  return out;
}

constexpr detail::SparseOps kBlockmaxOps{.shape = blockmax_shape, .select = blockmax_select};

// Blocks are cut per tensor, so one call over many tensors picks other elements than a
// call each: never fused.
inline bool never(const CompressorSpec&) { return false; }

constexpr detail::Family kBlockmaxFamily{.id = kBlockmaxId,
                                         .name = "blockmax",
                                         .keys = kBlockmaxKeys,
                                         .ef_default = true,
                                         .values_default = detail::ValueType::kFp32,
                                         .collective = detail::Collective::kSparseSelection,
                                         .parse = parse_blockmax,
                                         .canonical = canonical_blockmax,
                                         .fusable = never,
                                         .sparse = &kBlockmaxOps};

}  // namespace gradcomm::example
