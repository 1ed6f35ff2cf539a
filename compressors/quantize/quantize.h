// quant (b-bit min/max buckets) and qsgd (stochastic levels of the bucket's norm): their
// keys and their CPU codecs. Dense codec families over the compressed ring; what they
// share with the other dense codecs is ../dense.
#pragma once

#include <cstdint>
#include <memory>

#include "compressors/family_params.h"

namespace gradcomm::detail {

class DenseCodec;
struct CompressorSpec;  // spec.h

enum class Rounding : uint8_t { kStochastic = 0, kNearest = 1 };

struct QuantParams final : FamilyParams {
  static constexpr const char* kName = "quant's keys";
  int bits = 8;        // 1, 2, 4 or 8
  int64_t bucket = 512;  // elements per min/max pair
  Rounding round = Rounding::kStochastic;
};

struct QsgdParams final : FamilyParams {
  static constexpr const char* kName = "qsgd's keys";
  int levels = 16;     // quantization levels s >= 1
  int64_t bucket = 512;  // elements per norm
};

// Specs built from fields rather than parsed (tests, benchmarks): no default and no
// check is applied (make_dense_codec checks what the payload header can carry).
CompressorSpec quant_spec(int bits, int64_t bucket, Rounding round = Rounding::kStochastic);
CompressorSpec qsgd_spec(int levels, int64_t bucket);

// The codecs (quant_codec.cc, qsgd_codec.cc), for arguments already checked.
std::unique_ptr<DenseCodec> make_quant_codec(int bits, int64_t bucket, Rounding round);
std::unique_ptr<DenseCodec> make_qsgd_codec(int levels, int64_t bucket);

}  // namespace gradcomm::detail
