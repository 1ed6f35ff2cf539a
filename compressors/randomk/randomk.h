// randomk: the same ratio x n indices drawn on every rank, their values summed by a
// dense allreduce.
#pragma once

#include <cstdint>
#include <vector>

#include "compressors/philox.h"
#include "compressors/family_params.h"

namespace gradcomm::detail {

struct RandomkParams final : FamilyParams {
  static constexpr const char* kName = "randomk's keys";
  double ratio = 0.0;  // fraction of elements, (0, 1]
};

// k distinct indices of [0, n), increasing, the same for every caller with the same
// stream (random-k draws one stream per (seed, key, step), shared by all ranks).
std::vector<uint64_t> randomk_indices(int64_t n, int64_t k, const PhiloxStream& rng);

}  // namespace gradcomm::detail
