// quant:bits=b,bucket=B,round=... on the GPU: per-bucket order-key min/max (8 threads
// a bucket), then one thread per 8 elements for the codes. The width and the rounding
// are run-time fields of the policy (uniform branches), which keeps one instantiation.
// Kernels and launchers: gpu_dense_kernels.cuh; formulas: gpu_dense_logic.h.
#include "compressors/quantize/gpu_dense_kernels.cuh"

namespace gradcomm::detail {

namespace {

QuantPolicy quant_policy(const DenseLayout& l, bool stochastic) {
  return QuantPolicy{(1u << l.code_bits) - 1u, l.code_bits, stochastic};
}

DenseLayout layout(const CompressorSpec& spec, uint64_t n) { return quant_layout(spec.bits, spec.bucket, n); }

void encode(const GpuEncodeArgs& args, const CompressorSpec& spec) {
  gpu_dense::launch_encode(quant_policy(args.layout, spec.round == Rounding::kStochastic), args);
}

void decode(const GpuDecodeArgs& args) { gpu_dense::launch_decode(quant_policy(args.layout, false), args); }

}  // namespace

const GpuDenseKernels kQuantGpuKernels{layout, encode, decode};

}  // namespace gradcomm::detail
