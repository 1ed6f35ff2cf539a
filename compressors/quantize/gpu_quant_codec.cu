// quant:bits=b,bucket=B,round=... on the GPU: per-bucket order-key min/max (8 threads
// a bucket), then one thread per 8 elements for the codes. The width and the rounding
// are run-time fields of the policy (uniform branches), which keeps one instantiation.
// Layout and policy: gpu_quant_logic.h; kernels and launchers: ../dense/gpu_dense_kernels.cuh.
#include "compressors/dense/gpu_dense_kernels.cuh"
#include "compressors/quantize/gpu_quant_logic.h"
#include "compressors/quantize/quantize.h"
#include "compressors/spec.h"

namespace gradcomm::detail {

// The bucket pass's lane combine moves each lane's accumulator down the warp
// (bucket_scales_kernel calls shfl_down, which finds this by argument-dependent
// lookup): QuantAcc field by field.
__device__ __forceinline__ QuantAcc shfl_down(QuantAcc a, unsigned delta) {
  return {__shfl_down_sync(gpu_dense::kFullMask, a.lo, delta), __shfl_down_sync(gpu_dense::kFullMask, a.hi, delta),
          __shfl_down_sync(gpu_dense::kFullMask, a.bad, delta)};
}

namespace {

DenseLayout layout(const CompressorSpec& spec, uint64_t n) {
  const auto& p = spec.family<QuantParams>();
  return quant_layout(p.bits, p.bucket, n);
}

void encode(const GpuEncodeArgs& args, const CompressorSpec& spec) {
  gpu_dense::launch_encode(quant_policy(args.layout, spec.family<QuantParams>().round == Rounding::kStochastic), args);
}

void decode(const GpuDecodeArgs& args) { gpu_dense::launch_decode(quant_policy(args.layout, false), args); }

}  // namespace

const GpuDenseKernels kQuantGpuKernels{layout, encode, decode};

}  // namespace gradcomm::detail
