// Grid-stride launch helpers shared by the compressor kernels (.cu files only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "cuda/device.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {

// Blocks for `items` one-per-thread work items: enough to cover them, but at most
// `blocks_per_sm` per SM of the current device (grid-stride loops take the rest).
inline unsigned grid_for(int64_t items, int threads, int blocks_per_sm) {
  const int64_t fill = static_cast<int64_t>(cuda_sm_count(cuda_current_device())) * blocks_per_sm;
  return static_cast<unsigned>(std::clamp<int64_t>((items + threads - 1) / threads, 1, fill));
}

__device__ __forceinline__ int64_t first_thread() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// InvalidArgument from streamed parts (fmt::format does not compile under nvcc here).
template <class... Args>
[[noreturn]] void throw_invalid(const Args&... parts) {
  std::ostringstream text;
  (text << ... << parts);
  throw InvalidArgument(text.str());
}

}  // namespace gradcomm::detail
