// qsgd:levels=s,bucket=B on the GPU: per-bucket squared norm in the CPU's lane order
// (8 threads a bucket), then one thread per 8 elements for the stochastic levels.
// Layout and policy: gpu_qsgd_logic.h; kernels and launchers: ../dense/gpu_dense_kernels.cuh.
#include "compressors/dense/gpu_dense_kernels.cuh"
#include "compressors/quantize/gpu_qsgd_logic.h"
#include "compressors/quantize/quantize.h"
#include "compressors/spec.h"

namespace gradcomm::detail {

namespace {

DenseLayout layout(const CompressorSpec& spec, uint64_t n) {
  const auto& p = spec.family<QsgdParams>();
  return qsgd_layout(p.levels, p.bucket, n);
}

void encode(const GpuEncodeArgs& args, const CompressorSpec&) {
  gpu_dense::launch_encode(qsgd_policy(args.layout), args);
}

void decode(const GpuDecodeArgs& args) {
  gpu_dense::launch_decode(qsgd_policy(args.layout), args);
}

}  // namespace

const GpuDenseKernels kQsgdGpuKernels{layout, encode, decode};

}  // namespace gradcomm::detail
