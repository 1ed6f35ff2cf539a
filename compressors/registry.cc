// The compressor registry: the registered families (family.h; built-ins in
// families.cc), and spec strings `name[:key=value[,key=value...]]` parsed through
// them into a CompressorSpec with every parameter resolved, and back (canonical()).
//
// The grammar is strict, so that what ranks compare (canonical strings) is exactly
// what users wrote, with nothing silently ignored:
//  - no whitespace anywhere (rejected, not trimmed: "topk: ratio=0.1" is a typo
//    more often than a style, and trimming would make " topk" and "topk" differ
//    only in the error path);
//  - names, keys and enum values are lower case; each key at most once;
//  - integers are decimal (no sign on unsigned values, no '+'); ratios are decimal
//    or scientific ("0.01", "1e-3"), finite, in (0, 1].
// Each family lists its keys in canonical order; error messages list them in that order too.
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <charconv>
#include <cmath>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compressors/family.h"
#include "compressors/sparse/sparse.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {

std::span<const Family* const> builtin_families();  // families.cc

namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
constexpr size_t kMaxShown = 100;  // characters of user text quoted in an error

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

// The registered families: a slot per wire id, read without a lock (a family, once
// registered, stays for the life of the process); registration takes the mutex.
class Registry {
 public:
  static Registry& get() {
    static Registry* registry = [] {
      auto* r = new Registry;  // never destroyed: names may be looked up during exit
      for (const Family* f : builtin_families()) r->add(*f);
      return r;
    }();
    return *registry;
  }

  const Family* find(CompressorId id) const { return slots_[static_cast<uint8_t>(id)].load(std::memory_order_acquire); }

  const Family* find(std::string_view name) const {
    for (const auto& slot : slots_) {
      const Family* f = slot.load(std::memory_order_acquire);
      if (f != nullptr && name == f->name) return f;
    }
    return nullptr;
  }

  std::vector<const Family*> all() const {
    std::vector<const Family*> out;
    for (const auto& slot : slots_) {
      if (const Family* f = slot.load(std::memory_order_acquire)) out.push_back(f);
    }
    return out;
  }

  std::string names() const {
    std::string out;
    for (const Family* f : all()) out += fmt::format("{}{}", out.empty() ? "" : ", ", f->name);
    return out;
  }

  void add(const Family& family);

 private:
  Registry() = default;
  std::mutex mutex_;
  std::deque<Family> owned_;  // stable addresses for the slots
  std::array<std::atomic<const Family*>, 256> slots_{};
};

void Registry::add(const Family& f) {
  const std::string name = f.name != nullptr ? f.name : "";
  auto refuse = [&](std::string_view why) {
    throw InvalidArgument(fmt::format("register_family '{}' (id {}): {}", shown(name), static_cast<int>(f.id), why));
  };
  if (name.empty()) refuse("it has no name");
  for (const char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
      refuse("a name is lower-case letters, digits and '_'");
    }
  }
  if (f.collective == Collective::kCodecRing && f.make_codec == nullptr) refuse("a codec-ring family needs make_codec");
  if (f.collective == Collective::kLowRank && !f.reads_shapes) {
    refuse("a low-rank family reads the shapes (reads_shapes)");
  }
  if (f.collective == Collective::kLowRank && f.low_rank == nullptr) refuse("a low-rank family needs low_rank");
  const bool sparse = f.collective == Collective::kSparseSelection || f.collective == Collective::kSharedIndices ||
                      f.collective == Collective::kTableThenValues;
  if (sparse && (f.sparse == nullptr || f.sparse->shape == nullptr)) refuse("a sparsifier needs sparse ops with shape");
  if (f.collective == Collective::kSparseSelection && f.sparse->select == nullptr) {
    refuse("a family selecting its own indices needs sparse->select");
  }
  if (f.collective == Collective::kSharedIndices && f.sparse->draw == nullptr) {
    refuse("a family drawing shared indices needs sparse->draw");
  }
  if (f.collective == Collective::kTableThenValues &&
      (f.sparse->table == nullptr || f.sparse->accumulate == nullptr || f.sparse->recover == nullptr)) {
    refuse("a family whose indices come from a table needs sparse->table, accumulate and recover");
  }
  if (f.parse != nullptr && f.canonical == nullptr) refuse("it parses keys but has no canonical form");
  if (!f.keys.empty()) {
    // The paths apply these to every family (warm-up, small tensors, error feedback, draws).
    for (std::string_view common : {"ef", "min_numel", "warmup", "seed"}) {
      if (!f.takes(common)) refuse(fmt::format("a family with keys takes the common key '{}' too", common));
    }
  }
  std::lock_guard lock(mutex_);
  if (find(name) != nullptr) refuse("the name is taken");
  auto& slot = slots_[static_cast<uint8_t>(f.id)];
  if (slot.load(std::memory_order_acquire) != nullptr) {
    refuse(fmt::format("the id is {}'s", slot.load(std::memory_order_acquire)->name));
  }
  owned_.push_back(f);
  slot.store(&owned_.back(), std::memory_order_release);
}

