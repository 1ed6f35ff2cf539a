// CommunicatorImpl's CUDA branch (CUDA builds only): runs a call on CUDA tensors
// inside its Op, on the path chosen at the first CUDA call (NCCL or staging), and
// synchronize(). See gpu_context.h for the stream semantics and
// collectives/gpu_collectives.h for the algorithms.
//
// Compressed allreduce: on the NCCL path the GPU codecs (collectives/nccl_compressed.h),
// on the staging path the CPU engine on a pinned host copy.
//
// Streams: allreduce is ordered on CompressOptions::stream (null = the legacy
// default stream); allgather and broadcast take no options and use the legacy
// default stream.
#include <fmt/format.h>

#include "collectives/collectives.h"
#include "collectives/gpu_collectives.h"
#include "collectives/nccl_compressed.h"
#include "comm_impl.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "gpu_context.h"

namespace gradcomm::detail {

void CommunicatorImpl::gpu_allreduce(Op& op, TensorView t, ReduceOp reduce_op, void* stream_ptr,
                                     const GpuCompressed* compressed) {
  GpuContext& gpu = *gpu_;
  DeviceGuard guard(gpu.device());
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  op.finish();  // every rank agrees on the call before anything is enqueued for it
  gpu.begin(stream, "allreduce");
  if (compressed != nullptr && gpu.path() == GpuPath::kNccl) {
    // The GPU codecs on NCCL, stream-ordered, state on the device
    // (collectives/nccl_compressed.h).
    nccl_compressed_allreduce(op, gpu, static_cast<float*>(t.data), t.numel, reduce_op, *compressed->spec,
                              compressed->key, compressed->key_hash, compressed->parts, stream);
  } else if (compressed != nullptr) {
    // Staging: the CPU compression engine (the reference codecs, the same payload
    // bytes, error feedback state on the host as for CPU tensors) on a pinned host
    // copy of the whole tensor. The host transport moves the payloads either way,
    // so the GPU codecs would only add copies here.
    const int64_t bytes = t.nbytes();
    StagedCopy copy;
    copy.down_src = t.data;
    copy.down_bytes = bytes;
    copy.up_dst = t.data;
    copy.up_bytes = bytes;
    copy.host_bytes = bytes;
    staged_call(op, gpu, copy, stream,
                [&](uint8_t* host) { (*compressed->host_engine)(reinterpret_cast<float*>(host)); });
  } else if (gpu.path() == GpuPath::kNccl) {
    nccl_ring_allreduce(op, gpu, t.data, t.numel, t.dtype, reduce_op, stream);
  } else {
    staged_dense_allreduce(op, gpu, t.data, t.numel, t.dtype, reduce_op, stream);
  }
  gpu.end(stream);
}

void CommunicatorImpl::gpu_allgather(Op& op, TensorView in, TensorView out) {
  GpuContext& gpu = *gpu_;
  DeviceGuard guard(gpu.device());
  const cudaStream_t stream = nullptr;
  op.finish();
  gpu.begin(stream, "allgather");
  const int64_t bytes = in.nbytes();
  if (gpu.path() == GpuPath::kNccl) {
    nccl_allgather(op, gpu, in.data, out.data, bytes, stream);
  } else {
    StagedCopy copy;
    copy.down_src = in.data;
    copy.down_bytes = bytes;
    copy.down_offset = bytes * op.rank();
    copy.up_dst = out.data;
    copy.up_bytes = bytes * op.size();
    copy.host_bytes = bytes * op.size();
    staged_call(op, gpu, copy, stream, [&](uint8_t* host) {
      if (op.size() > 1 && bytes > 0) {
        ring_allgatherv(op, host, std::vector<int64_t>(op.size(), in.numel), dtype_size(in.dtype), /*unit_base=*/0);
      }
    });
  }
  gpu.end(stream);
}

void CommunicatorImpl::gpu_broadcast(Op& op, TensorView t, int root) {
  GpuContext& gpu = *gpu_;
  DeviceGuard guard(gpu.device());
  const cudaStream_t stream = nullptr;
  op.finish();
  gpu.begin(stream, "broadcast");
  const int64_t bytes = t.nbytes();
  if (gpu.path() == GpuPath::kNccl) {
    nccl_broadcast(op, gpu, t.data, bytes, root, stream);
  } else {
    const bool is_root = op.rank() == root;
    StagedCopy copy;
    copy.down_src = t.data;
    copy.down_bytes = is_root ? bytes : 0;
    copy.up_dst = t.data;
    copy.up_bytes = is_root ? 0 : bytes;
    copy.host_bytes = bytes;
    staged_call(op, gpu, copy, stream, [&](uint8_t* host) {
      if (op.size() > 1 && bytes > 0) chain_broadcast(op, host, bytes, root);
    });
  }
  gpu.end(stream);
}

void CommunicatorImpl::gpu_synchronize() { gpu_->synchronize("synchronize"); }

void CommunicatorImpl::gpu_copy_to_device(const float* host, TensorView dst, void* stream_ptr) {
  DeviceGuard guard(dst.device.index);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, static_cast<size_t>(dst.numel) * sizeof(float),
                                      cudaMemcpyHostToDevice, stream));
  GRADCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void CommunicatorImpl::gpu_abort() noexcept {
  if (gpu_) gpu_->abort();
}

}  // namespace gradcomm::detail
