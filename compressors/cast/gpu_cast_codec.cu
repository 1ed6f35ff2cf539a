// fp16 and bf16 on the GPU: one thread per 8 elements narrows them with base/half.h
// (the CPU's rounding, bit for bit) and stores the 16 bytes; decode widens back.
// Layout and policy: gpu_cast_logic.h; kernels and launchers: ../dense/gpu_dense_kernels.cuh.
#include "compressors/cast/gpu_cast_logic.h"
#include "compressors/dense/gpu_dense_kernels.cuh"
#include "compressors/spec.h"

namespace gradcomm::detail {

namespace {

DenseLayout layout(const CompressorSpec& spec, uint64_t n) { return cast_layout(spec.id, n); }

void encode(const GpuEncodeArgs& args, const CompressorSpec&) {
  if (args.layout.id == CompressorId::kBf16) {
    gpu_dense::launch_encode(CastPolicy<true>{}, args);
  } else {
    gpu_dense::launch_encode(CastPolicy<false>{}, args);
  }
}

void decode(const GpuDecodeArgs& args) {
  if (args.layout.id == CompressorId::kBf16) {
    gpu_dense::launch_decode(CastPolicy<true>{}, args);
  } else {
    gpu_dense::launch_decode(CastPolicy<false>{}, args);
  }
}

}  // namespace

const GpuDenseKernels kCastGpuKernels{layout, encode, decode};

}  // namespace gradcomm::detail
