// The compressor registry: spec strings `name[:key=value[,key=value...]]` into a
// CompressorSpec with every parameter resolved, and back (canonical()).
//
// The grammar is strict, so that what ranks compare (canonical strings) is exactly
// what users wrote, with nothing silently ignored:
//  - no whitespace anywhere (rejected, not trimmed: "topk: ratio=0.1" is a typo
//    more often than a style, and trimming would make " topk" and "topk" differ
//    only in the error path);
//  - names, keys and enum values are lower case; each key at most once;
//  - integers are decimal (no sign on unsigned values, no '+'); ratios are decimal
//    or scientific ("0.01", "1e-3"), finite, in (0, 1].
// Each table below lists a compressor's keys in canonical order; error messages list
// them in that order too.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compressors/powersgd/powersgd_logic.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

constexpr std::string_view kAcceptedNames = "none, fp16, bf16, topk, randomk, qsgd, quant, sign, sketch, powersgd";

// Limits beyond the grammar: each keeps a parameter inside the integer type the
// codecs and the 32-bit payload header fields (param0/param1) store it in.
constexpr int64_t kMaxBucket = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxLevels = int64_t{1} << 15;
constexpr int64_t kMaxRows = 64;
constexpr int64_t kMinCols = 16;
constexpr int64_t kMaxCols = int64_t{1} << 24;  // 64 rows x 2^24 cols x 4 B = 4 GiB table at most
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxPowersgdRank = powersgd::kMaxRank;
constexpr size_t kMaxShown = 100;  // characters of user text quoted in an error

constexpr std::string_view kCastKeys[] = {"ef", "min_numel", "warmup", "seed"};
constexpr std::string_view kTopkKeys[] = {"ratio",     "k",      "select", "indices", "algo",
                                          "ef",        "min_numel", "warmup", "seed",    "values"};
constexpr std::string_view kRandomkKeys[] = {"ratio", "ef", "min_numel", "warmup", "seed", "values"};
constexpr std::string_view kQsgdKeys[] = {"levels", "bucket", "ef", "min_numel", "warmup", "seed"};
constexpr std::string_view kQuantKeys[] = {"bits", "bucket", "round", "ef", "min_numel", "warmup", "seed"};
constexpr std::string_view kSignKeys[] = {"bucket", "ef", "min_numel", "warmup", "seed"};
constexpr std::string_view kSketchKeys[] = {"rows",     "cols",   "k",    "ratio", "ef",
                                            "min_numel", "warmup", "seed", "values"};
constexpr std::string_view kPowersgdKeys[] = {"rank",      "warm_start", "min_compression_rate", "start_iter", "ef",
                                              "min_numel", "warmup",     "seed"};

struct Family {
  CompressorId id;
  std::span<const std::string_view> keys;  // empty for none: it takes no keys
  bool ef_default;                         // the spec table (README, "Compression")
};

constexpr Family kFamilies[] = {
    {CompressorId::kNone, {}, false},
    {CompressorId::kFp16, kCastKeys, false},
    {CompressorId::kBf16, kCastKeys, false},
    {CompressorId::kTopk, kTopkKeys, true},
    {CompressorId::kRandomk, kRandomkKeys, true},
    {CompressorId::kQsgd, kQsgdKeys, false},
    {CompressorId::kQuant, kQuantKeys, false},
    {CompressorId::kSign, kSignKeys, true},
    {CompressorId::kSketch, kSketchKeys, true},
    {CompressorId::kPowersgd, kPowersgdKeys, true},
};

// A quotable form of untrusted text: control and non-ASCII bytes escaped, cut after
// kMaxShown characters, so an error message stays one short readable line whatever
// was passed in.
std::string shown(std::string_view text) {
  std::string out;
  size_t i = 0;
  for (; i < text.size() && out.size() < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (i < text.size()) out += fmt::format("...({} bytes)", text.size());
  return out;
}

std::string join(std::span<const std::string_view> words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ", ";
    out += w;
  }
  return out;
}

// Parses one spec. Holds the key=value pairs (already checked against the
// family's key list and for duplicates) and turns values into typed fields; every
// failure names the spec, the compressor, the key, and what is accepted.
class SpecParser {
 public:
  explicit SpecParser(std::string_view spec) : spec_(spec) {}

