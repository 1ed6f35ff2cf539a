// Random-k indices on the GPU (gpu_sparse.h: gpu_randomk_indices): the same set as
// randomk_indices() (Floyd's algorithm, randomk.cc) without its sequential loop.
// randomk_logic.h proves the parallel form; here, for base = n - k:
//
//   draw      (k threads)   t_d = Lemire(u64 draw d, j + 1); a rejected draw gets
//                           t_d = kRejected and its d is listed for the fix-up
//   fix-up    (one thread)  the listed draws, in increasing d, take spare draws k,
//                           k+1, ... exactly as the CPU's retry loop does. Rejection
//                           has probability < 2^-31 per draw for n < 2^33, so the
//                           list is almost always empty; past kRejectList entries the
//                           thread scans every d in order instead (same result).
//   sort      (CUB)         (t_d, d) pairs by t, stable: equal draws adjacent, the
//                           earliest first
//   dup       (k threads)   dup_d = "an earlier d drew the same t"
//   insert    (k threads)   v_d = c_d ? base + d : t_d, c_d by walking the chain
//   sort      (CUB)         the k distinct v_d ascending = randomk_indices()
//
// Cost for k draws: two radix sorts of k 64-bit keys (over bit_width(n) bits) and
// a few passes over k-element arrays; no O(n) work and nothing on the host.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <bit>
#include <sstream>

#include "compressors/randomk/randomk_logic.h"
#include "compressors/randomk/gpu_randomk.h"
#include "cuda/check.h"
#include "cuda/grid.cuh"
#include "cuda/device.h"
#include "compressors/sparse/radix_select.cuh"  // SelectState: the workspace's count lives in it
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;
constexpr uint64_t kRejected = ~uint64_t{0};  // never a value of t (t < n <= 2^63)
constexpr int64_t kRejectList = 4096;

// rejected[0] is the list length (atomic), rejected[1 ..] the listed draws.
__global__ void draw_kernel(uint64_t base, int64_t k, PhiloxStream rng, uint64_t* t, uint32_t* order,
                            unsigned long long* rejected) {
  for (int64_t d = first_thread(); d < k; d += thread_stride()) {
    uint64_t v = 0;
    if (!randomk::lemire_map(randomk::draw_bits64(rng, static_cast<uint64_t>(d)), base + static_cast<uint64_t>(d) + 1, &v)) {
      v = kRejected;
      const unsigned long long at = atomicAdd(&rejected[0], 1ull);
      if (at < static_cast<unsigned long long>(kRejectList)) rejected[1 + at] = static_cast<unsigned long long>(d);
    }
    t[d] = v;
    order[d] = static_cast<uint32_t>(d);
  }
}

// One thread: rejected draws in increasing d take the spare draws k, k+1, ...
__global__ void __launch_bounds__(1) fixup_kernel(uint64_t base, int64_t k, PhiloxStream rng, uint64_t* t,
                                                  unsigned long long* rejected) {
  const unsigned long long listed = rejected[0];
  if (listed == 0) return;
  uint64_t spare = static_cast<uint64_t>(k);
  auto redraw = [&](uint64_t d) {
    uint64_t v = 0;
    while (!randomk::lemire_map(randomk::draw_bits64(rng, spare++), base + d + 1, &v)) {
    }
    t[d] = v;
  };
  if (listed <= static_cast<unsigned long long>(kRejectList)) {
    unsigned long long* list = rejected + 1;
    for (unsigned long long a = 1; a < listed; ++a) {  // insertion sort: the list is tiny
      const unsigned long long x = list[a];
      unsigned long long b = a;
      for (; b > 0 && list[b - 1] > x; --b) list[b] = list[b - 1];
      list[b] = x;
    }
    for (unsigned long long a = 0; a < listed; ++a) redraw(list[a]);
  } else {
    for (uint64_t d = 0; d < static_cast<uint64_t>(k); ++d) {
      if (t[d] == kRejected) redraw(d);
    }
  }
}

// Sorted pairs: position p repeats its predecessor's draw -> that draw is a dup.
__global__ void dup_kernel(const uint64_t* t_sorted, const uint32_t* order_sorted, int64_t k, uint8_t* dup) {
  for (int64_t p = first_thread(); p < k; p += thread_stride()) {
    dup[order_sorted[p]] = (p > 0 && t_sorted[p] == t_sorted[p - 1]) ? 1 : 0;
  }
}

