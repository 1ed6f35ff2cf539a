// sketch: a rows x cols count-sketch of acc summed densely; the heavy hitters it
// recovers are the same on every rank, and their exact values are then summed as
// random-k's are.
#pragma once

#include <algorithm>
#include <cstdint>

#include "compressors/philox.h"
#include "compressors/family_params.h"

namespace gradcomm::detail {

struct SketchParams final : FamilyParams {
  static constexpr const char* kName = "sketch's keys";
  int rows = 5;
  int cols = 0;        // 0: from k at use (sketch_columns)
  double ratio = 0.0;  // heavy hitters to recover: exactly one of ratio / k
  int64_t k = 0;
};

// Count-sketch width: cols, or when the spec leaves it to us a few columns per heavy
// hitter (4k, within [16, 2^26]).
inline int sketch_columns(const SketchParams& p, int64_t k) {
  return p.cols > 0 ? p.cols : static_cast<int>(std::clamp<int64_t>(4 * k, 16, int64_t{1} << 26));
}

// rows x cols table; row r hashes element i to a column and a sign drawn from
// `rng` (shared by all ranks), so tables of different ranks are summable.
class CountSketch {
 public:
  CountSketch(int rows, int cols, const PhiloxStream& rng);
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  // table[r * cols + h_r(i)] += s_r(i) * x[i] for all i in [0, n); table not cleared.
  void accumulate(const float* x, int64_t n, float* table) const;
  // estimate[i] = median over rows of s_r(i) * table[r * cols + h_r(i)].
  void estimate(const float* table, int64_t n, float* estimate) const;

 private:
  int rows_, cols_;
  PhiloxStream rng_;
};

}  // namespace gradcomm::detail
