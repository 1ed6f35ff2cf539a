// PowerSGD on the CPU (the step is written out in compressors/powersgd/powersgd_logic.h):
// two dense allreduces per call, one of every matrix's P (with the call's dense parts
// behind them) and one of every matrix's Q, whatever the number of matrices.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "compression.h"
#include "compressors/powersgd/powersgd.h"
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

}  // namespace

void powersgd_allreduce(Op& op, float* data, int64_t numel, ReduceOp reduce_op, const CompressorSpec& spec,
                        const std::vector<powersgd::Part>& parts, KeyState* key, uint64_t key_hash, float* residual) {
  using powersgd::Entry;
  const int n = op.size();
  const bool average = reduce_op == ReduceOp::kAvg;
  const powersgd::Plan plan = powersgd::make_call_plan(parts, numel, spec.rank, spec.min_compression_rate);
  const uint64_t step = key != nullptr ? key->step : 0;

  std::vector<float> pbuf(static_cast<size_t>(plan.p_floats + plan.dense_floats));
  std::vector<float> fresh_q;
  float* q = nullptr;
  {
    Op::PhaseTimer timer(op, &Stats::encode_s);
    if (residual != nullptr) reduce_inplace(data, residual, numel, DType::kFloat32, ReduceOp::kSum);  // acc

    // Q: the key's, kept from the last step (warm start), or drawn now.
    const size_t q_bytes = static_cast<size_t>(plan.q_floats) * sizeof(float);
    const bool keep = spec.warm_start && key != nullptr;
    bool draw = !keep;
    if (keep) {
      if (key->extra.empty()) {
        key->extra.resize(q_bytes);
        draw = true;
      } else if (key->extra.size() != q_bytes) {
        throw InvalidArgument(fmt::format(
            "powersgd: key's Q holds {} floats but this call's shapes ({}) need {}: a key's shapes must not change",
            key->extra.size() / sizeof(float), describe_parts(parts), plan.q_floats));
      }
      q = reinterpret_cast<float*>(key->extra.data());
    } else {
      fresh_q.resize(static_cast<size_t>(plan.q_floats));
      q = fresh_q.data();
    }
    if (draw) {
      const PhiloxStream s{spec.seed, philox_stream_id(key_hash, spec.warm_start ? 0 : step, -1)};
      powersgd::draw_initial_q(q, plan.q_floats, s);
      for (const Entry& e : plan.entries) {
        if (e.rank > 0) powersgd::orthonormalize(q + e.q_offset, e.cols, e.rank);
      }
    }
    for (const Entry& e : plan.entries) {
      float* m = data + e.offset;
      if (e.rank > 0) {
        powersgd::multiply(m, e.rows, e.cols, q + e.q_offset, e.rank, pbuf.data() + e.p_offset);
      } else {
        std::memcpy(pbuf.data() + e.p_offset, m, static_cast<size_t>(e.numel) * sizeof(float));
      }
    }
  }
  payload_allreduce(op, pbuf.data(), static_cast<int64_t>(pbuf.size()), 0);

  if (plan.matrices > 0) {
    {
      Op::PhaseTimer timer(op, &Stats::encode_s);
      for (const Entry& e : plan.entries) {
        if (e.rank == 0) continue;
        float* p = pbuf.data() + e.p_offset;
        powersgd::orthonormalize(p, e.rows, e.rank);
        powersgd::multiply_transposed(data + e.offset, e.rows, e.cols, p, e.rank, q + e.q_offset);
      }
    }
    payload_allreduce(op, q, plan.q_floats, kSecondPhaseUnits);
  }

  Op::PhaseTimer timer(op, &Stats::decode_s);
  for (const Entry& e : plan.entries) {
    float* m = data + e.offset;
    float* res = residual != nullptr ? residual + e.offset : nullptr;
    if (e.rank > 0) {
      powersgd::reconstruct(pbuf.data() + e.p_offset, q + e.q_offset, e.rows, e.cols, e.rank, n, average, m, res);
      continue;
    }
    const float* sum = pbuf.data() + e.p_offset;
    if (average) {
      const auto fn = static_cast<float>(n);
      for (int64_t i = 0; i < e.numel; ++i) m[i] = sum[i] / fn;
    } else {
      std::memcpy(m, sum, static_cast<size_t>(e.numel) * sizeof(float));
    }
    if (res != nullptr) std::fill(res, res + e.numel, 0.0f);  // sent exactly: nothing left over
  }
}

}  // namespace gradcomm::detail
