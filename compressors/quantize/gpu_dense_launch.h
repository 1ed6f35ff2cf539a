// Internal: the launchers behind GpuDenseCodec, one per codec family, implemented in
// compressors/cast/gpu_cast_codec.cu, quantize/gpu_quant_codec.cu,
// quantize/gpu_qsgd_codec.cu and sign/gpu_sign_codec.cu. Host-only declarations.
// The arguments are already validated (gpu_dense_codec.cc); the launchers only
// compute grids, launch on the stream and check the launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "compressors/philox.h"
#include "compressors/quantize/gpu_dense_codec.h"
#include "compressors/quantize/gpu_dense_logic.h"
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

void gpu_cast_encode(const GpuEncodeArgs& args);  // layout.id: fp16 or bf16
void gpu_cast_decode(const GpuDecodeArgs& args);
void gpu_quant_encode(const GpuEncodeArgs& args, Rounding round);
void gpu_quant_decode(const GpuDecodeArgs& args);
void gpu_qsgd_encode(const GpuEncodeArgs& args);
void gpu_qsgd_decode(const GpuDecodeArgs& args);
void gpu_sign_encode(const GpuEncodeArgs& args);
void gpu_sign_decode(const GpuDecodeArgs& args);

}  // namespace gradcomm::detail
