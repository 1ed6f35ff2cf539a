// PowerSGD on CUDA tensors over NCCL (the step is written out in
// compressors/powersgd/powersgd_logic.h; the CPU engine's is powersgd_allreduce.cc):
// two dense NCCL rings per call, one of every matrix's P with the call's dense parts
// behind them, one of every matrix's Q, whatever the number of matrices. Everything is
// enqueued on the caller's stream, in this order:
//
//   acc = data + residual                       launch_reduce_inplace (EF on)
//   Q: the key's (warm start, kept on the device in GpuKeyState::q) or drawn
//      now from the shared Philox stream, then orthonormalized
//   p_buf = [M_i Q_i .., dense parts]            cuBLAS, gather kernel
//   ring allreduce of p_buf (sum)
//   orthonormalize each P_i; Q_i = M_i^T P_i     one block per matrix; cuBLAS
//   ring allreduce of the Qs (sum)
//   data = P_i Q_i^T (/N), dense parts (/N)      kernels; residual = acc - P_i Q_i^T / N
//
// The plan, the buffer offsets and the Philox streams are the CPU's (make_plan,
// philox_stream_id(key, warm_start ? 0 : step, -1)), so both engines compute the same
// step; only the summation order of the products differs (gpu_powersgd.h: tolerance).
// Every rank ends bitwise identical: the rings hand every rank the same sums, and the
// kernels that read them are deterministic.
//
// Memory: p_buf (and a Q drawn for this call alone, warm_start=0) live in the context's
// payload scratch; a warm-start Q in the key's state. Nothing is allocated once warm,
// except that a key's first Q allocation synchronizes (CudaMemory::reserve).
#include <fmt/format.h>

#include <vector>

#include "collectives/gpu_collectives.h"
#include "collectives/nccl_compressed.h"
#include "cuda/reduce.cuh"
#include "gradcomm/errors.h"
#include "shape.h"

namespace gradcomm::detail {
namespace {

constexpr size_t kAlign = 256;  // the Q drawn per call starts aligned after p_buf
size_t round_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

void nccl_powersgd_allreduce(Op& op, GpuContext& gpu, GpuKeyState& ks, GpuBlas& blas, float* data, int64_t numel,
                             ReduceOp reduce_op, const CompressorSpec& spec, const std::vector<powersgd::Part>& parts,
                             KeyState* key, uint64_t key_hash, float* residual, cudaStream_t stream) {
  const int n = op.size();
  const bool average = reduce_op == ReduceOp::kAvg;
  const powersgd::Plan plan = powersgd::make_call_plan(parts, numel, spec.rank, spec.min_compression_rate);
  const uint64_t step = key != nullptr ? key->step : 0;
  const auto f32 = DType::kFloat32;

  // Q's place, checked before anything is enqueued: the key's, kept from the last step
  // (warm start), or one drawn for this call.
  const bool keep = spec.warm_start && key != nullptr;
  const size_t p_bytes = static_cast<size_t>(plan.p_floats + plan.dense_floats) * sizeof(float);
  const size_t q_bytes = static_cast<size_t>(plan.q_floats) * sizeof(float);
  if (keep && ks.q_floats != 0 && ks.q_floats != plan.q_floats) {
    throw InvalidArgument(fmt::format(
        "powersgd: key's Q holds {} floats but this call's shapes ({}) need {}: a key's shapes must not change",
        ks.q_floats, describe_parts(parts), plan.q_floats));
  }

  if (residual != nullptr) launch_reduce_inplace(data, residual, numel, f32, ReduceOp::kSum, 1, stream);  // acc

  if (plan.matrices == 0) {
    // All dense: the exact sum, in place, without the copy through p_buf the CPU makes
    // (the same ring on the same values). With no Ps, each dense part's p_offset is its
    // offset in the tensor, so the tensor is its own p_buf for the last step (/N,
    // residual zeroed).
    if (n > 1) nccl_ring_allreduce(op, gpu, data, numel, f32, ReduceOp::kSum, stream);
    gpu_powersgd_reconstruct(plan, data, nullptr, n, average, data, residual, stream);
    return;
  }

  auto* scratch = gpu.payload_scratch(round_up(p_bytes) + (keep ? 0 : q_bytes)).as<uint8_t>();
  auto* p_buf = reinterpret_cast<float*>(scratch);
  float* q = reinterpret_cast<float*>(scratch + round_up(p_bytes));
  bool draw = !keep;
  if (keep) {
    if (ks.q_floats == 0) {  // the key's first compressed step
      ks.q.reserve(q_bytes);
      ks.q_floats = plan.q_floats;
      draw = true;
    }
    q = ks.q.as<float>();
  }
  if (draw) {
    const PhiloxStream s{spec.seed, philox_stream_id(key_hash, spec.warm_start ? 0 : step, -1)};
    gpu_powersgd_draw_q(q, plan.q_floats, s, stream);
    gpu_powersgd_orthonormalize(plan, q, Factor::kQ, stream);
  }

  gpu_powersgd_project(blas, plan, data, q, p_buf, stream);
  if (n > 1) nccl_ring_allreduce(op, gpu, p_buf, plan.p_floats + plan.dense_floats, f32, ReduceOp::kSum, stream);

  gpu_powersgd_orthonormalize(plan, p_buf, Factor::kP, stream);
  gpu_powersgd_project_back(blas, plan, data, p_buf, q, stream);
  if (n > 1) nccl_ring_allreduce(op, gpu, q, plan.q_floats, f32, ReduceOp::kSum, stream);

  gpu_powersgd_reconstruct(plan, p_buf, q, n, average, data, residual, stream);
}

}  // namespace gradcomm::detail
