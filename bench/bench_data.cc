#include "bench_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "compressors/lowrank/powersgd_logic.h"
#include "compressors/powersgd/powersgd.h"
#include "compressors/quantize/quantize.h"
#include "compressors/randomk/randomk.h"
#include "compressors/sketch/sketch.h"
#include "compressors/spec.h"
#include "compressors/topk/topk.h"
#include "env.h"
#include "gradcomm/errors.h"
#include "half.h"

#if GRADCOMM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gradcomm::bench {

namespace {

#if GRADCOMM_WITH_CUDA
void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw CudaError(fmt::format("gradcomm-bench: {}: {}", what, cudaGetErrorString(rc)));
}
#endif

[[noreturn, maybe_unused]] void no_cuda() {
  throw Unsupported("--device cuda: this gradcomm-bench was built without CUDA (configure with GRADCOMM_CUDA=ON)");
}

int64_t pattern(int rank, int64_t i) { return (rank + 1) * (i % 7 + 1); }

// normal(0, 1) draws for the gradient-like timing input: splitmix64 feeding
// Box-Muller, two draws per pair of 64-bit words (fast enough for 256 MB per rank).
class NormalDraws {
 public:
  explicit NormalDraws(uint64_t seed) : state_(seed) {}
  double next() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1] so that log(u1) is finite; u2 in [0, 1).
    const double u1 = (static_cast<double>(word() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(word() >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * M_PI * u2;
    spare_ = radius * std::sin(angle);
    have_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  uint64_t word() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
  double spare_ = 0;
  bool have_spare_ = false;
};

void store_real(void* base, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(base)[i] = v; break;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = detail::float_to_half(static_cast<float>(v)); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = detail::float_to_bf16(static_cast<float>(v)); break;
    default: break;  // integer types never take real values (fill_timing_input)
  }
}

// Every value the bench writes or expects is an integer well inside each type's
// exact range, so going through int64 loses nothing.
void store_value(void* base, DType dtype, int64_t i, int64_t v) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(base)[i] = static_cast<double>(v); break;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = detail::float_to_half(static_cast<float>(v)); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = detail::float_to_bf16(static_cast<float>(v)); break;
    case DType::kInt32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(base)[i] = v; break;
    case DType::kUInt8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
  }
}

// Exact comparison: the expected values are representable, so any difference is an error.
bool equals(const void* base, DType dtype, int64_t i, int64_t v) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(base)[i] == static_cast<float>(v);
    case DType::kFloat64: return static_cast<const double*>(base)[i] == static_cast<double>(v);
    case DType::kFloat16:
      return detail::half_to_float(static_cast<const uint16_t*>(base)[i]) == static_cast<float>(v);
    case DType::kBFloat16:
      return detail::bf16_to_float(static_cast<const uint16_t*>(base)[i]) == static_cast<float>(v);
    case DType::kInt32: return static_cast<const int32_t*>(base)[i] == static_cast<int32_t>(v);
    case DType::kInt64: return static_cast<const int64_t*>(base)[i] == v;
    case DType::kUInt8: return static_cast<const uint8_t*>(base)[i] == static_cast<uint8_t>(v);
  }
  return false;
}

bool is_integer(DType dtype) {
  return dtype == DType::kInt32 || dtype == DType::kInt64 || dtype == DType::kUInt8;
}

