// fp16 <-> fp32 over whole arrays, for the fp16 codec: bit-identical to half.h's
// float_to_half / half_to_float element by element, with the CPU's F16C
// conversions (eight values per instruction) where it has them (half_bulk.cc); and
// bf16 <-> fp32, for bfloat16 tensors compressed in float32 pieces.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradcomm::detail {

// out[i] = float_to_half(in[i]).
void floats_to_halves(const float* in, uint16_t* out, size_t n);
// out[i] = half_to_float(in[i]), or out[i] += it when `add`.
void halves_to_floats(const uint16_t* in, float* out, size_t n, bool add);

// The scalar definitions the F16C path is tested against.
void floats_to_halves_scalar(const float* in, uint16_t* out, size_t n);
void halves_to_floats_scalar(const uint16_t* in, float* out, size_t n, bool add);

// bf16 <-> fp32 likewise: out[i] = float_to_bf16(in[i]) and out[i] = bf16_to_float(in[i]),
// bit for bit, eight values per step with AVX2 where the CPU has it.
void floats_to_bf16s(const float* in, uint16_t* out, size_t n);
void bf16s_to_floats(const uint16_t* in, float* out, size_t n);
void floats_to_bf16s_scalar(const float* in, uint16_t* out, size_t n);
void bf16s_to_floats_scalar(const uint16_t* in, float* out, size_t n);

// "f16c" or "scalar": the path the fp16 functions above take on this CPU.
const char* half_bulk_path();

}  // namespace gradcomm::detail
