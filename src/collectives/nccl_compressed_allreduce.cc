// The GPU compression engine on the NCCL path (see nccl_compressed.h): per-key
// device state, warm-up and min_numel, error feedback, and the three sparse
// families (top-k's sparse allgather, random-k and the sketch on the NCCL dense
// ring). The dense codecs' ring is nccl_compressed_ring.cc; PowerSGD's step is
// nccl_powersgd_allreduce.cc.
//
// Each branch mirrors src/compression.cc step for step (same counts, same Philox
// streams, same EF arithmetic), so the two can be read side by side.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/gpu_collectives.h"
#include "collectives/nccl_compressed.h"
#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/payload.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/reduce.cuh"

namespace gradcomm::detail {
namespace {

constexpr size_t kBlockAlign = 16;
size_t round_up(size_t v) { return (v + kBlockAlign - 1) / kBlockAlign * kBlockAlign; }

// The key's device state, created at its first GPU call. A residual (and PowerSGD's
// Q, KeyState::extra) already on the host (load_state, or earlier CPU calls with
// this key) moves to the device once; from then on the device copies are the key's
// state (state.h).
GpuKeyState& key_state(GpuContext& gpu, KeyState* key, int64_t numel, bool ef, cudaStream_t stream) {
  std::shared_ptr<DeviceKeyState>& slot = key != nullptr ? key->device : gpu.keyless_state();
  if (!slot) {
    auto state = std::make_shared<GpuKeyState>(gpu);
    if (key != nullptr && !key->residual.empty()) {
      const size_t bytes = static_cast<size_t>(numel) * sizeof(float);
      if (key->residual.size() != bytes) {
        throw InvalidArgument(fmt::format("allreduce: the key's residual holds {} bytes, expected {} for {} floats",
                                          key->residual.size(), bytes, numel));
      }
      state->residual = DeviceBuffer(bytes);
      // Pageable source: synchronous, once per key (after a load_state).
      GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(state->residual.data(), key->residual.data(), bytes,
                                          cudaMemcpyHostToDevice, stream));
      GRADCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
      state->has_residual = true;
      key->residual = {};
    }
    if (key != nullptr && !key->extra.empty()) {
      // Its size is checked against the call's shapes where it is used (a multiple of
      // 4 bytes: parse_state and the CPU engine only ever store floats).
      const size_t bytes = key->extra.size();
      state->q = DeviceBuffer(bytes);
      GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(state->q.data(), key->extra.data(), bytes, cudaMemcpyHostToDevice, stream));
      GRADCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
      state->q_floats = static_cast<int64_t>(bytes / sizeof(float));
      key->extra = {};
    }
    state->numel = numel;
    // From here the key's selections are the device's (GpuKeyState::sent_mask): a
    // host one left from earlier CPU calls is not this key's last any more.
    if (key != nullptr) key->sent.clear();
    slot = std::move(state);
  }
  auto& state = static_cast<GpuKeyState&>(*slot);
  if (ef && key != nullptr && !state.has_residual) {  // zero-filled the first time, as on the CPU
    state.residual = DeviceBuffer(static_cast<size_t>(numel) * sizeof(float));
    GRADCOMM_CUDA_CHECK(cudaMemsetAsync(state.residual.data(), 0, state.residual.size(), stream));
    state.has_residual = true;
  }
  return state;
}

// The context's cuBLAS handle, made at its first PowerSGD call. It lives in the
// keyless state: the one piece of per-context storage this engine owns (GpuContext
// destroys it with the context).
GpuBlas& context_blas(GpuContext& gpu, cudaStream_t stream) {
  GpuKeyState& shared = key_state(gpu, nullptr, 0, /*ef=*/false, stream);
  if (!shared.blas) shared.blas = std::make_unique<GpuBlas>();
  return *shared.blas;
}

// acc = data + residual into data; the residual is then zero, free to collect this
// step's loss (compression.cc's fold_residual + fill).
void fold_and_clear(float* data, float* residual, int64_t numel, cudaStream_t stream) {
  if (residual == nullptr) return;
  launch_reduce_inplace(data, residual, numel, DType::kFloat32, ReduceOp::kSum, 1, stream);
  GRADCOMM_CUDA_CHECK(cudaMemsetAsync(residual, 0, static_cast<size_t>(numel) * sizeof(float), stream));
}

