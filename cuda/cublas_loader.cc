#include "cuda/cublas_loader.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>
#include <string>

#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

#define GRADCOMM_STR2(x) #x
#define GRADCOMM_STR(x) GRADCOMM_STR2(x)
constexpr const char* kLibrary = "libcublas.so." GRADCOMM_STR(CUBLAS_VER_MAJOR);

template <class Fn>
void resolve(void* library, const char* name, Fn& out) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    throw CudaError(fmt::format("cuBLAS: {} has no symbol {} (PowerSGD on CUDA tensors needs cuBLAS {})", kLibrary,
                                name, CUBLAS_VER_MAJOR));
  }
  out = reinterpret_cast<Fn>(symbol);
}

CublasApi load() {
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
    throw CudaError(fmt::format("cuBLAS: cannot open {} ({}); PowerSGD on CUDA tensors needs it: install the CUDA "
                                "toolkit's cuBLAS or put its directory on LD_LIBRARY_PATH",
                                kLibrary, why != nullptr ? why : "no reason given"));
  }
  CublasApi api{};
  resolve(library, "cublasCreate_v2", api.create);
  resolve(library, "cublasDestroy_v2", api.destroy);
  resolve(library, "cublasSetStream_v2", api.set_stream);
  resolve(library, "cublasSetWorkspace_v2", api.set_workspace);
  resolve(library, "cublasSetMathMode", api.set_math_mode);
  resolve(library, "cublasSgemm_v2", api.sgemm);
  resolve(library, "cublasGetStatusName", api.status_name);
  resolve(library, "cublasGetStatusString", api.status_string);
  return api;  // the library stays open for the process's lifetime
}

}  // namespace

const CublasApi& cublas_api() {
  static std::once_flag once;
  static CublasApi api;
  std::call_once(once, [] { api = load(); });  // a throw leaves `once` unset: the next call retries
  return api;
}

}  // namespace gradcomm::detail
