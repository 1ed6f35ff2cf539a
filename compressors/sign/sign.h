// sign: one bit per element and a per-bucket mean |x|, over the compressed ring.
#pragma once

#include <cstdint>
#include <memory>

#include "compressors/family_params.h"

namespace gradcomm::detail {

class DenseCodec;
struct CompressorSpec;  // spec.h

struct SignParams final : FamilyParams {
  static constexpr const char* kName = "sign's keys";
  int64_t bucket = 512;  // elements per scale
};

// A sign spec from its field, unchecked (tests, benchmarks).
CompressorSpec sign_spec(int64_t bucket);

// The codec (sign_codec.cc), for a bucket already checked.
std::unique_ptr<DenseCodec> make_sign_codec(int64_t bucket);

}  // namespace gradcomm::detail