// The cast codec that narrows sparse values of a 16-bit type (fp16 or bf16).
const CompressorSpec& cast_spec(ValueType type) {
  static const CompressorSpec fp16 = parse_compressor_spec("fp16");
  static const CompressorSpec bf16 = parse_compressor_spec("bf16");
  return type == ValueType::kFp16 ? fp16 : bf16;
}

// Sums values[0, count) across ranks in place: fp32 on the NCCL ring, or (values=fp16
// or bf16) narrowed with that type's cast codec (base/half.h's rounding, sparse_narrow,
// as compression.cc's allreduce_values), summed in the 16-bit type in place inside the
// payload (fp32 per hop), and widened back. The payload header stays untouched, so the
// decode validates it.
void allreduce_values(Op& op, GpuContext& gpu, GpuKeyState& ks, float* values, int64_t count, ValueType type,
                      DeviceStatus* own_status, cudaStream_t stream) {
  if (type == ValueType::kFp32) {
    nccl_ring_allreduce(op, gpu, values, count, DType::kFloat32, ReduceOp::kSum, stream);
    return;
  }
  const GpuDenseCodec codec(cast_spec(type));
  const size_t bytes = codec.encoded_bytes(count);
  if (bytes != PayloadHeader::kBytes + static_cast<size_t>(count) * 2) {
    throw InvalidArgument(fmt::format("allreduce: 16-bit payload of {} values is {} bytes, expected header + 2 per "
                                      "value",
                                      count, bytes));
  }
  ks.payload.reserve(bytes);
  auto* payload = ks.payload.as<uint8_t>();
  codec.encode(values, count, payload, PhiloxStream{}, 0, nullptr, stream);
  nccl_ring_allreduce(op, gpu, payload + PayloadHeader::kBytes, count,
                      type == ValueType::kFp16 ? DType::kFloat16 : DType::kBFloat16, ReduceOp::kSum, stream);
  codec.decode(payload, bytes, count, values, /*add=*/false, own_status, stream);
}

// Top-k: select (EF fused, keeping the values' rounding), encode in the spec's format,
// allgather the payloads, decode all in rank order. Only the sparse allgather exists
// here: algo=auto means it on this path, algo=reduce_scatter is refused.
void topk(Op& op, GpuContext& gpu, GpuKeyState& ks, float* data, float* residual, int64_t numel,
          const CompressorSpec& spec, const PhiloxStream& mine, DeviceStatus* status, cudaStream_t stream) {
  if (spec.algo == SparseAlgo::kReduceScatter) {
    throw InvalidArgument(
        "topk algo=reduce_scatter is not available for CUDA tensors (NCCL path); use algo=allgather or auto");
  }
  const int n = op.size();
  const int r = op.rank();
  const SparseFormat format = sparse_format(spec);
  const int64_t k = selection_count(spec.ratio, spec.k, numel);
  gpu_topk_select(data, residual, numel, k, spec.select, mine, format.values, ks.sparse, stream);
  const int64_t capacity = ks.sparse.capacity();
  // The payload size grows with the count, so the capacity's bounds every rank's.
  const size_t block = round_up(sparse_payload_bytes(numel, capacity, format));

  // Sizes. Exact: min(k, n) entries on every rank, known here. Sample: the count is
  // on the device; we read it (one stream sync) and agree on all counts over the
  // host transport. Sending capacity-sized blocks instead would avoid the sync but
  // put up to 2k entries on the wire, and the decoder needs the exact length anyway
  // (its length check is part of validating an untrusted payload).
  std::vector<uint64_t> counts(static_cast<size_t>(n), static_cast<uint64_t>(std::min(k, numel)));
  if (spec.select == TopkSelect::kSample) {
    counts[r] = static_cast<uint64_t>(ks.sparse.read_count(stream));
    if (n > 1) {
      ring_allgatherv(op, reinterpret_cast<uint8_t*>(counts.data()), std::vector<int64_t>(n, 1), sizeof(uint64_t),
                      /*unit_base=*/0);
    }
  }
  if (auto problem = check_sample_counts(counts, static_cast<uint64_t>(capacity), numel, k)) {
    op.fail(ErrorCode::kCorruptPayload, *problem);
  }
  std::vector<size_t> offsets(n), sizes(n);
  for (int p = 0; p < n; ++p) {
    offsets[p] = block * static_cast<size_t>(p);
    sizes[p] = sparse_payload_bytes(numel, static_cast<int64_t>(counts[p]), format);
  }
  uint8_t* base = gpu.payload_scratch(block * static_cast<size_t>(n)).as<uint8_t>();
  gpu_encode_sparse(CompressorId::kTopk, numel, ks.sparse.indices(), ks.sparse.values(), ks.sparse.count(), capacity,
                    format, base + offsets[r], nullptr, status + r, stream);
  nccl_allgatherv_blocks(op, gpu, base, offsets, sizes, stream);
  // Every rank decodes every payload in rank order: bitwise identical sums (coded
  // indices through ks.sparse's decode scratch).
  GRADCOMM_CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(numel) * sizeof(float), stream));
  for (int p = 0; p < n; ++p) {
    gpu_decode_add_sparse(CompressorId::kTopk, base + offsets[p], sizes[p], numel, format, data, ks.sparse, status + p,
                          stream);
  }
}

