// The CUDA side of the sparse shape (sparse.h): the per-key workspace, selection by
// magnitude, the payload's encode and decode-add, gather and scatter, and the calls a
// family provides (GpuSparseOps): host-callable, stream-ordered functions on device
// pointers, producing the same selections and payload bytes as the CPU reference. Host-only header
// (cuda_runtime_api.h, no device code), so .cc files can call it.
//
// Every function enqueues work on `stream` and returns without synchronizing; the
// only exception is GpuSparseWorkspace::read_count (documented there). Results that
// depend on the data (how many elements a select=sample selection kept) stay on the
// device: later kernels read them from there, the host learns them when it needs a
// size (read_count), and bounds known in advance (capacity()) size every buffer.
//
// Error feedback is fused: with `residual` given, a call computes acc = grad +
// residual into `residual` while it reads the data anyway, and leaves residual = acc
// except at the transmitted indices, where it keeps what the value type's rounding
// dropped: sparse_rounding_residual(x, sparse_round(x, type)) (sparse_code.h; 0 for
// fp32), src/compression.cc's rule. `grad` is then only read. Without a residual, acc
// is `grad` itself.
//
// Workspaces: one GpuSparseWorkspace per key (per tensor), kept by the caller. Its
// buffers only grow, so once a key has run at its size nothing is allocated.
// (CudaMemory::reserve frees and reallocates, which synchronizes the device: the
// first call of a key at a new size is not asynchronous.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "compressors/philox.h"
#include "compressors/sparse/sparse.h"  // SparseFormat, sparse_payload_bytes, SparseTable
#include "cuda/buffer.h"
#include "cuda/device_status.h"

namespace gradcomm::detail {

// Scratch and results of the sparse GPU calls for one key. The members are the
// .cu files' business; callers use the accessors. Not thread-safe; one stream at
// a time (a call's results are valid on its stream after it, until the next call).
class GpuSparseWorkspace {
 public:
  // The last selection (gpu_topk_select, gpu_randomk_indices, GpuCountSketch::recover):
  // indices()[0, count) strictly increasing, values()[0, count) the accumulator at
  // them (topk only; randomk and recover leave values() unset: use gpu_gather).
  const uint64_t* indices() const { return indices_.as<uint64_t>(); }
  const float* values() const { return values_.as<float>(); }
  // Device word holding the selection's size; at most capacity().
  const uint64_t* count() const;
  // Host bound on count(): min(k, n) for exact top-k, random-k and recover;
  // min(2k, n) for select=sample (FORMAT.md's count bounds).
  int64_t capacity() const { return capacity_; }
  // Copies count() to the host: synchronizes `stream` (a D2H copy of 8 bytes).
  int64_t read_count(cudaStream_t stream);

