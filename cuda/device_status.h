// A device-side verdict for kernels that check untrusted input (payload decoders).
//
// A decoder cannot throw from a kernel, and reading a payload header on the host
// would cost a stream synchronization per message. Instead the validating kernel
// records the first problem it finds in a DeviceStatus word in device memory, and
// every writing kernel launched after it on the same stream reads that word and
// writes nothing when it is set ("nothing is written before validation", as on
// the CPU). The host learns the verdict when it next synchronizes:
//
//   StatusBuffer status;                 // one per stream / workspace, reused
//   status.reset(stream);                // clear before a batch of decodes
//   launch_decode(..., status.device(), stream);
//   ...
//   status.check(stream, "allreduce #17: payload from rank 2");  // syncs; throws CorruptPayload
//
// This header is host-and-device: .cu files include it for report_status();
// .cc files may use StatusBuffer (it needs only cuda_runtime_api.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/buffer.h"

namespace gradcomm::detail {

// What a validating kernel found (first one wins).
enum class PayloadFault : uint32_t {
  kNone = 0,
  kBadHeader = 1,         // magic, version, compressor id, flags or params differ from the spec
  kBadNumel = 2,          // header numel != the call's numel      (a = found, b = expected)
  kBadLength = 3,         // payload bytes != what the header implies (a = found, b = expected)
  kIndexOutOfRange = 4,   // sparse index >= numel                  (a = index, b = position)
  kIndexOrder = 5,        // sparse indices not strictly increasing (a = index, b = position)
  kBadPadding = 6,        // nonzero unused bits in the last packed byte
  kBadCode = 7,           // a code no encoder writes (e.g. a level > s)  (a = value, b = position)
  kBadScale = 8,          // a scale no encoder writes (negative, or NaN with nonzero codes) (b = bucket)
};

const char* payload_fault_name(PayloadFault fault) noexcept;

struct DeviceStatus {
  uint32_t fault;  // PayloadFault; 0 = clean
  uint32_t pad;
  int64_t a, b;    // details, meaning per fault (see PayloadFault)
};

#if defined(__CUDACC__)
// Records `fault` unless an earlier one is already recorded. Details of the winning
// fault are written by the thread that won the CAS; a reader (the host, after the
// stream synchronizes) sees a consistent record.
__device__ inline void report_status(DeviceStatus* s, PayloadFault fault, int64_t a = 0, int64_t b = 0) {
  if (atomicCAS(&s->fault, 0u, static_cast<uint32_t>(fault)) == 0u) {
    s->a = a;
    s->b = b;
  }
}
// True when an earlier kernel on the stream found a fault: writing kernels bail out.
__device__ inline bool status_failed(const DeviceStatus* s) {
  return *reinterpret_cast<const volatile uint32_t*>(&s->fault) != 0u;
}
#endif

// Owns one DeviceStatus in device memory and a pinned mirror for reading it back.
class StatusBuffer {
 public:
  StatusBuffer();
  DeviceStatus* device() const noexcept { return device_.as<DeviceStatus>(); }
  // Enqueues clearing the word on `stream` (no synchronization).
  void reset(cudaStream_t stream);
  // Enqueues a copy of the word to the pinned mirror, synchronizes `stream`, and
  // throws CorruptPayload("<context>: <fault name> (details)") when it is set.
  // CudaError for an asynchronous fault on the stream.
  void check(cudaStream_t stream, const std::string& context);
  // Like check() but returns the record instead of throwing (tests).
  DeviceStatus read(cudaStream_t stream);

 private:
  DeviceBuffer device_;
  PinnedBuffer host_;
};

}  // namespace gradcomm::detail
