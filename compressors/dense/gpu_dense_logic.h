// The family-neutral steps of the CUDA dense codecs as GRADCOMM_HD functions on
// plain arrays: payload layout, header writing and checking, the per-bucket
// reduction (one lane of it), and the encode/decode of one group of 8 elements,
// each templated on a family's policy. A family's own layout and policy (its scales,
// its per-element code and value formulas, what a decoder rejects) live in its
// folder, e.g. sign/gpu_sign_logic.h. The kernels (gpu_dense_kernels.cuh) only add
// thread indexing, vector loads/stores and warp shuffles around these, so a CPU unit
// test (tests/unit/test_gpu_dense_logic.cc) can run exactly this logic and hold it
// to the CPU codecs byte for byte.
//
// Work decomposition (FORMAT.md "Packed codes"): with b-bit codes, the 8 elements
// of group g = [8g, 8g + 8) of a run fill exactly b whole bytes at byte 8g*b/8 = g*b
// of the code section, whatever the bucket size, so groups are independent. Buckets
// are reduced by 8 threads each, thread l summing the elements j = l, l + 8, ... of
// the bucket in increasing j: exactly the lanes of dense_math.h's lane order.
#pragma once

#include <cstdint>

#include "compressors/philox.h"
#include "compressors/dense/dense_math.h"
#include "compressors/compressor_id.h"
#include "half.h"  // GRADCOMM_HD, float_bits, bits_float

// Full unrolling of the fixed 8-element loops on the GPU (keeps the group arrays in
// registers); the host compiler decides for itself.
#if defined(__CUDACC__)
#define GRADCOMM_UNROLL _Pragma("unroll")
#else
#define GRADCOMM_UNROLL
#endif

namespace gradcomm::detail {

// ---- faults (the values of PayloadFault in cuda/device_status.h; this header must
// not need CUDA, so the .cu files static_assert that the two agree) ---------------
enum class DenseFault : uint32_t {
  kNone = 0,
  kBadHeader = 1,
  kBadNumel = 2,
  kBadLength = 3,
  kBadPadding = 6,
  kBadCode = 7,
  kBadScale = 8,
};
struct DenseFaultRecord {
  DenseFault fault;
  int64_t a, b;  // details as PayloadFault documents (found, expected / position)
};

constexpr uint32_t kDenseMagic = 0x31504347u;  // "GCP1", PayloadHeader::kMagic
constexpr uint8_t kDenseVersion = 1;
constexpr uint64_t kDenseHeaderBytes = 24;
constexpr int kGroupElems = 8;  // elements per group (one thread's unit of work)
constexpr int kGroupWords = 7;  // u32 words holding 8 codes of up to 25 bits (200 bits)

// ---- little-endian bytes, any alignment ---------------------------------------------
GRADCOMM_HD uint32_t load_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
GRADCOMM_HD uint64_t load_le64(const uint8_t* p) {
  return static_cast<uint64_t>(load_le32(p)) | static_cast<uint64_t>(load_le32(p + 4)) << 32;
}
GRADCOMM_HD void store_le32(uint8_t* p, uint32_t v) {
  for (int k = 0; k < 4; ++k) p[k] = static_cast<uint8_t>(v >> (8 * k));
}
GRADCOMM_HD void store_le64(uint8_t* p, uint64_t v) {
  store_le32(p, static_cast<uint32_t>(v));
  store_le32(p + 4, static_cast<uint32_t>(v >> 32));
}
GRADCOMM_HD float load_f32le(const uint8_t* p) { return bits_float(load_le32(p)); }
GRADCOMM_HD void store_f32le(uint8_t* p, float v) { store_le32(p, float_bits(v)); }

// a - b rounded once (dense_math.h has add and mul; the residual needs the difference).
GRADCOMM_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// ---- payload layout -------------------------------------------------------------------
// Everything a kernel needs to know about the payload of an n-element run.
struct DenseLayout {
  CompressorId id;
  uint64_t n;
  uint32_t param0, param1;  // what the header carries
  uint64_t bucket;          // elements per scale; 0 for the casts
  unsigned scale_width;     // scale bytes per bucket: 8 (quant), 4 (qsgd, sign), 0 (casts)
  unsigned code_bits;       // per element: b, 1 + ceil(log2(s + 1)), 1, or 16 (casts)

