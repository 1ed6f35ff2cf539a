// The compressed allreduce on the NCCL path (see nccl_compressed.h): the compressed
// allreduce's primitives (src/compressed_allreduce.h) over device memory, stream-ordered on the
// caller's stream, with the key's state on the GPU. The steps themselves are the
// CPU path's, the same code: only how each primitive touches memory differs. The
// dense codecs' ring is nccl_compressed_ring.cc; PowerSGD's step is
// nccl_powersgd_allreduce.cc.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/collectives.h"
#include "compressed_allreduce.h"
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
      // 4 bytes: parse_state and the CPU path only ever store floats).
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
// keyless state: the one piece of per-context storage this path owns (GpuContext
// destroys it with the context).
GpuBlas& context_blas(GpuContext& gpu, cudaStream_t stream) {
  GpuKeyState& shared = key_state(gpu, nullptr, 0, /*ef=*/false, stream);
  if (!shared.blas) shared.blas = std::make_unique<GpuBlas>();
  return *shared.blas;
}

// The cast codec that narrows sparse values of a 16-bit type (fp16 or bf16).
const CompressorSpec& cast_spec(ValueType type) {
  static const CompressorSpec fp16 = parse_compressor_spec("fp16");
  static const CompressorSpec bf16 = parse_compressor_spec("bf16");
  return type == ValueType::kFp16 ? fp16 : bf16;
}

// Sums values[0, count) across ranks in place: fp32 on the NCCL ring, or (values=fp16
// or bf16) narrowed with that type's cast codec (base/half.h's rounding, sparse_narrow,
// as HostPrimitives::allreduce_values in compression.cc), summed in the 16-bit type
// in place inside the payload (fp32 per hop), and widened back. The payload header
// stays untouched, so the decode validates it.
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

// The compressed allreduce's primitives over device memory (compressed_allreduce.h lists them), on
// `stream`. One object a call; the residual and the selection are the key's GpuKeyState's.
class DevicePrimitives {
 public:
  DevicePrimitives(Op& op, const CompressedCall& call, GpuContext& gpu, int64_t numel, cudaStream_t stream)
      : call_(call),
        op_(op),
        spec_(call.spec),
        gpu_(gpu),
        stream_(stream),
        ks_(key_state(gpu, call.key, numel, call.spec.ef, stream)),
        residual_(call.spec.ef && call.key != nullptr ? ks_.residual.as<float>() : nullptr) {}

  void fold_and_clear(float* data, int64_t numel) {
    if (residual_ == nullptr) return;
    launch_reduce_inplace(data, residual_, numel, DType::kFloat32, ReduceOp::kSum, 1, stream_);
    GRADCOMM_CUDA_CHECK(cudaMemsetAsync(residual_, 0, static_cast<size_t>(numel) * sizeof(float), stream_));
  }

  const float* accumulate_in_residual(const float* data, int64_t numel) {
    if (residual_ == nullptr) return data;
    gpu_fold_residual(data, residual_, numel, stream_);  // residual = acc
    return residual_;
  }

  void dense_allreduce(float* data, int64_t numel, ReduceOp reduce_op, uint32_t /*unit_base: host rings only*/) {
    nccl_ring_allreduce(op_, gpu_, data, numel, DType::kFloat32, reduce_op, stream_);
  }

  // acc = data + residual, payload = encode(acc), residual = acc - decode, data = decode,
  // fused into the encode.
  void codec_round_trip(float* data, int64_t numel, const PhiloxStream& rng) {
    const GpuDenseCodec codec(spec_);
    uint8_t* payload = gpu_.payload_scratch(codec.encoded_bytes(numel)).as<uint8_t>();
    EncodeFeedback feedback;
    feedback.residual = residual_;
    feedback.mode = ResidualMode::kFold;
    feedback.decoded = data;
    codec.encode(data, numel, payload, rng, 0, feedback, stream_);
  }

