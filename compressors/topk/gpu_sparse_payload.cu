// Sparse payloads on the GPU (gpu_sparse.h: gpu_encode_sparse, gpu_decode_add_sparse)
// and the small gather / scatter / fold kernels the sparse compressors share. The
// byte layout is FORMAT.md's "Sparse payload", the same as sparse_payload.cc writes.
//
// Decoding is three kernels on the caller's stream, each a no-op once the
// DeviceStatus word holds a fault:
//   header   (one thread)  magic, version, id, numel, flags, count vs length
//   indices  (count threads) index < n, above its predecessor
//   apply    (count threads) out[index] += value; indices are unique within a payload,
//            so plain read-modify-writes, no atomics, and payloads applied one after
//            another in rank order give the same bits on every rank.
// Payloads sit wherever the allgather put them (any alignment): the kernels read
// through byte loads unless the payload is 8-byte aligned.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "compressors/payload.h"
#include "compressors/topk/gpu_sparse.h"
#include "cuda/check.h"
#include "cuda/grid.cuh"
#include "cuda/device.h"
#include "cuda/device_status.h"
#include "gradcomm/errors.h"
#include "half.h"

namespace gradcomm::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;
constexpr uint16_t kFlagU64Indices = 1u << 0;
constexpr uint16_t kFlagFp16Values = 1u << 1;
constexpr uint16_t kKnownFlags = kFlagU64Indices | kFlagFp16Values;
constexpr uint64_t kU32Limit = uint64_t{1} << 32;

// Little-endian load of a T at p: one typed load when the payload is aligned
// (Aligned: payload 8-byte aligned, and every field sits at a multiple of its
// size from the payload start), byte loads otherwise.
template <class T, bool Aligned>
__device__ __forceinline__ T load_le(const uint8_t* p) {
  if constexpr (Aligned) {
    return *reinterpret_cast<const T*>(p);
  } else {
    uint64_t v = 0;
#pragma unroll
    for (int b = 0; b < static_cast<int>(sizeof(T)); ++b) v |= static_cast<uint64_t>(p[b]) << (8 * b);
    T out;
    memcpy(&out, &v, sizeof out);
    return out;
  }
}

template <bool Aligned>
__device__ __forceinline__ uint64_t load_index(const uint8_t* p, bool wide) {
  return wide ? load_le<uint64_t, Aligned>(p) : load_le<uint32_t, Aligned>(p);
}

// ---- decode ------------------------------------------------------------------------------
template <bool Aligned>
__global__ void __launch_bounds__(1) check_header_kernel(const uint8_t* p, uint64_t bytes, uint8_t id, uint64_t n,
                                                         DeviceStatus* status) {
  if (status_failed(status)) return;
  if (bytes < PayloadHeader::kBytes) {
    report_status(status, PayloadFault::kBadLength, static_cast<int64_t>(bytes), PayloadHeader::kBytes);
    return;
  }
  const uint32_t magic = load_le<uint32_t, Aligned>(p);
  if (magic != PayloadHeader::kMagic || p[4] != PayloadHeader::kVersion || p[5] != id) {
    report_status(status, PayloadFault::kBadHeader, magic, p[5]);
    return;
  }
  const uint64_t numel = load_le<uint64_t, Aligned>(p + 8);
  if (numel != n) {
    report_status(status, PayloadFault::kBadNumel, static_cast<int64_t>(numel), static_cast<int64_t>(n));
    return;
  }
  const uint16_t flags = load_le<uint16_t, Aligned>(p + 6);
  const bool u64_flag = (flags & kFlagU64Indices) != 0;
  if ((flags & ~kKnownFlags) != 0 || u64_flag != (n >= kU32Limit)) {
    report_status(status, PayloadFault::kBadHeader, flags, n >= kU32Limit ? kFlagU64Indices : 0);
    return;
  }
  const uint64_t count =
      static_cast<uint64_t>(load_le<uint32_t, Aligned>(p + 16)) | (static_cast<uint64_t>(load_le<uint32_t, Aligned>(p + 20)) << 32);
  const uint64_t per = (u64_flag ? 8u : 4u) + ((flags & kFlagFp16Values) != 0 ? 2u : 4u);
  const uint64_t body = bytes - PayloadHeader::kBytes;
  // Divide rather than multiply: a count of 2^63 must not wrap.
  if (count > n || count > body / per || count * per != body) {
    report_status(status, PayloadFault::kBadLength, static_cast<int64_t>(body),
                  count <= body / per ? static_cast<int64_t>(count * per) : -1);
  }
}

