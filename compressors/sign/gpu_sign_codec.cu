// sign:bucket=B on the GPU: per-bucket mean |x| in the CPU's lane order (8 threads a
// bucket), then one thread per 8 elements packing the 8 sign bits into one byte.
// Layout and policy: gpu_sign_logic.h; kernels and launchers: ../dense/gpu_dense_kernels.cuh.
#include "compressors/dense/gpu_dense_kernels.cuh"
#include "compressors/sign/gpu_sign_logic.h"
#include "compressors/sign/sign.h"
#include "compressors/spec.h"

namespace gradcomm::detail {

namespace {

DenseLayout layout(const CompressorSpec& spec, uint64_t n) { return sign_layout(spec.family<SignParams>().bucket, n); }

void encode(const GpuEncodeArgs& args, const CompressorSpec&) { gpu_dense::launch_encode(SignPolicy{}, args); }

void decode(const GpuDecodeArgs& args) { gpu_dense::launch_decode(SignPolicy{}, args); }

}  // namespace

const GpuDenseKernels kSignGpuKernels{layout, encode, decode};

}  // namespace gradcomm::detail
