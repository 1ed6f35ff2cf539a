// x86 features the CPU kernels dispatch on at run time (compressors/philox.cc,
// base/half_bulk.cc), each read once, from CPUID: never a compile-time -m flag, so
// one binary runs everywhere, and under valgrind (whose virtual CPU reports AVX2 but
// not AVX-512) the AVX2 paths run. Always false off x86-64 or without GCC/clang.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define GRADCOMM_X86_DISPATCH 1
#endif

namespace gradcomm::detail {

inline bool cpu_has_avx2() {
#if GRADCOMM_X86_DISPATCH
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

// AVX-512 Foundation, all that the AVX-512 kernels use (mul_epu32, ternarylogic,
// permutex2var, compare into masks). Like "avx2", __builtin_cpu_supports also asks
// the OS (XGETBV) whether it saves the wider register state, so a kernel or VM that
// disables AVX-512 reads false here.
inline bool cpu_has_avx512f() {
#if GRADCOMM_X86_DISPATCH
  static const bool avx512f = __builtin_cpu_supports("avx512f");
  return avx512f;
#else
  return false;
#endif
}

// AVX2 and F16C both. F16C from CPUID leaf 1: clang's __builtin_cpu_supports does
// not know "f16c".
inline bool cpu_has_avx2_f16c() {
#if GRADCOMM_X86_DISPATCH
  static const bool f16c = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return cpu_has_avx2() && f16c;
#else
  return false;
#endif
}

}  // namespace gradcomm::detail