  CompressorSpec parse() {
    if (spec_.empty()) fail(fmt::format("empty spec; accepted compressors: {}", kAcceptedNames));
    for (size_t i = 0; i < spec_.size(); ++i) {
      if (spec_[i] == ' ' || spec_[i] == '\t' || spec_[i] == '\n' || spec_[i] == '\r' || spec_[i] == '\v' ||
          spec_[i] == '\f') {
        fail(fmt::format("whitespace at offset {}; write the spec without spaces, e.g. 'topk:ratio=0.01,ef=1'", i));
      }
    }
    const size_t colon = spec_.find(':');
    name_ = spec_.substr(0, colon);
    const Family* family = nullptr;
    for (const auto& f : kFamilies) {
      if (name_ == compressor_name(f.id)) family = &f;
    }
    if (family == nullptr) {
      fail(fmt::format("compressor '{}' unknown; accepted: {}", shown(name_), kAcceptedNames));
    }
    if (colon != std::string_view::npos) split_pairs(*family, spec_.substr(colon + 1));

    CompressorSpec s;
    s.id = family->id;
    if (s.id == CompressorId::kNone) return s;
    parse_common(*family, s);
    switch (s.id) {
      case CompressorId::kFp16:
      case CompressorId::kBf16: break;
      case CompressorId::kTopk:
        parse_ratio_or_k(s);
        s.select = choice<TopkSelect>("select", {{"exact", TopkSelect::kExact}, {"sample", TopkSelect::kSample}},
                                      TopkSelect::kExact);
        s.coded_indices = choice<bool>("indices", {{"coded", true}, {"raw", false}}, true);
        s.algo = choice<SparseAlgo>("algo",
                                    {{"auto", SparseAlgo::kAuto},
                                     {"allgather", SparseAlgo::kAllgather},
                                     {"reduce_scatter", SparseAlgo::kReduceScatter}},
                                    SparseAlgo::kAuto);
        break;
      case CompressorId::kRandomk: {
        const auto ratio = take("ratio");
        if (!ratio) fail(fmt::format("{}: key 'ratio' is required (a number in (0, 1])", name_));
        s.ratio = parse_ratio(*ratio);
        break;
      }
      case CompressorId::kQsgd:
        s.levels = static_cast<int>(integer("levels", 1, kMaxLevels, 16));
        s.bucket = integer("bucket", 1, kMaxBucket, 512);
        break;
      case CompressorId::kQuant:
        s.bits = choice<int>("bits", {{"1", 1}, {"2", 2}, {"4", 4}, {"8", 8}}, 8);
        s.bucket = integer("bucket", 1, kMaxBucket, 512);
        s.round = choice<Rounding>("round", {{"stochastic", Rounding::kStochastic}, {"nearest", Rounding::kNearest}},
                                   Rounding::kStochastic);
        break;
      case CompressorId::kSign: s.bucket = integer("bucket", 1, kMaxBucket, 512); break;
      case CompressorId::kSketch: {
        s.rows = static_cast<int>(integer("rows", 1, kMaxRows, 5));
        // cols = 0 is the default "choose from k at use"; an explicit value must be a
        // real table width.
        if (const auto cols = take("cols")) {
          s.cols = static_cast<int>(*cols == "0" ? 0 : parse_integer("cols", *cols, kMinCols, kMaxCols));
        }
        parse_ratio_or_k(s);
        break;
      }
      case CompressorId::kPowersgd: {
        // torch's PowerSGDState defaults: rank 1, warm start, min_compression_rate 2.
        s.rank = static_cast<int>(integer("rank", 1, kMaxPowersgdRank, 1));
        s.warm_start = choice<bool>("warm_start", {{"0", false}, {"1", true}}, true);
        s.min_compression_rate = 2.0;
        if (const auto rate = take("min_compression_rate")) s.min_compression_rate = parse_rate(*rate);
        // start_iter is torch's name (start_powerSGD_iter) for the common warmup.
        if (const auto start = take("start_iter")) {
          if (take("warmup")) fail(fmt::format("{}: give start_iter or warmup (the same setting), not both", name_));
          s.warmup = parse_integer("start_iter", *start, 0, kMaxInt64);
        }
        break;
      }
      case CompressorId::kNone: break;
    }
    return s;
  }