// Host copy of a device buffer (or the host buffer itself).
class HostView {
 public:
  HostView(const BenchBuffer& buf, int64_t bytes, Device device) {
    if (device.type == DeviceType::kCpu) {
      data_ = buf.data();
      return;
    }
#if GRADCOMM_WITH_CUDA
    staging_.resize(static_cast<size_t>(bytes));
    cuda_check(cudaMemcpy(staging_.data(), buf.data(), staging_.size(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    data_ = staging_.data();
#else
    (void)bytes;
    no_cuda();
#endif
  }
  const void* data() const { return data_; }

 private:
  const void* data_ = nullptr;
  std::vector<std::byte> staging_;
};

// Fills through a host staging copy when the buffer lives on the GPU.
// store(base, i) writes element i.
template <class Store>
void fill_with(const BenchBuffer& buf, DType dtype, int64_t count, Device device, Store&& store) {
  if (device.type == DeviceType::kCpu) {
    for (int64_t i = 0; i < count; ++i) store(buf.data(), i);
    return;
  }
#if GRADCOMM_WITH_CUDA
  std::vector<std::byte> staging(static_cast<size_t>(count) * dtype_size(dtype));
  for (int64_t i = 0; i < count; ++i) store(staging.data(), i);
  cuda_check(cudaMemcpy(buf.data(), staging.data(), staging.size(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
#else
  no_cuda();
#endif
}

template <class Fill>
void fill(const BenchBuffer& buf, DType dtype, int64_t count, Device device, Fill&& value_of) {
  fill_with(buf, dtype, count, device,
            [&](void* base, int64_t i) { store_value(base, dtype, i, value_of(i)); });
}

}  // namespace

int bench_cuda_device() {
  int local = 0;
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (auto v = detail::env_string(name)) {
      try {
        local = std::stoi(*v);
      } catch (const std::exception&) {
        throw InvalidArgument(fmt::format("--device cuda: {}='{}' is not a local rank", name, *v));
      }
      break;
    }
  }
#if GRADCOMM_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();
    throw Unsupported("--device cuda: no CUDA device on this machine");
  }
  return std::max(local, 0) % count;
#else
  (void)local;
  no_cuda();
#endif
}

BenchBuffer::BenchBuffer(int64_t bytes, Device device) : device_(device) {
  size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 1));  // never a null pointer, even for 0 bytes
  if (device.type == DeviceType::kCpu) {
    data_ = ::operator new(n, std::align_val_t{64});
    return;
  }
#if GRADCOMM_WITH_CUDA
  cuda_check(cudaSetDevice(device.index), "cudaSetDevice");
  cuda_check(cudaMalloc(&data_, n), "cudaMalloc");
#else
  no_cuda();
#endif
}

BenchBuffer::BenchBuffer(int64_t bytes, Communicator& comm)
    : shared_(comm.alloc_shared(static_cast<size_t>(std::max<int64_t>(bytes, 1)))) {
  data_ = shared_.data();
}

BenchBuffer::~BenchBuffer() {
  if (shared_.data() != nullptr) return;  // its own destructor unmaps it
  if (device_.type == DeviceType::kCpu) {
    ::operator delete(data_, std::align_val_t{64});
    return;
  }
#if GRADCOMM_WITH_CUDA
  cudaFree(data_);
#endif
}

void fill_check_input(const BenchBuffer& buf, DType dtype, int64_t count, int rank, Device device) {
  fill(buf, dtype, count, device, [rank](int64_t i) { return pattern(rank, i); });
}

void fill_timing_input(const BenchBuffer& buf, DType dtype, int64_t count, int rank, Device device,
                       TimingInput input) {
  if (is_integer(dtype)) {
    fill(buf, dtype, count, device, [](int64_t) { return int64_t{0}; });
  } else if (input == TimingInput::kPattern) {
    fill_check_input(buf, dtype, count, rank, device);
  } else {
    NormalDraws draws(0x6772616463ull + static_cast<uint64_t>(rank));  // fixed per rank: runs repeat
    fill_with(buf, dtype, count, device, [&](void* base, int64_t i) { store_real(base, dtype, i, draws.next()); });
  }
}

void copy_buffer(const BenchBuffer& dst, const BenchBuffer& src, int64_t bytes, Device device) {
  if (device.type == DeviceType::kCpu) {
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(bytes));
    return;
  }
#if GRADCOMM_WITH_CUDA
  cuda_check(cudaMemcpy(dst.data(), src.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice),
             "cudaMemcpy D2D");
#else
  no_cuda();
#endif
}

