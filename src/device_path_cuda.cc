// The device paths of a CUDA build (device_path.h): NCCL and staging over one
// GpuContext (gpu_context.h: the device, the NCCL communicator, stream ordering and
// cached resources). Each call runs inside its Op, after its header matched.
//
// Streams: allreduce is ordered on CompressOptions::stream (null = the legacy
// default stream); allgather and broadcast take no options and use the legacy
// default stream.
#include <fmt/format.h>

#include "collectives/collectives.h"
#include "collectives/gpu_collectives.h"
#include "collectives/nccl_compressed.h"
#include "compressors/spec.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "device_path.h"
#include "gpu_context.h"
#include "hierarchy.h"
#include "op.h"

namespace gradcomm::detail {
namespace {

// What both paths share: the context, and each call's begin/end on its stream.
class GpuPathBase : public DevicePath {
 public:
  explicit GpuPathBase(std::unique_ptr<GpuContext> gpu) : gpu_(std::move(gpu)) {}

  void synchronize() override { gpu_->synchronize("synchronize"); }
  void abort() noexcept override { gpu_->abort(); }

  // Both paths stage reduce_scatter through pinned host memory and the host ring
  // (NCCL's own ncclReduceScatter is not wired in): the whole input down, the ring's
  // reduce-scatter in the host copy (the device input stays unchanged), this rank's
  // segment up. On the legacy default stream, as allgather.
  void reduce_scatter(Op& op, TensorView in, TensorView out, ReduceOp reduce_op) override {
    call(op, nullptr, "reduce_scatter", [&] {
      const int64_t segment = out.nbytes();
      StagedCopy copy;
      copy.down_src = in.data;
      copy.down_bytes = in.nbytes();
      copy.up_dst = out.data;
      copy.up_bytes = segment;
      copy.up_offset = segment * op.rank();
      copy.host_bytes = in.nbytes();
      staged_call(op, *gpu_, copy, nullptr, [&](uint8_t* host) {
        if (op.size() == 1 || out.numel == 0) return;
        if (op.two_levels()) {
          two_level_reduce_scatter(op, host, out.numel, in.dtype, reduce_op, /*codec=*/nullptr);
        } else {
          ring_reduce_scatter(op, host, in.numel, in.dtype, reduce_op);
        }
      });
    });
  }

 protected:
  // A compressed allreduce by the CPU path on a staged copy of the whole tensor.
  void staged_host_allreduce(Op& op, TensorView t, cudaStream_t stream, const Compressed& compressed) {
    staged_call(op, *gpu_, StagedCopy::round_trip(t.data, t.nbytes()), stream,
                [&](uint8_t* host) { (*compressed.host_allreduce)(reinterpret_cast<float*>(host)); });
  }

  // Runs `body` as one call on `stream`: every rank agrees on the call before
  // anything is enqueued for it, and the call is ordered after the previous one.
  template <class Body>
  void call(Op& op, cudaStream_t stream, const char* what, Body&& body) {
    DeviceGuard guard(gpu_->device());
    op.finish();
    gpu_->begin(stream, what);
    body();
    gpu_->end(stream);
  }

  std::unique_ptr<GpuContext> gpu_;
};

// NCCL: everything stream-ordered on the device; the GPU codecs, state on the device.
class NcclPath final : public GpuPathBase {
 public:
  using GpuPathBase::GpuPathBase;
  const char* name() const override { return "nccl"; }

  void allreduce(Op& op, TensorView t, ReduceOp reduce_op, void* stream_ptr, const Compressed* compressed) override {
    const auto stream = static_cast<cudaStream_t>(stream_ptr);
    call(op, stream, "allreduce", [&] {
      if (op.two_levels() && two_level_allreduce(op, t, reduce_op, stream, compressed)) return;
      if (compressed != nullptr) {
        nccl_compressed_allreduce(op, *gpu_, static_cast<float*>(t.data), t.numel, reduce_op, *compressed->spec,
                                  compressed->key, compressed->key_hash, compressed->parts, stream);
      } else {
        nccl_ring_allreduce(op, *gpu_, t.data, t.numel, t.dtype, reduce_op, stream);
      }
    });
  }

  void allgather(Op& op, TensorView in, TensorView out) override {
    call(op, nullptr, "allgather", [&] { nccl_allgather(op, *gpu_, in.data, out.data, in.nbytes(), nullptr); });
  }

  void broadcast(Op& op, TensorView t, int root) override {
    call(op, nullptr, "broadcast", [&] { nccl_broadcast(op, *gpu_, t.data, t.nbytes(), root, nullptr); });
  }