  GRADCOMM_HD uint64_t buckets() const { return bucket == 0 ? 0 : (n + bucket - 1) / bucket; }
  GRADCOMM_HD uint64_t scale_bytes() const { return buckets() * scale_width; }
  GRADCOMM_HD uint64_t code_bytes() const { return (n * code_bits + 7) / 8; }
  GRADCOMM_HD uint64_t codes_offset() const { return kDenseHeaderBytes + scale_bytes(); }
  GRADCOMM_HD uint64_t total_bytes() const { return codes_offset() + code_bytes(); }
  GRADCOMM_HD uint64_t groups() const { return (n + kGroupElems - 1) / kGroupElems; }
};

// The 24-byte header (payload.h): flags always 0 for the dense codecs.
GRADCOMM_HD void write_dense_header(const DenseLayout& l, uint8_t* out) {
  store_le32(out, kDenseMagic);
  out[4] = kDenseVersion;
  out[5] = static_cast<uint8_t>(l.id);
  out[6] = 0;
  out[7] = 0;
  store_le64(out + 8, l.n);
  store_le32(out + 16, l.param0);
  store_le32(out + 20, l.param1);
}

GRADCOMM_HD int64_t s64(uint64_t v) { return static_cast<int64_t>(v); }

// The framing checks of the CPU decoder (read_header + read_dense_sections), in its
// order: size >= header, magic, version, id, numel, flags and params, exact length,
// zero padding after the last code. Reads only bytes [0, size) of p.
GRADCOMM_HD DenseFaultRecord check_dense_header(const uint8_t* p, uint64_t size, const DenseLayout& l) {
  const uint64_t expected = l.total_bytes();
  if (size < kDenseHeaderBytes) return {DenseFault::kBadLength, s64(size), s64(expected)};
  const uint32_t magic = load_le32(p);
  if (magic != kDenseMagic) return {DenseFault::kBadHeader, magic, kDenseMagic};
  if (p[4] != kDenseVersion) return {DenseFault::kBadHeader, p[4], kDenseVersion};
  if (p[5] != static_cast<uint8_t>(l.id)) return {DenseFault::kBadHeader, p[5], static_cast<uint8_t>(l.id)};
  const uint64_t numel = load_le64(p + 8);
  if (numel != l.n) return {DenseFault::kBadNumel, s64(numel), s64(l.n)};
  const uint32_t flags = static_cast<uint32_t>(p[6]) | static_cast<uint32_t>(p[7]) << 8;
  if (flags != 0) return {DenseFault::kBadHeader, flags, 0};
  const uint32_t param0 = load_le32(p + 16), param1 = load_le32(p + 20);
  if (param0 != l.param0) return {DenseFault::kBadHeader, param0, l.param0};
  if (param1 != l.param1) return {DenseFault::kBadHeader, param1, l.param1};
  if (size != expected) return {DenseFault::kBadLength, s64(size), s64(expected)};
  const unsigned used = static_cast<unsigned>((l.n * l.code_bits) % 8);
  if (used != 0 && (p[expected - 1] >> used) != 0) return {DenseFault::kBadPadding, p[expected - 1], s64(expected - 1)};
  return {DenseFault::kNone, 0, 0};
}

// ---- packing one group of 8 codes ---------------------------------------------------------
// Stream bit k*bits + j holds bit j of code k; word w holds stream bits [32w, 32w + 32),
// so the words stored little-endian are the group's bytes. bits in [1, 25].
GRADCOMM_HD void pack_codes8(const uint32_t* codes, unsigned bits, uint32_t* words) {
GRADCOMM_UNROLL
  for (int w = 0; w < kGroupWords; ++w) words[w] = 0;
GRADCOMM_UNROLL
  for (unsigned k = 0; k < kGroupElems; ++k) {
    const unsigned bit = k * bits, w = bit / 32, s = bit % 32;
    words[w] |= codes[k] << s;
    if (s + bits > 32) words[w + 1] |= codes[k] >> (32 - s);
  }
}
GRADCOMM_HD void unpack_codes8(const uint32_t* words, unsigned bits, uint32_t* codes) {
  const uint32_t mask = (1u << bits) - 1u;
GRADCOMM_UNROLL
  for (unsigned k = 0; k < kGroupElems; ++k) {
    const unsigned bit = k * bits, w = bit / 32, s = bit % 32;
    uint32_t v = words[w] >> s;
    if (s + bits > 32) v |= words[w + 1] << (32 - s);
    codes[k] = v & mask;
  }
}
// Bytes of group words: byte j is bits [8j, 8j + 8) of the group.
GRADCOMM_HD uint8_t group_byte(const uint32_t* words, unsigned j) {
  return static_cast<uint8_t>(words[j / 4] >> (8 * (j % 4)));
}

// Bucket of run element i (bucket < 2^32): 32-bit division when i allows, as 64-bit
// division costs several times more on the GPU.
GRADCOMM_HD uint64_t bucket_of(uint64_t i, uint64_t bucket) {
  if (i <= 0xFFFFFFFFull) return static_cast<uint32_t>(i) / static_cast<uint32_t>(bucket);
  return i / bucket;
}

// philox_uniform16 for element `pos`, reusing the block when it is the cached one
// (eight consecutive positions share a block).
struct UniformCache {
  uint64_t block = ~uint64_t{0};
  Philox4 r{};
  GRADCOMM_HD float at(const PhiloxStream& s, uint64_t pos) {
    if ((pos >> 3) != block) {
      block = pos >> 3;
      r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                        static_cast<uint32_t>(s.stream), static_cast<uint32_t>(s.stream >> 32),
                        static_cast<uint32_t>(s.seed), static_cast<uint32_t>(s.seed >> 32));
    }
    const unsigned lane = static_cast<unsigned>((pos >> 1) & 3);
    // Selects, not r.v[lane]: a dynamic index would put r in local memory on the GPU.
    const uint32_t word = lane == 0 ? r.v[0] : lane == 1 ? r.v[1] : lane == 2 ? r.v[2] : r.v[3];
    return uniform_from_bits16((word >> (16u * static_cast<uint32_t>(pos & 1))) & 0xFFFFu);  // philox_uniform16's
  }
};

