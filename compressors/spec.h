// Compressor specs: `name[:key=value[,key=value...]]`, parsed once by the registry
// (registry.cc, through each family's descriptor, family.h) into a CompressorSpec
// with every parameter resolved. Two ranks agree on a compressor iff their
// canonical() strings are equal.
//
// A spec is the keys every family shares, here, and the family's own keys in a block
// only the family knows the type of (its public header: compressors/<family>/<family>.h,
// e.g. QuantParams). Code outside a family never names a family's key: it asks the
// family, through its descriptor (family.h), for what its shape needs (a codec, a
// sparse selection's size and format, a low-rank step's rank).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "compressors/compressor_id.h"
#include "compressors/family_params.h"

namespace gradcomm::detail {

// InvalidArgument: the spec's block is not a `wanted` (registry.cc).
[[noreturn]] void wrong_family_params(CompressorId id, const char* wanted);

struct CompressorSpec {
  CompressorId id = CompressorId::kNone;

  // Common keys (every compressor but none):
  bool ef = false;            // error feedback; default per compressor (docs/api.md, "Compression")
  int64_t min_numel = 0;      // smaller tensors go dense
  int64_t warmup = 0;         // the first `warmup` steps of a key go dense
  uint64_t seed = 0;          // Philox seed (stochastic rounding, random-k, sketch hashes)
  ValueType values = ValueType::kFp32;  // sparse values on the wire (topk: bf16; randomk, sketch: fp32)
  // Codec-ring families over two levels (src/hierarchy.h): compress inside the nodes too
  // (inside=compress), not only across them (inside=dense, the default).
  bool compress_inside = false;

  // The family's own keys (null: it has none). Shared: copies of a spec share the block,
  // which nobody changes once parsed.
  std::shared_ptr<const FamilyParams> params;

  // The family's block as its type P; InvalidArgument when the spec's family keeps another.
  template <class P>
  const P& family() const {
    const P* p = dynamic_cast<const P*>(params.get());
    if (p == nullptr) wrong_family_params(id, P::kName);
    return *p;
  }

  // The spec with every key spelled out in a fixed order, e.g.
  // "topk:ratio=0.01,select=exact,indices=coded,algo=auto,ef=1,min_numel=0,warmup=0,seed=0,values=bf16".
  std::string canonical() const;
};

// A spec of family `id` with the common keys at their zero values and the family's block
// `params`, for code that builds one from fields rather than parsing it (the families'
// quant_spec, sign_spec, ...; tests, benchmarks).
inline CompressorSpec spec_of(CompressorId id, std::shared_ptr<const FamilyParams> params) {
  CompressorSpec s;
  s.id = id;
  s.params = std::move(params);
  return s;
}

// User text as error messages quote it: at most 100 characters, control and non-ASCII
// bytes escaped (\xNN), so a message stays one short line whatever the input.
std::string shown_spec_text(std::string_view text);

// Parses a spec string. InvalidArgument naming the problem and listing what is
// accepted: unknown compressor, unknown key, bad value, missing required key,
// key given twice.
CompressorSpec parse_compressor_spec(std::string_view spec);

}  // namespace gradcomm::detail
