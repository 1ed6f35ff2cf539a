// sign: one bit per element and a per-bucket mean |x| (sign_codec.cc), over the
// compressed ring; error feedback on by default (signSGD needs it to converge).
#include <fmt/format.h>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/quantize/dense_util.h"

#if GRADCOMM_WITH_CUDA
#include "compressors/sign/gpu_sign_logic.h"  // kSignGpuKernels
#endif

namespace gradcomm::detail {
namespace {

constexpr std::string_view kKeys[] = {"bucket", "ef", "min_numel", "warmup", "seed", "inside"};

void parse(const SpecReader& r, CompressorSpec& s) { s.bucket = r.integer("bucket", 1, kMaxBucket, 512); }

std::string canonical(const CompressorSpec& s) { return fmt::format("bucket={},", s.bucket); }

std::unique_ptr<DenseCodec> make_codec(const CompressorSpec& s) {
  check_bucket("sign", s.bucket);
  return make_sign_codec(s.bucket);
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

const Family& sign_family() { return kSignFamily; }

}  // namespace gradcomm::detail
