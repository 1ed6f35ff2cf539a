// Sparse payloads on the GPU (gpu_sparse.h: gpu_encode_sparse, gpu_decode_add_sparse)
// and the small gather / scatter / fold kernels the sparse compressors share. The
// byte layout is FORMAT.md's "Sparse payload" (sparse_code.h's sparse_layout), the
// same bytes sparse_payload.cc writes; the per-thread steps are sparse_code_kernels.h's,
// which a host test runs against the CPU codec.
//
// Encoding is two kernels: check the selection (what encode_sparse refuses), then one
// grid-stride kernel that writes header, values and indices; raw indices one per thread,
// coded sections one 32-bit output word per thread, so every byte is written once, with
// no atomics and no fill (sparse_code_kernels.h). The count is on the device, so the
// layout is computed there; the launcher sizes the grid by the capacity.
//
// Decoding runs on the caller's stream, every kernel a no-op once the DeviceStatus
// word holds a fault:
//   header   (one thread)  magic, version, id, numel, flags (the expected format),
//                          count vs length, padding of the coded sections
//   coded only: popcount per 64-bit high word, CUB exclusive scan, emit (each word's
//            thread writes its indices to scratch; the last checks the total)
//   indices  (count threads) index < n, above its predecessor
//   apply    (count threads) out[index] += value; indices are unique within a payload,
//            so plain read-modify-writes, no atomics, and payloads applied one after
//            another in rank order give the same bits on every rank.
// Payloads sit wherever the allgather put them (any alignment): values are read with
// typed loads when the payload is 8-byte aligned, raw indices when their section is
// also aligned for their width (after an odd count of 16-bit values it is not), byte
// loads otherwise.
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "compressors/sparse/sparse.h"
#include "compressors/payload.h"
#include "compressors/sparse/gpu_sparse.h"
#include "compressors/sparse/sparse_code.h"
#include "compressors/sparse/sparse_code_kernels.h"
#include "cuda/check.h"
#include "cuda/grid.cuh"
#include "cuda/device.h"
#include "cuda/device_status.h"
#include "gradcomm/errors.h"
#include "half.h"

