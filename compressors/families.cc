// The built-in compressor families: one line each. A family is its folder (its
// descriptor in <folder>/family.cc, its codecs and kernels beside it) and its line
// here; docs/adding-a-compressor.md walks through adding one.
#include <span>

#include "compressors/family.h"

namespace gradcomm::detail {

extern const Family kFp16Family, kBf16Family, kTopkFamily, kRandomkFamily, kQsgdFamily, kQuantFamily, kSignFamily,
    kSketchFamily, kPowersgdFamily;

namespace {

// none: no keys, nothing to compress; the dense ring.
constinit const Family kNoneFamily{.id = CompressorId::kNone,
                                   .name = "none",
                                   .keys = {},
                                   .ef_default = false,
                                   .values_default = ValueType::kFp32,
                                   .collective = Collective::kDense};

constinit const Family* const kBuiltins[] = {
    &kNoneFamily,    // none
    &kFp16Family,    // cast/
    &kBf16Family,    // cast/
    &kTopkFamily,    // topk/
    &kRandomkFamily, // randomk/
    &kQsgdFamily,    // quantize/
    &kQuantFamily,   // quantize/
    &kSignFamily,    // sign/
    &kSketchFamily,  // sketch/
    &kPowersgdFamily,// powersgd/
};

}  // namespace

std::span<const Family* const> builtin_families() { return kBuiltins; }

}  // namespace gradcomm::detail
