// fp16 and bf16: every value narrowed to 16 bits, over the compressed ring. No keys.
#pragma once

#include <memory>

#include "compressors/compressor_id.h"

namespace gradcomm::detail {

class DenseCodec;

// The codec (cast_codec.cc) of kFp16 or kBf16.
std::unique_ptr<DenseCodec> make_cast_codec(CompressorId id);

}  // namespace gradcomm::detail