namespace gradcomm::detail {
namespace {

namespace sk = sparse_kernels;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

static_assert(static_cast<uint32_t>(sk::SparseFault::kBadHeader) == static_cast<uint32_t>(PayloadFault::kBadHeader));
static_assert(static_cast<uint32_t>(sk::SparseFault::kBadNumel) == static_cast<uint32_t>(PayloadFault::kBadNumel));
static_assert(static_cast<uint32_t>(sk::SparseFault::kBadLength) == static_cast<uint32_t>(PayloadFault::kBadLength));
static_assert(static_cast<uint32_t>(sk::SparseFault::kIndexOutOfRange) ==
              static_cast<uint32_t>(PayloadFault::kIndexOutOfRange));
static_assert(static_cast<uint32_t>(sk::SparseFault::kIndexOrder) == static_cast<uint32_t>(PayloadFault::kIndexOrder));
static_assert(static_cast<uint32_t>(sk::SparseFault::kBadPadding) == static_cast<uint32_t>(PayloadFault::kBadPadding));
static_assert(static_cast<uint32_t>(sk::SparseFault::kBadCode) == static_cast<uint32_t>(PayloadFault::kBadCode));

__device__ __forceinline__ void report(DeviceStatus* status, const sk::SparseFaultRecord& r) {
  if (r.fault != sk::SparseFault::kNone) report_status(status, static_cast<PayloadFault>(r.fault), r.a, r.b);
}

// A payload whose header passed check_header_kernel: its count and layout.
struct Parsed {
  uint64_t count;
  SparseLayout lay;
};
__device__ __forceinline__ Parsed parse(const uint8_t* p, uint64_t n, ValueType values, bool coded) {
  const uint64_t count = sk::header_count(p);
  return {count, sparse_layout(n, count, values, coded)};
}

// Value j (aligned: the payload is 8-byte aligned, so every value is aligned for its type).
template <bool Aligned>
__device__ __forceinline__ float load_value(const uint8_t* p, const SparseLayout& lay, uint64_t j, ValueType t) {
  const uint8_t* at = p + lay.values_offset + j * lay.value_bytes;
  uint32_t bits;
  if constexpr (Aligned) {
    bits = lay.value_bytes == 4 ? *reinterpret_cast<const uint32_t*>(at) : *reinterpret_cast<const uint16_t*>(at);
  } else {
    bits = static_cast<uint32_t>(sk::load_le(at, lay.value_bytes));
  }
  return sk::value_from_bits(bits, t);
}

// Raw index j: a typed load when the payload and the index section are aligned.
template <bool Aligned>
__device__ __forceinline__ uint64_t load_raw_index(const uint8_t* p, const SparseLayout& lay, uint64_t j) {
  const uint8_t* at = p + lay.indices_offset + j * lay.index_bytes;
  if (Aligned && lay.indices_offset % lay.index_bytes == 0) {
    return lay.index_bytes == 8 ? *reinterpret_cast<const uint64_t*>(at) : *reinterpret_cast<const uint32_t*>(at);
  }
  return sk::load_le(at, lay.index_bytes);
}

// Index j of a checked payload: raw from the payload, coded from the emit kernel's scratch.
template <bool Aligned>
__device__ __forceinline__ uint64_t load_index(const uint8_t* p, const SparseLayout& lay, const uint64_t* decoded,
                                               uint64_t j) {
  return decoded != nullptr ? decoded[j] : load_raw_index<Aligned>(p, lay, j);
}

// ---- decode ------------------------------------------------------------------------------
__global__ void __launch_bounds__(1) check_header_kernel(const uint8_t* p, uint64_t bytes, uint8_t id, uint64_t n,
                                                         ValueType values, bool coded, DeviceStatus* status) {
  if (status_failed(status)) return;
  report(status, sk::check_sparse_header(p, bytes, id, n, values, coded));
}

// counts[w] = one bits of high word w, for w < words_bound (0 past the section), so
// the scan over the host's bound reads only written words.
__global__ void ef_count_kernel(const uint8_t* p, uint64_t n, ValueType values, uint64_t words_bound,
                                uint64_t* counts, const DeviceStatus* status) {
  if (status_failed(status)) return;
  const Parsed h = parse(p, n, values, true);
  const uint64_t words = sk::ef_high_words(h.lay.ef);
  const uint8_t* high = p + h.lay.high_offset;
  for (int64_t w = first_thread(); static_cast<uint64_t>(w) < words_bound; w += thread_stride()) {
    const uint64_t wu = static_cast<uint64_t>(w);
    counts[w] = wu < words ? sk::popcount64(sk::ef_load_high_word(high, h.lay.ef.high_bytes, wu)) : 0;
  }
}

// Each high word's indices into decoded[0, count); the last word checks the total.
__global__ void ef_emit_kernel(const uint8_t* p, uint64_t n, ValueType values, uint64_t words_bound,
                               const uint64_t* counts, const uint64_t* ranks, uint64_t* decoded,
                               DeviceStatus* status) {
  if (status_failed(status)) return;
  const Parsed h = parse(p, n, values, true);
  const uint64_t all = sk::ef_high_words(h.lay.ef);
  const uint64_t words = all < words_bound ? all : words_bound;  // equal for a checked header
  const uint8_t* low = p + h.lay.indices_offset;
  const uint8_t* high = p + h.lay.high_offset;
  for (int64_t w = first_thread(); static_cast<uint64_t>(w) < words; w += thread_stride()) {
    const uint64_t wu = static_cast<uint64_t>(w);
    sk::ef_emit_word(sk::ef_load_high_word(high, h.lay.ef.high_bytes, wu), wu, ranks[w], low, h.lay.ef.low_bits,
                     h.count, decoded);
    if (wu + 1 == words) report(status, sk::ef_check_total(ranks[w] + counts[w], h.count));
  }
}

template <bool Aligned>
__global__ void check_indices_kernel(const uint8_t* p, uint64_t n, ValueType values, bool coded,
                                     const uint64_t* decoded, DeviceStatus* status) {
  if (status_failed(status)) return;
  const Parsed h = parse(p, n, values, coded);
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < h.count; j += thread_stride()) {
    const uint64_t ju = static_cast<uint64_t>(j);
    const uint64_t x = load_index<Aligned>(p, h.lay, decoded, ju);
    const uint64_t prev = j > 0 ? load_index<Aligned>(p, h.lay, decoded, ju - 1) : 0;
    report(status, sk::check_index(x, ju, prev, n));
  }
}

template <bool Aligned>
__global__ void apply_kernel(const uint8_t* p, uint64_t n, ValueType values, bool coded, const uint64_t* decoded,
                             float* out, const DeviceStatus* status) {
  if (status_failed(status)) return;  // set by this payload's checks or an earlier payload's
  const Parsed h = parse(p, n, values, coded);
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < h.count; j += thread_stride()) {
    const uint64_t ju = static_cast<uint64_t>(j);
    const uint64_t i = load_index<Aligned>(p, h.lay, decoded, ju);
    out[i] = __fadd_rn(out[i], load_value<Aligned>(p, h.lay, ju, values));
  }
}

