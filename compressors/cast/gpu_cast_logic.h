// fp16 and bf16 on the GPU: their payload layout and their policy for the shared
// dense kernels (../dense/gpu_dense_logic.h says what a policy provides): each element
// narrowed with base/half.h, the CPU's rounding bit for bit. GRADCOMM_HD, so the CPU
// unit test (tests/unit/test_gpu_dense_logic.cc) runs exactly what the kernels run.
// Host and device code; needs no CUDA. The kernels: gpu_cast_codec.cu.
#pragma once

#include <cstdint>

#include "compressors/dense/gpu_dense_logic.h"
#include "compressors/compressor_id.h"
#include "half.h"

namespace gradcomm::detail {

// No parameters in the header, no scales; 16 bits an element. `id` is kFp16 or kBf16.
inline DenseLayout cast_layout(CompressorId id, uint64_t n) { return DenseLayout{id, n, 0, 0, 0, 0, 16}; }

// fp16 / bf16: a 16-bit "code" per element, no buckets, every pattern valid.
template <bool kBf16>
struct CastPolicy {
  static constexpr bool kBucketed = false;
  static constexpr bool stochastic = false;
  static constexpr unsigned bits = 16;
  struct Params {};
  GRADCOMM_HD Params encode_params(const uint8_t*) const { return {}; }
  GRADCOMM_HD Params decode_params(const uint8_t*) const { return {}; }
  GRADCOMM_HD uint32_t code(float x, const Params&, float) const { return kBf16 ? float_to_bf16(x) : float_to_half(x); }
  GRADCOMM_HD float value(uint32_t code, const Params&) const {
    return kBf16 ? bf16_to_float(static_cast<uint16_t>(code)) : half_to_float(static_cast<uint16_t>(code));
  }
};

struct GpuDenseKernels;
// fp16 and bf16 alike (layout.id says which): gpu_cast_codec.cu (CUDA builds); Family::gpu_dense.
extern const GpuDenseKernels kCastGpuKernels;

}  // namespace gradcomm::detail
