// The CUDA kernels of the dense codecs, templated on a family's codec policy (the
// family's gpu_NAME_logic.h and the shared gpu_dense_logic.h hold every formula;
// this file adds only the thread mapping, memory access and warp shuffles), and their
// launchers. Included by each family's .cu file, which instantiates its policies.
//
// Layers (as CUB): thread helpers (group loads and stores at whatever alignment the
// pointers allow), kernels (grid-stride loops, 64-bit indices), launchers (grid from
// the SM count, launch on the caller's stream, check the launch, never synchronize).
//
// Encode, bucketed codecs:
//   bucket_scales_kernel  8 threads per bucket, thread l reducing elements l, l+8, ...
//                         in order (dense_math.h lane order), shfl_down 1, 2, 4 to
//                         combine; lane 0 writes the bucket's scale bytes. Thread 0
//                         writes the header.
//   encode_groups_kernel  one thread per group of 8 elements: two 16-byte loads (in,
//                         and residual), codes packed in registers and stored as
//                         `bits` bytes (u32 stores when aligned), residual and decoded
//                         values stored back as two 16-byte stores.
// Decode: check_header_kernel (one thread: the CPU decoder's framing checks),
// check_sections_kernel (every scale, and every qsgd level when a level can be out
// of range), decode_groups_kernel (writes only when the status word is clean).
// Kernels launched after a fault see it because they run after it on the stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "compressors/dense/gpu_dense_launch.h"
#include "compressors/dense/gpu_dense_logic.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/device_status.h"

namespace gradcomm::detail {

static_assert(static_cast<uint32_t>(DenseFault::kBadHeader) == static_cast<uint32_t>(PayloadFault::kBadHeader));
static_assert(static_cast<uint32_t>(DenseFault::kBadNumel) == static_cast<uint32_t>(PayloadFault::kBadNumel));
static_assert(static_cast<uint32_t>(DenseFault::kBadLength) == static_cast<uint32_t>(PayloadFault::kBadLength));
static_assert(static_cast<uint32_t>(DenseFault::kBadPadding) == static_cast<uint32_t>(PayloadFault::kBadPadding));
static_assert(static_cast<uint32_t>(DenseFault::kBadCode) == static_cast<uint32_t>(PayloadFault::kBadCode));
static_assert(static_cast<uint32_t>(DenseFault::kBadScale) == static_cast<uint32_t>(PayloadFault::kBadScale));

namespace gpu_dense {

constexpr int kBlockThreads = 256;
constexpr int kBlocksPerSm = 8;  // 8 x 256 threads: one full wave on an sm_90 SM
constexpr unsigned kFullMask = 0xFFFFFFFFu;

enum EfKind : int { kEfNone = 0, kEfFold = 1, kEfAccumulate = 2 };

// ---- thread helpers ---------------------------------------------------------------------
__device__ __forceinline__ uint64_t global_thread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t grid_threads() { return static_cast<uint64_t>(gridDim.x) * blockDim.x; }
__device__ __forceinline__ bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// v[k] = p[k] for k < cnt, 0 above. A full group at a 16-byte boundary is two float4s.
__device__ __forceinline__ void load_group(const float* p, int cnt, float* v) {
  if (cnt == kGroupElems && aligned(p, 16)) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#pragma unroll
  for (int k = 0; k < kGroupElems; ++k) v[k] = k < cnt ? p[k] : 0.0f;
}
__device__ __forceinline__ void store_group(float* p, int cnt, const float* v) {
  if (cnt == kGroupElems && aligned(p, 16)) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int k = 0; k < kGroupElems; ++k) {
    if (k < cnt) p[k] = v[k];
  }
}

// dst[0, nbytes) = the group's bytes (nbytes <= 4 * kGroupWords), with the widest
// stores the destination's alignment allows; never touches a byte past nbytes.
__device__ __forceinline__ void store_group_bytes(uint8_t* dst, const uint32_t* words, unsigned nbytes) {
  if (nbytes % 4 == 0 && aligned(dst, 4)) {
    if (nbytes == 16 && aligned(dst, 16)) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
      return;
    }
    if (nbytes % 8 == 0 && aligned(dst, 8)) {  // e.g. 8-bit codes, or casts at payload offset 24
#pragma unroll
      for (unsigned w = 0; w + 1 < kGroupWords; w += 2) {
        if (4 * w < nbytes) reinterpret_cast<uint2*>(dst)[w / 2] = make_uint2(words[w], words[w + 1]);
      }
      return;
    }
#pragma unroll
    for (unsigned w = 0; w < kGroupWords; ++w) {
      if (4 * w < nbytes) reinterpret_cast<uint32_t*>(dst)[w] = words[w];
    }
    return;
  }
  if (nbytes % 2 == 0 && aligned(dst, 2)) {
#pragma unroll
    for (unsigned h = 0; h < 2 * kGroupWords; ++h) {
      if (2 * h < nbytes) reinterpret_cast<uint16_t*>(dst)[h] = static_cast<uint16_t>(words[h / 2] >> (16 * (h % 2)));
    }
    return;
  }
#pragma unroll
  for (unsigned j = 0; j < 4 * kGroupWords; ++j) {
    if (j < nbytes) dst[j] = group_byte(words, j);
  }
}
// words = src[0, nbytes) little-endian, zero past nbytes; never reads past nbytes.
__device__ __forceinline__ void load_group_bytes(const uint8_t* src, unsigned nbytes, uint32_t* words) {
#pragma unroll
  for (unsigned w = 0; w < kGroupWords; ++w) words[w] = 0;
  if (nbytes % 4 == 0 && aligned(src, 4)) {
    if (nbytes == 16 && aligned(src, 16)) {
      const uint4 v = *reinterpret_cast<const uint4*>(src);
      words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
      return;
    }
    if (nbytes % 8 == 0 && aligned(src, 8)) {
#pragma unroll
      for (unsigned w = 0; w + 1 < kGroupWords; w += 2) {
        if (4 * w < nbytes) {
          const uint2 v = reinterpret_cast<const uint2*>(src)[w / 2];
          words[w] = v.x, words[w + 1] = v.y;
        }
      }
      return;
    }
#pragma unroll
    for (unsigned w = 0; w < kGroupWords; ++w) {
      if (4 * w < nbytes) words[w] = reinterpret_cast<const uint32_t*>(src)[w];
    }
    return;
  }
#pragma unroll
  for (unsigned j = 0; j < 4 * kGroupWords; ++j) {
    if (j < nbytes) words[j / 4] |= static_cast<uint32_t>(src[j]) << (8 * (j % 4));
  }
}