 private:
  struct Pair {
    std::string_view key, value;
  };

  [[noreturn]] void fail(std::string_view problem) const {
    throw InvalidArgument(fmt::format("compressor spec '{}': {}", shown(spec_), problem));
  }

  void split_pairs(const Family& family, std::string_view list) {
    if (family.keys.empty()) {
      fail(fmt::format("{} takes no keys (found '{}'); write just '{}'", name_, shown(list), name_));
    }
    const std::string accepted = join(family.keys);
    if (list.empty()) fail(fmt::format("{}: nothing after ':'; accepted keys: {}", name_, accepted));
    size_t start = 0;
    while (true) {
      const size_t comma = list.find(',', start);
      const std::string_view item = list.substr(start, comma == std::string_view::npos ? list.npos : comma - start);
      const size_t eq = item.find('=');
      if (item.empty()) fail(fmt::format("{}: empty key=value item (stray ','); accepted keys: {}", name_, accepted));
      if (eq == std::string_view::npos) {
        fail(fmt::format("{}: '{}' is not key=value; accepted keys: {}", name_, shown(item), accepted));
      }
      const std::string_view key = item.substr(0, eq);
      const std::string_view value = item.substr(eq + 1);
      bool known = false;
      for (const auto& k : family.keys) known = known || k == key;
      if (!known) fail(fmt::format("{}: unknown key '{}'; accepted: {}", name_, shown(key), accepted));
      for (const auto& p : pairs_) {
        if (p.key == key) fail(fmt::format("{}: key '{}' given twice", name_, key));
      }
      if (value.empty()) fail(fmt::format("{}: key '{}' has an empty value", name_, key));
      pairs_.push_back({key, value});
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
  }

  // The value of `key` if it was given.
  std::optional<std::string_view> take(std::string_view key) const {
    for (const auto& p : pairs_) {
      if (p.key == key) return p.value;
    }
    return std::nullopt;
  }

  int64_t parse_integer(std::string_view key, std::string_view value, int64_t lo, int64_t hi) const {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v, 10);
    if (ec == std::errc() && end == value.data() + value.size() && v >= lo && v <= hi) return v;
    fail(fmt::format("{}: {}='{}' {}; accepted: an integer in [{}, {}]", name_, key, shown(value),
                     ec == std::errc::invalid_argument || (ec == std::errc() && end != value.data() + value.size())
                         ? "is not a decimal integer"
                         : "is out of range",
                     lo, hi));
  }

  int64_t integer(std::string_view key, int64_t lo, int64_t hi, int64_t fallback) const {
    const auto value = take(key);
    return value ? parse_integer(key, *value, lo, hi) : fallback;
  }

  double parse_ratio(std::string_view value) const {
    double v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    const bool whole = ec == std::errc() && end == value.data() + value.size();
    if (whole && std::isfinite(v) && v > 0.0 && v <= 1.0) return v;
    fail(fmt::format("{}: ratio='{}' {}; accepted: a number in (0, 1], e.g. 0.01 or 1e-3", name_, shown(value),
                     whole && std::isfinite(v) ? "is out of range" : "is not a finite number"));
  }

  // min_compression_rate: a finite number >= 1 (1 compresses whatever is smaller at all).
  double parse_rate(std::string_view value) const {
    double v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    const bool whole = ec == std::errc() && end == value.data() + value.size();
    if (whole && std::isfinite(v) && v >= 1.0 && v <= 1e9) return v;
    fail(fmt::format("{}: min_compression_rate='{}' {}; accepted: a number in [1, 1e9], e.g. 2", name_, shown(value),
                     whole && std::isfinite(v) ? "is out of range" : "is not a finite number"));
  }

  template <class T>
  T choice(std::string_view key, std::initializer_list<std::pair<std::string_view, T>> options, T fallback) const {
    const auto value = take(key);
    if (!value) return fallback;
    std::string accepted;
    for (const auto& [word, result] : options) {
      if (word == *value) return result;
      accepted += accepted.empty() ? "" : ", ";
      accepted += word;
    }
    fail(fmt::format("{}: {}='{}' unknown; accepted: {}", name_, key, shown(*value), accepted));
  }

