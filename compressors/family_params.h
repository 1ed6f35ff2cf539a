// A family's own keys: the block of a spec (CompressorSpec::params, spec.h) that only the
// family reads. Each family derives its struct from FamilyParams in its public header
// (compressors/<family>/<family>.h, e.g. QuantParams) and names it by kName; the spec
// hands it back typed (CompressorSpec::family<P>), refusing a block of another family.
// Apart from spec.h so that a family's header, and the code that reads its keys, do not
// depend on the spec's own layout.
#pragma once

namespace gradcomm::detail {

struct FamilyParams {
  virtual ~FamilyParams() = default;
};

}  // namespace gradcomm::detail
