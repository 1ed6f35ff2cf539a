// topk: each rank's k largest |acc| (the magnitude selection of ../sparse), exchanged as
// sparse payloads by allgather or reduce-scatter; values travel as bf16 by default.
#pragma once

#include <cstdint>

#include "compressors/sparse/sparse.h"
#include "compressors/family_params.h"

namespace gradcomm::detail {

struct TopkParams final : FamilyParams {
  static constexpr const char* kName = "topk's keys";
  double ratio = 0.0;  // exactly one of ratio / k is set (k = 0 means "use ratio")
  int64_t k = 0;
  TopkSelect select = TopkSelect::kExact;
  bool coded_indices = true;  // Elias-Fano coded indices (indices=coded), else raw u32/u64
  SparseAlgo algo = SparseAlgo::kAuto;
};

}  // namespace gradcomm::detail
