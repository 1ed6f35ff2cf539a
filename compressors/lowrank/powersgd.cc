#include "compressors/lowrank/powersgd.h"

#include <cblas.h>

#include <cmath>
#include <vector>

namespace gradcomm::detail::powersgd {

void multiply(const float* m, int64_t rows, int64_t cols, const float* q, int r, float* p) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), r, static_cast<int>(cols),
              1.0f, m, static_cast<int>(cols), q, r, 0.0f, p, r);
}

void multiply_transposed(const float* m, int64_t rows, int64_t cols, const float* p, int r, float* q) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(cols), r, static_cast<int>(rows),
              1.0f, m, static_cast<int>(cols), p, r, 0.0f, q, r);
}

namespace {
double column_norm(const float* a, int64_t rows, int r, int j) {
  double norm2 = 0;
  for (int64_t i = 0; i < rows; ++i) norm2 += static_cast<double>(a[i * r + j]) * a[i * r + j];
  return std::sqrt(norm2);
}
}  // namespace

void orthonormalize(float* a, int64_t rows, int r) {
  std::vector<double> before(static_cast<size_t>(r));
  for (int j = 0; j < r; ++j) before[static_cast<size_t>(j)] = column_norm(a, rows, r, j);
  for (int j = 0; j < r; ++j) {
    const double norm = column_norm(a, rows, r, j);
    if (only_rounding_left(norm, before[static_cast<size_t>(j)])) {  // no new direction: drop it
      for (int64_t i = 0; i < rows; ++i) a[i * r + j] = 0.0f;
      continue;
    }
    const float scale = 1.0f / (static_cast<float>(norm) + kEpsilon);
    for (int64_t i = 0; i < rows; ++i) a[i * r + j] *= scale;
    for (int k = j + 1; k < r; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += static_cast<double>(a[i * r + j]) * a[i * r + k];
      const auto d = static_cast<float>(dot);
      for (int64_t i = 0; i < rows; ++i) a[i * r + k] -= d * a[i * r + j];
    }
  }
}

void reconstruct(const float* p, const float* q, int64_t rows, int64_t cols, int r, int n, bool average,
                 float* acc, float* residual) {
  // q^T (r x cols), so the inner loop runs over contiguous columns.
  std::vector<float> qt(static_cast<size_t>(r) * static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    for (int l = 0; l < r; ++l) qt[static_cast<size_t>(l * cols + j)] = q[j * r + l];
  }
  std::vector<float> row(static_cast<size_t>(cols));
  float* s = row.data();
  const auto fn = static_cast<float>(n);
  for (int64_t i = 0; i < rows; ++i) {
    const float* pi = p + i * r;
    const float* q0 = qt.data();
    for (int64_t j = 0; j < cols; ++j) s[j] = pi[0] * q0[j];
    for (int l = 1; l < r; ++l) {
      const float* ql = qt.data() + static_cast<size_t>(l) * static_cast<size_t>(cols);
      const float pl = pi[l];
      for (int64_t j = 0; j < cols; ++j) s[j] += pl * ql[j];
    }
    float* out = acc + i * cols;
    if (residual != nullptr) {
      float* res = residual + i * cols;
      for (int64_t j = 0; j < cols; ++j) res[j] = out[j] - s[j] / fn;
    }
    if (average) {
      for (int64_t j = 0; j < cols; ++j) out[j] = s[j] / fn;
    } else {
      for (int64_t j = 0; j < cols; ++j) out[j] = s[j];
    }
  }
}

void draw_initial_q(float* q, int64_t floats, const PhiloxStream& s) {
  for (int64_t e = 0; e < floats; ++e) q[e] = initial_q(s, static_cast<uint64_t>(e));
}

}  // namespace gradcomm::detail::powersgd