// ---- the codecs as policies ---------------------------------------------------------------
// A family's policy (in its folder) provides kBucketed, bits and stochastic; Params,
// encode_params / decode_params (what one bucket's scale bytes mean; empty for an
// unbucketed codec) and code / value (per element). A bucketed policy adds Acc,
// identity / accumulate / combine / finalize (the bucket reduction and the scale bytes
// it writes; an Acc that is not a float comes with its own device shfl_down, see
// gpu_dense_kernels.cuh) and scale_valid / check_codes / code_valid (what a decoder
// rejects).

// A norm or mean |x| as an encoder writes it: NaN (poisoned) or finite >= 0.
GRADCOMM_HD bool nonnegative_scale_valid(float s) { return is_nan(s) || (is_finite(s) && s >= 0.0f); }

// ---- one bucket: lane `lane` (0..7) of the reduction --------------------------------------
// load(j) gives element j of the bucket (the accumulator: input, plus the residual
// when error feedback folds it in). Lanes are combined as dense_math.h's
// combine_lanes: combine8 here, shfl_down by 1, 2, 4 in the kernel (same tree).
template <class Policy, class Load>
GRADCOMM_HD typename Policy::Acc lane_partial(const Policy& p, const Load& load, uint64_t m, unsigned lane) {
  typename Policy::Acc a = p.identity();
  for (uint64_t j = lane; j < m; j += kSumLanes) a = p.accumulate(a, load(j));
  return a;
}
template <class Policy>
GRADCOMM_HD typename Policy::Acc combine8(const Policy& p, const typename Policy::Acc* lanes) {
  return p.combine(p.combine(p.combine(lanes[0], lanes[1]), p.combine(lanes[2], lanes[3])),
                   p.combine(p.combine(lanes[4], lanes[5]), p.combine(lanes[6], lanes[7])));
}

