// The count sketch on the GPU (gpu_sketch.cu): the family's table calls
// (GpuSparseOps::accumulate, recover).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "compressors/philox.h"
#include "compressors/sparse/gpu_sparse.h"  // GpuSparseWorkspace

namespace gradcomm::detail {

// ---- count sketch -------------------------------------------------------------------------
// CountSketch on the GPU, same hashes (sketch_hash.h). Bitwise equality with the CPU:
// estimate() for the same table bits; recover() (indices) for the same table bits.
// accumulate() adds with float atomics in a nondeterministic order: each table cell
// is a sum of the same terms as on the CPU, rounded in another order (see gpu_sketch.cu
// for the bound).
class GpuCountSketch {
 public:
  GpuCountSketch(int rows, int cols, const PhiloxStream& rng);  // InvalidArgument as CountSketch
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  // table[r * cols + h_r(i)] += s_r(i) * acc[i], acc = x (+ residual: residual = acc
  // afterwards, the fold fused into this pass). Table (device, rows x cols) not cleared.
  void accumulate(const float* x, float* residual, int64_t n, float* table, cudaStream_t stream) const;
  // estimate[i] = median over rows of s_r(i) * table[r * cols + h_r(i)].
  void estimate(const float* table, int64_t n, float* estimate, cudaStream_t stream) const;
  // Heavy hitters: the exact top-k of the estimates (as src/compression.cc selects them)
  // into ws.indices(); the estimates themselves land in ws.values().
  void recover(const float* table, int64_t n, int64_t k, GpuSparseWorkspace& ws, cudaStream_t stream) const;

 private:
  int rows_, cols_;
  PhiloxStream rng_;
};

}  // namespace gradcomm::detail
