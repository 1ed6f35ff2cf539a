// qsgd (stochastic levels of the bucket's norm) and quant (b-bit min/max buckets):
// dense codecs over the compressed ring (qsgd_codec.cc, quant_codec.cc).
#include <fmt/format.h>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/quantize/dense_util.h"
#include "gradcomm/errors.h"

#if GRADCOMM_WITH_CUDA
#include "compressors/quantize/gpu_qsgd_logic.h"   // kQsgdGpuKernels
#include "compressors/quantize/gpu_quant_logic.h"  // kQuantGpuKernels
#endif

namespace gradcomm::detail {
namespace {

constexpr int64_t kMaxLevels = int64_t{1} << 15;

constexpr std::string_view kQsgdKeys[] = {"levels", "bucket", "ef", "min_numel", "warmup", "seed"};
constexpr std::string_view kQuantKeys[] = {"bits", "bucket", "round", "ef", "min_numel", "warmup", "seed"};

void parse_qsgd(const SpecReader& r, CompressorSpec& s) {
  s.levels = static_cast<int>(r.integer("levels", 1, kMaxLevels, 16));
  s.bucket = r.integer("bucket", 1, kMaxBucket, 512);
}

std::string canonical_qsgd(const CompressorSpec& s) { return fmt::format("levels={},bucket={},", s.levels, s.bucket); }

std::unique_ptr<DenseCodec> make_qsgd(const CompressorSpec& s) {
  check_bucket("qsgd", s.bucket);
  // Levels must be exact in fp32 and fit the 25-bit codes of bitpack.h.
  if (s.levels < 1 || s.levels >= (1 << 24)) {
    throw InvalidArgument(fmt::format("qsgd: levels={} outside [1, 2^24 - 1]", s.levels));
  }
  return make_qsgd_codec(s.levels, s.bucket);
}

void parse_quant(const SpecReader& r, CompressorSpec& s) {
  s.bits = r.choice<int>("bits", {{"1", 1}, {"2", 2}, {"4", 4}, {"8", 8}}, 8);
  s.bucket = r.integer("bucket", 1, kMaxBucket, 512);
  s.round = r.choice<Rounding>("round", {{"stochastic", Rounding::kStochastic}, {"nearest", Rounding::kNearest}},
                               Rounding::kStochastic);
}

std::string canonical_quant(const CompressorSpec& s) {
  return fmt::format("bits={},bucket={},round={},", s.bits, s.bucket,
                     s.round == Rounding::kStochastic ? "stochastic" : "nearest");
}

bool quant_keeps_state(const CompressorSpec& s) { return s.round == Rounding::kStochastic; }

std::unique_ptr<DenseCodec> make_quant(const CompressorSpec& s) {
  check_bucket("quant", s.bucket);
  if (s.bits != 1 && s.bits != 2 && s.bits != 4 && s.bits != 8) {
    throw InvalidArgument(fmt::format("quant: bits={} (accepted: 1, 2, 4, 8)", s.bits));
  }
  return make_quant_codec(s.bits, s.bucket, s.round);
}

bool always(const CompressorSpec&) { return true; }  // qsgd's draws change from step to step

#if GRADCOMM_WITH_CUDA
constexpr const GpuDenseKernels* kQsgdGpu = &kQsgdGpuKernels;
#else
constexpr const GpuDenseKernels* kQsgdGpu = nullptr;  // built without CUDA
#endif
#if GRADCOMM_WITH_CUDA
constexpr const GpuDenseKernels* kQuantGpu = &kQuantGpuKernels;
#else
constexpr const GpuDenseKernels* kQuantGpu = nullptr;  // built without CUDA
#endif

constexpr Family kQsgdFamily{.id = CompressorId::kQsgd,
                             .name = "qsgd",
                             .keys = kQsgdKeys,
                             .ef_default = false,
                             .values_default = ValueType::kFp32,
                             .collective = Collective::kCodecRing,
                             .parse = parse_qsgd,
                             .canonical = canonical_qsgd,
                             .keeps_state = always,
                             .make_codec = make_qsgd,
                             .gpu_dense = kQsgdGpu};

constexpr Family kQuantFamily{.id = CompressorId::kQuant,
                              .name = "quant",
                              .keys = kQuantKeys,
                              .ef_default = false,
                              .values_default = ValueType::kFp32,
                              .collective = Collective::kCodecRing,
                              .parse = parse_quant,
                              .canonical = canonical_quant,
                              .keeps_state = quant_keeps_state,
                              .make_codec = make_quant,
                              .gpu_dense = kQuantGpu};

}  // namespace

const Family& qsgd_family() { return kQsgdFamily; }
const Family& quant_family() { return kQuantFamily; }

}  // namespace gradcomm::detail
