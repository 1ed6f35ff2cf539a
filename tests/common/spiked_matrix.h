// Test gradients for PowerSGD with a stable rank-3 subspace: singular values 4, 2, 1
// well apart, plus small noise, so CPU and GPU engines pick the same subspace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradcomm::testing {

// Appends the rows x cols matrix (row-major) noise + sum_l sigma_l u_l v_l^T to g, with
// u (rows x 3), v (cols x 3) and noise (rows x cols) row-major and sigma = {4, 2, 1}.
inline void append_spiked(std::vector<float>& g, int64_t rows, int64_t cols, const std::vector<float>& u,
                          const std::vector<float>& v, const std::vector<float>& noise) {
  const float sigma[3] = {4.0f, 2.0f, 1.0f};
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      float x = noise[static_cast<size_t>(i * cols + j)];
      for (int l = 0; l < 3; ++l) x += sigma[l] * u[static_cast<size_t>(i * 3 + l)] * v[static_cast<size_t>(j * 3 + l)];
      g.push_back(x);
    }
  }
}

}  // namespace gradcomm::testing
