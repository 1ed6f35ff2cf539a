#include "compressors/cpu_kernels.h"

#include <atomic>

#include "cpu_features.h"

namespace gradcomm::detail {
namespace {

std::atomic<int> caps_alive[2]{};  // live ScopedKernelCap objects, by Widest

bool capped_at(ScopedKernelCap::Widest widest) { return caps_alive[widest].load(std::memory_order_relaxed) != 0; }

}  // namespace

bool use_avx2_kernels() { return cpu_has_avx2() && !capped_at(ScopedKernelCap::kScalar); }

bool use_avx512_kernels() {
  return cpu_has_avx512f() && use_avx2_kernels() && !capped_at(ScopedKernelCap::kAvx2);
}

ScopedKernelCap::ScopedKernelCap(Widest widest) : widest_(widest) {
  caps_alive[widest_].fetch_add(1, std::memory_order_relaxed);
}
ScopedKernelCap::~ScopedKernelCap() { caps_alive[widest_].fetch_sub(1, std::memory_order_relaxed); }

}  // namespace gradcomm::detail
