// sign:bucket=B on the GPU: per-bucket mean |x| in the CPU's lane order (8 threads a
// bucket), then one thread per 8 elements packing the 8 sign bits into one byte.
// Kernels and launchers: ../quantize/gpu_dense_kernels.cuh; formulas: ../quantize/gpu_dense_logic.h.
#include "compressors/quantize/gpu_dense_kernels.cuh"

namespace gradcomm::detail {

void gpu_sign_encode(const GpuEncodeArgs& args) { gpu_dense::launch_encode(SignPolicy{}, args); }

void gpu_sign_decode(const GpuDecodeArgs& args) { gpu_dense::launch_decode(SignPolicy{}, args); }

}  // namespace gradcomm::detail