  void codec_ring(float* data, int64_t numel, const PhiloxStream& rng, int divisor) {
    nccl_compressed_ring(op_, gpu_, data, numel, GpuDenseCodec(spec_), rng, residual_, status(), stream_);
    divide(data, numel, divisor);  // one pass on the stream: cheap on the GPU, and it keeps the kernels as they are
  }

  // Only the sparse allgather exists here: algo=auto means it, reduce_scatter is refused.
  SparseAlgo sparse_algo(const SparseShape& shape, int64_t /*numel*/) const {
    if (shape.algo == SparseAlgo::kReduceScatter) {
      throw InvalidArgument(
          "topk algo=reduce_scatter is not available for CUDA tensors (NCCL path); use algo=allgather or auto");
    }
    return SparseAlgo::kAllgather;
  }

  void select(float* data, int64_t numel, int64_t k, const PhiloxStream& rng) {
    gpu_ops().select(spec_, data, residual_, numel, k, rng, ks_.sparse, stream_);
  }

  // Encode in the spec's format, allgather the payloads, decode all in rank order.
  void sparse_allreduce(SparseAlgo /*allgather*/, const SparseShape& shape, float* data, int64_t numel, int64_t k,
                        ReduceOp reduce_op) {
    const int n = op_.size();
    const int r = op_.rank();
    const SparseFormat format = shape.format;
    const int64_t capacity = ks_.sparse.capacity();
    // The payload size grows with the count, so the capacity's bounds every rank's.
    const size_t block = round_up(sparse_payload_bytes(numel, capacity, format));

    // Sizes. Exact: min(k, n) entries on every rank, known here. Sample: the count is
    // on the device; we read it (one stream sync) and agree on all counts over the
    // host transport. Sending capacity-sized blocks instead would avoid the sync but
    // put up to 2k entries on the wire, and the decoder needs the exact length anyway
    // (its length check is part of validating an untrusted payload).
    std::vector<uint64_t> counts(static_cast<size_t>(n), static_cast<uint64_t>(std::min(k, numel)));
    if (!shape.exact_count) {
      counts[r] = static_cast<uint64_t>(ks_.sparse.read_count(stream_));
      if (n > 1) {
        ring_allgatherv(op_, reinterpret_cast<uint8_t*>(counts.data()), std::vector<int64_t>(n, 1), sizeof(uint64_t),
                        /*unit_base=*/0);
      }
    }
    if (auto problem = check_sample_counts(counts, static_cast<uint64_t>(capacity), numel, k)) {
      op_.fail(ErrorCode::kCorruptPayload, *problem);
    }
    std::vector<size_t> offsets(n), sizes(n);
    for (int p = 0; p < n; ++p) {
      offsets[p] = block * static_cast<size_t>(p);
      sizes[p] = sparse_payload_bytes(numel, static_cast<int64_t>(counts[p]), format);
    }
    DeviceStatus* status = this->status();
    uint8_t* base = gpu_.payload_scratch(block * static_cast<size_t>(n)).as<uint8_t>();
    gpu_encode_sparse(spec_.id, numel, ks_.sparse.indices(), ks_.sparse.values(), ks_.sparse.count(),
                      capacity, format, base + offsets[r], nullptr, status + r, stream_);
    nccl_allgatherv_blocks(op_, gpu_, base, offsets, sizes, stream_);
    // Every rank decodes every payload in rank order: bitwise identical sums (coded
    // indices through ks.sparse's decode scratch).
    GRADCOMM_CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(numel) * sizeof(float), stream_));
    for (int p = 0; p < n; ++p) {
      gpu_decode_add_sparse(spec_.id, base + offsets[p], sizes[p], numel, format, data, ks_.sparse,
                            status + p, stream_);
    }
    if (reduce_op == ReduceOp::kAvg) divide(data, numel, n);
  }

  void draw(int64_t numel, int64_t count, const PhiloxStream& rng) {
    gpu_ops().draw(spec_, numel, count, rng, ks_.sparse, stream_);
  }

  float* table_cells(SparseTable table) {
    const size_t bytes = static_cast<size_t>(table.rows) * table.cols * sizeof(float);
    ks_.table.reserve(bytes);
    GRADCOMM_CUDA_CHECK(cudaMemsetAsync(ks_.table.data(), 0, bytes, stream_));
    return ks_.table.as<float>();
  }
  // With EF, the residual becomes acc in the same pass.
  const float* table_accumulate(SparseTable table, const PhiloxStream& rng, const float* data, int64_t numel,
                                float* cells) {
    gpu_ops().accumulate(spec_, table, rng, data, residual_, numel, cells, stream_);
    return residual_ != nullptr ? residual_ : data;
  }
  void table_recover(SparseTable table, const PhiloxStream& rng, const float* cells, int64_t numel, int64_t k) {
    gpu_ops().recover(spec_, table, rng, cells, numel, k, ks_.sparse, stream_);
  }

  void gather_sum_scatter(float* data, const float* acc, int64_t numel, ValueType type, uint32_t /*unit_base*/) {
    const int64_t capacity = ks_.sparse.capacity();
    ks_.values.reserve(static_cast<size_t>(std::max<int64_t>(capacity, 1)) * sizeof(float));
    float* values = ks_.values.as<float>();
    gpu_gather(acc, ks_.sparse.indices(), ks_.sparse.count(), capacity, values, residual_, type, stream_);
    allreduce_values(op_, gpu_, ks_, values, capacity, type, status() + op_.rank(), stream_);
    GRADCOMM_CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(numel) * sizeof(float), stream_));
    gpu_scatter(data, ks_.sparse.indices(), values, ks_.sparse.count(), capacity, stream_);
  }

  void keep_selection() { ks_.has_selection = true; }

  void low_rank(float* data, int64_t numel, ReduceOp reduce_op) {
    nccl_powersgd_allreduce(op_, gpu_, ks_, context_blas(gpu_, stream_), data, numel, reduce_op, spec_,
                            call_.parts != nullptr ? *call_.parts : std::vector<powersgd::Part>{}, call_.key,
                            call_.key_hash, residual_, stream_);
  }

  // The decoders' fault words, checked once the stream gets there (GpuContext).
  void check_payloads(int64_t numel) {
    if (status_ == nullptr) return;
    gpu_.queue_payload_check(stream_, fmt::format("rank {}: allreduce #{} ({}, numel {})", op_.rank(),
                                                  op_.header().seq, op_.header().compressor, numel));
  }

  void divide(float* data, int64_t numel, int ranks) {
    launch_divide_inplace(data, numel, DType::kFloat32, ranks, stream_);
  }

 private:
  // The family's device calls (Family::gpu_sparse); a family without them is refused by name.
  const GpuSparseOps& gpu_ops() const {
    const Family& family = family_of(spec_.id);
    if (family.gpu_sparse == nullptr) {
      throw InvalidArgument(fmt::format("compressor {} has no CUDA implementation (a build without CUDA, or a family "
                                        "that provides none); use a host tensor",
                                        family.name));
    }
    return *family.gpu_sparse;
  }

  // The call's payload status words (one per peer), cleared at the first use.
  DeviceStatus* status() {
    if (status_ == nullptr) status_ = gpu_.payload_status(op_.size(), stream_);
    return status_;
  }

  const CompressedCall& call_;
  Op& op_;
  const CompressorSpec& spec_;
  GpuContext& gpu_;
  cudaStream_t stream_;
  GpuKeyState& ks_;
  float* residual_;  // null without error feedback
  DeviceStatus* status_ = nullptr;
};

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
  const CompressedCall call{spec, key, key_hash, parts, op.rank(), op.size()};
  DevicePrimitives device(op, call, gpu, numel, stream);
  compressed_allreduce(device, call, data, numel, reduce_op);
}

}  // namespace gradcomm::detail