// A float accumulator moved down `delta` lanes. A policy whose Acc is a struct
// provides its own shfl_down(Acc, unsigned) beside its kernels (found by
// argument-dependent lookup), e.g. quantize/gpu_quant_codec.cu.
__device__ __forceinline__ float shfl_down(float v, unsigned delta) { return __shfl_down_sync(kFullMask, v, delta); }

// ---- encode kernels -----------------------------------------------------------------------
// Thread t works on bucket t / 8 as lane t % 8. The loop bound is rounded up to a
// whole warp, so every lane of a warp runs the same iterations and the full-mask
// shuffles are legal; lanes past the last bucket reduce nothing.
template <class Policy>
__global__ void __launch_bounds__(kBlockThreads)
    bucket_scales_kernel(Policy p, DenseLayout l, const float* in, const float* fold_residual, uint8_t* payload) {
  const uint64_t tid = global_thread();
  if (tid == 0) write_dense_header(l, payload);
  uint8_t* scales = payload + kDenseHeaderBytes;
  const uint64_t buckets = l.buckets();
  const uint64_t total = (buckets * kSumLanes + 31) / 32 * 32;
  for (uint64_t t = tid; t < total; t += grid_threads()) {
    const uint64_t b = t / kSumLanes;
    const unsigned lane = static_cast<unsigned>(t % kSumLanes);
    const bool active = b < buckets;
    uint64_t m = 0;
    AccLoad load{in, nullptr};
    if (active) {
      const uint64_t start = b * l.bucket;
      m = l.n - start < l.bucket ? l.n - start : l.bucket;
      load = AccLoad{in + start, fold_residual != nullptr ? fold_residual + start : nullptr};
    }
    typename Policy::Acc acc = lane_partial(p, load, m, lane);
    // combine_lanes' tree: (l0 l1) (l2 l3) (l4 l5) (l6 l7), then pairs, then the two halves.
    acc = p.combine(acc, shfl_down(acc, 1));
    acc = p.combine(acc, shfl_down(acc, 2));
    acc = p.combine(acc, shfl_down(acc, 4));
    if (active && lane == 0) p.finalize(acc, m, scales + b * l.scale_width);
  }
}

