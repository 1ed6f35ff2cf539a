// Shared by the CUDA tests: they skip, with the reason, on machines without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "comm_impl.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "gradcomm/gradcomm.h"
#include "unit/test_util.h"

#define SKIP_WITHOUT_CUDA_DEVICE()                                                 \
  do {                                                                             \
    if (cuda_device_count() == 0) {                                                \
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();             \
    }                                                                              \
  } while (0)

namespace gradcomm::testing {

// N ranks as threads over the in-process transport, rank r on device device_of(r),
// each preferring `transport` ("nccl", "ucx", "auto"); rethrows the first rank's error.
inline void run_device_threads(int n, const std::string& transport, const std::function<int(int)>& device_of,
                               const std::function<void(Communicator&, int device)>& fn) {
  const auto errors = run_transport_threads(n, [&](int r, std::unique_ptr<detail::Transport> t) {
    detail::DeviceGuard guard(device_of(r));
    auto impl = std::make_unique<detail::CommunicatorImpl>(std::move(t), std::chrono::seconds(60));
    impl->set_transport_preference(transport);
    Communicator comm(std::move(impl));
    fn(comm, device_of(r));
  });
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Host <-> device copies for checking kernels, ordered with every stream. A plain
// cudaMemcpy runs on the legacy default stream, which does not wait for the
// non-blocking streams the kernels run on (Stream's default): a download would read
// a table a kernel is still adding into, and a pageable upload may still be in flight
// when a kernel reads it. So each copy synchronizes the device on both sides (which also
// raises an earlier kernel's fault here, with its location).
inline void copy_to_device(void* dst, const void* src, size_t bytes) {
  GRADCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  if (bytes != 0) GRADCOMM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  GRADCOMM_CUDA_CHECK(cudaDeviceSynchronize());
}
inline void copy_to_host(void* dst, const void* src, size_t bytes) {
  GRADCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  if (bytes != 0) GRADCOMM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

// A world of one over the real transports, preferring `transport` for CUDA tensors.
inline std::unique_ptr<Communicator> single_rank(const std::string& transport) {
  InitOptions options;
  options.rank = 0;
  options.world_size = 1;
  options.transport = transport;
  options.timeout = std::chrono::seconds(60);
  return Communicator::create(options);
}

}  // namespace gradcomm::testing
