#include "compressors/cpu_kernels.h"

#include <atomic>

#include "cpu_features.h"

namespace gradcomm::detail {
namespace {

std::atomic<int> scalar_forced{0};  // live ScopedScalarKernels

}  // namespace

bool use_avx2_kernels() { return cpu_has_avx2() && scalar_forced.load(std::memory_order_relaxed) == 0; }

ScopedScalarKernels::ScopedScalarKernels() { scalar_forced.fetch_add(1, std::memory_order_relaxed); }
ScopedScalarKernels::~ScopedScalarKernels() { scalar_forced.fetch_sub(1, std::memory_order_relaxed); }

}  // namespace gradcomm::detail
