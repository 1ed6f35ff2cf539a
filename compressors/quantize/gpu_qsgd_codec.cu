// qsgd:levels=s,bucket=B on the GPU: per-bucket squared norm in the CPU's lane order
// (8 threads a bucket), then one thread per 8 elements for the stochastic levels.
// Kernels and launchers: gpu_dense_kernels.cuh; formulas: gpu_dense_logic.h.
#include "compressors/quantize/gpu_dense_kernels.cuh"

namespace gradcomm::detail {

namespace {

DenseLayout layout(const CompressorSpec& spec, uint64_t n) { return qsgd_layout(spec.levels, spec.bucket, n); }

void encode(const GpuEncodeArgs& args, const CompressorSpec&) {
  gpu_dense::launch_encode(QsgdPolicy{args.layout.param0, args.layout.code_bits}, args);
}

void decode(const GpuDecodeArgs& args) {
  gpu_dense::launch_decode(QsgdPolicy{args.layout.param0, args.layout.code_bits}, args);
}

}  // namespace

const GpuDenseKernels kQsgdGpuKernels{layout, encode, decode};

}  // namespace gradcomm::detail
