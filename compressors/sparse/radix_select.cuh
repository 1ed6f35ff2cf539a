// Radix select and stable threshold compaction on the GPU: the building blocks of
// exact top-k (compressors/sparse/gpu_topk.cu) and of anything else that needs "the k
// largest 32-bit keys, ties to the lower index, in index order" without a sort.
// Device header (.cu files only). The arithmetic is compressors/sparse/topk_logic.h.
//
// Pipeline (every kernel stream-ordered, state in device memory, no host sync):
//   init            SelectState = {prefix 0, need k}
//   3 x (histogram, pick)
//                   histogram: per-block shared 2048-bin counts of the digit of every
//                   key matching the prefix, flushed with one global atomic per bin;
//                   pick (one block): the bucket holding the need-th largest key,
//                   by an exclusive scan of per-thread chunk sums; narrows the
//                   prefix, clears the histogram. Pass 1 also collects the keys of
//                   pass 0's bucket when it holds <= the candidate capacity, so pass
//                   2 reads only those.
//   tile count      per 4096-element tile: keys > T and keys == T
//   scan            exclusive scan of the tile counts (CUB)
//   tile scatter    per tile: block scan of per-thread counts; an element's output
//                   slot is compact_slot(...) (topk_logic.h); writes index and value,
//                   zeroes the residual.
// A SelectState can be told to `skip` (device flag): then every kernel of its
// pipeline returns at once. select=sample uses that to fall back to exact on the
// device only when its threshold's count is out of bounds.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>
#include <cstdint>
#include <type_traits>

#include "compressors/sparse/topk_logic.h"

