// sketch: a rows x cols count-sketch of acc (count_sketch.cc) summed densely; the
// heavy hitters it recovers are the same on every rank, and their exact values are
// then summed as random-k's are.
#include <fmt/format.h>

#include "compressors/family.h"

namespace gradcomm::detail {
namespace {

constexpr int64_t kMaxRows = 64;
constexpr int64_t kMinCols = 16;
constexpr int64_t kMaxCols = int64_t{1} << 24;  // 64 rows x 2^24 cols x 4 B = 4 GiB table at most

constexpr std::string_view kKeys[] = {"rows",     "cols",   "k",    "ratio", "ef",
                                      "min_numel", "warmup", "seed", "values"};

void parse(const SpecReader& r, CompressorSpec& s) {
  s.rows = static_cast<int>(r.integer("rows", 1, kMaxRows, 5));
  // cols = 0 is the default "choose from k at use"; an explicit value must be a
  // real table width.
  if (const auto cols = r.take("cols")) {
    s.cols = static_cast<int>(*cols == "0" ? 0 : r.parse_integer("cols", *cols, kMinCols, kMaxCols));
  }
  r.ratio_or_k(s);
}

std::string canonical(const CompressorSpec& s) {
  return fmt::format("rows={},cols={},{},", s.rows, s.cols, ratio_or_k_text(s));
}

bool never(const CompressorSpec&) { return false; }  // its table and k are sized per tensor

constexpr Family kSketchFamily{.id = CompressorId::kSketch,
                               .name = "sketch",
                               .keys = kKeys,
                               .ef_default = true,
                               .values_default = ValueType::kFp32,
                               .collective = Collective::kSketchThenValues,
                               .parse = parse,
                               .canonical = canonical,
                               .fusable = never};

}  // namespace

const Family& sketch_family() { return kSketchFamily; }

}  // namespace gradcomm::detail
