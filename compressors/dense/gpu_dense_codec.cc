// GpuDenseCodec: argument checks, then the family's own GPU codec (its
// GpuDenseKernels table, gpu_dense_launch.h). Host code only; the kernels live in the .cu files.
#include "compressors/dense/gpu_dense_codec.h"

#include <fmt/format.h>

#include <cstdint>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/dense/gpu_dense_launch.h"
#include "compressors/dense/gpu_dense_logic.h"
#include "compressors/payload.h"
#include "compressors/spec.h"
#include "compressors/dense/dense_util.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {

static_assert(kDenseMagic == PayloadHeader::kMagic && kDenseVersion == PayloadHeader::kVersion &&
              kDenseHeaderBytes == PayloadHeader::kBytes);

namespace {

// InvalidArgument unless p is null only when allowed, and 4-byte aligned (fp32).
void check_floats(const void* p, int64_t n, const char* name, const char* what) {
  if (p == nullptr && n > 0) throw InvalidArgument(fmt::format("{}: {} is null with n={}", what, name, n));
  if (reinterpret_cast<uintptr_t>(p) % alignof(float) != 0) {
    throw InvalidArgument(fmt::format("{}: {} = {} is not aligned to its 4-byte float elements", what, name, p));
  }
}

// InvalidArgument when [a, a + a_bytes) and [b, b + b_bytes) share a byte.
void check_disjoint(const void* a, uint64_t a_bytes, const char* a_name, const void* b, uint64_t b_bytes,
                    const char* b_name, const char* what) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  if (a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes) {
    throw InvalidArgument(fmt::format("{}: {} and {} overlap", what, a_name, b_name));
  }
}

}  // namespace

GpuDenseCodec::GpuDenseCodec(const CompressorSpec& spec)
    : spec_(std::make_shared<const CompressorSpec>(spec)),
      id_(spec.id),
      kernels_(family_of(spec.id).gpu_dense),
      alignment_(make_dense_codec(spec)->alignment()) {  // the CPU codec's checks: bits, levels, bucket
  if (kernels_ == nullptr) {
    throw InvalidArgument(fmt::format("{}: no CUDA codec; on the NCCL path only families with GPU kernels compress "
                                      "(CPU tensors, or transport=ucx staging, use its CPU codec)",
                                      compressor_name(spec.id)));
  }
}

size_t GpuDenseCodec::encoded_bytes(int64_t n) const {
  check_dense_numel(compressor_name(id_), n);
  return static_cast<size_t>(kernels_->layout(*spec_, static_cast<uint64_t>(n)).total_bytes());
}

int64_t GpuDenseCodec::alignment() const { return alignment_; }

void GpuDenseCodec::encode(const float* in, int64_t n, uint8_t* payload, const PhiloxStream& rng, int64_t first,
                           float* residual, cudaStream_t stream) const {
  encode(in, n, payload, rng, first, EncodeFeedback{residual, ResidualMode::kFold, nullptr}, stream);
}

void GpuDenseCodec::encode(const float* in, int64_t n, uint8_t* payload, const PhiloxStream& rng, int64_t first,
                           const EncodeFeedback& feedback, cudaStream_t stream) const {
  const std::string what = fmt::format("{} GPU encode", compressor_name(id_));
  check_dense_encode(what.c_str(), n, first, alignment());
  const DenseLayout layout = kernels_->layout(*spec_, static_cast<uint64_t>(n));
  const uint64_t floats = static_cast<uint64_t>(n) * sizeof(float);
  check_floats(in, n, "in", what.c_str());
  if (payload == nullptr) throw InvalidArgument(fmt::format("{}: payload is null", what));
  check_disjoint(in, floats, "in", payload, layout.total_bytes(), "payload", what.c_str());
  if (feedback.residual != nullptr) {
    check_floats(feedback.residual, n, "residual", what.c_str());
    check_disjoint(feedback.residual, floats, "residual", in, floats, "in", what.c_str());
    check_disjoint(feedback.residual, floats, "residual", payload, layout.total_bytes(), "payload", what.c_str());
    if (feedback.mode != ResidualMode::kFold && feedback.mode != ResidualMode::kAccumulate) {
      throw InvalidArgument(fmt::format("{}: unknown residual mode {}", what, static_cast<int>(feedback.mode)));
    }
  }
  if (feedback.decoded != nullptr) {
    check_floats(feedback.decoded, n, "decoded", what.c_str());
    check_disjoint(feedback.decoded, floats, "decoded", payload, layout.total_bytes(), "payload", what.c_str());
    if (feedback.residual != nullptr) {
      check_disjoint(feedback.decoded, floats, "decoded", feedback.residual, floats, "residual", what.c_str());
    }
    // decoded == in is fine (each element is read, then written, by one thread);
    // a partial overlap would make the result depend on scheduling.
    if (feedback.decoded != in) check_disjoint(feedback.decoded, floats, "decoded", in, floats, "in", what.c_str());
  }
  kernels_->encode(GpuEncodeArgs{layout, in, payload, rng, static_cast<uint64_t>(first), feedback, stream}, *spec_);
}

void GpuDenseCodec::decode(const uint8_t* payload, size_t payload_bytes, int64_t n, float* out, bool add,
                           DeviceStatus* status, cudaStream_t stream) const {
  const std::string what = fmt::format("{} GPU decode", compressor_name(id_));
  check_dense_numel(what.c_str(), n);
  check_floats(out, n, "out", what.c_str());
  if (status == nullptr) throw InvalidArgument(fmt::format("{}: status is null", what));
  if (payload == nullptr && payload_bytes > 0) {
    throw InvalidArgument(fmt::format("{}: payload is null with {} bytes", what, payload_bytes));
  }
  check_disjoint(out, static_cast<uint64_t>(n) * sizeof(float), "out", payload, payload_bytes, "payload",
                 what.c_str());
  kernels_->decode(
      GpuDecodeArgs{kernels_->layout(*spec_, static_cast<uint64_t>(n)), payload, payload_bytes, out, add, status, stream});
}

}  // namespace gradcomm::detail
