// make_cuda_backend for builds without CUDA (GRADCOMM_CUDA=OFF or no nvcc).
#include "gradcomm/errors.h"
#include "trainer/backend.h"

namespace gradcomm::train {

std::unique_ptr<Backend> make_cuda_backend(const MlpLayout&, int64_t, int) {
  throw Unsupported("--device cuda: this gradcomm-train was built without CUDA (configure with -DGRADCOMM_CUDA=ON)");
}

}  // namespace gradcomm::train