// Random-k and the sketch's second round: gather acc at the selection (leaving in the
// residual there only what sending it as `type` rounds off), sum the values across
// ranks, scatter them into a zeroed output.
void gather_sum_scatter(Op& op, GpuContext& gpu, GpuKeyState& ks, float* data, const float* acc, float* residual,
                        int64_t numel, ValueType type, DeviceStatus* own_status, cudaStream_t stream) {
  const int64_t capacity = ks.sparse.capacity();
  ks.values.reserve(static_cast<size_t>(std::max<int64_t>(capacity, 1)) * sizeof(float));
  float* values = ks.values.as<float>();
  gpu_gather(acc, ks.sparse.indices(), ks.sparse.count(), capacity, values, residual, type, stream);
  allreduce_values(op, gpu, ks, values, capacity, type, own_status, stream);
  GRADCOMM_CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(numel) * sizeof(float), stream));
  gpu_scatter(data, ks.sparse.indices(), values, ks.sparse.count(), capacity, stream);
}

}  // namespace

std::vector<uint8_t> GpuKeyState::residual_to_host() const {
  if (!has_residual) return {};
  gpu_->synchronize("save_state");
  DeviceGuard guard(gpu_->device());
  std::vector<uint8_t> out(residual.size());
  GRADCOMM_CUDA_CHECK(cudaMemcpy(out.data(), residual.data(), out.size(), cudaMemcpyDeviceToHost));
  return out;
}

std::vector<uint8_t> GpuKeyState::extra_to_host() const {
  if (q_floats == 0) return {};
  gpu_->synchronize("save_state");
  DeviceGuard guard(gpu_->device());
  std::vector<uint8_t> out(static_cast<size_t>(q_floats) * sizeof(float));
  GRADCOMM_CUDA_CHECK(cudaMemcpy(out.data(), q.data(), out.size(), cudaMemcpyDeviceToHost));
  return out;
}

bool GpuKeyState::sent_mask(float* mask, void* stream) const {
  if (!has_selection) return false;
  DeviceGuard guard(gpu_->device());
  // The selection is the last one on this key's stream; decoding never touches it
  // (coded payloads decode through the workspace's own scratch).
  gpu_sent_mask(mask, numel, sparse.indices(), sparse.count(), sparse.capacity(), static_cast<cudaStream_t>(stream));
  return true;
}