namespace gradcomm::detail {

struct SelectState {
  uint32_t prefix;                 // key bits chosen so far
  uint32_t prefix_mask;            // which bits those are
  int64_t need;                    // rank of the target among keys matching the prefix
  unsigned long long candidates;   // keys collected by pass 1 (atomic counter)
  uint32_t collect;                // 1: pass 1 collects pass 0's bucket
  uint32_t skip;                   // 1: this pipeline has nothing to do
  uint32_t threshold;              // T after pass 2
  uint32_t pad;
  unsigned long long take_equal;   // keys == T to take (kTakeAllEqual: all)
  unsigned long long count;        // size of the final selection
};

struct TileCount {
  unsigned long long gt, eq;
};
struct TileCountSum {
  __host__ __device__ TileCount operator()(const TileCount& a, const TileCount& b) const {
    return TileCount{a.gt + b.gt, a.eq + b.eq};
  }
};

namespace radix {

constexpr int kHistThreads = 256;
constexpr int kTileThreads = 256;
constexpr int kTileItems = 16;
constexpr int64_t kTile = int64_t{kTileThreads} * kTileItems;  // 4096: gt, eq < 2^16 per tile
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// ---- key sources ------------------------------------------------------------------------
// acc[i] read as is.
struct AccKeys {
  const float* acc;
  __device__ __forceinline__ float value(int64_t i) const { return acc[i]; }
};
// acc = grad + residual, stored back into residual (error feedback fused into the first
// pass that reads the data). Each index is visited exactly once per pass.
struct FoldKeys {
  const float* grad;
  float* residual;
  __device__ __forceinline__ float value(int64_t i) const {
    const float a = __fadd_rn(grad[i], residual[i]);
    residual[i] = a;
    return a;
  }
};
// Precomputed keys (the select=sample sample).
struct RawKeys {
  const uint32_t* keys;
};

template <class Src>
__device__ __forceinline__ uint32_t key_at(const Src& src, int64_t i) {
  if constexpr (std::is_same_v<Src, RawKeys>) {
    return src.keys[i];
  } else {
    return topk::magnitude_key(src.value(i));
  }
}

// ---- kernels --------------------------------------------------------------------------
// Non-template kernels are static: this header is included by several .cu files.
static __global__ void __launch_bounds__(1) init_kernel(SelectState* s, int64_t need, unsigned long long count,
                                                 unsigned long long take_equal) {
  s->prefix = 0;
  s->prefix_mask = 0;
  s->need = need;
  s->candidates = 0;
  s->collect = 0;
  s->skip = 0;
  s->threshold = 0;
  s->take_equal = take_equal;
  s->count = count;
}

// Histogram of digit `pass` over the keys matching the prefix. Pass 2 reads the
// collected candidates instead of the input when pass 1 collected them; pass 1
// collects when told to (cand != null and s->collect). Warp loops run in lockstep
// (every lane of a warp makes the same iterations), so the warp intrinsics below see
// full warps; per-block counts are u32, the launcher keeps blocks below 2^31 keys.
template <class Src>
__global__ void __launch_bounds__(kHistThreads)
    histogram_kernel(Src src, int64_t n, int pass, SelectState* s, unsigned long long* hist, uint32_t* cand,
                     int64_t cand_capacity) {
  if (s->skip) return;  // uniform: written by an earlier kernel
  __shared__ uint32_t local[topk::kRadixBuckets];
  for (int b = threadIdx.x; b < topk::kRadixBuckets; b += blockDim.x) local[b] = 0;
  __syncthreads();

  const uint32_t prefix = s->prefix, mask = s->prefix_mask;
  const bool from_cand = pass == 2 && cand != nullptr && s->collect != 0;
  const bool collect = pass == 1 && cand != nullptr && s->collect != 0;
  const int64_t count = from_cand ? static_cast<int64_t>(s->candidates) : n;
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x - lane; i0 < count; i0 += stride) {
    const int64_t i = i0 + lane;
    bool match = false;
    uint32_t key = 0;
    if (i < count) {
      key = from_cand ? cand[i] : key_at(src, i);
      match = topk::prefix_matches(key, prefix, mask);
    }
    const unsigned matching = __ballot_sync(kFullMask, match);
    if (match) {
      // Lanes with the same digit add once (many equal keys, e.g. zeros, would
      // otherwise serialize on one shared counter).
      const uint32_t digit = topk::digit_of(key, pass);
      const unsigned peers = __match_any_sync(matching, digit);
      if (lane == __ffs(peers) - 1) atomicAdd(&local[digit], static_cast<uint32_t>(__popc(peers)));
    }
    if (collect && matching != 0) {
      unsigned long long base = 0;
      if (lane == 0) base = atomicAdd(&s->candidates, static_cast<unsigned long long>(__popc(matching)));
      base = __shfl_sync(kFullMask, base, 0);
      if (match) {
        const unsigned long long at = base + __popc(matching & ((1u << lane) - 1u));
        if (at < static_cast<unsigned long long>(cand_capacity)) cand[at] = key;
      }
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < topk::kRadixBuckets; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&hist[b], static_cast<unsigned long long>(local[b]));
  }
}

// One block of kPickThreads: finds the bucket of the need-th largest key (topk_logic.h
// pick_chunk_sum / pick_in_chunk), narrows the prefix, and clears the histogram.
// exact_ties: after the last pass take_equal = the rank inside T's bucket (exact
// top-k); otherwise it stays as initialised (select=sample takes every key == T).
static __global__ void __launch_bounds__(topk::kPickThreads)
    pick_kernel(int pass, SelectState* s, unsigned long long* hist, int64_t cand_capacity, bool exact_ties) {
  if (s->skip) return;
  using Scan = cub::BlockScan<unsigned long long, topk::kPickThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int t = threadIdx.x;
  const uint32_t top = topk::digit_top(pass);
  const int64_t need = s->need;  // read by every thread before the scan's barrier; written after it
  const unsigned long long sum = topk::pick_chunk_sum(hist, top, t);
  unsigned long long before = 0;
  Scan(scan_storage).ExclusiveSum(sum, before);
  __syncthreads();  // every thread has read s->need before the one below rewrites it
  uint32_t bucket = 0;
  int64_t inside = 0;
  if (topk::pick_in_chunk(hist, top, t, before, need, &bucket, &inside)) {  // exactly one thread
    const unsigned long long in_bucket = hist[bucket];
    s->prefix |= bucket << topk::digit_shift(pass);
    s->prefix_mask = topk::mask_after(pass);
    s->need = inside;
    if (pass == 0) s->collect = in_bucket <= static_cast<unsigned long long>(cand_capacity) ? 1u : 0u;
    if (pass == topk::kRadixPasses - 1) {
      s->threshold = s->prefix;
      if (exact_ties) s->take_equal = static_cast<unsigned long long>(inside);
    }
  }
  __syncthreads();  // every read of hist above happens before it is cleared
  for (int b = t; b < topk::kRadixBuckets; b += blockDim.x) hist[b] = 0;
}

// Per tile (one block): keys > T and == T. Skipped unless *run_flag == run_value.
template <class Src>
__global__ void __launch_bounds__(kTileThreads)
    tile_count_kernel(Src src, int64_t n, const SelectState* sel, const uint32_t* run_flag, uint32_t run_value,
                      TileCount* tiles) {
  if (*run_flag != run_value) return;
  using Scan = cub::BlockScan<uint32_t, kTileThreads>;  // used as a reduction of packed counts
  __shared__ typename Scan::TempStorage scan_storage;
  const uint32_t threshold = sel->threshold;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile;
  uint32_t gt = 0, eq = 0;
#pragma unroll
  for (int j = 0; j < kTileItems; ++j) {
    const int64_t i = base + j * kTileThreads + threadIdx.x;
    if (i < n) {
      const uint32_t key = key_at(src, i);
      gt += key > threshold;
      eq += key == threshold;
    }
  }
  uint32_t total = 0, ignored = 0;
  Scan(scan_storage).ExclusiveSum((gt << 16) | eq, ignored, total);
  if (threadIdx.x == 0) tiles[blockIdx.x] = TileCount{total >> 16, total & 0xFFFFu};
}

// After the scan: the selection size. Sample mode also decides here whether its
// result stands (lower <= count <= upper): then `accept` (the exact pipeline's
// state) is told to skip and takes the count.
static __global__ void __launch_bounds__(1)
    finalize_kernel(const TileCount* tiles, const TileCount* offsets, int64_t num_tiles, const SelectState* sel,
                    SelectState* accept, int64_t lower, int64_t upper) {
  const TileCount last = tiles[num_tiles - 1], before = offsets[num_tiles - 1];
  const unsigned long long count = topk::compact_count(before.gt + last.gt, before.eq + last.eq, sel->take_equal);
  if (count >= static_cast<unsigned long long>(lower) && count <= static_cast<unsigned long long>(upper)) {
    accept->skip = 1;
    accept->count = count;
  }
}

// Per tile (one block): the stable compaction. Keys are staged in shared memory
// (coalesced loads), each thread then owns 16 consecutive elements, and a block scan
// of packed (gt << 16 | eq) counts gives each thread's position in index order.
// Skipped unless *run_flag == run_value.
static __global__ void __launch_bounds__(kTileThreads)
    tile_scatter_kernel(const float* acc, int64_t n, const SelectState* sel, const uint32_t* run_flag,
                        uint32_t run_value, const TileCount* offsets, uint64_t* out_indices, float* out_values,
                        int64_t capacity, float* zero_in) {
  if (*run_flag != run_value) return;
  using Scan = cub::BlockScan<uint32_t, kTileThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ float staged[kTile + kTile / 32];  // +1 word per 32: conflict-free blocked reads
  auto slot_of = [](int64_t j) { return j + (j >> 5); };
  const uint32_t threshold = sel->threshold;
  const unsigned long long take_equal = sel->take_equal;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile;
#pragma unroll
  for (int j = 0; j < kTileItems; ++j) {
    const int64_t local = j * kTileThreads + threadIdx.x;
    if (base + local < n) staged[slot_of(local)] = acc[base + local];
  }
  __syncthreads();

  const int64_t first = static_cast<int64_t>(threadIdx.x) * kTileItems;  // this thread's items, in order
  uint32_t gt = 0, eq = 0;
  for (int j = 0; j < kTileItems && base + first + j < n; ++j) {
    const uint32_t key = topk::magnitude_key(staged[slot_of(first + j)]);
    gt += key > threshold;
    eq += key == threshold;
  }
  uint32_t packed_before = 0;
  Scan(scan_storage).ExclusiveSum((gt << 16) | eq, packed_before);
  const TileCount off = offsets[blockIdx.x];
  unsigned long long gt_before = off.gt + (packed_before >> 16);
  unsigned long long eq_before = off.eq + (packed_before & 0xFFFFu);
  for (int j = 0; j < kTileItems && base + first + j < n; ++j) {
    const float v = staged[slot_of(first + j)];
    const uint32_t key = topk::magnitude_key(v);
    const int64_t slot = topk::compact_slot(key, threshold, take_equal, gt_before, eq_before);
    if (slot >= 0 && slot < capacity) {
      const int64_t i = base + first + j;
      out_indices[slot] = static_cast<uint64_t>(i);
      out_values[slot] = v;
      if (zero_in != nullptr) zero_in[i] = 0.0f;
    }
    gt_before += key > threshold;
    eq_before += key == threshold;
  }
}

}  // namespace radix
}  // namespace gradcomm::detail
