// The device path functions of a build without CUDA (device_path.h). A CUDA tensor
// is refused at issue by check_device_tensor, so the other two are never reached;
// they refuse too rather than pretend.
#include <fmt/format.h>

#include "device_path.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

[[noreturn]] void no_cuda(const std::string& what) {
  throw Unsupported(fmt::format("{} is a CUDA tensor, but this gradcomm was built without CUDA "
                                "(configure with GRADCOMM_CUDA=ON)",
                                what));
}

}  // namespace

std::unique_ptr<DevicePath> open_device_path(Op&, int device, const std::string&, std::chrono::milliseconds,
                                             std::function<void()>) {
  no_cuda(fmt::format("the first tensor on cuda:{}", device));
}

void check_device_tensor(const TensorView&, const std::string& what) { no_cuda(what); }

void copy_to_device(const float*, TensorView, void*) { no_cuda("a mask"); }

}  // namespace gradcomm::detail