void clear_buffer(const BenchBuffer& buf, int64_t bytes, Device device) {
  if (device.type == DeviceType::kCpu) {
    std::memset(buf.data(), 0, static_cast<size_t>(bytes));
    return;
  }
#if GRADCOMM_WITH_CUDA
  cuda_check(cudaMemset(buf.data(), 0, static_cast<size_t>(bytes)), "cudaMemset");
#else
  no_cuda();
#endif
}

int64_t count_wrong_allreduce(const BenchBuffer& buf, DType dtype, int64_t count, int world_size, Device device,
                              ReduceOp op, int64_t first) {
  HostView host(buf, count * static_cast<int64_t>(dtype_size(dtype)), device);
  const int64_t n = world_size;
  const int64_t ranks_sum = n * (n + 1) / 2;  // sum of (r + 1)
  int64_t wrong = 0;
  if (op == ReduceOp::kAvg && !is_integer(dtype)) {
    // The sum is exact; one division by N, in fp64 for float64 and in fp32 otherwise.
    std::vector<uint8_t> expected(dtype_size(dtype));
    for (int64_t i = 0; i < count; ++i) {
      const double sum = static_cast<double>(((first + i) % 7 + 1) * ranks_sum);
      const double avg = dtype == DType::kFloat64 ? sum / static_cast<double>(n)
                                                  : static_cast<float>(sum) / static_cast<float>(n);
      store_real(expected.data(), dtype, 0, avg);
      wrong += std::memcmp(static_cast<const uint8_t*>(host.data()) + i * expected.size(), expected.data(),
                           expected.size()) != 0;
    }
    return wrong;
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t v = (first + i) % 7 + 1;
    int64_t want = v * ranks_sum;
    if (op == ReduceOp::kMin) want = v;
    if (op == ReduceOp::kMax) want = v * n;
    if (op == ReduceOp::kAvg) {
      // Integers: the sum wraps in the type first, then truncates toward zero.
      if (dtype == DType::kUInt8) want = static_cast<uint8_t>(want);
      if (dtype == DType::kInt32) want = static_cast<int32_t>(want);
      want /= n;
    }
    wrong += !equals(host.data(), dtype, i, want);
  }
  return wrong;
}

// PowerSGD sends P P^T S for the exact sum S (P orthonormal, up to the 1e-8 epsilon
// and fp32 rounding): an orthogonal projection, so ||out|| <= ||S|| (counted as one
// wrong value when broken). The check input's rows repeat with period 7, so S has rank
// at most 7: at rank >= min(7, rows, cols) the projection is S itself, and every
// element must be within 1e-4 of the largest exact value. A message that is not a
// compressed matrix (1-D, or too small to pay off) goes dense and must be exact.
template <class Exact>
int64_t count_wrong_powersgd(const detail::CompressorSpec& spec, const float* out, int64_t count, int64_t rows,
                             Exact exact) {
  const int64_t cols = rows > 0 ? count / rows : 0;
  const auto& p = spec.family<detail::PowersgdParams>();
  const int r = rows > 0 ? detail::powersgd::matrix_rank(rows, cols, p.rank, p.min_compression_rate) : 0;
  double s_max = 0, out_norm = 0, exact_norm = 0;
  for (int64_t i = 0; i < count; ++i) {
    s_max = std::max(s_max, exact(i));
    out_norm += static_cast<double>(out[i]) * out[i];
    exact_norm += exact(i) * exact(i);
  }
  const double tolerance = r == 0 ? 0.0 : r >= std::min<int64_t>({7, rows, cols}) ? 1e-4 * s_max : -1.0;
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(out[i])) {
      ++wrong;
    } else if (tolerance >= 0) {
      wrong += !(std::abs(out[i] - exact(i)) <= tolerance);
    }
  }
  if (!(std::sqrt(out_norm) <= std::sqrt(exact_norm) * (1 + 1e-5))) ++wrong;
  return wrong;
}

