// Reduce kernels (the contract of base/reduce.h on device memory), in CUB's layers:
// thread helpers (one 16-byte vector through the element functor), kernels
// (grid-stride loops, 64-bit indices), launchers (grid from the SM count, launch
// on the caller's stream, check the launch, never synchronize).
//
// Vector path: when dst and src have the same offset modulo 16 bytes, the first
// `head` (< 16 / sizeof(T)) elements are peeled so the rest starts 16-byte
// aligned; the body moves 16 bytes per load and store; the tail (< one vector) and
// the head are done one element per thread. Otherwise a scalar grid-stride kernel.
#include "cuda/reduce.cuh"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/reduce_op.cuh"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

constexpr int kBlockThreads = 256;
constexpr int kBlocksPerSm = 8;  // 8 x 256 threads fill an sm_90 SM (2048 threads) in one wave
constexpr int kVectorBytes = 16;

template <class T>
struct alignas(kVectorBytes) Vector {
  static constexpr int kLanes = kVectorBytes / static_cast<int>(sizeof(T));
  T lane[kLanes];
};

// ---- thread helpers ----------------------------------------------------------------
// Loads go through uint4 so the compiler emits one 128-bit access per vector.
template <class T>
__device__ __forceinline__ Vector<T> load_vector(const Vector<T>* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  Vector<T> v;
  memcpy(&v, &raw, sizeof v);
  return v;
}

template <class T>
__device__ __forceinline__ void store_vector(Vector<T>* p, const Vector<T>& v) {
  uint4 raw;
  memcpy(&raw, &v, sizeof raw);
  *reinterpret_cast<uint4*>(p) = raw;
}

template <class T, ElementOp Op>
__device__ __forceinline__ void reduce_vector(Vector<T>& d, const Vector<T>& s, const ReduceElement<T, Op>& f) {
#pragma unroll
  for (int k = 0; k < Vector<T>::kLanes; ++k) d.lane[k] = f(d.lane[k], s.lane[k]);
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---- kernels -----------------------------------------------------------------------
// Requires dst + head and src + head 16-byte aligned, head < kLanes, and at least
// kLanes threads in the grid (head and tail are one element per thread).
template <class T, ElementOp Op>
__global__ void __launch_bounds__(kBlockThreads)
    reduce_vector_kernel(T* dst, const T* src, int64_t n, int64_t head, int64_t divisor) {
  constexpr int kLanes = Vector<T>::kLanes;
  const ReduceElement<T, Op> f{divisor};
  const int64_t tid = global_thread();
  const int64_t vectors = (n - head) / kLanes;
  auto* dv = reinterpret_cast<Vector<T>*>(dst + head);
  const auto* sv = reinterpret_cast<const Vector<T>*>(src + head);
  for (int64_t i = tid; i < vectors; i += grid_threads()) {
    Vector<T> d = load_vector(dv + i);
    if constexpr (Op == ElementOp::kKeep) {
      reduce_vector(d, d, f);  // src is dst: no second load
    } else {
      reduce_vector(d, load_vector(sv + i), f);
    }
    store_vector(dv + i, d);
  }
  if (tid < head) dst[tid] = f(dst[tid], src[tid]);
  const int64_t tail_begin = head + vectors * kLanes;
  if (tid < n - tail_begin) dst[tail_begin + tid] = f(dst[tail_begin + tid], src[tail_begin + tid]);
}

// Any element-aligned dst and src.
template <class T, ElementOp Op>
__global__ void __launch_bounds__(kBlockThreads) reduce_scalar_kernel(T* dst, const T* src, int64_t n, int64_t divisor) {
  const ReduceElement<T, Op> f{divisor};
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dst[i] = f(dst[i], src[i]);
}

// ---- launchers -----------------------------------------------------------------------
unsigned grid_for(int64_t work_items) {
  const int64_t max_blocks = static_cast<int64_t>(cuda_sm_count(cuda_current_device())) * kBlocksPerSm;
  const int64_t wanted = (std::max<int64_t>(work_items, 1) + kBlockThreads - 1) / kBlockThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(wanted, 1, max_blocks));
}

