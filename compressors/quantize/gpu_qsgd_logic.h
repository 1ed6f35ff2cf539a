// qsgd:levels=s,bucket=B on the GPU: its payload layout and its policy for the
// shared dense kernels (../dense/gpu_dense_logic.h says what a policy provides), as
// GRADCOMM_HD code over the formulas of dense_math.h, so the CPU unit test
// (tests/unit/test_gpu_dense_logic.cc) runs exactly what the kernels run. Host and
// device code; needs no CUDA. The kernels: gpu_qsgd_codec.cu.
#pragma once

#include <cstdint>

#include "compressors/dense/gpu_dense_logic.h"
#include "compressors/dense/dense_math.h"
#include "compressors/compressor_id.h"

namespace gradcomm::detail {

// The header carries param0 = levels, param1 = the bucket; the scales are the norms,
// 4 bytes a bucket; codes are a sign bit and the level. No validation here: the caller
// has run the spec through the family's make_codec checks.
inline DenseLayout qsgd_layout(int levels, int64_t bucket, uint64_t n) {
  return DenseLayout{CompressorId::kQsgd,           n, static_cast<uint32_t>(levels), static_cast<uint32_t>(bucket),
                     static_cast<uint64_t>(bucket), 4, qsgd_code_bits(static_cast<uint32_t>(levels))};
}

// qsgd: lane sums of x*x, then the correctly rounded square root.
struct QsgdPolicy {
  static constexpr bool kBucketed = true;
  static constexpr bool stochastic = true;
  uint32_t levels;
  unsigned bits;  // qsgd_code_bits(levels)

  using Acc = float;
  struct Params {
    float scale, unit;
  };
  GRADCOMM_HD Acc identity() const { return 0.0f; }
  GRADCOMM_HD Acc accumulate(Acc a, float x) const { return add_rn(a, mul_rn(x, x)); }
  GRADCOMM_HD Acc combine(Acc a, Acc b) const { return add_rn(a, b); }
  GRADCOMM_HD void finalize(Acc sum, uint64_t, uint8_t* scale) const {
    float norm = sqrt_rn(sum);
    if (!is_finite(norm)) norm = bits_float(kCanonicalNanBits);
    store_f32le(scale, norm);
  }
  GRADCOMM_HD Params encode_params(const uint8_t* scale) const {
    const float norm = load_f32le(scale);
    return {qsgd_scale(norm, levels), qsgd_unit(norm, levels)};
  }
  GRADCOMM_HD Params decode_params(const uint8_t* scale) const { return {0.0f, qsgd_unit(load_f32le(scale), levels)}; }
  GRADCOMM_HD uint32_t code(float x, const Params& p, float u) const {
    return qsgd_code(x, round_stochastic(qsgd_position(x, p.scale, static_cast<float>(levels)), u), bits);
  }
  GRADCOMM_HD float value(uint32_t code, const Params& p) const { return qsgd_value(code, p.unit, bits); }
  GRADCOMM_HD bool scale_valid(const uint8_t* scale) const { return nonnegative_scale_valid(load_f32le(scale)); }
  // A level field above s is possible only when s + 1 is not a power of two.
  GRADCOMM_HD bool check_codes() const { return ((levels + 1) & levels) != 0; }
  GRADCOMM_HD bool code_valid(uint32_t code) const { return (code & ((1u << (bits - 1)) - 1u)) <= levels; }
};

// The policy for a layout of qsgd_layout's.
inline QsgdPolicy qsgd_policy(const DenseLayout& l) { return QsgdPolicy{l.param0, l.code_bits}; }

struct GpuDenseKernels;
extern const GpuDenseKernels kQsgdGpuKernels;  // gpu_qsgd_codec.cu (CUDA builds); Family::gpu_dense

}  // namespace gradcomm::detail
