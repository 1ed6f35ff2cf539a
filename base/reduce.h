// CPU reduction kernels for the ring: one place that knows how each dtype adds.
// fp16 and bf16 are widened to fp32, combined, and rounded back once per call
// (base/half.h); integers wrap like the hardware does (two's complement).
// cuda/reduce.cuh implements the same contract on the GPU.
#pragma once

#include <cstdint>

#include "gradcomm/types.h"

namespace gradcomm::detail {

// dst[i] = dst[i] (+|min|max) src[i] for i in [0, n). kAvg adds. When
// `final_divisor` > 1 (the owner's last hop of an average), the combined value is
// divided by it before it is stored: in fp32 for fp16/bf16 (one rounding), in the
// type's own arithmetic otherwise (integers truncate toward zero).
void reduce_inplace(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op, int64_t final_divisor = 1);
// dst[i] = a[i] (+|min|max) b[i], the same arithmetic: one pass where a copy and an
// in-place reduction would take two. dst may be a, never b.
void reduce_into(void* dst, const void* a, const void* b, int64_t n, DType dtype, ReduceOp op,
                 int64_t final_divisor = 1);

// data[i] /= divisor, same arithmetic as above (average on a single rank).
void divide_inplace(void* data, int64_t n, DType dtype, int64_t divisor);

// The exact fp32 reciprocal of a power-of-two divisor > 1 (x * inverse is then x /
// divisor bit for bit); false for any other divisor.
bool exact_reciprocal_f32(int64_t divisor, float& inverse);

// Error feedback's loss, fp32: residual[i] += value[i] - kept[i] (the difference
// first, then the sum). The three ranges must not overlap.
void accumulate_loss(float* residual, const float* value, const float* kept, int64_t n);

}  // namespace gradcomm::detail