// The accumulator of element j of a range: x[j], or x[j] + r[j] when r is set.
struct AccLoad {
  const float* x;
  const float* r;  // null: no residual folded in
  GRADCOMM_HD float operator()(uint64_t j) const { return r != nullptr ? add_rn(x[j], r[j]) : x[j]; }
};

// ---- one group of 8 elements --------------------------------------------------------------
// Encodes run elements [i0, i0 + cnt) (i0 a multiple of 8, cnt in 1..8) whose
// accumulators are acc[0, cnt): the packed codes into words[0, kGroupWords) (codes
// past cnt are 0, so the partial last group has zero padding) and the values the
// decoder will produce into values[0, 8). `scales` is the payload's scale section,
// already final (the bucket pass ran first).
template <class Policy>
GRADCOMM_HD void encode_group(const Policy& p, const DenseLayout& l, const uint8_t* scales, const float* acc, int cnt,
                              uint64_t i0, const PhiloxStream& rng, uint64_t first, uint32_t* words, float* values) {
  uint32_t codes[kGroupElems];
  typename Policy::Params prm{};
  uint64_t b = 0, next = ~uint64_t{0};
  if constexpr (Policy::kBucketed) {
    b = bucket_of(i0, l.bucket);
    next = (b + 1) * l.bucket;
    prm = p.encode_params(scales + b * l.scale_width);
  }
  UniformCache uniforms;
GRADCOMM_UNROLL
  for (int k = 0; k < kGroupElems; ++k) {
    codes[k] = 0;
    values[k] = 0.0f;
    if (k < cnt) {
      if constexpr (Policy::kBucketed) {
        if (i0 + k >= next) {  // consecutive elements: the next bucket (buckets < 8 long cross often)
          ++b;
          next += l.bucket;
          prm = p.encode_params(scales + b * l.scale_width);
        }
      }
      const float u = p.stochastic ? uniforms.at(rng, first + i0 + k) : 0.0f;
      codes[k] = p.code(acc[k], prm, u);
      values[k] = p.value(codes[k], prm);
    }
  }
  pack_codes8(codes, p.bits, words);
}

// Decodes run elements [i0, i0 + cnt) from the group's words into values[0, cnt).
template <class Policy>
GRADCOMM_HD void decode_group(const Policy& p, const DenseLayout& l, const uint8_t* scales, const uint32_t* words,
                              int cnt, uint64_t i0, float* values) {
  uint32_t codes[kGroupElems];
  unpack_codes8(words, p.bits, codes);
  typename Policy::Params prm{};
  uint64_t b = 0, next = ~uint64_t{0};
  if constexpr (Policy::kBucketed) {
    b = bucket_of(i0, l.bucket);
    next = (b + 1) * l.bucket;
    prm = p.decode_params(scales + b * l.scale_width);
  }
GRADCOMM_UNROLL
  for (int k = 0; k < kGroupElems; ++k) {
    values[k] = 0.0f;
    if (k < cnt) {
      if constexpr (Policy::kBucketed) {
        if (i0 + k >= next) {
          ++b;
          next += l.bucket;
          prm = p.decode_params(scales + b * l.scale_width);
        }
      }
      values[k] = p.value(codes[k], prm);
    }
  }
}

// Packed bytes of a group of cnt codes (the last group of a run may be partial).
GRADCOMM_HD unsigned group_bytes(int cnt, unsigned bits) { return (static_cast<unsigned>(cnt) * bits + 7) / 8; }

}  // namespace gradcomm::detail
