#include "cuda/check.h"

#include <fmt/format.h>

#include "gradcomm/errors.h"
#include "logging.h"

namespace gradcomm::detail {

std::string cuda_error_message(cudaError_t error, const char* expression, const char* file, int line) {
  // Both lookups are pure table reads in the runtime; they work without a driver.
  const char* name = cudaGetErrorName(error);
  const char* text = cudaGetErrorString(error);
  return fmt::format("CUDA error {} ({}) in `{}` at {}:{}", name ? name : "cudaError?", text ? text : "unknown",
                     expression ? expression : "?", file ? file : "?", line);
}

void throw_cuda_error(cudaError_t error, const char* expression, const char* file, int line) {
  (void)cudaGetLastError();  // clear the non-sticky error this call left behind
  throw CudaError(cuda_error_message(error, expression, file, line));
}

void log_cuda_error(cudaError_t error, const char* expression, const char* file, int line) noexcept {
  try {
    (void)cudaGetLastError();
    log(LogLevel::kWarn, "{} (ignored: cannot throw here)", cuda_error_message(error, expression, file, line));
  } catch (...) {
    // Formatting failed (out of memory): nothing sensible is left to do.
  }
}

}  // namespace gradcomm::detail
