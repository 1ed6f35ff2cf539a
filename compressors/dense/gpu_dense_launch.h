// Internal: the launchers behind GpuDenseCodec. Each dense family with GPU kernels
// defines a GpuDenseKernels table in its own folder's .cu file (e.g.
// sign/gpu_sign_codec.cu, declared in sign/gpu_sign_logic.h), and its Family points
// at it (Family::gpu_dense). Host-only declarations. The arguments are already
// validated (gpu_dense_codec.cc); the launchers only compute grids, launch on the
// stream and check the launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "compressors/dense/gpu_dense_codec.h"
#include "compressors/dense/gpu_dense_logic.h"
#include "compressors/philox.h"
#include "cuda/device_status.h"

namespace gradcomm::detail {

struct GpuEncodeArgs {
  DenseLayout layout;  // of the run; layout.n elements
  const float* in;
  uint8_t* payload;    // layout.total_bytes()
  PhiloxStream rng;
  uint64_t first;
  EncodeFeedback feedback;
  cudaStream_t stream;
};

struct GpuDecodeArgs {
  DenseLayout layout;  // what the caller expects
  const uint8_t* payload;
  uint64_t payload_bytes;
  float* out;
  bool add;
  DeviceStatus* status;
  cudaStream_t stream;
};

// A dense family's GPU codec: the payload layout of its spec for n elements, and its
// two launchers.
struct GpuDenseKernels {
  DenseLayout (*layout)(const CompressorSpec& spec, uint64_t n);
  void (*encode)(const GpuEncodeArgs& args, const CompressorSpec& spec);
  void (*decode)(const GpuDecodeArgs& args);
};

}  // namespace gradcomm::detail
