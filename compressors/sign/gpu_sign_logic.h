// sign:bucket=B on the GPU: its payload layout and its policy for the shared dense
// kernels (../dense/gpu_dense_logic.h says what a policy provides), as GRADCOMM_HD code over
// the formulas of dense/dense_math.h (which the CPU codec, sign_codec.cc, uses too),
// so the CPU unit test (tests/unit/test_gpu_dense_logic.cc) runs exactly what the
// kernels run. Host and device code; needs no CUDA. The kernels: gpu_sign_codec.cu.
#pragma once

#include <cstdint>

#include "compressors/dense/gpu_dense_logic.h"
#include "compressors/dense/dense_math.h"
#include "compressors/compressor_id.h"

namespace gradcomm::detail {

// The header carries param1 = the bucket; the scales are the mean |x|, 4 bytes a
// bucket; one bit an element.
inline DenseLayout sign_layout(int64_t bucket, uint64_t n) {
  return DenseLayout{CompressorId::kSign, n, 0, static_cast<uint32_t>(bucket), static_cast<uint64_t>(bucket), 4, 1};
}

// sign: lane sums of |x|, divided by the bucket's element count.
struct SignPolicy {
  static constexpr bool kBucketed = true;
  static constexpr bool stochastic = false;
  static constexpr unsigned bits = 1;

  using Acc = float;
  struct Params {
    float scale;
  };
  GRADCOMM_HD Acc identity() const { return 0.0f; }
  GRADCOMM_HD Acc accumulate(Acc a, float x) const { return add_rn(a, bits_float(float_bits(x) & 0x7FFFFFFFu)); }
  GRADCOMM_HD Acc combine(Acc a, Acc b) const { return add_rn(a, b); }
  GRADCOMM_HD void finalize(Acc sum, uint64_t m, uint8_t* scale) const {
    float s = sum / static_cast<float>(m);
    if (!is_finite(s)) s = bits_float(kCanonicalNanBits);
    store_f32le(scale, s);
  }
  GRADCOMM_HD Params encode_params(const uint8_t* scale) const { return {load_f32le(scale)}; }
  GRADCOMM_HD Params decode_params(const uint8_t* scale) const { return {load_f32le(scale)}; }
  GRADCOMM_HD uint32_t code(float x, const Params&, float) const { return sign_bit(x); }
  GRADCOMM_HD float value(uint32_t code, const Params& p) const { return sign_value(p.scale, code); }
  GRADCOMM_HD bool scale_valid(const uint8_t* scale) const { return nonnegative_scale_valid(load_f32le(scale)); }
  GRADCOMM_HD bool check_codes() const { return false; }
  GRADCOMM_HD bool code_valid(uint32_t) const { return true; }
};

struct GpuDenseKernels;
extern const GpuDenseKernels kSignGpuKernels;  // gpu_sign_codec.cu (CUDA builds); Family::gpu_dense

}  // namespace gradcomm::detail
