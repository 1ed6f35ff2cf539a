// parse_compressor_spec (and parse_auto_spec, for text naming auto) on arbitrary text.
// Only InvalidArgument may escape, its message one bounded line; a spec that parses must canonicalize to a string that parses to the same spec and the
// same canonical string (the identity ranks compare).
#include <string>
#include <string_view>

#include "compressors/auto_spec.h"
#include "compressors/spec.h"
#include "fuzz_util.h"
#include "gradcomm/errors.h"

using gradcomm::detail::CompressorSpec;

void write_seeds(gradcomm::fuzz::SeedWriter& seeds) {
  const char* specs[] = {
      "none",
      "fp16:ef=1,min_numel=1024",
      "bf16:seed=18446744073709551615,warmup=3",
      "topk:ratio=0.01",
      "topk:k=10,select=sample,values=fp16",
      "randomk:ratio=1e-3,ef=0",
      "qsgd:levels=4,bucket=128",
      "quant:bits=2,bucket=64,round=nearest",
      "sign:bucket=1024",
      "sketch:rows=5,cols=1024,k=100",
      "sketch:ratio=0.5",
      "powersgd:rank=4,warm_start=0,min_compression_rate=1.5,start_iter=3,seed=7",
      "auto",
      "auto:min_bits=2,max_ratio=50,review=7,small=100,among=none|quant:bits=2,ef=1|topk:k=5,values=fp16",
  };
  int i = 0;
  for (const char* spec : specs) seeds.add("spec" + std::to_string(i++), std::string(spec));
}

namespace {

// The common keys field by field; the family's own keys are its block's, which only the
// family reads: they are compared through the canonical form, which prints every one.
bool same(const CompressorSpec& a, const CompressorSpec& b) {
  return a.id == b.id && a.ef == b.ef && a.min_numel == b.min_numel && a.warmup == b.warmup && a.seed == b.seed &&
         a.values == b.values && a.compress_inside == b.compress_inside && (a.params == nullptr) == (b.params == nullptr);
}

}  // namespace

// compressor=auto's spec (compressors/auto_spec.h): the same contract, on its canonical form.
int fuzz_auto(std::string_view text) {
  std::string canonical;
  try {
    canonical = gradcomm::detail::parse_auto_spec(text).canonical();
  } catch (const gradcomm::InvalidArgument& e) {
    const std::string_view message = e.what();
    GRADCOMM_FUZZ_CHECK(message.size() < 1024, "%zu-byte message", message.size());
    GRADCOMM_FUZZ_CHECK(message.find('\n') == std::string_view::npos, "newline in message");
    return 0;
  }
  std::string again;
  try {
    again = gradcomm::detail::parse_auto_spec(canonical).canonical();
  } catch (const gradcomm::InvalidArgument& e) {
    GRADCOMM_FUZZ_CHECK(false, "canonical '%s' does not parse: %s", canonical.c_str(), e.what());
  }
  GRADCOMM_FUZZ_CHECK(again == canonical, "'%s' canonicalizes to '%s'", canonical.c_str(), again.c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (gradcomm::detail::is_auto_spec(text)) return fuzz_auto(text);
  CompressorSpec spec;
  try {
    spec = gradcomm::detail::parse_compressor_spec(text);
  } catch (const gradcomm::InvalidArgument& e) {
    // Messages stay one bounded line whatever the input.
    const std::string_view message = e.what();
    GRADCOMM_FUZZ_CHECK(message.size() < 1024, "%zu-byte message", message.size());
    GRADCOMM_FUZZ_CHECK(message.find('\n') == std::string_view::npos, "newline in message");
    return 0;
  }
  const std::string canonical = spec.canonical();
  CompressorSpec again;
  try {
    again = gradcomm::detail::parse_compressor_spec(canonical);
  } catch (const gradcomm::InvalidArgument& e) {
    GRADCOMM_FUZZ_CHECK(false, "canonical '%s' does not parse: %s", canonical.c_str(), e.what());
  }
  GRADCOMM_FUZZ_CHECK(same(spec, again), "'%s' parses to another spec", canonical.c_str());
  GRADCOMM_FUZZ_CHECK(again.canonical() == canonical, "'%s' canonicalizes to '%s'", canonical.c_str(),
                      again.canonical().c_str());
  return 0;
}
