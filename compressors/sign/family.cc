// sign: one bit per element and a per-bucket mean |x| (sign_codec.cc), over the
// compressed ring; error feedback on by default (signSGD needs it to converge).
#include <fmt/format.h>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/dense/dense_util.h"
#include "compressors/sign/sign.h"
#include "compressors/spec.h"

#if GRADCOMM_WITH_CUDA
#include "compressors/sign/gpu_sign_logic.h"  // kSignGpuKernels
#endif

namespace gradcomm::detail {
namespace {

constexpr std::string_view kKeys[] = {"bucket", "ef", "min_numel", "warmup", "seed", "inside"};

std::shared_ptr<const FamilyParams> parse(const SpecReader& r, CompressorSpec& /*common*/) {
  auto s = std::make_shared<SignParams>();
  s->bucket = r.integer("bucket", 1, kMaxBucket, 512);
  return s;
}

std::string canonical(const CompressorSpec& spec) { return fmt::format("bucket={},", spec.family<SignParams>().bucket); }

std::unique_ptr<DenseCodec> make_codec(const CompressorSpec& spec) {
  const int64_t bucket = spec.family<SignParams>().bucket;
  check_bucket("sign", bucket);
  return make_sign_codec(bucket);
}

#if GRADCOMM_WITH_CUDA
constexpr const GpuDenseKernels* kGpu = &kSignGpuKernels;
#else
constexpr const GpuDenseKernels* kGpu = nullptr;  // built without CUDA
#endif

constexpr Family kSignFamily{.id = CompressorId::kSign,
                             .name = "sign",
                             .keys = kKeys,
                             .ef_default = true,
                             .values_default = ValueType::kFp32,
                             .collective = Collective::kCodecRing,
                             .parse = parse,
                             .canonical = canonical,
                             .make_codec = make_codec,
                             .gpu_dense = kGpu};

}  // namespace

CompressorSpec sign_spec(int64_t bucket) {
  auto p = std::make_shared<SignParams>();
  p->bucket = bucket;
  return spec_of(CompressorId::kSign, std::move(p));
}

const Family& sign_family() { return kSignFamily; }

}  // namespace gradcomm::detail