// Splits "k=v,k=v" into pairs checked against the family's keys and for duplicates.
std::vector<SpecReader::Pair> split_pairs(const SpecReader& reader, const Family& family, std::string_view list) {
  const std::string_view name = family.name;
  if (family.keys.empty()) {
    reader.fail(fmt::format("{} takes no keys (found '{}'); write just '{}'", name, shown(list), name));
  }
  const std::string accepted = join(family.keys);
  if (list.empty()) reader.fail(fmt::format("{}: nothing after ':'; accepted keys: {}", name, accepted));
  std::vector<SpecReader::Pair> pairs;
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    const std::string_view item = list.substr(start, comma == std::string_view::npos ? list.npos : comma - start);
    const size_t eq = item.find('=');
    if (item.empty()) reader.fail(fmt::format("{}: empty key=value item (stray ','); accepted keys: {}", name, accepted));
    if (eq == std::string_view::npos) {
      reader.fail(fmt::format("{}: '{}' is not key=value; accepted keys: {}", name, shown(item), accepted));
    }
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    if (!family.takes(key)) reader.fail(fmt::format("{}: unknown key '{}'; accepted: {}", name, shown(key), accepted));
    for (const auto& p : pairs) {
      if (p.key == key) reader.fail(fmt::format("{}: key '{}' given twice", name, key));
    }
    if (value.empty()) reader.fail(fmt::format("{}: key '{}' has an empty value", name, key));
    pairs.push_back({key, value});
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return pairs;
}

// The keys every family but none takes (those it lists), and `values` where listed.
void parse_common(const SpecReader& r, const Family& family, CompressorSpec& s) {
  s.ef = r.choice<bool>("ef", {{"0", false}, {"1", true}}, family.ef_default);
  s.min_numel = r.integer("min_numel", 0, kMaxInt64, 0);
  s.warmup = r.integer("warmup", 0, kMaxInt64, 0);
  if (const auto seed = r.take("seed")) {
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(seed->data(), seed->data() + seed->size(), v, 10);
    if (ec != std::errc() || end != seed->data() + seed->size()) {
      r.fail(fmt::format("{}: seed='{}' {}; accepted: an integer in [0, {}]", r.name(), shown(*seed),
                         ec == std::errc::result_out_of_range ? "is out of range" : "is not a decimal integer",
                         std::numeric_limits<uint64_t>::max()));
    }
    s.seed = v;
  }
  s.compress_inside = r.choice<bool>("inside", {{"dense", false}, {"compress", true}}, false);
  s.values = r.choice<ValueType>("values",
                                 {{"fp32", ValueType::kFp32}, {"fp16", ValueType::kFp16}, {"bf16", ValueType::kBf16}},
                                 family.takes("values") ? family.values_default : ValueType::kFp32);
}

}  // namespace

std::string shown_spec_text(std::string_view text) { return shown(text); }

// ---- SpecReader -------------------------------------------------------------------

void SpecReader::fail(std::string_view problem) const {
  throw InvalidArgument(fmt::format("compressor spec '{}': {}", shown(spec_), problem));
}

void SpecReader::unknown_choice(std::string_view key, std::string_view value, const std::string& accepted) const {
  fail(fmt::format("{}: {}='{}' unknown; accepted: {}", name_, key, shown(value), accepted));
}

std::optional<std::string_view> SpecReader::take(std::string_view key) const {
  for (const auto& p : pairs_) {
    if (p.key == key) return p.value;
  }
  return std::nullopt;
}

int64_t SpecReader::parse_integer(std::string_view key, std::string_view value, int64_t lo, int64_t hi) const {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v, 10);
  if (ec == std::errc() && end == value.data() + value.size() && v >= lo && v <= hi) return v;
  fail(fmt::format("{}: {}='{}' {}; accepted: an integer in [{}, {}]", name_, key, shown(value),
                   ec == std::errc::invalid_argument || (ec == std::errc() && end != value.data() + value.size())
                       ? "is not a decimal integer"
                       : "is out of range",
                   lo, hi));
}

int64_t SpecReader::integer(std::string_view key, int64_t lo, int64_t hi, int64_t fallback) const {
  const auto value = take(key);
  return value ? parse_integer(key, *value, lo, hi) : fallback;
}

double SpecReader::parse_ratio(std::string_view key, std::string_view value) const {
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  const bool whole = ec == std::errc() && end == value.data() + value.size();
  if (whole && std::isfinite(v) && v > 0.0 && v <= 1.0) return v;
  fail(fmt::format("{}: {}='{}' {}; accepted: a number in (0, 1], e.g. 0.01 or 1e-3", name_, key, shown(value),
                   whole && std::isfinite(v) ? "is out of range" : "is not a finite number"));
}

