// The built-in compressor families: one line each. A family is its folder (its
// descriptor in <folder>/family.cc, its codecs and kernels beside it) and its line
// here; docs/adding-a-compressor.md walks through adding one.
#include <span>

#include "compressors/dense_codec_spec.h"
#include "compressors/family.h"
#include "compressors/sign/sign.h"
#include "compressors/quantize/quantize.h"
#include "compressors/spec.h"

namespace gradcomm::detail {

// Each family's descriptor (<folder>/family.cc). Accessors, not extern objects: the
// tests link the library's objects beside libgradcomm.so, and a global with external
// linkage in both is an ODR violation to ASan.
const Family &fp16_family(), &bf16_family(), &topk_family(), &randomk_family(), &qsgd_family(), &quant_family(),
    &sign_family(), &sketch_family(), &powersgd_family();

namespace {

// none: no keys, nothing to compress; the dense ring.
constexpr Family kNoneFamily{.id = CompressorId::kNone,
                             .name = "none",
                             .keys = {},
                             .ef_default = false,
                             .values_default = ValueType::kFp32,
                             .collective = Collective::kDense};

}  // namespace

CompressorSpec dense_codec_spec(CompressorId id, int bits, Rounding round, int levels, int64_t bucket) {
  switch (id) {
    case CompressorId::kQuant: return quant_spec(bits, bucket, round);
    case CompressorId::kQsgd: return qsgd_spec(levels, bucket);
    case CompressorId::kSign: return sign_spec(bucket);
    default: return spec_of(id, nullptr);  // the casts have no keys; another id's, make_dense_codec refuses
  }
}

DenseCodecFields dense_codec_fields(const CompressorSpec& spec) {
  DenseCodecFields f;
  switch (spec.id) {
    case CompressorId::kQuant: {
      const auto& p = spec.family<QuantParams>();
      f.bits = p.bits;
      f.round = p.round;
      f.bucket = p.bucket;
      break;
    }
    case CompressorId::kQsgd: {
      const auto& p = spec.family<QsgdParams>();
      f.levels = p.levels;
      f.bucket = p.bucket;
      break;
    }
    case CompressorId::kSign: f.bucket = spec.family<SignParams>().bucket; break;
    default: break;
  }
  return f;
}

std::span<const Family* const> builtin_families() {
  static const Family* const kBuiltins[] = {
      &kNoneFamily,        // none
      &fp16_family(),      // cast/
      &bf16_family(),      // cast/
      &topk_family(),      // topk/
      &randomk_family(),   // randomk/
      &qsgd_family(),      // quantize/
      &quant_family(),     // quantize/
      &sign_family(),      // sign/
      &sketch_family(),    // sketch/
      &powersgd_family(),  // powersgd/
  };
  return kBuiltins;
}

}  // namespace gradcomm::detail
