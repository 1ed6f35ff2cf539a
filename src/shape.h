// Tensor shapes passed with an allreduce (CompressOptions::shape / parts): checked
// against the tensor, reduced to what a compressor that views tensors as matrices
// needs (each part's numel and first dimension), and fingerprinted for the call
// header so that ranks passing different shapes get a MismatchError.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compressors/tensor_part.h"

namespace gradcomm::detail {

// The parts of a tensor of `numel` elements: one part for `shape`, one per entry of
// `parts`, none when neither is given. InvalidArgument (without the rank prefix)
// when both are given, a dimension is negative, or the sizes do not add up.
std::vector<TensorPart> tensor_parts(const std::vector<int64_t>& shape,
                                     const std::vector<std::vector<int64_t>>& parts, int64_t numel);

// A 32-bit fingerprint of the parts; 0 only when there are none.
uint32_t parts_digest(const std::vector<TensorPart>& parts);

// "2048x2048, 2048" for error messages (at most a few dozen parts shown).
std::string describe_parts(const std::vector<TensorPart>& parts);

}  // namespace gradcomm::detail