template <class T, ElementOp Op>
void launch_typed(T* dst, const T* src, int64_t n, int64_t divisor, cudaStream_t stream) {
  constexpr int64_t kLanes = Vector<T>::kLanes;
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  if ((d - s) % kVectorBytes == 0) {
    const auto to_boundary = static_cast<int64_t>((kVectorBytes - d % kVectorBytes) % kVectorBytes / sizeof(T));
    const int64_t head = std::min(n, to_boundary);
    const int64_t vectors = (n - head) / kLanes;
    reduce_vector_kernel<T, Op>
        <<<grid_for(std::max(vectors, kLanes)), kBlockThreads, 0, stream>>>(dst, src, n, head, divisor);
  } else if constexpr (Op != ElementOp::kKeep) {  // kKeep has src == dst: always the vector path
    reduce_scalar_kernel<T, Op><<<grid_for(n), kBlockThreads, 0, stream>>>(dst, src, n, divisor);
  }
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

// Messages are built with ostringstream: fmt 9's compile-time format strings
// (consteval) do not get through nvcc's front end in C++20 mode.
template <class... Args>
[[noreturn]] void throw_invalid(const Args&... parts) {
  std::ostringstream text;
  (text << ... << parts);
  throw InvalidArgument(text.str());
}

void check_pointer(const void* p, int64_t n, DType dtype, const char* name, const char* what) {
  if (n > 0 && p == nullptr) throw_invalid(what, ": ", name, " is null with n=", n);
  const size_t elem = dtype_size(dtype);
  if (elem > 1 && reinterpret_cast<uintptr_t>(p) % elem != 0) {
    throw_invalid(what, ": ", name, " = ", p, " is not aligned to its ", elem, "-byte ", dtype_name(dtype),
                  " elements");
  }
}

void check_dtype(DType dtype, const char* what) {
  if (!dtype_valid(static_cast<uint8_t>(dtype))) throw_invalid(what, ": unknown dtype value ", static_cast<int>(dtype));
}

void launch(void* dst, const void* src, int64_t n, DType dtype, ElementOp op, int64_t divisor, cudaStream_t stream) {
  visit_dtype(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    visit_element_op(op, [&](auto element_op) {
      launch_typed<T, decltype(element_op)::value>(static_cast<T*>(dst), static_cast<const T*>(src), n, divisor,
                                                  stream);
    });
  });
}

}  // namespace

void launch_reduce_inplace(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op, int64_t final_divisor,
                           cudaStream_t stream) {
  constexpr const char* kWhat = "launch_reduce_inplace";
  check_dtype(dtype, kWhat);
  const ElementOp element_op = element_op_for(op);
  if (n < 0) throw_invalid(kWhat, ": n=", n, " is negative");
  if (final_divisor < 1) throw_invalid(kWhat, ": final_divisor=", final_divisor, " must be >= 1");
  check_pointer(dst, n, dtype, "dst", kWhat);
  check_pointer(src, n, dtype, "src", kWhat);
  if (n == 0) return;
  // Equal is fine (each element is read, then written, by one thread); a partial
  // overlap would make the result depend on thread scheduling.
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  const auto bytes = static_cast<uintptr_t>(n) * dtype_size(dtype);
  if (d != s && d < s + bytes && s < d + bytes) throw_invalid(kWhat, ": dst and src overlap partially");
  launch(dst, src, n, dtype, element_op, final_divisor, stream);
}

void launch_divide_inplace(void* data, int64_t n, DType dtype, int64_t divisor, cudaStream_t stream) {
  constexpr const char* kWhat = "launch_divide_inplace";
  check_dtype(dtype, kWhat);
  if (n < 0) throw_invalid(kWhat, ": n=", n, " is negative");
  if (divisor < 1) throw_invalid(kWhat, ": divisor=", divisor, " must be >= 1");
  check_pointer(data, n, dtype, "data", kWhat);
  if (n == 0 || divisor == 1) return;
  launch(data, data, n, dtype, ElementOp::kKeep, divisor, stream);
}

}  // namespace gradcomm::detail
