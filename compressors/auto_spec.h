// `compressor=auto`: the choice among candidate compressors, made per key by the
// engine (src/auto_choice.h, docs/does-compression-pay.md). This is its spec:
//
//   auto[:min_bits=B,max_ratio=R,review=K,small=S,among=C1|C2|...]
//
//   among      the candidates, '|'-separated, each a compressor spec. It comes last and
//              takes the rest of the string, so a candidate's own keys keep their
//              commas: "auto:review=20,among=none|quant:bits=4,ef=1|topk:ratio=0.01".
//              Default: none|bf16|quant:bits=8,ef=1|quant:bits=4,ef=1|topk:ratio=0.01.
//   min_bits   the accuracy guard: a dense codec candidate with fewer bits per element
//              on the wire is refused (default 4). Every lossy candidate below 16 bits
//              must carry error feedback (ef=1), and top-k must; others are refused.
//   max_ratio  the most compression auto may pick: candidates whose payload is more than
//              R times smaller than fp32 are left out at the decision (default 0: no cap).
//   review     steps of a key between reviews of its choice (default 50).
//   small      keys of fewer elements consider only candidates of 16 bits or more
//              (default 4096).
//
// Candidates run as they would on their own: the same families, specs and payloads.
// Allowed families: those of the dense ring, the compressed ring's codecs and top-k.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compressors/spec.h"

namespace gradcomm::detail {

struct AutoSpec {
  std::vector<CompressorSpec> candidates;  // in the user's order: near-ties go to the earlier one
  std::vector<std::string> names;          // each candidate as the spec wrote it (logs, reports)
  int min_bits = 4;
  double max_ratio = 0.0;  // 0: no cap
  int64_t review = 50;
  int64_t small = 4096;
  // fnv1a32 of canonical(): what ranks' review calls and saved records compare. Set once
  // where a communicator caches the parsed spec (CommunicatorImpl::auto_spec).
  uint32_t hash = 0;

  // "auto:min_bits=4,max_ratio=0,review=50,small=4096,among=none|bf16|..." with every
  // candidate canonical: equal specs print equal, and parse(canonical()) gives it back.
  std::string canonical() const;
};

// True when `text` names auto ("auto" or "auto:...").
inline bool is_auto_spec(std::string_view text) {
  return text == "auto" || text.substr(0, 5) == "auto:";
}

// Parses an auto spec; InvalidArgument naming the problem (unknown key, bad value, a
// candidate the registry refuses, one of a family auto cannot run, one the guard
// refuses, a duplicate candidate).
AutoSpec parse_auto_spec(std::string_view text);

// Checks any spec a user may pass as a compressor: a family's, or auto's.
void check_compressor_spec(std::string_view text);

// Wire bits per element of a dense codec candidate (the compressed ring's payload for a
// large tensor, headers included), 32 for none; 0 for top-k (sparse: see max_ratio).
double auto_candidate_bits(const CompressorSpec& spec);

}  // namespace gradcomm::detail
