// PowerSGD on CUDA tensors over NCCL: the call of powersgd_steps.h (the CPU path runs
// the same, powersgd_allreduce.cc) over device primitives, everything enqueued on the
// caller's stream: the EF fold and reconstruction kernels, cuBLAS products, the
// orthonormalization (one block per matrix), and the dense NCCL ring for the
// allreduces of P and Q.
//
// Memory: p_buf (and a Q drawn for this call alone, warm_start=0) live in the context's
// payload scratch; a warm-start Q in the key's state. Nothing is allocated once warm,
// except that a key's first Q allocation synchronizes (CudaMemory::reserve).
#include <fmt/format.h>

#include <vector>

#include "collectives/gpu_collectives.h"
#include "collectives/nccl_compressed.h"
#include "collectives/powersgd_steps.h"
#include "cuda/reduce.cuh"
#include "gradcomm/errors.h"
#include "shape.h"

namespace gradcomm::detail {
namespace {

constexpr size_t kAlign = 256;  // the Q drawn per call starts aligned after p_buf
size_t round_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// The device primitives of powersgd_steps.h, every one enqueued on the caller's stream.
class DevicePowerSgd {
 public:
  DevicePowerSgd(Op& op, GpuContext& gpu, GpuKeyState& ks, GpuBlas& blas, float* data, int64_t numel,
                 const CompressorSpec& spec, const std::vector<powersgd::Part>& parts, KeyState* key, float* residual,
                 bool average, cudaStream_t stream)
      : op_(op), gpu_(gpu), ks_(ks), blas_(blas), data_(data), numel_(numel), parts_(parts), residual_(residual),
        average_(average), keep_(low_rank_shape(spec).warm_start && key != nullptr), stream_(stream) {}

  float* data() { return data_; }

  void check_key_q(const powersgd::Plan& plan) const {
    if (keep_ && ks_.q_floats != 0 && ks_.q_floats != plan.q_floats) {
      throw key_q_mismatch(ks_.q_floats, describe_parts(parts_), plan.q_floats);
    }
  }
  void fold_residual() {
    if (residual_ != nullptr) launch_reduce_inplace(data_, residual_, numel_, DType::kFloat32, ReduceOp::kSum, 1, stream_);
  }
  void allreduce(float* buf, int64_t numel, uint32_t) {
    if (op_.size() > 1) nccl_ring_allreduce(op_, gpu_, buf, numel, DType::kFloat32, ReduceOp::kSum, stream_);
  }

  // p_buf (and a Q drawn for this call alone) in the context's payload scratch; a
  // warm-start Q in the key's device state (its first allocation synchronizes).
  QPlace place_q(const powersgd::Plan& plan) {
    const size_t p_bytes = static_cast<size_t>(plan.p_floats + plan.dense_floats) * sizeof(float);
    const size_t q_bytes = static_cast<size_t>(plan.q_floats) * sizeof(float);
    auto* scratch = gpu_.payload_scratch(round_up(p_bytes) + (keep_ ? 0 : q_bytes)).as<uint8_t>();
    QPlace at{reinterpret_cast<float*>(scratch), reinterpret_cast<float*>(scratch + round_up(p_bytes)), !keep_};
    if (keep_) {
      if (ks_.q_floats == 0) {  // the key's first compressed step
        ks_.q.reserve(q_bytes);
        ks_.q_floats = plan.q_floats;
        at.draw = true;
      }
      at.q = ks_.q.as<float>();
    }
    return at;
  }
  void draw_q(float* q, int64_t floats, const PhiloxStream& s) { gpu_powersgd_draw_q(q, floats, s, stream_); }
  void orthonormalize(const powersgd::Plan& plan, float* buf, Factor factor) {
    gpu_powersgd_orthonormalize(plan, buf, factor, stream_);
  }
  void project(const powersgd::Plan& plan, const float* q, float* p_buf) {
    gpu_powersgd_project(blas_, plan, data_, q, p_buf, stream_);
  }
  void project_back(const powersgd::Plan& plan, const float* p_buf, float* q) {
    gpu_powersgd_project_back(blas_, plan, data_, p_buf, q, stream_);
  }
  void reconstruct(const powersgd::Plan& plan, const float* p_buf, const float* q) {
    gpu_powersgd_reconstruct(plan, p_buf, q, op_.size(), average_, data_, residual_, stream_);
  }

 private:
  Op& op_;
  GpuContext& gpu_;
  GpuKeyState& ks_;
  GpuBlas& blas_;
  float* data_;
  int64_t numel_;
  const std::vector<powersgd::Part>& parts_;
  float* residual_;
  bool average_;
  bool keep_;
  cudaStream_t stream_;
};

}  // namespace

void nccl_powersgd_allreduce(Op& op, GpuContext& gpu, GpuKeyState& ks, GpuBlas& blas, float* data, int64_t numel,
                             ReduceOp reduce_op, const CompressorSpec& spec, const std::vector<powersgd::Part>& parts,
                             KeyState* key, uint64_t key_hash, float* residual, cudaStream_t stream) {
  const LowRankShape shape = low_rank_shape(spec);
  const powersgd::Plan plan = powersgd::make_call_plan(parts, numel, shape.rank, shape.min_compression_rate);
  DevicePowerSgd x(op, gpu, ks, blas, data, numel, spec, parts, key, residual, reduce_op == ReduceOp::kAvg, stream);
  powersgd_steps(x, plan, numel, spec, key_hash, key != nullptr ? key->step : 0);
}

}  // namespace gradcomm::detail
