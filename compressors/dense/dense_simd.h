// AVX2 versions of the dense codecs' bulk loops (quant, qsgd; sign's decoder),
// host only: each returns exactly the bits of the scalar loop named beside it, which
// stays the reference and the path on CPUs without AVX2. Callers take these only when
// use_avx2_kernels() (compressors/cpu_kernels.h) says so; calling them on a CPU
// without AVX2 is an illegal instruction. Never include this from a .cu file.
//
// Why the results are identical and not just close: every fp32 step is the same
// IEEE operation on the same operands as in dense_math.h, rounded to nearest even,
// never fused (no FMA: the files are built for AVX2 only, with -ffp-contract=off); the
// clamps are maxps/minps, whose "second operand unless the first is strictly
// greater/less" rule is exactly `s > 0 ? s : 0` with NaN going to 0; the casts are
// truncating; min/max over order keys and sums in the fixed lane order do not
// depend on how the elements are grouped. The decoders convert codes (< 2^16, exact
// as unsigned or signed) with cvtdq2ps, then multiply and add as the scalar loops do.
// tests/unit/test_dense_codec_bytes.cc compares the payloads and the decoded floats
// bit for bit, NaN signs and payloads included, except for one thing no source code
// fixes: when both addends of a decode_add are NaN, x86 returns the first operand,
// and which one is first is the compiler's choice in either path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/dense/dense_util.h"

namespace gradcomm::detail {

// bucket_range (dense_util.h).
BucketRange bucket_range_avx2(const float* x, size_t m);

// sqrt-free part of qsgd's norm: lane_sum(x, m, v * v) (dense_util.h).
float sum_squares_avx2(const float* x, size_t m);

// codes[k] = round_half_up(quant_position(x[k], lo, inv, levels)) (quant_codec.cc).
void quant_codes_nearest_avx2(const float* x, size_t m, float lo, float inv, float levels, uint32_t* codes);
// codes[k] = round_stochastic(quant_position(x[k], lo, inv, levels), u[k]); sixteen
// lanes at a time where use_avx512_kernels() (the same bits).
void quant_codes_stochastic_avx2(const float* x, const float* u, size_t m, float lo, float inv, float levels,
                                 uint32_t* codes);
// codes[k] = qsgd_code(x[k], round_stochastic(qsgd_position(x[k], scale, levels), u[k]), bits).
void qsgd_codes_avx2(const float* x, const float* u, size_t m, float scale, float levels, unsigned bits,
                     uint32_t* codes);

// A CodeWriter bulk packer (bitpack.h) for bits 1, 2, 4 and 8: packs the first
// count / 32 * 32 codes (each < 2^bits) as pack_group8 would, 32 at a time, into
// out, and returns how many it packed. Other widths: packs nothing, returns 0.
size_t pack_codes_avx2(const uint32_t* codes, size_t count, unsigned bits, uint8_t* out);

// ---- decoders (dense_simd_decode.cc) ---------------------------------------------
// A whole packed code stream (bitpack.h): `total` codes of `bits` bits, in exactly
// packed_code_bytes(total, bits) bytes (the decoders' length check comes first).
struct CodeStream {
  const uint8_t* packed;
  uint64_t total;
  unsigned bits;
};

// Widths the decoders unpack eight at a time; wider codes (qsgd with s >= 2^15) would
// go element by element, so their callers keep the scalar CodeReader path instead.
constexpr unsigned kMaxAvx2DecodeBits = 16;

// For k in [0, m), with c the code of element first + k of `codes`:
//   store_value<store>(y[k], v, scale) (dense_util.h), with v = quant_value(lo, step, c) (quant_codec.cc),
void quant_decode_avx2(const CodeStream& codes, uint64_t first, size_t m, float lo, float step, DecodeStore store,
                       float scale, float* y);
//   v = qsgd_value(c, unit, codes.bits) (qsgd_codec.cc),
void qsgd_decode_avx2(const CodeStream& codes, uint64_t first, size_t m, float unit, DecodeStore store, float scale,
                      float* y);
//   v = sign_value(sign_scale, c), codes.bits == 1 (sign_codec.cc).
void sign_decode_avx2(const CodeStream& codes, uint64_t first, size_t m, float sign_scale, DecodeStore store,
                      float scale, float* y);

// store_value<store>(y[k], quant_value(lo, step, codes[k]), scale) for k in [0, m): the
// decoder's values straight from unpacked codes (quant's encode_with_values).
void quant_values_avx2(const uint32_t* codes, size_t m, unsigned bits, float lo, float step, DecodeStore store,
                       float scale, float* y);

// The largest (code & level_mask) in the whole stream (qsgd's level check).
uint32_t max_level_avx2(const CodeStream& codes, uint32_t level_mask);

}  // namespace gradcomm::detail
