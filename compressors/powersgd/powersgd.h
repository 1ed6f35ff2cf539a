// powersgd: a rank-r approximation P Q^T of each gradient matrix, P and Q summed over two
// dense rings; Q carries over between steps (warm start). The arithmetic is ../lowrank's.
#pragma once

#include "compressors/family_params.h"

namespace gradcomm::detail {

struct PowersgdParams final : FamilyParams {
  static constexpr const char* kName = "powersgd's keys";
  // torch's PowerSGDState defaults: rank 1, warm start, min_compression_rate 2.
  int rank = 1;
  bool warm_start = true;
  double min_compression_rate = 2.0;
};

}  // namespace gradcomm::detail
