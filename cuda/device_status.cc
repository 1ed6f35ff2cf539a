#include "cuda/device_status.h"

#include <fmt/format.h>

#include "cuda/check.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {

const char* payload_fault_name(PayloadFault fault) noexcept {
  switch (fault) {
    case PayloadFault::kNone: return "no fault";
    case PayloadFault::kBadHeader: return "header does not match the spec";
    case PayloadFault::kBadNumel: return "header numel does not match the call";
    case PayloadFault::kBadLength: return "payload length does not match its header";
    case PayloadFault::kIndexOutOfRange: return "sparse index out of range";
    case PayloadFault::kIndexOrder: return "sparse indices not strictly increasing";
    case PayloadFault::kBadPadding: return "nonzero padding bits";
    case PayloadFault::kBadCode: return "code no encoder writes";
    case PayloadFault::kBadScale: return "invalid bucket scale";
  }
  return "unknown fault";
}

StatusBuffer::StatusBuffer() : device_(sizeof(DeviceStatus)), host_(sizeof(DeviceStatus)) {
  GRADCOMM_CUDA_CHECK(cudaMemset(device_.data(), 0, sizeof(DeviceStatus)));
}

void StatusBuffer::reset(cudaStream_t stream) {
  GRADCOMM_CUDA_CHECK(cudaMemsetAsync(device_.data(), 0, sizeof(DeviceStatus), stream));
}

DeviceStatus StatusBuffer::read(cudaStream_t stream) {
  GRADCOMM_CUDA_CHECK(
      cudaMemcpyAsync(host_.data(), device_.data(), sizeof(DeviceStatus), cudaMemcpyDeviceToHost, stream));
  GRADCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *host_.as<DeviceStatus>();
}

void StatusBuffer::check(cudaStream_t stream, const std::string& context) {
  const DeviceStatus s = read(stream);
  if (s.fault == 0) return;
  throw CorruptPayload(fmt::format("{}: {} (found {}, expected/at {})", context,
                                   payload_fault_name(static_cast<PayloadFault>(s.fault)), s.a, s.b));
}

}  // namespace gradcomm::detail
