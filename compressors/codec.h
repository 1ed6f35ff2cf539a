// The codec interface of the dense codec families (fp16, bf16, quant, qsgd, sign):
// fixed-size payloads, so the compressed ring knows every message size in advance. A
// segment of a tensor encodes exactly as the same elements do inside the whole tensor
// (bucket boundaries and random streams are positions in the tensor, not the segment).
// All work on fp32 values; the CPU implementations are the reference the CUDA ones
// (dense/gpu_dense_codec.h) are held to. A family makes its codec (Family::make_codec);
// what the codecs share is dense/. The sparse families' interface is sparse/sparse.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "compressors/philox.h"

namespace gradcomm::detail {

class DenseCodec {
 public:
  virtual ~DenseCodec() = default;
  // Exact payload size for n values (header included); depends only on n and the spec.
  virtual size_t encoded_bytes(int64_t n) const = 0;
  // Encodes in[0, n) into out[0, encoded_bytes(n)). Element i of the run is element
  // `first + i` of the tensor: it draws its random numbers at that position of
  // `rng`, and buckets are counted from `first` (which must be a multiple of alignment()).
  virtual void encode(const float* in, int64_t n, uint8_t* out, const PhiloxStream& rng, int64_t first) const = 0;
  // out[i] = decoded value i (decode) or out[i] += it (decode_add). CorruptPayload
  // when the payload is not a valid encoding of n values under this spec.
  virtual void decode(std::span<const uint8_t> payload, int64_t n, float* out) const = 0;
  virtual void decode_add(std::span<const uint8_t> payload, int64_t n, float* out) const = 0;
  // out[i] = decoded value i / divisor (divisor >= 1), bit for bit what decode and then
  // divide_inplace (base/reduce.h) give: the average's last step. This default does
  // exactly that; the bucketed codecs and the casts fold a power-of-two divisor into
  // their stores (x * 2^-k is x / 2^k), which saves a pass over the output.
  virtual void decode_average(std::span<const uint8_t> payload, int64_t n, float* out, int64_t divisor) const;
  // encode, and values[i] = what decode_average(the payload, n, ., divisor) gives, bit for
  // bit: the encoder's own result, as the ring's final owner and error feedback need it.
  // `values` may be `in` (each element is overwritten after it is read). This default
  // encodes, then decodes; quant fuses the two (the values come from the codes while the
  // bucket is in cache), saving the decode's pass over the payload and the output.
  virtual void encode_with_values(const float* in, int64_t n, uint8_t* out, const PhiloxStream& rng, int64_t first,
                                  float* values, int64_t divisor) const;
  // Ring segments must start at multiples of this (bucket size; 1 for casts).
  virtual int64_t alignment() const = 0;
};

struct CompressorSpec;  // spec.h
// The spec's family's codec (Family::make_codec: fp16, bf16, quant, qsgd, sign);
// InvalidArgument for a family without one (dense/dense_codec.cc).
std::unique_ptr<DenseCodec> make_dense_codec(const CompressorSpec& spec);

}  // namespace gradcomm::detail
