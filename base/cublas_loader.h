// cuBLAS, opened at its first use (dlopen) instead of linked: loading libcublas costs
// a process about 215 MB of resident memory and 0.4 s at start (measured on the dev
// VM: a program linking libcublas.so.13 and never calling it, against one that does
// not link it), which every process linking it would pay, CPU-only ones included.
// Two users: PowerSGD on CUDA tensors (compressors/lowrank/gpu_powersgd.cu) and
// gradcomm-train's CUDA backend (trainer/cuda_backend.cc).
//
// Header-only, so the trainer, which links only the shared library's public API,
// gets its own copy; only CUDA builds include it, .cu files too (hence no fmt). An
// including target may define GRADCOMM_CUDA_LIBRARY_DIR, the toolkit's library
// directory, tried when libcublas is not on the loader's path.
#pragma once

#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <string_view>

#include "gradcomm/errors.h"

namespace gradcomm::detail {

// The entry points used, resolved from libcublas.so.<CUBLAS_VER_MAJOR>.
struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

namespace cublas_loader {

#define GRADCOMM_CUBLAS_STR2(x) #x
#define GRADCOMM_CUBLAS_STR(x) GRADCOMM_CUBLAS_STR2(x)
inline constexpr const char* kLibrary = "libcublas.so." GRADCOMM_CUBLAS_STR(CUBLAS_VER_MAJOR);

template <class Fn>
void resolve(void* library, const char* name, std::string_view needed_by, Fn& out) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    throw CudaError("cuBLAS: " + std::string(kLibrary) + " has no symbol " + name + " (" + std::string(needed_by) +
                    " needs cuBLAS " + std::to_string(CUBLAS_VER_MAJOR) + ")");
  }
  out = reinterpret_cast<Fn>(symbol);
}

inline CublasApi load(std::string_view needed_by) {
  // RTLD_LOCAL: its symbols stay out of the global namespace (torch may load another cuBLAS).
  void* library = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
#ifdef GRADCOMM_CUDA_LIBRARY_DIR
  if (library == nullptr) {  // not on the loader's path: where the toolkit we built against keeps it
    const std::string beside_toolkit = std::string(GRADCOMM_CUDA_LIBRARY_DIR) + "/" + kLibrary;
    library = dlopen(beside_toolkit.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
#endif
  if (library == nullptr) {
    const char* why = dlerror();
    throw CudaError("cuBLAS: cannot open " + std::string(kLibrary) + " (" + (why != nullptr ? why : "no reason given") +
                    "); " + std::string(needed_by) +
                    " needs it: install the CUDA toolkit's cuBLAS or put its directory on LD_LIBRARY_PATH");
  }
  CublasApi api{};
  resolve(library, "cublasCreate_v2", needed_by, api.create);
  resolve(library, "cublasDestroy_v2", needed_by, api.destroy);
  resolve(library, "cublasSetStream_v2", needed_by, api.set_stream);
  resolve(library, "cublasSetWorkspace_v2", needed_by, api.set_workspace);
  resolve(library, "cublasSetMathMode", needed_by, api.set_math_mode);
  resolve(library, "cublasSgemm_v2", needed_by, api.sgemm);
  resolve(library, "cublasGetStatusName", needed_by, api.status_name);
  resolve(library, "cublasGetStatusString", needed_by, api.status_string);
  return api;  // the library stays open for the process's lifetime
}

}  // namespace cublas_loader

// Opens the library once (thread-safe) and returns its entry points. When it or a
// symbol is missing: CudaError naming the library, the loader's reason and
// `needed_by` (what the caller was doing, e.g. "PowerSGD on CUDA tensors"); a
// later call tries again.
inline const CublasApi& cublas_api(std::string_view needed_by) {
  static std::once_flag once;
  static CublasApi api;
  std::call_once(once, [&] { api = cublas_loader::load(needed_by); });  // a throw leaves `once` unset
  return api;
}

}  // namespace gradcomm::detail