void nccl_compressed_allreduce(Op& op, GpuContext& gpu, float* data, int64_t numel, ReduceOp reduce_op,
                               const CompressorSpec& spec, KeyState* key, uint64_t key_hash,
                               const std::vector<powersgd::Part>* parts, cudaStream_t stream) {
  const int n = op.size();
  const uint64_t step = key != nullptr ? key->step : 0;
  GpuKeyState& ks = key_state(gpu, key, numel, spec.ef, stream);
  float* residual = spec.ef && key != nullptr ? ks.residual.as<float>() : nullptr;
  const PhiloxStream mine{spec.seed, philox_stream_id(key_hash, step, op.rank())};
  const PhiloxStream shared{spec.seed, philox_stream_id(key_hash, step, -1)};

  // Warm-up steps and small tensors go dense (with what the residual still holds).
  if (step < static_cast<uint64_t>(spec.warmup) || numel < spec.min_numel) {
    fold_and_clear(data, residual, numel, stream);
    nccl_ring_allreduce(op, gpu, data, numel, DType::kFloat32, reduce_op, stream);
    return;
  }

  DeviceStatus* status = gpu.payload_status(n, stream);
  switch (family_of(spec.id).collective) {
    case Collective::kCodecRing: {
      const GpuDenseCodec codec(spec);
      if (n == 1) {
        // Nothing to exchange, but the output is still what compression keeps:
        // acc = data + residual, payload = encode(acc), residual = acc - decode,
        // data = decode (compression.cc's N = 1 branch, fused into the encode).
        uint8_t* payload = gpu.payload_scratch(codec.encoded_bytes(numel)).as<uint8_t>();
        EncodeFeedback feedback;
        feedback.residual = residual;
        feedback.mode = ResidualMode::kFold;
        feedback.decoded = data;
        codec.encode(data, numel, payload, mine, 0, feedback, stream);
      } else {
        fold_and_clear(data, residual, numel, stream);
        nccl_compressed_ring(op, gpu, data, numel, codec, mine, residual, status, stream);
      }
      break;
    }
    case Collective::kSparseSelection:
      topk(op, gpu, ks, data, residual, numel, spec, mine, status, stream);
      ks.has_selection = true;
      break;
    case Collective::kSharedIndices: {
      gpu_randomk_indices(numel, selection_count(spec.ratio, 0, numel), shared, ks.sparse, stream);
      const float* acc = data;
      if (residual != nullptr) {
        gpu_fold_residual(data, residual, numel, stream);  // residual = acc
        acc = residual;
      }
      gather_sum_scatter(op, gpu, ks, data, acc, residual, numel, spec.values, status + op.rank(), stream);
      ks.has_selection = true;
      break;
    }
    case Collective::kSketchThenValues: {
      const int64_t k = selection_count(spec.ratio, spec.k, numel);
      const GpuCountSketch sketch(spec.rows, sketch_columns(spec, k), shared);
      const int64_t cells = int64_t{sketch.rows()} * sketch.cols();
      ks.table.reserve(static_cast<size_t>(cells) * sizeof(float));
      float* table = ks.table.as<float>();
      GRADCOMM_CUDA_CHECK(cudaMemsetAsync(table, 0, static_cast<size_t>(cells) * sizeof(float), stream));
      sketch.accumulate(data, residual, numel, table, stream);  // with EF: residual = acc
      nccl_ring_allreduce(op, gpu, table, cells, DType::kFloat32, ReduceOp::kSum, stream);
      // Same summed table on every rank (the ring's allgather carries the owners'
      // bytes), so the same heavy hitters everywhere.
      sketch.recover(table, numel, k, ks.sparse, stream);
      gather_sum_scatter(op, gpu, ks, data, residual != nullptr ? residual : data, residual, numel, spec.values,
                         status + op.rank(), stream);
      ks.has_selection = true;
      break;
    }
    case Collective::kLowRank:
      // Two dense rings of its own, no payloads to check; the average is its own.
      nccl_powersgd_allreduce(op, gpu, ks, context_blas(gpu, stream), data, numel, reduce_op, spec,
                              parts != nullptr ? *parts : std::vector<powersgd::Part>{}, key, key_hash, residual,
                              stream);
      return;
    case Collective::kDense:
      nccl_ring_allreduce(op, gpu, data, numel, DType::kFloat32, reduce_op, stream);
      return;
  }
  gpu.queue_payload_check(stream, fmt::format("rank {}: allreduce #{} ({}, numel {})", op.rank(), op.header().seq,
                                              op.header().compressor, numel));
  if (reduce_op == ReduceOp::kAvg) launch_divide_inplace(data, numel, DType::kFloat32, n, stream);
}

}  // namespace gradcomm::detail
