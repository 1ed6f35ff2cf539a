// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019): the rules both paths
// (CPU: powersgd.cc; CUDA: gpu_powersgd.cu) follow, so they choose the same
// matrices, ranks, buffer offsets and initial Q. GRADCOMM_HD where a kernel needs it.
//
// Which tensors are matrices (torch's powerSGD_hook rules). A call's tensor is one
// tensor of the given shape, or several laid end to end (a DDP bucket). Each part:
//  - with fewer than 2 dimensions goes dense (biases, norms);
//  - otherwise is viewed as rows = shape[0] by cols = numel / rows (row-major), with
//    rank r = min(spec rank, rows, cols), and is compressed only when
//    (rows + cols) * r * min_compression_rate < rows * cols; otherwise dense.
// A call with no shape at all is one 1-D tensor: all dense.
//
// One step for a call (every rank, in this order):
//   acc = grad + residual                        (error feedback, when on)
//   P_i = M_i Q_i for each matrix i; one allreduce of [P_1 .. P_m, dense parts]
//   orthonormalize each P_i's columns (Gram-Schmidt, below)
//   Q_i = M_i^T P_i; one allreduce of [Q_1 .. Q_m]
//   out_i = P_i Q_i^T (divided by N for avg); dense parts: their sum (or mean)
//   residual_i = acc_i - P_i Q_i^T / N           (this rank's share of what was sent)
// Q_i is kept (the summed one) as the next step's start when warm_start=1. The first
// Q (and every Q when warm_start=0) is drawn from Philox: element e of the call's Q
// buffer is uniform_from_bits(philox_bits(s, e)) - 0.5 with s = (seed,
// philox_stream_id(key, warm_start ? 0 : step, -1)), the same on every rank and
// device, then orthonormalized. (torch draws normals; the distribution does not
// matter once the columns are orthonormalized, exactness across devices does.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "compressors/philox.h"
#include "compressors/tensor_part.h"
#include "half.h"  // GRADCOMM_HD

namespace gradcomm::detail::powersgd {

// Gram-Schmidt (orthonormalize in powersgd.h, and the CUDA kernel): for j = 0..r-1,
// column j, already made orthogonal to columns 0..j-1, is divided by its norm +
// kEpsilon (torch's orthogonalization_epsilon safeguard: a zero column stays zero
// instead of becoming NaN), then its projection is removed from columns j+1..r-1.
// One step beyond torch: a column whose norm fell below kRankTolerance times its
// norm before any projection was removed is set to zero instead. It held no new
// direction, only rounding error (the matrix has rank < r: a sum of few rank-one
// gradients, a tiny layer); normalized, that error would be a random unit vector
// outside the matrix's span, and P P^T M would add garbage to the result. A zero
// column adds nothing. Every rank holds the same P, so every rank zeroes the same columns.
inline constexpr int kMaxRank = 1024;  // the largest rank a spec may ask for (registry.cc)
inline constexpr float kEpsilon = 1e-8f;
inline constexpr double kRankTolerance = 1e-4;

// Whether column j, once orthogonal to the columns before it, holds only rounding
// error: its norm `now` against its norm `before` any projection was removed.
GRADCOMM_HD bool only_rounding_left(double now, double before) { return now <= kRankTolerance * before; }

// One part of a call's tensor, as the caller described it (compressors/tensor_part.h):
// `rows` = shape[0] for a tensor of 2 or more dimensions, 0 for one of fewer.
using Part = TensorPart;

// Where one part goes in a step: a matrix (rank > 0) or dense (rank == 0).
struct Entry {
  int64_t offset = 0;  // in the call's tensor
  int64_t numel = 0;
  int64_t rows = 0, cols = 0;
  int rank = 0;
  int64_t p_offset = 0;  // floats into the P buffer (matrices) or the dense block after the Ps
  int64_t q_offset = 0;  // floats into the Q buffer (matrices)
};

// The rank a part of rows x cols is compressed at under the spec, 0 when it goes dense.
inline int matrix_rank(int64_t rows, int64_t cols, int spec_rank, double min_compression_rate) {
  // BLAS takes int dimensions: a larger matrix goes dense.
  if (rows < 2 || cols < 1 || rows > INT32_MAX || cols > INT32_MAX) return 0;
  const int64_t r = std::min<int64_t>(spec_rank, std::min(rows, cols));
  const double compressed = static_cast<double>(rows + cols) * static_cast<double>(r) * min_compression_rate;
  return compressed < static_cast<double>(rows) * static_cast<double>(cols) ? static_cast<int>(r) : 0;
}

struct Plan {
  std::vector<Entry> entries;
  int64_t p_floats = 0;      // sum of rows * rank over the matrices
  int64_t dense_floats = 0;  // sum of numel over the dense parts (after the Ps in one buffer)
  int64_t q_floats = 0;      // sum of cols * rank over the matrices
  int matrices = 0;
};

// The plan for a call's parts (their numels sum to the tensor's).
inline Plan make_plan(const std::vector<Part>& parts, int spec_rank, double min_compression_rate) {
  Plan plan;
  int64_t offset = 0;
  for (const Part& part : parts) {
    Entry e;
    e.offset = offset;
    e.numel = part.numel;
    if (part.rows >= 2 && part.numel > 0 && part.numel % part.rows == 0) {
      e.rows = part.rows;
      e.cols = part.numel / part.rows;
      e.rank = matrix_rank(e.rows, e.cols, spec_rank, min_compression_rate);
    }
    if (e.rank > 0) {
      e.p_offset = plan.p_floats;
      e.q_offset = plan.q_floats;
      plan.p_floats += e.rows * e.rank;
      plan.q_floats += e.cols * e.rank;
      ++plan.matrices;
    }
    plan.entries.push_back(e);
    offset += part.numel;
  }
  for (Entry& e : plan.entries) {
    if (e.rank == 0) {
      e.p_offset = plan.p_floats + plan.dense_floats;
      plan.dense_floats += e.numel;
    }
  }
  return plan;
}

// The plan of a call on `numel` elements with the caller's parts (none: one 1-D part).
inline Plan make_call_plan(const std::vector<Part>& parts, int64_t numel, int spec_rank, double min_compression_rate) {
  return make_plan(parts.empty() ? std::vector<Part>{{numel, 0}} : parts, spec_rank, min_compression_rate);
}

// Element e of the initial Q buffer: uniform in [-0.5, 0.5), exact in fp32.
GRADCOMM_HD float initial_q(const PhiloxStream& s, uint64_t e) { return uniform_from_bits(philox_bits(s, e)) - 0.5f; }

}  // namespace gradcomm::detail::powersgd

namespace gradcomm::detail {

// Which factor of every matrix a per-matrix pass works on: P (rows x rank, at p_offset in
// the P buffer) or Q (cols x rank, at q_offset in the Q buffer).
enum class Factor : uint8_t { kP, kQ };

}  // namespace gradcomm::detail