  // ---- internals (gpu_topk.cu, gpu_randomk.cu, gpu_sketch.cu) ----------------------
  DeviceBuffer state_;        // two SelectState records (radix progress, flags, count)
  DeviceBuffer hist_;         // 2048 x u64 histogram, zero between passes
  DeviceBuffer candidates_;   // keys of the bucket chosen by radix pass 0 (when small)
  DeviceBuffer tiles_;        // per-tile (greater, equal) counts of the compaction
  DeviceBuffer tile_offsets_; // their exclusive scan
  DeviceBuffer cub_temp_;     // CUB's temporary storage (scan, radix sort)
  DeviceBuffer indices_;      // capacity x u64
  DeviceBuffer values_;       // capacity x f32
  DeviceBuffer sample_keys_;  // select=sample: m keys
  DeviceBuffer estimate_;     // sketch: n estimates
  DeviceBuffer draws_, draws_sorted_, order_, order_sorted_, dup_, rejected_;  // random-k
  DeviceBuffer decode_counts_, decode_ranks_;  // coded decode: one bits per 64-bit high word, their scan
  DeviceBuffer decode_indices_;                // coded decode: the payload's indices
  PinnedBuffer host_count_;
  int64_t capacity_ = 0;
  int64_t candidate_capacity_ = 0;
};

// ---- top-k ----------------------------------------------------------------------------
// topk_select() on the GPU: acc = grad (+ residual), n >= 0, k >= 0. The selection
// (indices and fp32 values) is exactly the CPU's for the same acc bits, mode and
// stream: exact = the k largest magnitude keys, ties to the lower index (radix select
// over 11/11/10-bit digits, then a stable tile compaction); sample = the CPU's DGC
// threshold from the same Philox sample, every key >= it, and the same fallback to
// exact outside [max(1, k/2), min(2k, n)] (decided on the device, no sync).
// With a residual: residual = acc afterwards, except at the selected indices, where
// it is the rounding that sending the value as `values` drops (0 for fp32).
void gpu_topk_select(const float* grad, float* residual, int64_t n, int64_t k, TopkSelect select,
                     const PhiloxStream& rng, ValueType values, GpuSparseWorkspace& ws, cudaStream_t stream);

// ---- sparse payload (FORMAT.md, "Sparse payload") -------------------------------------
// Sizes: sparse_payload_bytes(n, count, format) (sparse.h), shared with the CPU codec; it
// grows with count, so the size at the capacity bounds every selection's payload.

// encode_sparse() on the GPU. Writes the payload of the selection (indices, values,
// *count <= capacity, all on the device) in `format` to `out` (8-byte aligned, at
// least sparse_payload_bytes(n, capacity, format) bytes) and its size to *out_bytes
// (device u64, may be null). Validates first, as encode_sparse refuses: an index >= n,
// indices not increasing or *count > capacity record the fault in `status`
// (kIndexOutOfRange, kIndexOrder, kBadLength) and nothing is written. Byte-identical to
// encode_sparse, padding included; no byte of `out` needs to be initialised.
void gpu_encode_sparse(CompressorId id, int64_t n, const uint64_t* indices, const float* values,
                       const uint64_t* count, int64_t capacity, SparseFormat format, uint8_t* out,
                       uint64_t* out_bytes, DeviceStatus* status, cudaStream_t stream);

// decode_add_sparse() on the GPU: out[indices[j]] += values[j] for the payload's
// entries. `payload` (device, any alignment) holds `payload_bytes` bytes from an
// untrusted peer, expected in `format` (the flags must say exactly that format, as the
// spec every rank agreed on writes). Checked on the device first, as validate_sparse
// checks: header, flags, count, length; raw indices < n and strictly increasing;
// coded indices: zero padding in both sections, exactly count one bits in the high
// section, every decoded index < n and strictly increasing. A bad payload records its
// fault in `status` (kBadHeader, kBadNumel, kBadLength, kBadPadding, kBadCode for the
// one bits, kIndexOutOfRange, kIndexOrder) and writes nothing. A payload is also
// skipped when `status` already holds a fault, so a batch (payloads decoded in rank
// order on one stream, deterministic: indices within a payload are unique, so no
// atomics) stops at the first bad one. Coded payloads decode through `ws`'s scratch
// (about 8 bytes per entry the length could hold; grow-only), not its selection.
void gpu_decode_add_sparse(CompressorId id, const uint8_t* payload, size_t payload_bytes, int64_t n,
                           SparseFormat format, float* out, GpuSparseWorkspace& ws, DeviceStatus* status,
                           cudaStream_t stream);

// ---- gather / scatter / error feedback --------------------------------------------------
// values[j] = x = acc[indices[j]] for j < *count; when `residual` is given (error
// feedback, residual == acc), residual[indices[j]] = what sending x as `type` drops,
// sparse_rounding_residual(x, sparse_round(x, type)), afterwards (0 for fp32).
void gpu_gather(const float* acc, const uint64_t* indices, const uint64_t* count, int64_t capacity, float* values,
                float* residual, ValueType type, cudaStream_t stream);
// out[indices[j]] = values[j] for j < *count (the caller zero-fills out first).
void gpu_scatter(float* out, const uint64_t* indices, const float* values, const uint64_t* count, int64_t capacity,
                 cudaStream_t stream);
// DGC's momentum mask of a selection: mask[i] = 0 at indices[0, *count), 1 elsewhere
// (n floats; indices < n, as every selection above leaves them).
void gpu_sent_mask(float* mask, int64_t n, const uint64_t* indices, const uint64_t* count, int64_t capacity,
                   cudaStream_t stream);
// residual[i] = grad[i] + residual[i]: acc, for the compressors whose selection does
// not read the data (random-k).
void gpu_fold_residual(const float* grad, float* residual, int64_t n, cudaStream_t stream);

// ---- a family's calls ------------------------------------------------------------------
// SparseOps (sparse.h) on a GPU, stream-ordered, with the selection in `ws` (indices(),
// count(); values() for own selections). Each family fills the calls of its Collective.
struct GpuSparseOps {
  // kSparseSelection: SparseOps::select's selection of acc = data (+ residual), into ws;
  // with a residual, residual = acc afterwards but at the selection, where it keeps the
  // rounding that sending the value as spec.values drops. `data` is only read.
  void (*select)(const CompressorSpec& spec, const float* data, float* residual, int64_t n, int64_t count,
                 const PhiloxStream& rng, GpuSparseWorkspace& ws, cudaStream_t stream) = nullptr;
  // kSharedIndices: SparseOps::draw's indices, into ws.indices() (count = min(count, n)).
  void (*draw)(const CompressorSpec& spec, int64_t n, int64_t count, const PhiloxStream& rng, GpuSparseWorkspace& ws,
               cudaStream_t stream) = nullptr;
  // kTableThenValues: cells += the table of acc = data (+ residual: residual = acc
  // afterwards, fused into the pass); then the `count` indices the summed cells recover,
  // into ws.indices().
  void (*accumulate)(const CompressorSpec& spec, SparseTable table, const PhiloxStream& rng, const float* data,
                     float* residual, int64_t n, float* cells, cudaStream_t stream) = nullptr;
  void (*recover)(const CompressorSpec& spec, SparseTable table, const PhiloxStream& rng, const float* cells,
                  int64_t n, int64_t count, GpuSparseWorkspace& ws, cudaStream_t stream) = nullptr;
};

}  // namespace gradcomm::detail
