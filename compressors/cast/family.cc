// fp16 and bf16: every value cast to 16 bits over the compressed ring (cast_codec.cc).
#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/cast/cast.h"
#include "compressors/dense/dense_util.h"
#include "compressors/spec.h"

#if GRADCOMM_WITH_CUDA
#include "compressors/cast/gpu_cast_logic.h"  // kCastGpuKernels
#endif

namespace gradcomm::detail {
namespace {

constexpr std::string_view kKeys[] = {"ef", "min_numel", "warmup", "seed", "inside"};

std::unique_ptr<DenseCodec> make_codec(const CompressorSpec& spec) { return make_cast_codec(spec.id); }

#if GRADCOMM_WITH_CUDA
constexpr const GpuDenseKernels* kGpu = &kCastGpuKernels;
#else
constexpr const GpuDenseKernels* kGpu = nullptr;  // built without CUDA
#endif

constexpr Family cast_family(CompressorId id, const char* name) {
  return Family{.id = id,
                .name = name,
                .keys = kKeys,
                .ef_default = false,
                .values_default = ValueType::kFp32,
                .collective = Collective::kCodecRing,
                .make_codec = make_codec,
                .gpu_dense = kGpu};
}

constexpr Family kFp16Family = cast_family(CompressorId::kFp16, "fp16");
constexpr Family kBf16Family = cast_family(CompressorId::kBf16, "bf16");

}  // namespace

const Family& fp16_family() { return kFp16Family; }
const Family& bf16_family() { return kBf16Family; }

}  // namespace gradcomm::detail
