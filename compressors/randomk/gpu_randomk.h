// random-k on the GPU (gpu_randomk.cu): the family's draw (GpuSparseOps::draw).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "compressors/philox.h"
#include "compressors/sparse/gpu_sparse.h"  // GpuSparseWorkspace

namespace gradcomm::detail {

// ---- random-k ---------------------------------------------------------------------------
// randomk_indices() on the GPU: the same k distinct increasing indices of [0, n) for
// the same stream, into ws.indices() (count = min(k, n)). Floyd's sequential loop is
// replaced by the equivalent parallel form of randomk_logic.h (draws in parallel,
// duplicates by a radix sort, collisions by chain walking, a final sort).
void gpu_randomk_indices(int64_t n, int64_t k, const PhiloxStream& rng, GpuSparseWorkspace& ws,
                         cudaStream_t stream);

}  // namespace gradcomm::detail
