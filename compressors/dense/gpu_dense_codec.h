// The CUDA dense codecs (each codec-ring family with GPU kernels): the same payload bytes as
// the CPU reference (compressors/codec.h DenseCodec, FORMAT.md) behind the same spec,
// on device memory, stream-ordered. Host-only header (cuda_runtime_api.h, no device
// code), so .cc files can use it. Kernels: each family's own .cu (Family::gpu_dense).
//
// Stream semantics: every method enqueues its kernels on `stream` (null = the legacy
// default stream) on the calling thread's current device, which must own all the
// pointers, and returns without synchronizing. Bad arguments throw InvalidArgument
// before anything is enqueued; launch failures throw CudaError. Nothing is allocated:
// the kernels need no scratch beyond the payload itself (the bucket pass writes the
// scales into the payload, and the code pass reads them back from there).
//
// Encode (2 kernels for the bucketed codecs: per-bucket scales, then one pass over
// groups of 8 elements that writes the codes, the residual and the decoded values;
// 1 kernel for the casts). Decode (2-3 kernels: header and length check, the scales
// and codes check, then the writing pass). A decoder never throws for bad bytes: it
// records the fault in a DeviceStatus (cuda/device_status.h) and writes nothing; the
// caller learns the verdict from StatusBuffer::check after the stream synchronizes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "compressors/philox.h"
#include "compressors/compressor_id.h"
#include "cuda/device_status.h"

namespace gradcomm::detail {

struct CompressorSpec;  // compressors/spec.h
struct GpuDenseKernels;

// What error feedback does around an encode.
enum class ResidualMode : uint8_t {
  // acc = in + residual; payload = encode(acc); residual = acc - decode(payload).
  // The per-tensor form (src/compression.cc: fold, encode, keep the loss).
  kFold,
  // acc = in; payload = encode(in); residual += in - decode(payload). The compressed
  // ring's form (each hop's loss is added to the residual at the same positions).
  kAccumulate,
};

struct EncodeFeedback {
  float* residual = nullptr;  // n floats, or null: no error feedback
  ResidualMode mode = ResidualMode::kFold;
  // Optional: decode(payload) written here (n floats), e.g. the ring owner keeping
  // what every rank decodes. May equal `in`; must not overlap residual or payload.
  float* decoded = nullptr;
};

class GpuDenseCodec {
 public:
  // A codec-ring family with GPU kernels (Family::gpu_dense: fp16, bf16, quant, qsgd,
  // sign); InvalidArgument otherwise or for parameters its CPU codec rejects. Makes no
  // CUDA call.
  explicit GpuDenseCodec(const CompressorSpec& spec);

  CompressorId id() const { return id_; }
  // Exact payload bytes for n values, header included (== the CPU codec's).
  size_t encoded_bytes(int64_t n) const;
  // Runs must start at multiples of this (the bucket; 1 for the casts).
  int64_t alignment() const;

  // Encodes in[0, n) (element i is tensor element first + i: its random draw and its
  // bucket are counted from `first`, a multiple of alignment()) into
  // payload[0, encoded_bytes(n)). With `residual` non-null: ResidualMode::kFold.
  // in, residual: device floats; payload: device bytes, any alignment (4-byte aligned
  // is faster). in must not overlap payload or residual.
  void encode(const float* in, int64_t n, uint8_t* payload, const PhiloxStream& rng, int64_t first, float* residual,
              cudaStream_t stream) const;
  void encode(const float* in, int64_t n, uint8_t* payload, const PhiloxStream& rng, int64_t first,
              const EncodeFeedback& feedback, cudaStream_t stream) const;

  // out[i] = decoded value i (add = false) or out[i] += it (add = true), for a payload
  // of payload_bytes device bytes. Validates on the device everything the CPU decoder
  // does; when the payload is invalid, or `status` already holds a fault from earlier
  // work on this stream, nothing is written and the (first) fault stays in *status.
  void decode(const uint8_t* payload, size_t payload_bytes, int64_t n, float* out, bool add, DeviceStatus* status,
              cudaStream_t stream) const;

 private:
  std::shared_ptr<const CompressorSpec> spec_;  // a copy of the caller's
  CompressorId id_;
  const GpuDenseKernels* kernels_;  // the family's (never null once constructed)
  int64_t alignment_;              // the CPU codec's: the bucket, 1 for the casts
};

}  // namespace gradcomm::detail
