// cuBLAS, opened at its first use (dlopen) instead of linked: loading libcublas puts
// ~155 MB in a process's resident memory (measured on the dev VM: VmRSS 9.6 -> 163 MB
// on loading libcublas.so.13 alone), which every process linking gradcomm would pay,
// CPU-only ones included. Only PowerSGD on CUDA tensors needs it
// (compressors/powersgd/gpu_powersgd.cu).
#pragma once

#include <cublas_v2.h>

namespace gradcomm::detail {

// The entry points gradcomm uses, resolved from libcublas.so.<CUBLAS_VER_MAJOR>.
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

// Opens the library once (thread-safe) and returns its entry points; CudaError naming
// the library and the loader's reason when it or a symbol is missing.
const CublasApi& cublas_api();

}  // namespace gradcomm::detail