// One thread per group of 8 run elements. For the bucketed codecs the scales are
// final (bucket_scales_kernel ran first on the stream); the casts write the header here.
template <class Policy>
__global__ void __launch_bounds__(kBlockThreads)
    encode_groups_kernel(Policy p, DenseLayout l, const float* in, float* residual, int ef, float* decoded,
                         uint8_t* payload, PhiloxStream rng, uint64_t first) {
  const uint64_t tid = global_thread();
  if constexpr (!Policy::kBucketed) {
    if (tid == 0) write_dense_header(l, payload);
  }
  const uint8_t* scales = payload + kDenseHeaderBytes;
  uint8_t* codes = payload + l.codes_offset();
  const uint64_t groups = l.groups();
  for (uint64_t g = tid; g < groups; g += grid_threads()) {
    const uint64_t i0 = g * kGroupElems;
    const int cnt = l.n - i0 < kGroupElems ? static_cast<int>(l.n - i0) : kGroupElems;
    float x[kGroupElems], r[kGroupElems], acc[kGroupElems], v[kGroupElems];
    load_group(in + i0, cnt, x);
    if (ef != kEfNone) load_group(residual + i0, cnt, r);
#pragma unroll
    for (int k = 0; k < kGroupElems; ++k) acc[k] = ef == kEfFold ? add_rn(x[k], r[k]) : x[k];
    uint32_t words[kGroupWords];
    encode_group(p, l, scales, acc, cnt, i0, rng, first, words, v);
    store_group_bytes(codes + g * p.bits, words, group_bytes(cnt, p.bits));
    if (ef != kEfNone) {
#pragma unroll
      for (int k = 0; k < kGroupElems; ++k) {
        r[k] = ef == kEfFold ? sub_rn(acc[k], v[k]) : add_rn(r[k], sub_rn(x[k], v[k]));
      }
      store_group(residual + i0, cnt, r);
    }
    if (decoded != nullptr) store_group(decoded + i0, cnt, v);
  }
}

// ---- decode kernels -----------------------------------------------------------------------
// One thread: the framing checks. static: every .cu gets its own copy, so launching
// it needs no relocatable device code.
static __global__ void check_header_kernel(const uint8_t* payload, uint64_t size, DenseLayout l,
                                           DeviceStatus* status) {
  if (global_thread() != 0 || status_failed(status)) return;
  const DenseFaultRecord r = check_dense_header(payload, size, l);
  if (r.fault != DenseFault::kNone) report_status(status, static_cast<PayloadFault>(r.fault), r.a, r.b);
}

// Scales no encoder writes (work items [0, buckets)) and, when the policy says a
// code can be invalid, every code (work items past that, one per group). Skipped
// entirely when the framing already failed: the sections may not exist.
template <class Policy>
__global__ void __launch_bounds__(kBlockThreads)
    check_sections_kernel(Policy p, DenseLayout l, const uint8_t* payload, DeviceStatus* status) {
  if (status_failed(status)) return;
  const uint8_t* scales = payload + kDenseHeaderBytes;
  const uint8_t* codes = payload + l.codes_offset();
  const uint64_t buckets = l.buckets();
  const uint64_t items = buckets + (p.check_codes() ? l.groups() : 0);
  for (uint64_t t = global_thread(); t < items; t += grid_threads()) {
    if (t < buckets) {
      if (!p.scale_valid(scales + t * l.scale_width)) {
        report_status(status, PayloadFault::kBadScale, load_le32(scales + t * l.scale_width), s64(t));
      }
      continue;
    }
    const uint64_t g = t - buckets, i0 = g * kGroupElems;
    const int cnt = l.n - i0 < kGroupElems ? static_cast<int>(l.n - i0) : kGroupElems;
    uint32_t words[kGroupWords], c[kGroupElems];
    load_group_bytes(codes + g * p.bits, group_bytes(cnt, p.bits), words);
    unpack_codes8(words, p.bits, c);
    for (int k = 0; k < cnt; ++k) {
      if (!p.code_valid(c[k])) report_status(status, PayloadFault::kBadCode, c[k], s64(i0 + k));
    }
  }
}