  // topk and sketch: exactly one of ratio=R, k=K.
  void parse_ratio_or_k(CompressorSpec& s) const {
    const auto ratio = take("ratio");
    const auto k = take("k");
    if (ratio && k) fail(fmt::format("{}: give ratio or k, not both", name_));
    if (!ratio && !k) {
      fail(fmt::format("{}: one of ratio=R (a number in (0, 1]) or k=K (an integer >= 1) is required", name_));
    }
    if (ratio) s.ratio = parse_ratio(*ratio);
    if (k) s.k = parse_integer("k", *k, 1, kMaxInt64);
  }

  void parse_common(const Family& family, CompressorSpec& s) const {
    s.ef = choice<bool>("ef", {{"0", false}, {"1", true}}, family.ef_default);
    s.min_numel = integer("min_numel", 0, kMaxInt64, 0);
    s.warmup = integer("warmup", 0, kMaxInt64, 0);
    if (const auto seed = take("seed")) {
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(seed->data(), seed->data() + seed->size(), v, 10);
      if (ec != std::errc() || end != seed->data() + seed->size()) {
        fail(fmt::format("{}: seed='{}' {}; accepted: an integer in [0, {}]", name_, shown(*seed),
                         ec == std::errc::result_out_of_range ? "is out of range" : "is not a decimal integer",
                         std::numeric_limits<uint64_t>::max()));
      }
      s.seed = v;
    }
    // Top-k's values are summed in fp32 after they arrive, so bf16 (fp32's range, no
    // overflow) costs only rounding, which error feedback keeps; random-k and the sketch
    // sum their values on the wire, where 16-bit sums lose more, so they stay fp32.
    s.values = choice<ValueType>("values",
                                 {{"fp32", ValueType::kFp32}, {"fp16", ValueType::kFp16}, {"bf16", ValueType::kBf16}},
                                 s.id == CompressorId::kTopk ? ValueType::kBf16 : ValueType::kFp32);
  }

  std::string_view spec_;
  std::string_view name_;
  std::vector<Pair> pairs_;
};

}  // namespace

CompressorSpec parse_compressor_spec(std::string_view spec) { return SpecParser(spec).parse(); }

// Keys in the family's table order, each with its resolved value, so that two
// specs that parse equal print equal and parse(canonical()) gives the spec back.
// Doubles print with fmt's shortest round-trip form ("0.01", "1e-05").
std::string CompressorSpec::canonical() const {
  const char* name = compressor_name(id);
  if (id == CompressorId::kNone) return name;
  std::string out = fmt::format("{}:", name);
  auto ratio_or_k = [&] { out += k > 0 ? fmt::format("k={}", k) : fmt::format("ratio={}", ratio); };
  switch (id) {
    case CompressorId::kTopk:
      ratio_or_k();
      out += fmt::format(",select={},indices={},algo={},", select == TopkSelect::kExact ? "exact" : "sample",
                         coded_indices ? "coded" : "raw",
                         algo == SparseAlgo::kAuto ? "auto" : algo == SparseAlgo::kAllgather ? "allgather" : "reduce_scatter");
      break;
    case CompressorId::kRandomk: out += fmt::format("ratio={},", ratio); break;
    case CompressorId::kQsgd: out += fmt::format("levels={},bucket={},", levels, bucket); break;
    case CompressorId::kQuant:
      out += fmt::format("bits={},bucket={},round={},", bits, bucket,
                         round == Rounding::kStochastic ? "stochastic" : "nearest");
      break;
    case CompressorId::kSign: out += fmt::format("bucket={},", bucket); break;
    case CompressorId::kPowersgd:
      out += fmt::format("rank={},warm_start={},min_compression_rate={},", rank, warm_start ? 1 : 0,
                         min_compression_rate);
      break;
    case CompressorId::kSketch:
      out += fmt::format("rows={},cols={},", rows, cols);
      ratio_or_k();
      out += ',';
      break;
    default: break;
  }
  out += fmt::format("ef={},min_numel={},warmup={},seed={}", ef ? 1 : 0, min_numel, warmup, seed);
  if (id == CompressorId::kTopk || id == CompressorId::kRandomk || id == CompressorId::kSketch) {
    out += fmt::format(",values={}", values == ValueType::kFp32   ? "fp32"
                                     : values == ValueType::kFp16 ? "fp16"
                                                                  : "bf16");
  }
  return out;
}

}  // namespace gradcomm::detail
