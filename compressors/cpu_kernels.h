// The one switch between the compressors' CPU kernel sets, host only: the AVX2
// kernels (philox.cc, dense/dense_simd.cc) where the CPU has AVX2, the AVX-512
// Philox kernel (philox.cc) where it also has AVX-512F, the scalar definitions
// everywhere else. All give the same bits (tests/unit/test_dense_codec_bytes.cc,
// tests/unit/test_philox.cc), so the switch is a speed choice and nothing on the wire
// depends on it. Callers read it once per bulk call, not per element.
#pragma once

namespace gradcomm::detail {

// True when the CPU has AVX2 and no ScopedScalarKernels is alive.
bool use_avx2_kernels();

// True when use_avx2_kernels() is, the CPU also has AVX-512F, and no
// ScopedAvx2Kernels is alive. Implies use_avx2_kernels(): the AVX-512 kernel hands
// its tail to the AVX2 one.
bool use_avx512_kernels();

// While one is alive (in any thread), the kernels are capped at `widest`: how the
// tests compute the scalar reference, or reach the AVX2 path, on a wider machine.
// Not for concurrent use with encoders whose path must not change mid-run.
class ScopedKernelCap {
 public:
  enum Widest { kScalar, kAvx2 };
  explicit ScopedKernelCap(Widest widest);
  ~ScopedKernelCap();
  ScopedKernelCap(const ScopedKernelCap&) = delete;
  ScopedKernelCap& operator=(const ScopedKernelCap&) = delete;

 private:
  Widest widest_;
};

struct ScopedScalarKernels : ScopedKernelCap {
  ScopedScalarKernels() : ScopedKernelCap(kScalar) {}
};

struct ScopedAvx2Kernels : ScopedKernelCap {
  ScopedAvx2Kernels() : ScopedKernelCap(kAvx2) {}
};

}  // namespace gradcomm::detail
