// qsgd (stochastic levels of the bucket's norm) and quant (b-bit min/max buckets):
// dense codecs over the compressed ring (qsgd_codec.cc, quant_codec.cc).
#include <fmt/format.h>

#include <cmath>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/dense/dense_util.h"
#include "compressors/quantize/quantize.h"
#include "gradcomm/errors.h"
#include "compressors/spec.h"

#if GRADCOMM_WITH_CUDA
#include "compressors/quantize/gpu_qsgd_logic.h"   // kQsgdGpuKernels
#include "compressors/quantize/gpu_quant_logic.h"  // kQuantGpuKernels
#endif

namespace gradcomm::detail {
namespace {

constexpr int64_t kMaxLevels = int64_t{1} << 15;

constexpr std::string_view kQsgdKeys[] = {"levels", "bucket", "ef", "min_numel", "warmup", "seed", "inside"};
constexpr std::string_view kQuantKeys[] = {"bits", "bucket", "round", "ef", "min_numel", "warmup", "seed",
                                           "inside"};

// Error feedback re-sends what a codec dropped: acc = grad + residual, residual = acc -
// decode(encode(acc)). It stays bounded only when a codec's error is below its input
// (||acc - decode(encode(acc))|| < ||acc||); otherwise the residual grows geometrically
// and the output becomes inf, then NaN (issue 42: quant:bits=1,ef=1 and
// qsgd:levels=2,ef=1 did so within 150 steps). The specs that cannot keep that bound on
// ordinary gradients are refused here; tests/unit/test_ef_stability.cc runs every
// accepted shape of spec 500 steps and shows the error-feedback average converging.
//
// qsgd: the variance of a bucket of B values at s levels is at most min(B/s^2,
// sqrt(B)/s) times its squared norm (QSGD, Alistarh et al. 2017, Lemma 3.1), and a
// quarter of B/s^2 when the values share one magnitude (every position at s/sqrt(B)).
// Accepted: 4 s^2 > B, where both stay below 1 (about 0.5 sqrt(B)/s for normal values).
// Measured at B = 512: s = 11 (4 s^2 = 484) still converged, s = 8 diverged.
void check_qsgd_feedback(const SpecReader& r, bool ef, const QsgdParams& s) {
  if (!ef || 4 * int64_t{s.levels} * s.levels > s.bucket) return;
  const auto fewest = static_cast<int64_t>(std::floor(std::sqrt(static_cast<double>(s.bucket)) / 2)) + 1;
  r.fail(fmt::format("qsgd: ef=1 needs levels > sqrt(bucket)/2 (levels={}, bucket={}): with fewer levels a bucket's "
                     "quantization error can exceed its values, and error feedback then grows without bound; use "
                     "levels={} or more, a bucket of at most {}, or ef=0",
                     s.levels, s.bucket, fewest, 4 * int64_t{s.levels} * s.levels - 1));
}

// quant: one bit per value leaves each bucket two points, its min and max, and a value
// between them is off by up to the whole range: for normal values the error is about 8
// times the input (stochastic rounding) and error feedback diverges from buckets of 4
// values up (3 is exact at its ends and within half the range in the middle). sign is the
// 1-bit codec made for error feedback (its scale, mean |x|, is the least-squares fit).
// 2 bits and more converge on normal, heavy-tailed and sparse gradients at every bucket
// size (the test's grid).
void check_quant_feedback(const SpecReader& r, bool ef, const QuantParams& s) {
  if (!ef || s.bits != 1 || s.bucket <= 3) return;
  r.fail(fmt::format("quant: ef=1 with bits=1 (bucket={}) is refused: a 1-bit min/max code's error exceeds the "
                     "values it codes, and error feedback then grows without bound; use sign (1 bit per value, "
                     "made for error feedback), bits=2 or more, or ef=0",
                     s.bucket));
}

std::shared_ptr<const FamilyParams> parse_qsgd(const SpecReader& r, CompressorSpec& common) {
  auto s = std::make_shared<QsgdParams>();
  s->levels = static_cast<int>(r.integer("levels", 1, kMaxLevels, 16));
  s->bucket = r.integer("bucket", 1, kMaxBucket, 512);
  check_qsgd_feedback(r, common.ef, *s);
  return s;
}

std::string canonical_qsgd(const CompressorSpec& spec) {
  const auto& s = spec.family<QsgdParams>();
  return fmt::format("levels={},bucket={},", s.levels, s.bucket);
}

std::unique_ptr<DenseCodec> make_qsgd(const CompressorSpec& spec) {
  const auto& s = spec.family<QsgdParams>();
  check_bucket("qsgd", s.bucket);
  // Levels must be exact in fp32 and fit the 25-bit codes of bitpack.h.
  if (s.levels < 1 || s.levels >= (1 << 24)) {
    throw InvalidArgument(fmt::format("qsgd: levels={} outside [1, 2^24 - 1]", s.levels));
  }
  return make_qsgd_codec(s.levels, s.bucket);
}

std::shared_ptr<const FamilyParams> parse_quant(const SpecReader& r, CompressorSpec& common) {
  auto s = std::make_shared<QuantParams>();
  s->bits = r.choice<int>("bits", {{"1", 1}, {"2", 2}, {"4", 4}, {"8", 8}}, 8);
  s->bucket = r.integer("bucket", 1, kMaxBucket, 512);
  s->round = r.choice<Rounding>("round", {{"stochastic", Rounding::kStochastic}, {"nearest", Rounding::kNearest}},
                                Rounding::kStochastic);
  check_quant_feedback(r, common.ef, *s);
  return s;
}

std::string canonical_quant(const CompressorSpec& spec) {
  const auto& s = spec.family<QuantParams>();
  return fmt::format("bits={},bucket={},round={},", s.bits, s.bucket,
                     s.round == Rounding::kStochastic ? "stochastic" : "nearest");
}

bool quant_keeps_state(const CompressorSpec& spec) { return spec.family<QuantParams>().round == Rounding::kStochastic; }

std::unique_ptr<DenseCodec> make_quant(const CompressorSpec& spec) {
  const auto& s = spec.family<QuantParams>();
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

CompressorSpec quant_spec(int bits, int64_t bucket, Rounding round) {
  auto p = std::make_shared<QuantParams>();
  p->bits = bits;
  p->bucket = bucket;
  p->round = round;
  return spec_of(CompressorId::kQuant, std::move(p));
}

CompressorSpec qsgd_spec(int levels, int64_t bucket) {
  auto p = std::make_shared<QsgdParams>();
  p->levels = levels;
  p->bucket = bucket;
  return spec_of(CompressorId::kQsgd, std::move(p));
}

const Family& qsgd_family() { return kQsgdFamily; }
const Family& quant_family() { return kQuantFamily; }

}  // namespace gradcomm::detail
