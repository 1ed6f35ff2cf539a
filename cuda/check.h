// Error checks for CUDA runtime calls. Usable from .cc files compiled by the host
// compiler: this header needs only cuda_runtime_api.h.
//
//   GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   GRADCOMM_CUDA_CHECK_LAUNCH();
//
// A failing call throws gradcomm::CudaError whose message names the CUDA error
// (name and text), the expression and file:line. Callers one level up add their
// own context (rank, operation) by catching and rethrowing, like NCCLCHECK chains.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace gradcomm::detail {

// "cudaErrorInvalidDevice (invalid device ordinal) in `cudaSetDevice(9)` at cuda/device.cc:42".
std::string cuda_error_message(cudaError_t error, const char* expression, const char* file, int line);

// Throws CudaError with cuda_error_message(...). It first clears the thread's
// last-error slot (cudaGetLastError), so a handled failure does not resurface in
// the next GRADCOMM_CUDA_CHECK_LAUNCH; sticky errors (a faulted context) stay and
// will be reported again by every later call, which is what CUDA intends.
[[noreturn]] void throw_cuda_error(cudaError_t error, const char* expression, const char* file, int line);

// For destructors and other paths that must not throw: logs a warning instead.
void log_cuda_error(cudaError_t error, const char* expression, const char* file, int line) noexcept;

}  // namespace gradcomm::detail

#define GRADCOMM_CUDA_CHECK(expr)                                                          \
  do {                                                                                     \
    const cudaError_t gradcomm_cuda_status_ = (expr);                                      \
    if (gradcomm_cuda_status_ != cudaSuccess) {                                            \
      ::gradcomm::detail::throw_cuda_error(gradcomm_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)

// After a kernel launch: reports a bad launch configuration (or an earlier
// asynchronous fault) at the launch site. Never synchronizes.
#define GRADCOMM_CUDA_CHECK_LAUNCH()                                                       \
  do {                                                                                     \
    const cudaError_t gradcomm_cuda_status_ = cudaGetLastError();                          \
    if (gradcomm_cuda_status_ != cudaSuccess) {                                            \
      ::gradcomm::detail::throw_cuda_error(gradcomm_cuda_status_, "kernel launch", __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)

// Non-throwing variant for destructors: logs and carries on.
#define GRADCOMM_CUDA_WARN(expr)                                                           \
  do {                                                                                     \
    const cudaError_t gradcomm_cuda_status_ = (expr);                                      \
    if (gradcomm_cuda_status_ != cudaSuccess) {                                            \
      ::gradcomm::detail::log_cuda_error(gradcomm_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)