// After a clean header: the header's count and widths are trustworthy. `max_count`
// (from the length, host side) only sizes the grid.
template <bool Aligned>
__global__ void check_indices_kernel(const uint8_t* p, uint64_t n, DeviceStatus* status) {
  if (status_failed(status)) return;
  const bool wide = n >= kU32Limit;
  const uint64_t count =
      static_cast<uint64_t>(load_le<uint32_t, Aligned>(p + 16)) | (static_cast<uint64_t>(load_le<uint32_t, Aligned>(p + 20)) << 32);
  const uint8_t* idx = p + PayloadHeader::kBytes;
  const int w = wide ? 8 : 4;
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < count; j += thread_stride()) {
    const uint64_t i = load_index<Aligned>(idx + j * w, wide);
    if (i >= n) {
      report_status(status, PayloadFault::kIndexOutOfRange, static_cast<int64_t>(i), j);
    } else if (j > 0 && i <= load_index<Aligned>(idx + (j - 1) * w, wide)) {
      report_status(status, PayloadFault::kIndexOrder, static_cast<int64_t>(i), j);
    }
  }
}

template <bool Aligned>
__global__ void apply_kernel(const uint8_t* p, uint64_t n, float* out, const DeviceStatus* status) {
  if (status_failed(status)) return;  // set by this payload's checks or an earlier payload's
  const bool wide = n >= kU32Limit;
  const uint16_t flags = load_le<uint16_t, Aligned>(p + 6);
  const bool fp16 = (flags & kFlagFp16Values) != 0;
  const uint64_t count =
      static_cast<uint64_t>(load_le<uint32_t, Aligned>(p + 16)) | (static_cast<uint64_t>(load_le<uint32_t, Aligned>(p + 20)) << 32);
  const int w = wide ? 8 : 4;
  const uint8_t* idx = p + PayloadHeader::kBytes;
  const uint8_t* val = idx + count * w;
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < count; j += thread_stride()) {
    const uint64_t i = load_index<Aligned>(idx + j * w, wide);
    const float v = fp16 ? half_to_float(load_le<uint16_t, Aligned>(val + j * 2)) : load_le<float, Aligned>(val + j * 4);
    out[i] = __fadd_rn(out[i], v);
  }
}

template <bool Aligned>
void launch_decode(CompressorId id, const uint8_t* payload, size_t bytes, int64_t n, float* out, DeviceStatus* status,
                   cudaStream_t stream) {
  const auto un = static_cast<uint64_t>(n);
  check_header_kernel<Aligned><<<1, 1, 0, stream>>>(payload, bytes, static_cast<uint8_t>(id), un, status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  // Grid for the largest count this length could hold (smallest entry: u32 + fp16).
  const int64_t max_count = bytes > PayloadHeader::kBytes
                                ? static_cast<int64_t>((bytes - PayloadHeader::kBytes) / ((un >= kU32Limit ? 8 : 4) + 2))
                                : 0;
  if (max_count == 0) return;  // nothing to check or apply (an empty payload has count 0)
  const unsigned grid = grid_for(max_count, kThreads, kBlocksPerSm);
  check_indices_kernel<Aligned><<<grid, kThreads, 0, stream>>>(payload, un, status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  apply_kernel<Aligned><<<grid, kThreads, 0, stream>>>(payload, un, out, status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

// ---- encode ------------------------------------------------------------------------------
__global__ void check_selection_kernel(uint64_t n, const uint64_t* indices, const uint64_t* count, int64_t capacity,
                                       DeviceStatus* status) {
  const uint64_t c = *count;
  if (c > static_cast<uint64_t>(capacity)) {
    if (first_thread() == 0) report_status(status, PayloadFault::kBadLength, static_cast<int64_t>(c), capacity);
    return;
  }
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < c; j += thread_stride()) {
    const uint64_t i = indices[j];
    if (i >= n) {
      report_status(status, PayloadFault::kIndexOutOfRange, static_cast<int64_t>(i), j);
    } else if (j > 0 && i <= indices[j - 1]) {
      report_status(status, PayloadFault::kIndexOrder, static_cast<int64_t>(i), j);
    }
  }
}

// `out` is 8-byte aligned (checked by the launcher), so every field is aligned.
__global__ void encode_kernel(uint8_t id, uint64_t n, const uint64_t* indices, const float* values,
                              const uint64_t* count, bool fp16, uint8_t* out, uint64_t* out_bytes,
                              const DeviceStatus* status) {
  if (status_failed(status)) return;
  const uint64_t c = *count;
  const bool wide = n >= kU32Limit;
  const int w = wide ? 8 : 4;
  if (first_thread() == 0) {
    *reinterpret_cast<uint32_t*>(out) = PayloadHeader::kMagic;
    out[4] = PayloadHeader::kVersion;
    out[5] = id;
    *reinterpret_cast<uint16_t*>(out + 6) = static_cast<uint16_t>((wide ? kFlagU64Indices : 0) | (fp16 ? kFlagFp16Values : 0));
    *reinterpret_cast<uint64_t*>(out + 8) = n;
    *reinterpret_cast<uint32_t*>(out + 16) = static_cast<uint32_t>(c);
    *reinterpret_cast<uint32_t*>(out + 20) = static_cast<uint32_t>(c >> 32);
    if (out_bytes != nullptr) *out_bytes = PayloadHeader::kBytes + c * (w + (fp16 ? 2 : 4));
  }
  uint8_t* idx = out + PayloadHeader::kBytes;
  uint8_t* val = idx + c * w;
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < c; j += thread_stride()) {
    if (wide) {
      reinterpret_cast<uint64_t*>(idx)[j] = indices[j];
    } else {
      reinterpret_cast<uint32_t*>(idx)[j] = static_cast<uint32_t>(indices[j]);
    }
    if (fp16) {
      reinterpret_cast<uint16_t*>(val)[j] = float_to_half(values[j]);
    } else {
      reinterpret_cast<float*>(val)[j] = values[j];
    }
  }
}

// ---- gather / scatter / fold -------------------------------------------------------------
__device__ __forceinline__ uint64_t bounded_count(const uint64_t* count, int64_t capacity) {
  const uint64_t c = *count;
  return c < static_cast<uint64_t>(capacity) ? c : static_cast<uint64_t>(capacity);
}

__global__ void gather_kernel(const float* acc, const uint64_t* indices, const uint64_t* count, int64_t capacity,
                              float* values, float* zero_in) {
  const uint64_t c = bounded_count(count, capacity);
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < c; j += thread_stride()) {
    const uint64_t i = indices[j];
    values[j] = acc[i];
    if (zero_in != nullptr) zero_in[i] = 0.0f;  // same thread read acc[i] first (zero_in may be acc)
  }
}

__global__ void scatter_kernel(float* out, const uint64_t* indices, const float* values, const uint64_t* count,
                               int64_t capacity) {
  const uint64_t c = bounded_count(count, capacity);
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < c; j += thread_stride()) out[indices[j]] = values[j];
}