template <bool Aligned>
void launch_decode(CompressorId id, const uint8_t* payload, size_t bytes, int64_t n, SparseFormat format, float* out,
                   GpuSparseWorkspace& ws, DeviceStatus* status, cudaStream_t stream) {
  const auto un = static_cast<uint64_t>(n);
  check_header_kernel<<<1, 1, 0, stream>>>(payload, bytes, static_cast<uint8_t>(id), un, format.values,
                                           format.coded, status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  // Grids and scratch for the largest count this length could hold: each entry takes
  // at least its value's bytes (and the header check bounds the real count the same way).
  const uint64_t body = bytes > PayloadHeader::kBytes ? bytes - PayloadHeader::kBytes : 0;
  const auto max_count = static_cast<int64_t>(std::min<uint64_t>(body / sparse_value_bytes(format.values), un));
  if (max_count == 0) return;  // nothing to check or apply (an empty payload has count 0)
  const unsigned grid = grid_for(max_count, kThreads, kBlocksPerSm);
  const uint64_t* decoded = nullptr;
  if (format.coded) {
    const auto words = static_cast<int64_t>(sk::ef_high_words_bound(static_cast<uint64_t>(max_count)));
    ws.decode_counts_.reserve(static_cast<size_t>(words) * sizeof(uint64_t));
    ws.decode_ranks_.reserve(static_cast<size_t>(words) * sizeof(uint64_t));
    ws.decode_indices_.reserve(static_cast<size_t>(max_count) * sizeof(uint64_t));
    auto* counts = ws.decode_counts_.as<uint64_t>();
    auto* ranks = ws.decode_ranks_.as<uint64_t>();
    size_t scan_bytes = 0;
    GRADCOMM_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, ranks, words, stream));
    ws.cub_temp_.reserve(std::max<size_t>(scan_bytes, 1));
    const unsigned word_grid = grid_for(words, kThreads, kBlocksPerSm);
    ef_count_kernel<<<word_grid, kThreads, 0, stream>>>(payload, un, format.values, static_cast<uint64_t>(words),
                                                        counts, status);
    GRADCOMM_CUDA_CHECK_LAUNCH();
    scan_bytes = ws.cub_temp_.size();
    GRADCOMM_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(ws.cub_temp_.data(), scan_bytes, counts, ranks, words, stream));
    ef_emit_kernel<<<word_grid, kThreads, 0, stream>>>(payload, un, format.values, static_cast<uint64_t>(words),
                                                       counts, ranks, ws.decode_indices_.as<uint64_t>(), status);
    GRADCOMM_CUDA_CHECK_LAUNCH();
    decoded = ws.decode_indices_.as<uint64_t>();
  }
  check_indices_kernel<Aligned><<<grid, kThreads, 0, stream>>>(payload, un, format.values, format.coded, decoded,
                                                               status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  apply_kernel<Aligned><<<grid, kThreads, 0, stream>>>(payload, un, format.values, format.coded, decoded, out,
                                                       status);
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
    const uint64_t ju = static_cast<uint64_t>(j);
    report(status, sk::check_index(indices[j], ju, j > 0 ? indices[j - 1] : 0, n));
  }
}

