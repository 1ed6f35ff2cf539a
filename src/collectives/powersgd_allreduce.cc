// PowerSGD on the CPU: the call of powersgd_steps.h over host primitives (OpenBLAS
// products, the dense allreduces below).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/powersgd_steps.h"
#include "compression.h"
#include "compressors/lowrank/powersgd.h"
#include "gradcomm/errors.h"
#include "op.h"
#include "reduce.h"
#include "shape.h"

namespace gradcomm::detail {
namespace {

// P and Q are small (kilobytes to a few MB), so the dense path would take recursive
// doubling: log2(N) exchanges of the whole buffer, 2x its size on the wire at N = 4
// where the ring and halving + doubling send 1.5x, the bandwidth optimum. PowerSGD
// exists to save bytes, and its users compare them with torch's hook; so from
// kMinHalvingBytes up its buffers take halving + doubling (the optimal bytes in
// 2 log2(N) messages). The price is log2(N) more messages per buffer; below 4 KiB the
// bytes are too few to matter and latency wins (the alpha-beta estimate and the
// trainer's bytes: bench/results/tuning-notes-2026-11-27.md#powersgd-min-halving-bytes).
constexpr int64_t kMinHalvingBytes = 4 << 10;

void payload_allreduce(Op& op, float* data, int64_t numel, uint32_t unit_base) {
  if (op.size() == 1 || numel == 0) return;
  if (op.size() > 2 && numel * static_cast<int64_t>(sizeof(float)) >= kMinHalvingBytes) {
    halving_doubling_allreduce(op, data, numel, DType::kFloat32, ReduceOp::kSum, unit_base);
  } else {
    dense_allreduce(op, data, numel, DType::kFloat32, ReduceOp::kSum, unit_base);
  }
}

// The host primitives of powersgd_steps.h: OpenBLAS products (powersgd.h), the dense
// allreduces above; encode time is the projections, decode time the reconstruction.
class HostPowerSgd {
 public:
  HostPowerSgd(Op& op, float* data, int64_t numel, const CompressorSpec& spec, const std::vector<powersgd::Part>& parts,
               KeyState* key, float* residual, bool average)
      : op_(op), data_(data), numel_(numel), parts_(parts), key_(key), residual_(residual), average_(average),
        keep_(low_rank_shape(spec).warm_start && key != nullptr) {}

  float* data() { return data_; }

  void check_key_q(const powersgd::Plan& plan) const {
    const size_t q_bytes = static_cast<size_t>(plan.q_floats) * sizeof(float);
    if (keep_ && !key_->extra.empty() && key_->extra.size() != q_bytes) {
      throw key_q_mismatch(static_cast<int64_t>(key_->extra.size() / sizeof(float)), describe_parts(parts_),
                           plan.q_floats);
    }
  }
  void fold_residual() {
    if (residual_ == nullptr) return;
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    reduce_inplace(data_, residual_, numel_, DType::kFloat32, ReduceOp::kSum);
  }
  void allreduce(float* buf, int64_t numel, uint32_t unit_base) { payload_allreduce(op_, buf, numel, unit_base); }

  // Q: the key's, kept from the last step (warm start; drawn at its first), or this call's.
  QPlace place_q(const powersgd::Plan& plan) {
    pbuf_.resize(static_cast<size_t>(plan.p_floats + plan.dense_floats));
    if (!keep_) {
      fresh_q_.resize(static_cast<size_t>(plan.q_floats));
      return {pbuf_.data(), fresh_q_.data(), true};
    }
    const bool first = key_->extra.empty();
    if (first) key_->extra.resize(static_cast<size_t>(plan.q_floats) * sizeof(float));
    return {pbuf_.data(), reinterpret_cast<float*>(key_->extra.data()), first};
  }
  void draw_q(float* q, int64_t floats, const PhiloxStream& s) {
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    powersgd::draw_initial_q(q, floats, s);
  }
  void orthonormalize(const powersgd::Plan& plan, float* buf, Factor factor) {
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    for (const powersgd::Entry& e : plan.entries) {
      if (e.rank == 0) continue;
      if (factor == Factor::kP) {
        powersgd::orthonormalize(buf + e.p_offset, e.rows, e.rank);
      } else {
        powersgd::orthonormalize(buf + e.q_offset, e.cols, e.rank);
      }
    }
  }
  void project(const powersgd::Plan& plan, const float* q, float* p_buf) {
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    for (const powersgd::Entry& e : plan.entries) {
      const float* m = data_ + e.offset;
      if (e.rank > 0) {
        powersgd::multiply(m, e.rows, e.cols, q + e.q_offset, e.rank, p_buf + e.p_offset);
      } else {
        std::memcpy(p_buf + e.p_offset, m, static_cast<size_t>(e.numel) * sizeof(float));
      }
    }
  }
  void project_back(const powersgd::Plan& plan, const float* p_buf, float* q) {
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    for (const powersgd::Entry& e : plan.entries) {
      if (e.rank > 0) {
        powersgd::multiply_transposed(data_ + e.offset, e.rows, e.cols, p_buf + e.p_offset, e.rank, q + e.q_offset);
      }
    }
  }
  void reconstruct(const powersgd::Plan& plan, const float* p_buf, const float* q) {
    Op::PhaseTimer timer(op_, &Stats::decode_s);
    const int n = op_.size();
    for (const powersgd::Entry& e : plan.entries) {
      float* m = data_ + e.offset;
      float* res = residual_ != nullptr ? residual_ + e.offset : nullptr;
      if (e.rank > 0) {
        powersgd::reconstruct(p_buf + e.p_offset, q + e.q_offset, e.rows, e.cols, e.rank, n, average_, m, res);
        continue;
      }
      const float* sum = p_buf + e.p_offset;  // the tensor itself when every part is dense
      if (average_) {
        const auto fn = static_cast<float>(n);
        for (int64_t i = 0; i < e.numel; ++i) m[i] = sum[i] / fn;
      } else if (sum != m) {
        std::memcpy(m, sum, static_cast<size_t>(e.numel) * sizeof(float));
      }
      if (res != nullptr) std::fill(res, res + e.numel, 0.0f);  // sent exactly: nothing left over
    }
  }

 private:
  Op& op_;
  float* data_;
  int64_t numel_;
  const std::vector<powersgd::Part>& parts_;
  KeyState* key_;
  float* residual_;
  bool average_;
  bool keep_;
  std::vector<float> pbuf_, fresh_q_;
};

}  // namespace

void powersgd_allreduce(Op& op, float* data, int64_t numel, ReduceOp reduce_op, const CompressorSpec& spec,
                        const std::vector<powersgd::Part>& parts, KeyState* key, uint64_t key_hash, float* residual) {
  const LowRankShape shape = low_rank_shape(spec);
  const powersgd::Plan plan = powersgd::make_call_plan(parts, numel, shape.rank, shape.min_compression_rate);
  HostPowerSgd x(op, data, numel, spec, parts, key, residual, reduce_op == ReduceOp::kAvg);
  powersgd_steps(x, plan, numel, spec, key_hash, key != nullptr ? key->step : 0);
}

}  // namespace gradcomm::detail
