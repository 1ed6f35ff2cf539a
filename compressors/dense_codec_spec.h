// A built-in dense codec's spec from its fields (fp16, bf16, quant, qsgd, sign), for code
// that builds one directly rather than parsing a spec string (tests, benchmarks): the
// registry's defaults (bucket 512, seed 0) are not applied and nothing is checked
// (make_dense_codec checks what a payload header can carry). Each family's own builder is
// in its public header (quant_spec, qsgd_spec, sign_spec); this picks one by id.
#pragma once

#include <cstdint>

#include "compressors/quantize/quantize.h"  // Rounding
#include "compressors/compressor_id.h"

namespace gradcomm::detail {

struct CompressorSpec;  // spec.h

CompressorSpec dense_codec_spec(CompressorId id, int bits = 0, Rounding round = Rounding::kStochastic, int levels = 0,
                                int64_t bucket = 0);

// The fields back from such a spec, or a parsed one (0 where its family has none): tests
// and benchmarks name and size their cases by them.
struct DenseCodecFields {
  int bits = 0;
  Rounding round = Rounding::kStochastic;
  int levels = 0;
  int64_t bucket = 0;
};
DenseCodecFields dense_codec_fields(const CompressorSpec& spec);

}  // namespace gradcomm::detail
