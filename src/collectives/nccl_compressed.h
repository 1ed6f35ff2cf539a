// Compressed allreduce of CUDA fp32 tensors on the NCCL path (CUDA builds only):
// the GPU codecs (compressors/*/ *.cu) on the collectives of docs/architecture.md, stream-
// ordered on the caller's stream, with the per-key state in device memory.
//
//   fp16, bf16, quant, qsgd, sign -> compressed ring (nccl_compressed_ring.cc)
//   topk                          -> sparse allgather(v) of payloads, decoded in rank order
//   randomk                       -> NCCL dense ring on the k shared-index values
//   sketch                        -> NCCL dense ring on the table, then on the exact values
//   powersgd                      -> NCCL dense ring on every P (and the dense parts), then
//                                    on every Q (nccl_powersgd_allreduce.cc)
// (nccl_compressed_allreduce.cc holds the compressed allreduce's device primitives.) The steps are
// the CPU path's own code (src/compressed_allreduce.h): warm-up and min_numel go
// dense, the Philox streams are philox_stream_id(key_hash, step, rank) and (key_hash,
// step, -1), and the EF folds and residual rules are the same element arithmetic
// (the __host__ __device__ formula headers). So results equal the CPU path's
// bytes, except the sketch (the GPU table is summed with atomics), the small
// dense allreduces of randomk/sketch for N > 2 (the CPU uses recursive doubling for
// small tensors, NCCL the ring), and powersgd, within the tolerance stated in
// compressors/lowrank/gpu_powersgd.h (cuBLAS and OpenBLAS sum in other orders).
//
// Payload faults found by the GPU decoders are reported by GpuContext's payload
// checks (CorruptPayload at the next call or synchronize(), naming the call and peer).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "op.h"
#include "compressors/lowrank/gpu_powersgd.h"
#include "compressors/dense/gpu_dense_codec.h"
#include "compressors/sparse/gpu_sparse.h"
#include "cuda/buffer.h"
#include "gpu_context.h"
#include "state.h"

namespace gradcomm::detail {

struct CompressorSpec;  // compressors/spec.h

// One key's state on the GPU (KeyState::device): the residual, PowerSGD's Q and the
// cached, grow-only workspaces, so a warm key allocates nothing.
class GpuKeyState final : public DeviceKeyState {
 public:
  explicit GpuKeyState(GpuContext& gpu) : gpu_(&gpu) {}
  // Both wait for every call enqueued so far (GpuContext::synchronize), then copy.
  std::vector<uint8_t> residual_to_host() const override;
  std::vector<uint8_t> extra_to_host() const override;  // the kept Q's bytes, or empty
  bool sent_mask(float* mask, void* stream) const override;  // from `sparse`'s selection

  bool has_selection = false;  // a sparsified call (topk, randomk, sketch) left its selection in `sparse`

  bool has_residual = false;
  int64_t numel = 0;
  DeviceBuffer residual;      // numel floats when has_residual
  GpuSparseWorkspace sparse;  // top-k / random-k / heavy-hitter selections
  DeviceBuffer values;        // capacity floats: gathered values (randomk, sketch)
  DeviceBuffer table;         // rows x cols floats (sketch)
  DeviceBuffer payload;       // fp16 values on the wire (values=fp16)
  DeviceBuffer q;             // powersgd, warm start: the Q kept from the last step (q_floats)
  int64_t q_floats = 0;       // 0: no Q kept (KeyState::extra empty)
  // The context's cuBLAS handle. Only the keyless state (GpuContext::keyless_state, one
  // per context, destroyed with it) holds one: see context_blas().
  std::unique_ptr<GpuBlas> blas;

 private:
  GpuContext* gpu_;
};

// In place on `data` (numel > 0 fp32 device floats), kSum or kAvg, after op.finish().
// `key` may be null for stateless specs; `parts` (may be null) the tensor's shapes.
void nccl_compressed_allreduce(Op& op, GpuContext& gpu, float* data, int64_t numel, ReduceOp reduce_op,
                               const CompressorSpec& spec, KeyState* key, uint64_t key_hash,
                               const std::vector<powersgd::Part>* parts, cudaStream_t stream);

// PowerSGD's step (nccl_powersgd_allreduce.cc), on `data` with `residual` (null without
// error feedback) still holding last step's; the Q state is `ks`'s; `blas` the context's.
void nccl_powersgd_allreduce(Op& op, GpuContext& gpu, GpuKeyState& ks, GpuBlas& blas, float* data, int64_t numel,
                             ReduceOp reduce_op, const CompressorSpec& spec, const std::vector<powersgd::Part>& parts,
                             KeyState* key, uint64_t key_hash, float* residual, cudaStream_t stream);

// The compressed ring for N >= 2 (nccl_compressed_ring.cc). `residual` (may be
// null) collects every encode's loss (ResidualMode::kAccumulate); decoders record
// faults of payloads from rank p in status[p].
void nccl_compressed_ring(Op& op, GpuContext& gpu, float* data, int64_t numel, const GpuDenseCodec& codec,
                          const PhiloxStream& rng, float* residual, DeviceStatus* status, cudaStream_t stream);

// Ring allgather of variable-size byte blocks (nccl_sparse_allgather.cc): block p
// (sizes[p] bytes at base + offsets[p]) is rank p's; on return every block is
// enqueued to arrive everywhere. Sizes must be agreed by every rank beforehand.
void nccl_allgatherv_blocks(Op& op, GpuContext& gpu, uint8_t* base, const std::vector<size_t>& offsets,
                            const std::vector<size_t>& sizes, cudaStream_t stream);

}  // namespace gradcomm::detail
