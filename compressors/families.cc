// The built-in compressor families: one line each. A family is its folder (its
// descriptor in <folder>/family.cc, its codecs and kernels beside it) and its line
// here; docs/adding-a-compressor.md walks through adding one.
#include <span>

#include "compressors/family.h"

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