__global__ void insert_kernel(uint64_t base, int64_t k, const uint64_t* t, const uint8_t* dup, uint64_t* v) {
  for (int64_t d = first_thread(); d < k; d += thread_stride()) {
    const auto ud = static_cast<uint64_t>(d);
    v[d] = randomk::floyd_collided(ud, base, dup, t) ? base + ud : t[d];
  }
}

__global__ void iota_kernel(int64_t n, uint64_t* out) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) out[i] = static_cast<uint64_t>(i);
}

__global__ void __launch_bounds__(1) set_count_kernel(SelectState* s, unsigned long long count) { s->count = count; }

}  // namespace

void gpu_randomk_indices(int64_t n, int64_t k, const PhiloxStream& rng, GpuSparseWorkspace& ws, cudaStream_t stream) {
  if (n < 0 || k < 0) throw_invalid("gpu_randomk_indices: n = ", n, " and k = ", k, " must be >= 0");
  const int64_t count = std::min(k, n);
  if (count > int64_t{0xFFFFFFFF}) {
    throw_invalid("gpu_randomk_indices: k = ", count, " exceeds the 2^32 - 1 draws the GPU path sorts");
  }
  ws.state_.reserve(2 * sizeof(SelectState));
  ws.indices_.reserve(static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(uint64_t));
  ws.capacity_ = count;
  set_count_kernel<<<1, 1, 0, stream>>>(ws.state_.as<SelectState>(), static_cast<unsigned long long>(count));
  GRADCOMM_CUDA_CHECK_LAUNCH();
  if (count == 0) return;
  if (k >= n) {
    iota_kernel<<<grid_for(n, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(n, ws.indices_.as<uint64_t>());
    GRADCOMM_CUDA_CHECK_LAUNCH();
    return;
  }

  const auto un = static_cast<uint64_t>(n);
  const uint64_t base = un - static_cast<uint64_t>(k);
  const int end_bit = std::max(1, static_cast<int>(std::bit_width(un - 1)));  // every t and v is < n
  const auto uk = static_cast<size_t>(k);
  ws.draws_.reserve(uk * sizeof(uint64_t));
  ws.draws_sorted_.reserve(uk * sizeof(uint64_t));
  ws.order_.reserve(uk * sizeof(uint32_t));
  ws.order_sorted_.reserve(uk * sizeof(uint32_t));
  ws.dup_.reserve(uk);
  ws.rejected_.reserve((1 + kRejectList) * sizeof(unsigned long long));
  // The inserted values reuse draws_sorted_ once the dup flags are out of it.
  auto* t = ws.draws_.as<uint64_t>();
  auto* t_sorted = ws.draws_sorted_.as<uint64_t>();
  auto* order = ws.order_.as<uint32_t>();
  auto* order_sorted = ws.order_sorted_.as<uint32_t>();
  auto* dup = ws.dup_.as<uint8_t>();
  auto* rejected = ws.rejected_.as<unsigned long long>();
  auto* out = ws.indices_.as<uint64_t>();

  size_t pair_bytes = 0, key_bytes = 0;
  GRADCOMM_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, pair_bytes, t, t_sorted, order, order_sorted, k, 0, end_bit, stream));
  GRADCOMM_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, key_bytes, t_sorted, out, k, 0, end_bit, stream));
  ws.cub_temp_.reserve(std::max<size_t>({pair_bytes, key_bytes, 1}));

  GRADCOMM_CUDA_CHECK(cudaMemsetAsync(rejected, 0, sizeof(unsigned long long), stream));
  const unsigned grid = grid_for(k, kThreads, kBlocksPerSm);
  draw_kernel<<<grid, kThreads, 0, stream>>>(base, k, rng, t, order, rejected);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  fixup_kernel<<<1, 1, 0, stream>>>(base, k, rng, t, rejected);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  size_t bytes = ws.cub_temp_.size();
  GRADCOMM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws.cub_temp_.data(), bytes, t, t_sorted, order, order_sorted, k,
                                                      0, end_bit, stream));
  dup_kernel<<<grid, kThreads, 0, stream>>>(t_sorted, order_sorted, k, dup);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  uint64_t* v = t_sorted;  // free again: dup holds what we needed from the sorted pairs
  insert_kernel<<<grid, kThreads, 0, stream>>>(base, k, t, dup, v);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  bytes = ws.cub_temp_.size();
  GRADCOMM_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(ws.cub_temp_.data(), bytes, v, out, k, 0, end_bit, stream));
}

}  // namespace gradcomm::detail