// `out` is 8-byte aligned (checked by the launcher), so values and the header are
// aligned; raw indices are when their section is, coded sections go byte by byte.
__global__ void encode_kernel(uint8_t id, uint64_t n, const uint64_t* indices, const float* values,
                              const uint64_t* count, ValueType type, bool coded, uint8_t* out, uint64_t* out_bytes,
                              const DeviceStatus* status) {
  if (status_failed(status)) return;
  const uint64_t c = *count;
  const SparseLayout lay = sparse_layout(n, c, type, coded);
  if (first_thread() == 0) {
    sk::write_sparse_header(out, id, n, c, type, coded);
    if (out_bytes != nullptr) *out_bytes = lay.total;
  }
  uint8_t* val = out + lay.values_offset;
  uint8_t* idx = out + lay.indices_offset;
  const bool raw_aligned = lay.indices_offset % lay.index_bytes == 0;
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < c; j += thread_stride()) {
    const uint32_t bits = sk::value_bits(values[j], type);
    if (lay.value_bytes == 4) {
      reinterpret_cast<uint32_t*>(val)[j] = bits;
    } else {
      reinterpret_cast<uint16_t*>(val)[j] = static_cast<uint16_t>(bits);
    }
    if (coded) continue;
    if (!raw_aligned) {
      sk::store_le(idx + j * lay.index_bytes, indices[j], lay.index_bytes);
    } else if (lay.index_bytes == 8) {
      reinterpret_cast<uint64_t*>(idx)[j] = indices[j];
    } else {
      reinterpret_cast<uint32_t*>(idx)[j] = static_cast<uint32_t>(indices[j]);
    }
  }
  if (!coded) return;
  const unsigned L = lay.ef.low_bits;
  const uint64_t low_words = sk::section_words(lay.ef.low_bytes);  // 0 when L = 0
  for (int64_t w = first_thread(); static_cast<uint64_t>(w) < low_words; w += thread_stride()) {
    const uint64_t wu = static_cast<uint64_t>(w);
    sk::store_section_word(idx, lay.ef.low_bytes, wu, sk::ef_low_word(indices, c, L, wu));
  }
  uint8_t* high = out + lay.high_offset;
  const uint64_t high_words = sk::section_words(lay.ef.high_bytes);
  for (int64_t w = first_thread(); static_cast<uint64_t>(w) < high_words; w += thread_stride()) {
    const uint64_t wu = static_cast<uint64_t>(w);
    sk::store_section_word(high, lay.ef.high_bytes, wu, sk::ef_high_word(indices, c, L, wu));
  }
}

// ---- gather / scatter / fold -------------------------------------------------------------
__device__ __forceinline__ uint64_t bounded_count(const uint64_t* count, int64_t capacity) {
  const uint64_t c = *count;
  return c < static_cast<uint64_t>(capacity) ? c : static_cast<uint64_t>(capacity);
}

__global__ void gather_kernel(const float* acc, const uint64_t* indices, const uint64_t* count, int64_t capacity,
                              float* values, float* residual, ValueType type) {
  const uint64_t c = bounded_count(count, capacity);
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < c; j += thread_stride()) {
    const uint64_t i = indices[j];
    const float x = acc[i];
    values[j] = x;
    // The same thread read acc[i] first (residual may be acc).
    if (residual != nullptr) residual[i] = sparse_rounding_residual(x, sparse_round(x, type));
  }
}

