// One part of a call's tensor, as the caller described it (the tensor's shape, or
// CompressOptions::parts for several tensors laid end to end). The core only carries
// the parts and compares their digest across ranks; a family that views a tensor as
// matrices (Family::reads_shapes: powersgd, compressors/lowrank/powersgd_logic.h)
// reads them.
#pragma once

#include <cstdint>

namespace gradcomm::detail {

struct TensorPart {
  int64_t numel = 0;
  int64_t rows = 0;  // shape[0] for a part of 2 or more dimensions, 0 for one of fewer
  bool operator==(const TensorPart&) const = default;
};

}  // namespace gradcomm::detail