__global__ void fold_kernel(const float* grad, float* residual, int64_t n) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) residual[i] = __fadd_rn(grad[i], residual[i]);
}

}  // namespace

size_t sparse_payload_bytes(int64_t n, int64_t count, ValueType values) {
  const size_t w = static_cast<uint64_t>(n) >= kU32Limit ? 8 : 4;
  return PayloadHeader::kBytes + static_cast<size_t>(count) * (w + (values == ValueType::kFp16 ? 2 : 4));
}

void gpu_encode_sparse(CompressorId id, int64_t n, const uint64_t* indices, const float* values, const uint64_t* count,
                       int64_t capacity, ValueType values_type, uint8_t* out, uint64_t* out_bytes,
                       DeviceStatus* status, cudaStream_t stream) {
  if (n < 0 || capacity < 0) throw_invalid("gpu_encode_sparse: numel ", n, " and capacity ", capacity, " must be >= 0");
  if (count == nullptr || out == nullptr || status == nullptr) {
    throw_invalid("gpu_encode_sparse: count, out and status must be device pointers, got ", count, ", ",
                  static_cast<const void*>(out), ", ", status);
  }
  if (capacity > 0 && (indices == nullptr || values == nullptr)) {
    throw_invalid("gpu_encode_sparse: indices/values are null with capacity ", capacity);
  }
  if (reinterpret_cast<uintptr_t>(out) % 8 != 0) {
    throw_invalid("gpu_encode_sparse: out = ", static_cast<const void*>(out), " is not 8-byte aligned");
  }
  const unsigned grid = grid_for(std::max<int64_t>(capacity, 1), kThreads, kBlocksPerSm);
  check_selection_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint64_t>(n), indices, count, capacity, status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  encode_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint8_t>(id), static_cast<uint64_t>(n), indices, values,
                                               count, values_type == ValueType::kFp16, out, out_bytes, status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void gpu_decode_add_sparse(CompressorId id, const uint8_t* payload, size_t payload_bytes, int64_t n, float* out,
                           DeviceStatus* status, cudaStream_t stream) {
  if (n < 0) throw_invalid("gpu_decode_add_sparse: numel ", n, " < 0");
  if (status == nullptr) throw_invalid("gpu_decode_add_sparse: status is null");
  if (payload == nullptr && payload_bytes > 0) throw_invalid("gpu_decode_add_sparse: payload is null with ", payload_bytes, " bytes");
  if (out == nullptr && n > 0) throw_invalid("gpu_decode_add_sparse: out is null with numel ", n);
  // (Zero bytes is a truncated header, reported on the device like any other fault.)
  if (reinterpret_cast<uintptr_t>(payload) % 8 == 0) {
    launch_decode<true>(id, payload, payload_bytes, n, out, status, stream);
  } else {
    launch_decode<false>(id, payload, payload_bytes, n, out, status, stream);
  }
}

void gpu_gather(const float* acc, const uint64_t* indices, const uint64_t* count, int64_t capacity, float* values,
                float* zero_in, cudaStream_t stream) {
  if (capacity <= 0) return;
  gather_kernel<<<grid_for(capacity, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(acc, indices, count, capacity, values, zero_in);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void gpu_scatter(float* out, const uint64_t* indices, const float* values, const uint64_t* count, int64_t capacity,
                 cudaStream_t stream) {
  if (capacity <= 0) return;
  scatter_kernel<<<grid_for(capacity, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(out, indices, values, count, capacity);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void gpu_fold_residual(const float* grad, float* residual, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  fold_kernel<<<grid_for(n, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(grad, residual, n);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

}  // namespace gradcomm::detail
