// The one switch between the compressors' CPU kernel sets, host only: the AVX2
// kernels (philox.cc, quantize/dense_simd.cc) where the CPU has AVX2, the scalar
// definitions everywhere else. Both give the same bits (tests/unit/
// test_dense_codec_bytes.cc), so the switch is a speed choice and nothing on the wire
// depends on it. Callers read it once per bulk call, not per element.
#pragma once

namespace gradcomm::detail {

// True when the CPU has AVX2 and no ScopedScalarKernels is alive.
bool use_avx2_kernels();

// While one is alive (in any thread), use_avx2_kernels() is false: how the tests
// compute the scalar reference on an AVX2 machine. Not for concurrent use with
// encoders whose path must not change mid-run.
class ScopedScalarKernels {
 public:
  ScopedScalarKernels();
  ~ScopedScalarKernels();
  ScopedScalarKernels(const ScopedScalarKernels&) = delete;
  ScopedScalarKernels& operator=(const ScopedScalarKernels&) = delete;
};

}  // namespace gradcomm::detail
