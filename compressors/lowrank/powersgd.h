// PowerSGD's CPU arithmetic (the rules are powersgd_logic.h's). Matrices are fp32,
// row-major. The two products against the gradient go through OpenBLAS; the
// reconstruction, whose result every rank must hold bit for bit, is a loop with a
// fixed summation order (it does not depend on which BLAS kernel a CPU selects).
#pragma once

#include <cstdint>

#include "compressors/philox.h"
#include "compressors/lowrank/powersgd_logic.h"

namespace gradcomm::detail::powersgd {

// p (rows x r) = m (rows x cols) * q (cols x r).
void multiply(const float* m, int64_t rows, int64_t cols, const float* q, int r, float* p);
// q (cols x r) = m^T (cols x rows) * p (rows x r).
void multiply_transposed(const float* m, int64_t rows, int64_t cols, const float* p, int r, float* q);

// Orthonormalizes the r columns of a (rows x r) in place: modified Gram-Schmidt
// with torch's epsilon, and columns of rounding error zeroed (powersgd_logic.h).
// Norms and dot products accumulate in double, in row order: deterministic for a
// given input.
void orthonormalize(float* a, int64_t rows, int r);

// acc holds this rank's rows x cols matrix (grad + residual) and receives the result:
// s = (p q^T)[i][j], summed over the r columns in order; acc = average ? s / n : s.
// When residual is not null it becomes acc_before - s / n (this rank's share).
void reconstruct(const float* p, const float* q, int64_t rows, int64_t cols, int r, int n, bool average,
                 float* acc, float* residual);

// The first Q: `floats` elements of stream s (initial_q), before orthonormalizing.
void draw_initial_q(float* q, int64_t floats, const PhiloxStream& s);

}  // namespace gradcomm::detail::powersgd