// out = decoded values (or out += them); nothing at all when the status is set.
template <class Policy>
__global__ void __launch_bounds__(kBlockThreads)
    decode_groups_kernel(Policy p, DenseLayout l, const uint8_t* payload, float* out, bool add,
                         const DeviceStatus* status) {
  if (status_failed(status)) return;
  const uint8_t* scales = payload + kDenseHeaderBytes;
  const uint8_t* codes = payload + l.codes_offset();
  const uint64_t groups = l.groups();
  for (uint64_t g = global_thread(); g < groups; g += grid_threads()) {
    const uint64_t i0 = g * kGroupElems;
    const int cnt = l.n - i0 < kGroupElems ? static_cast<int>(l.n - i0) : kGroupElems;
    uint32_t words[kGroupWords];
    load_group_bytes(codes + g * p.bits, group_bytes(cnt, p.bits), words);
    float v[kGroupElems];
    decode_group(p, l, scales, words, cnt, i0, v);
    if (add) {
      float y[kGroupElems];
      load_group(out + i0, cnt, y);
#pragma unroll
      for (int k = 0; k < kGroupElems; ++k) v[k] = add_rn(y[k], v[k]);
    }
    store_group(out + i0, cnt, v);
  }
}

// ---- launchers ----------------------------------------------------------------------------
inline unsigned grid_for(uint64_t work_items) {
  const uint64_t max_blocks = static_cast<uint64_t>(cuda_sm_count(cuda_current_device())) * kBlocksPerSm;
  const uint64_t wanted = (std::max<uint64_t>(work_items, 1) + kBlockThreads - 1) / kBlockThreads;
  return static_cast<unsigned>(std::min(wanted, max_blocks));
}

inline int ef_kind(const EncodeFeedback& f) {
  if (f.residual == nullptr) return kEfNone;
  return f.mode == ResidualMode::kFold ? kEfFold : kEfAccumulate;
}

template <class Policy>
void launch_encode(const Policy& p, const GpuEncodeArgs& a) {
  const DenseLayout& l = a.layout;
  const int ef = ef_kind(a.feedback);
  if constexpr (Policy::kBucketed) {
    // The bucket pass always runs (with n = 0 it only writes the header).
    bucket_scales_kernel<Policy><<<grid_for(l.buckets() * kSumLanes), kBlockThreads, 0, a.stream>>>(
        p, l, a.in, ef == kEfFold ? a.feedback.residual : nullptr, a.payload);
    GRADCOMM_CUDA_CHECK_LAUNCH();
    if (l.n == 0) return;
  }
  encode_groups_kernel<Policy><<<grid_for(l.groups()), kBlockThreads, 0, a.stream>>>(
      p, l, a.in, a.feedback.residual, ef, a.feedback.decoded, a.payload, a.rng, a.first);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

template <class Policy>
void launch_decode(const Policy& p, const GpuDecodeArgs& a) {
  const DenseLayout& l = a.layout;
  check_header_kernel<<<1, 32, 0, a.stream>>>(a.payload, a.payload_bytes, l, a.status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  if (l.n == 0) return;
  if constexpr (Policy::kBucketed) {
    const uint64_t items = l.buckets() + (p.check_codes() ? l.groups() : 0);
    check_sections_kernel<Policy><<<grid_for(items), kBlockThreads, 0, a.stream>>>(p, l, a.payload, a.status);
    GRADCOMM_CUDA_CHECK_LAUNCH();
  }
  decode_groups_kernel<Policy><<<grid_for(l.groups()), kBlockThreads, 0, a.stream>>>(p, l, a.payload, a.out, a.add,
                                                                                       a.status);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

}  // namespace gpu_dense
}  // namespace gradcomm::detail
