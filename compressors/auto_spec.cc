#include "compressors/auto_spec.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

constexpr std::string_view kDefaultAmong = "none|bf16|quant:bits=8,ef=1|quant:bits=4,ef=1|topk:ratio=0.01";

[[noreturn]] void refuse(std::string_view text, std::string_view problem) {
  throw InvalidArgument(fmt::format("compressor spec '{}': auto: {}", shown_spec_text(text), problem));
}

int64_t parse_int(std::string_view text, std::string_view key, std::string_view value, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < lo || v > hi) {
    refuse(text, fmt::format("{}='{}' is not an integer in [{}, {}]", key, shown_spec_text(value), lo, hi));
  }
  return v;
}

double parse_double(std::string_view text, std::string_view key, std::string_view value, double lo, double hi) {
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v) || v < lo || v > hi) {
    refuse(text, fmt::format("{}='{}' is not a number in [{}, {}]", key, shown_spec_text(value), lo, hi));
  }
  return v;
}

// The candidate's family runs on a collective auto can price, and passes the guard.
void check_candidate(std::string_view text, std::string_view candidate, const CompressorSpec& c, int min_bits) {
  const std::string given = shown_spec_text(candidate);
  const Family& family = family_of(c.id);
  switch (family.collective) {
    case Collective::kDense:
      return;
    case Collective::kCodecRing: {
      const double bits = auto_candidate_bits(c);
      if (bits < 16 && !c.ef) {
        refuse(text, fmt::format("candidate '{}' sends {:.3g} bits per element without error feedback; the guard "
                                 "takes lossy candidates below 16 bits only with ef=1 (add ',ef=1')",
                                 given, bits));
      }
      if (bits < min_bits) {
        refuse(text, fmt::format("candidate '{}' sends {:.3g} bits per element, below min_bits={} (the accuracy "
                                 "guard); lower min_bits or leave the candidate out",
                                 given, bits, min_bits));
      }
      return;
    }
    case Collective::kSparseSelection:
      if (!c.ef) {
        refuse(text, fmt::format("candidate '{}' drops what it does not select; the guard takes top-k only with "
                                 "error feedback (ef=1, its default)",
                                 given));
      }
      if (c.warmup > 0 || c.min_numel > 0) {
        refuse(text, fmt::format("candidate '{}': warmup and min_numel are auto's to decide (small=, review=); "
                                 "leave them out of a candidate",
                                 given));
      }
      return;
    default:
      refuse(text, fmt::format("candidate '{}': auto chooses among the dense ring (none), the compressed ring's "
                               "codecs ({}) and top-k; {} is not one of them",
                               given, family_names(Collective::kCodecRing), family.name));
  }
}

}  // namespace

double auto_candidate_bits(const CompressorSpec& spec) {
  const Family& family = family_of(spec.id);
  if (family.collective == Collective::kDense) return 32.0;
  if (family.collective != Collective::kCodecRing) return 0.0;
  constexpr int64_t n = int64_t{1} << 20;
  return static_cast<double>(make_dense_codec(spec)->encoded_bytes(n)) * 8.0 / static_cast<double>(n);
}

AutoSpec parse_auto_spec(std::string_view text) {
  if (!is_auto_spec(text)) refuse(text, "not an auto spec");
  AutoSpec spec;
  std::string_view among = kDefaultAmong;
  bool seen_among = false;
  std::string_view rest = text.size() > 4 ? text.substr(5) : std::string_view();
  if (text.size() > 4 && rest.empty()) refuse(text, "nothing after 'auto:'");
  std::vector<std::string_view> seen;
  while (!rest.empty()) {
    const size_t eq = rest.find('=');
    if (eq == std::string_view::npos) refuse(text, fmt::format("'{}' is not key=value", shown_spec_text(rest.substr(0, rest.find(',')))));
    const std::string_view key = rest.substr(0, eq);
    for (std::string_view s : seen) {
      if (s == key) refuse(text, fmt::format("key '{}' given twice", shown_spec_text(key)));
    }
    seen.push_back(key);
    if (key == "among") {  // the rest of the string
      among = rest.substr(eq + 1);
      seen_among = true;
      break;
    }
    const size_t comma = rest.find(',');
    const std::string_view value = rest.substr(eq + 1, comma == std::string_view::npos ? std::string_view::npos
                                                                                         : comma - eq - 1);
    if (key == "min_bits") {
      spec.min_bits = static_cast<int>(parse_int(text, key, value, 1, 32));
    } else if (key == "max_ratio") {
      spec.max_ratio = parse_double(text, key, value, 0.0, 1e9);
      if (spec.max_ratio > 0 && spec.max_ratio < 1) refuse(text, "max_ratio must be 0 (no cap) or at least 1");
    } else if (key == "review") {
      spec.review = parse_int(text, key, value, 1, int64_t{1} << 40);
    } else if (key == "small") {
      spec.small = parse_int(text, key, value, 0, int64_t{1} << 40);
    } else {
      refuse(text, fmt::format("unknown key '{}'; accepted: min_bits, max_ratio, review, small, among (last)",
                               shown_spec_text(key)));
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
    if (rest.empty()) refuse(text, "trailing ','");
  }
  if (seen_among && among.empty()) refuse(text, "among= lists no candidate");
  std::vector<std::string> canonical;
  size_t begin = 0;
  while (begin <= among.size()) {
    const size_t bar = among.find('|', begin);
    const std::string_view given = among.substr(begin, bar == std::string_view::npos ? std::string_view::npos : bar - begin);
    if (given.empty()) refuse(text, "an empty candidate in among= ('||' or a '|' at an end)");
    if (is_auto_spec(given)) refuse(text, "auto cannot be its own candidate");
    CompressorSpec c;
    try {
      c = parse_compressor_spec(given);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("auto: candidate {}", e.what()));  // it quotes the candidate
    }
    check_candidate(text, given, c, spec.min_bits);
    const std::string name = c.canonical();
    for (const std::string& s : canonical) {
      if (s == name) refuse(text, fmt::format("candidate '{}' given twice", shown_spec_text(given)));
    }
    canonical.push_back(name);
    spec.candidates.push_back(c);
    spec.names.emplace_back(given);
    if (bar == std::string_view::npos) break;
    begin = bar + 1;
  }
  return spec;
}

std::string AutoSpec::canonical() const {
  std::string out = fmt::format("auto:min_bits={},max_ratio={},review={},small={},among=", min_bits, max_ratio, review,
                                small);
  for (size_t i = 0; i < candidates.size(); ++i) {
    out += (i == 0 ? "" : "|");
    out += candidates[i].id == CompressorId::kNone ? std::string("none") : candidates[i].canonical();
  }
  return out;
}

void check_compressor_spec(std::string_view text) {
  if (is_auto_spec(text)) {
    (void)parse_auto_spec(text);
  } else {
    (void)parse_compressor_spec(text);
  }
}

}  // namespace gradcomm::detail