double SpecReader::parse_number(std::string_view key, std::string_view value, double lo, double hi) const {
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  const bool whole = ec == std::errc() && end == value.data() + value.size();
  if (whole && std::isfinite(v) && v >= lo && v <= hi) return v;
  fail(fmt::format("{}: {}='{}' {}; accepted: a number in [{}, {}]", name_, key, shown(value),
                   whole && std::isfinite(v) ? "is out of range" : "is not a finite number", lo, hi));
}

void SpecReader::ratio_or_k(double& ratio_out, int64_t& k_out) const {
  const auto ratio = take("ratio");
  const auto k = take("k");
  if (ratio && k) fail(fmt::format("{}: give ratio or k, not both", name_));
  if (!ratio && !k) {
    fail(fmt::format("{}: one of ratio=R (a number in (0, 1]) or k=K (an integer >= 1) is required", name_));
  }
  if (ratio) ratio_out = parse_ratio("ratio", *ratio);
  if (k) k_out = parse_integer("k", *k, 1, kMaxInt64);
}

std::string ratio_or_k_text(double ratio, int64_t k) {
  return k > 0 ? fmt::format("k={}", k) : fmt::format("ratio={}", ratio);
}

// ---- the registry ------------------------------------------------------------------

const Family& family_of(CompressorId id) {
  if (const Family* f = Registry::get().find(id)) return *f;
  throw InvalidArgument(fmt::format("no compressor family has id {}", static_cast<int>(id)));
}

std::vector<const Family*> registered_families() { return Registry::get().all(); }

bool compresses_16bit(const CompressorSpec& spec) {
  const Collective c = family_of(spec.id).collective;
  return (c == Collective::kCodecRing || c == Collective::kSparseSelection) && !spec.compress_inside;
}

bool runs_dense(const CompressorSpec& spec, uint64_t step, int64_t numel) {
  return family_of(spec.id).collective == Collective::kDense || step < static_cast<uint64_t>(spec.warmup) ||
         numel < spec.min_numel;
}

const SparseOps& sparse_ops(const CompressorSpec& spec) {
  const Family& family = family_of(spec.id);
  if (family.sparse == nullptr) throw InvalidArgument(fmt::format("{} is not a sparsifier", family.name));
  return *family.sparse;
}

void wrong_family_params(CompressorId id, const char* wanted) {
  throw InvalidArgument(fmt::format("a {} spec does not hold {}", compressor_name(id), wanted));
}

std::string family_names(Collective collective) {
  std::string names;
  for (const Family* f : registered_families()) {
    if (f->collective == collective) names += fmt::format("{}{}", names.empty() ? "" : ", ", f->name);
  }
  return names;
}

void register_family(const Family& family) { Registry::get().add(family); }

const char* compressor_name(CompressorId id) {
  const Family* f = Registry::get().find(id);
  return f != nullptr ? f->name : "unknown";
}

CompressorSpec parse_compressor_spec(std::string_view spec) {
  const Registry& registry = Registry::get();
  const SpecReader whole(spec, "", {});
  if (spec.empty()) whole.fail(fmt::format("empty spec; accepted compressors: {}", registry.names()));
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] == ' ' || spec[i] == '\t' || spec[i] == '\n' || spec[i] == '\r' || spec[i] == '\v' ||
        spec[i] == '\f') {
      whole.fail(fmt::format("whitespace at offset {}; write the spec without spaces, e.g. 'topk:ratio=0.01,ef=1'", i));
    }
  }
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  const Family* family = registry.find(name);
  if (family == nullptr) {
    whole.fail(fmt::format("compressor '{}' unknown; accepted: {}", shown(name), registry.names()));
  }
  std::vector<SpecReader::Pair> pairs;
  if (colon != std::string_view::npos) pairs = split_pairs(whole, *family, spec.substr(colon + 1));
  const SpecReader reader(spec, family->name, std::move(pairs));

  CompressorSpec s;
  s.id = family->id;
  if (family->keys.empty()) return s;
  parse_common(reader, *family, s);
  if (family->parse != nullptr) s.params = family->parse(reader, s);
  return s;
}

// The family's keys first, then the common ones it takes, each with its resolved
// value, so that two specs that parse equal print equal and parse(canonical()) gives
// the spec back. Doubles print with fmt's shortest round-trip form ("0.01", "1e-05").
std::string CompressorSpec::canonical() const {
  const Family& family = family_of(id);
  if (family.keys.empty()) return family.name;
  std::string out = fmt::format("{}:", family.name);
  if (family.canonical != nullptr) out += family.canonical(*this);
  out += fmt::format("ef={},min_numel={},warmup={},seed={}", ef ? 1 : 0, min_numel, warmup, seed);
  if (compress_inside) out += ",inside=compress";  // printed when set: specs of before read as they did
  if (family.takes("values")) {
    out += fmt::format(",values={}", values == ValueType::kFp32   ? "fp32"
                                     : values == ValueType::kFp16 ? "fp16"
                                                                  : "bf16");
  }
  return out;
}

}  // namespace gradcomm::detail