 private:
  // Over two levels (docs/two-levels.md): the levels inside the nodes on NCCL; across, a
  // dense call stays on the device (the NCCL ring among each piece's owners) and a
  // compressed one stages this rank's segment through pinned memory into the host's
  // compression (the CPU codecs, the residual on the host, as the staging path keeps it).
  // inside=compress stages the whole tensor into the host's two-level call; a low-rank
  // family is not handled here (false: the flat NCCL path, its own whole-tensor schedule).
  bool two_level_allreduce(Op& op, TensorView t, ReduceOp reduce_op, cudaStream_t stream,
                           const Compressed* compressed) {
    if (compressed == nullptr) {
      nccl_two_level_dense_allreduce(op, *gpu_, t.data, t.numel, t.dtype, reduce_op, stream);
      return true;
    }
    if (compressed->host_across == nullptr) {
      if (!compressed->spec->compress_inside) return false;
      staged_host_allreduce(op, t, stream, *compressed);
      return true;
    }
    auto* values = static_cast<float*>(t.data);
    nccl_two_level_allreduce(op, *gpu_, t.data, t.numel, DType::kFloat32, reduce_op, compressed->align, stream,
                             [&](const TwoLevelPlan& plan) {
                               const int64_t first = plan.segments[static_cast<size_t>(plan.local)];
                               const int64_t bytes =
                                   (plan.segments[static_cast<size_t>(plan.local) + 1] - first) *
                                   static_cast<int64_t>(sizeof(float));
                               const StagedCopy copy = StagedCopy::round_trip(values + first, bytes);
                               staged_call(op, *gpu_, copy, stream, [&](uint8_t* host) {
                                 (*compressed->host_across)(reinterpret_cast<float*>(host), plan);
                               });
                             });
    return true;
  }
};

// Staging: a pinned host copy, the host collectives over the host transport, and
// for compressed calls the CPU path (the reference codecs, the same payload bytes,
// error feedback state on the host as for CPU tensors). The host transport moves the
// payloads either way, so the GPU codecs would only add copies here.
class StagingPath final : public GpuPathBase {
 public:
  using GpuPathBase::GpuPathBase;
  const char* name() const override { return "staging"; }

  void allreduce(Op& op, TensorView t, ReduceOp reduce_op, void* stream_ptr, const Compressed* compressed) override {
    const auto stream = static_cast<cudaStream_t>(stream_ptr);
    call(op, stream, "allreduce", [&] {
      if (compressed == nullptr) {
        staged_dense_allreduce(op, *gpu_, t.data, t.numel, t.dtype, reduce_op, stream);
        return;
      }
      staged_host_allreduce(op, t, stream, *compressed);
    });
  }

  void allgather(Op& op, TensorView in, TensorView out) override {
    call(op, nullptr, "allgather", [&] {
      const int64_t bytes = in.nbytes();
      StagedCopy copy;
      copy.down_src = in.data;
      copy.down_bytes = bytes;
      copy.down_offset = bytes * op.rank();
      copy.up_dst = out.data;
      copy.up_bytes = bytes * op.size();
      copy.host_bytes = bytes * op.size();
      staged_call(op, *gpu_, copy, nullptr, [&](uint8_t* host) {
        if (op.size() > 1 && bytes > 0) {
          ring_allgatherv(op, host, std::vector<int64_t>(op.size(), in.numel), dtype_size(in.dtype), /*unit_base=*/0);
        }
      });
    });
  }

  void broadcast(Op& op, TensorView t, int root) override {
    call(op, nullptr, "broadcast", [&] {
      const int64_t bytes = t.nbytes();
      const bool is_root = op.rank() == root;
      StagedCopy copy;
      copy.down_src = t.data;
      copy.down_bytes = is_root ? bytes : 0;
      copy.up_dst = t.data;
      copy.up_bytes = is_root ? 0 : bytes;
      copy.host_bytes = bytes;
      staged_call(op, *gpu_, copy, nullptr, [&](uint8_t* host) {
        if (op.size() > 1 && bytes > 0) chain_broadcast(op, host, bytes, root);
      });
    });
  }
};

}  // namespace

std::unique_ptr<DevicePath> open_device_path(Op& op, int device, const std::string& preference,
                                             std::chrono::milliseconds timeout, std::function<void()> watchdog) {
  std::unique_ptr<GpuContext> gpu = create_gpu_context(op, device, preference, timeout, std::move(watchdog));
  if (gpu->path() == GpuPath::kNccl) return std::make_unique<NcclPath>(std::move(gpu));
  return std::make_unique<StagingPath>(std::move(gpu));
}

void check_device_tensor(const TensorView& t, const std::string& what) {
  require_cuda_device(t.device.index, fmt::format("{} on cuda:{}", what, t.device.index).c_str());
  if (t.numel == 0) return;
  // NCCL and the copies would fault (or silently read the wrong memory) on a
  // pointer that is not this device's: catch a mislabelled tensor here.
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, t.data);
  if (status != cudaSuccess) (void)cudaGetLastError();
  const bool device_memory = status == cudaSuccess &&
                             (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged);
  if (!device_memory) {
    throw InvalidArgument(fmt::format("{} is labelled cuda:{} but {:p} is not CUDA device memory "
                                      "(host memory? pass Device{{DeviceType::kCpu}})",
                                      what, t.device.index, t.data));
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != t.device.index) {
    throw InvalidArgument(
        fmt::format("{} is labelled cuda:{} but its memory is on cuda:{}", what, t.device.index, attributes.device));
  }
}

void copy_to_device(const float* host, TensorView dst, void* stream_ptr) {
  DeviceGuard guard(dst.device.index);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, static_cast<size_t>(dst.numel) * sizeof(float),
                                      cudaMemcpyHostToDevice, stream));
  GRADCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace gradcomm::detail
