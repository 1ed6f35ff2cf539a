// GPU implementation of the reduce contract in base/reduce.h, on device memory.
// The element arithmetic is cuda/reduce_op.cuh (shared with the CPU reference),
// so results match the CPU bit for bit. This header holds only host declarations
// (it needs cuda_runtime_api.h, nothing else), so .cc files may call the launchers.
//
// Stream semantics: both launchers enqueue one kernel on `stream` (null = the
// legacy default stream) on the calling thread's current device, which must own
// the memory, and return without synchronizing. A bad argument throws
// InvalidArgument before anything is enqueued; a launch failure throws CudaError;
// faults during execution surface at the next synchronizing call on that stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gradcomm/types.h"

namespace gradcomm::detail {

// dst[i] = dst[i] (+|min|max) src[i] for i in [0, n); kAvg adds; when
// `final_divisor` > 1 the combined value is divided by it before it is stored
// (see reduce_op.cuh). Elements outside [0, n) are neither read nor written.
// dst and src: device pointers aligned to the element size; either equal or not
// overlapping. n == 0 is a no-op that makes no CUDA call. Throws InvalidArgument
// for n < 0, final_divisor < 1, null or misaligned pointers, unknown dtype/op.
void launch_reduce_inplace(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op, int64_t final_divisor,
                           cudaStream_t stream);

// data[i] /= divisor with the same arithmetic. divisor == 1 (or n == 0) is a
// no-op that makes no CUDA call; divisor < 1 is InvalidArgument.
void launch_divide_inplace(void* data, int64_t n, DType dtype, int64_t divisor, cudaStream_t stream);

}  // namespace gradcomm::detail