__global__ void scatter_kernel(float* out, const uint64_t* indices, const float* values, const uint64_t* count,
                               int64_t capacity) {
  const uint64_t c = bounded_count(count, capacity);
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < c; j += thread_stride()) out[indices[j]] = values[j];
}

// DGC's momentum mask: 1 everywhere, then 0 at the selection (two kernels on one
// stream: the second sees the first's writes).
__global__ void fill_one_kernel(float* mask, int64_t n) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) mask[i] = 1.0f;
}
__global__ void clear_at_kernel(float* mask, const uint64_t* indices, const uint64_t* count, int64_t capacity) {
  const uint64_t c = bounded_count(count, capacity);
  for (int64_t j = first_thread(); static_cast<uint64_t>(j) < c; j += thread_stride()) mask[indices[j]] = 0.0f;
}

__global__ void fold_kernel(const float* grad, float* residual, int64_t n) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) residual[i] = __fadd_rn(grad[i], residual[i]);
}

}  // namespace

void gpu_encode_sparse(CompressorId id, int64_t n, const uint64_t* indices, const float* values, const uint64_t* count,
                       int64_t capacity, SparseFormat format, uint8_t* out, uint64_t* out_bytes, DeviceStatus* status,
                       cudaStream_t stream) {
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
  // A thread per entry (grid-stride loops take the coded sections' words, and any
  // entries beyond a full GPU).
  const unsigned grid = grid_for(std::max<int64_t>(capacity, 1), kThreads, kBlocksPerSm);
  check_selection_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint64_t>(n), indices, count, capacity, status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  encode_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint8_t>(id), static_cast<uint64_t>(n), indices, values,
                                               count, format.values, format.coded, out, out_bytes, status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void gpu_decode_add_sparse(CompressorId id, const uint8_t* payload, size_t payload_bytes, int64_t n,
                           SparseFormat format, float* out, GpuSparseWorkspace& ws, DeviceStatus* status,
                           cudaStream_t stream) {
  if (n < 0) throw_invalid("gpu_decode_add_sparse: numel ", n, " < 0");
  if (status == nullptr) throw_invalid("gpu_decode_add_sparse: status is null");
  if (payload == nullptr && payload_bytes > 0) throw_invalid("gpu_decode_add_sparse: payload is null with ", payload_bytes, " bytes");
  if (out == nullptr && n > 0) throw_invalid("gpu_decode_add_sparse: out is null with numel ", n);
  // (Zero bytes is a truncated header, reported on the device like any other fault.)
  if (reinterpret_cast<uintptr_t>(payload) % 8 == 0) {
    launch_decode<true>(id, payload, payload_bytes, n, format, out, ws, status, stream);
  } else {
    launch_decode<false>(id, payload, payload_bytes, n, format, out, ws, status, stream);
  }
}

void gpu_gather(const float* acc, const uint64_t* indices, const uint64_t* count, int64_t capacity, float* values,
                float* residual, ValueType type, cudaStream_t stream) {
  if (capacity <= 0) return;
  gather_kernel<<<grid_for(capacity, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(acc, indices, count, capacity,
                                                                                     values, residual, type);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void gpu_scatter(float* out, const uint64_t* indices, const float* values, const uint64_t* count, int64_t capacity,
                 cudaStream_t stream) {
  if (capacity <= 0) return;
  scatter_kernel<<<grid_for(capacity, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(out, indices, values, count, capacity);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void gpu_sent_mask(float* mask, int64_t n, const uint64_t* indices, const uint64_t* count, int64_t capacity,
                   cudaStream_t stream) {
  if (n <= 0) return;
  fill_one_kernel<<<grid_for(n, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(mask, n);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  if (capacity <= 0) return;
  clear_at_kernel<<<grid_for(capacity, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(mask, indices, count, capacity);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void gpu_fold_residual(const float* grad, float* residual, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  fold_kernel<<<grid_for(n, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(grad, residual, n);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

}  // namespace gradcomm::detail