int64_t count_wrong_compressed(const BenchBuffer& buf, const std::string& spec_text, int64_t count, int world_size,
                               Device device, int64_t rows, int64_t first, int64_t call_numel) {
  using detail::CompressorId, detail::Rounding, detail::TopkSelect;
  const detail::CompressorSpec spec = detail::parse_compressor_spec(spec_text);
  HostView host(buf, count * 4, device);
  const auto* out = static_cast<const float*>(host.data());
  const double n = world_size;
  const double ranks_sum = n * (n + 1) / 2;      // sum of (r + 1)
  const double s_max = 7 * ranks_sum;             // the largest exact sum, and every partial sum's bound
  const double encodes = n;                       // N-1 reduce-scatter hops + the owner's final encode
  auto exact = [&](int64_t i) { return static_cast<double>((first + i) % 7 + 1) * ranks_sum; };

  // Dense fallbacks (warm-up, small tensors) must be exact.
  if (spec.warmup > 0 || (call_numel > 0 ? call_numel : count) < spec.min_numel) {
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) wrong += out[i] != exact(i);
    return wrong;
  }
  if (spec.id == CompressorId::kPowersgd) return count_wrong_powersgd(spec, out, count, rows, exact);
  double bound = -1;  // per-element |out - exact| bound for the compressed ring
  int64_t max_nonzero = 0;
  const auto selected = [&](double ratio, int64_t k) {
    return k > 0 ? k : std::max<int64_t>(1, static_cast<int64_t>(std::llround(ratio * static_cast<double>(count))));
  };
  switch (spec.id) {
    case CompressorId::kNone: bound = 0; break;
    case CompressorId::kFp16: bound = encodes * std::ldexp(s_max, -11); break;
    case CompressorId::kBf16: bound = encodes * std::ldexp(s_max, -8); break;
    case CompressorId::kQuant: {  // step <= (max - min) / (2^b - 1) <= s_max / (2^b - 1)
      const auto& p = spec.family<detail::QuantParams>();
      const double step = s_max / ((1 << p.bits) - 1);
      bound = encodes * (p.round == Rounding::kNearest ? step / 2 : step);
      break;
    }
    case CompressorId::kQsgd: {  // one level of the bucket's L2 norm, <= sqrt(B) * s_max
      const auto& p = spec.family<detail::QsgdParams>();
      bound = encodes * std::sqrt(static_cast<double>(p.bucket)) * s_max / p.levels;
      break;
    }
    case CompressorId::kSign: bound = encodes * 2 * s_max; break;  // |x| + mean|x| per encode
    case CompressorId::kTopk: {  // all ranks' inputs are proportional: one shared selection
      const auto& p = spec.family<detail::TopkParams>();
      max_nonzero = n * selected(p.ratio, p.k) * (p.select == TopkSelect::kSample ? 2 : 1);
      break;
    }
    case CompressorId::kRandomk: max_nonzero = selected(spec.family<detail::RandomkParams>().ratio, 0); break;
    case CompressorId::kSketch: {
      const auto& p = spec.family<detail::SketchParams>();
      max_nonzero = selected(p.ratio, p.k);
      break;
    }
    case CompressorId::kPowersgd: break;  // handled above
  }
  int64_t wrong = 0, nonzero = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (bound >= 0) {
      wrong += !(std::abs(out[i] - exact(i)) <= bound * (1 + 1e-6));
    } else {
      nonzero += out[i] != 0;
      wrong += !(out[i] == 0 || out[i] == exact(i));
    }
  }
  return wrong + std::max<int64_t>(0, nonzero - max_nonzero);
}

int64_t count_wrong_allgather(const BenchBuffer& out, DType dtype, int64_t count_per_rank, int world_size,
                              Device device) {
  HostView host(out, count_per_rank * world_size * static_cast<int64_t>(dtype_size(dtype)), device);
  int64_t wrong = 0;
  for (int r = 0; r < world_size; ++r) {
    for (int64_t j = 0; j < count_per_rank; ++j) {
      wrong += !equals(host.data(), dtype, r * count_per_rank + j, pattern(r, j));
    }
  }
  return wrong;
}

}  // namespace gradcomm::bench
