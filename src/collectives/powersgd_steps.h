// PowerSGD's call, once for both paths (Vogels et al., 2019; the arithmetic of each
// step is compressors/lowrank/powersgd_logic.h): two dense allreduces per call, one of
// every matrix's P with the call's dense parts behind them, one of every matrix's Q,
// whatever the number of matrices. The host primitives are powersgd_allreduce.cc's, the
// device ones (cuBLAS and kernels, enqueued on the caller's stream)
// nccl_powersgd_allreduce.cc's; so both run the same step in the same order:
//
//   acc = data + residual                      (error feedback on)
//   all dense: allreduce acc in place          (no P buffer; each dense part's p_offset
//                                               is then its offset in the tensor)
//   Q: the key's (warm start) or drawn now from the shared Philox stream
//      philox_stream_id(key, warm_start ? 0 : step, -1), then orthonormalized
//   p_buf = [M_i Q_i .., dense parts]
//   allreduce p_buf (sum)
//   orthonormalize each P_i; Q_i = M_i^T P_i
//   allreduce the Qs (sum)
//   data = P_i Q_i^T (/N), dense parts (/N); residual = acc - P_i Q_i^T / N, 0 where dense
//
// Every rank ends bitwise identical: the allreduces hand every rank the same sums, and
// what reads them is deterministic. The paths differ only in the summation order of
// the products (cuBLAS and OpenBLAS; the tolerance is in compressors/lowrank/gpu_powersgd.h).
//
// Primitives (`x`):
//   void check_key_q(const Plan&)             InvalidArgument when the key's Q has another size
//   void fold_residual()                      acc = data + residual, when error feedback is on
//   float* data()
//   void allreduce(float* buf, int64_t n, uint32_t unit_base)   sum over the ranks
//   QPlace place_q(const Plan&)               the P buffer and Q, and whether Q is drawn now
//   void draw_q(float* q, int64_t n, const PhiloxStream&)
//   void orthonormalize(const Plan&, float* buf, Factor)
//   void project(const Plan&, const float* q, float* p_buf)
//   void project_back(const Plan&, const float* p_buf, float* q)
//   void reconstruct(const Plan&, const float* p_buf, const float* q)   (q null: all dense)
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "collectives/collectives.h"  // kSecondPhaseUnits
#include "compressors/philox.h"
#include "compressors/family.h"
#include "compressors/lowrank/lowrank.h"
#include "compressors/lowrank/powersgd_logic.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {

// What a low-rank family's spec asks for (Family::low_rank).
inline LowRankShape low_rank_shape(const CompressorSpec& spec) { return family_of(spec.id).low_rank(spec); }

// A warm-start key's Q was sized by other shapes: what both paths' check_key_q throw.
inline InvalidArgument key_q_mismatch(int64_t held_floats, const std::string& shapes, int64_t needed_floats) {
  return InvalidArgument(fmt::format(
      "powersgd: key's Q holds {} floats but this call's shapes ({}) need {}: a key's shapes must not change",
      held_floats, shapes, needed_floats));
}

struct QPlace {
  float* p_buf = nullptr;
  float* q = nullptr;
  bool draw = false;
};

template <class Primitives>
void powersgd_steps(Primitives& x, const powersgd::Plan& plan, int64_t numel, const CompressorSpec& spec,
                    uint64_t key_hash, uint64_t step) {
  x.check_key_q(plan);  // before anything runs
  x.fold_residual();
  if (plan.matrices == 0) {  // all dense: the exact sum, in place
    x.allreduce(x.data(), numel, 0);
    x.reconstruct(plan, x.data(), nullptr);
    return;
  }
  const QPlace at = x.place_q(plan);
  if (at.draw) {
    x.draw_q(at.q, plan.q_floats, PhiloxStream{spec.seed, philox_stream_id(key_hash, low_rank_shape(spec).warm_start ? 0 : step, -1)});
    x.orthonormalize(plan, at.q, Factor::kQ);
  }
  x.project(plan, at.q, at.p_buf);
  x.allreduce(at.p_buf, plan.p_floats + plan.dense_floats, 0);
  x.orthonormalize(plan, at.p_buf, Factor::kP);
  x.project_back(plan, at.p_buf, at.q);
  x.allreduce(at.q, plan.q_floats, kSecondPhaseUnits);
  x.reconstruct(plan, at.p_buf, at.q);
}

}  // namespace gradcomm::detail
