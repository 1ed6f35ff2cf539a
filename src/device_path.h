// How a communicator's CUDA tensors travel: one interface, chosen once, at the
// communicator's first CUDA call (gpu_plan.h says which and why):
//  - NCCL: stream-ordered NCCL collectives and the GPU codecs, state on the device
//    (collectives/gpu_collectives.h, collectives/nccl_compressed.h);
//  - staging: pinned host copies, the host collectives and the CPU's compressed
//    allreduce over the host transport (collectives/staging.cc).
// CPU tensors never come here. In a build without CUDA no path exists: a CUDA tensor
// is refused at issue (check_device_tensor), so nothing below is reached.
//
// The CUDA implementations live in device_path_cuda.cc, the stand-ins of a build
// without CUDA in device_path_none.cc; CommunicatorImpl sees only this header.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compressors/tensor_part.h"
#include "gradcomm/types.h"
#include "state.h"

namespace gradcomm::detail {

struct CompressorSpec;  // compressors/spec.h

class Op;
struct TwoLevelPlan;  // hierarchy.h

class DevicePath {
 public:
  // A compressed allreduce: its spec and key state, and the CPU path on a host
  // buffer (what the staging path runs).
  struct Compressed {
    const CompressorSpec* spec;
    KeyState* key;  // null for stateless specs without a key
    uint64_t key_hash;
    const std::function<void(float* host)>* host_allreduce;
    const std::vector<TensorPart>* parts;  // the tensor's shapes (Family::reads_shapes)
    // Over two levels (Op::two_levels), where the spec compresses pieces
    // (HostCompression::compresses_pieces): step 2 of hierarchy.h on a host copy of this
    // rank's segment under `plan`, and the alignment the plan's segments take. Null otherwise.
    const std::function<void(float* segment, const TwoLevelPlan& plan)>* host_across = nullptr;
    int64_t align = 1;
  };

  virtual ~DevicePath() = default;
  virtual const char* name() const = 0;  // "nccl" | "staging"

  // Inside the call's Op (its header matched); ordered on `stream` (null: the legacy
  // default stream). `compressed` null: a dense allreduce. Over two levels (Op::two_levels)
  // the NCCL path runs the levels inside the nodes on NCCL and the level across on the
  // device (dense) or staged through the host's compression (compressed); docs/two-levels.md.
  virtual void allreduce(Op& op, TensorView t, ReduceOp reduce_op, void* stream, const Compressed* compressed) = 0;
  virtual void allgather(Op& op, TensorView in, TensorView out) = 0;
  virtual void reduce_scatter(Op& op, TensorView in, TensorView out, ReduceOp reduce_op) = 0;
  virtual void broadcast(Op& op, TensorView t, int root) = 0;
  // Waits (with the deadline) for every call enqueued so far and raises its error.
  virtual void synchronize() = 0;
  // After a failure anywhere: releases device work stuck on a peer that will never come.
  virtual void abort() noexcept = 0;
};

// The path for `device`, built inside `op`, the numbered setup call every rank makes
// at its first CUDA call (an allgather of GpuRankRecord: each rank's GPU, and rank
// 0's NCCL id). `watchdog` runs between the polls of every host wait (it raises aborts
// other ranks sent). Without CUDA: Unsupported.
std::unique_ptr<DevicePath> open_device_path(Op& op, int device, const std::string& preference,
                                             std::chrono::milliseconds timeout, std::function<void()> watchdog);

// The issue-time check of a tensor labelled CUDA; `what` names it ("rank 0: allreduce:
// tensor"). InvalidArgument unless its device exists and, with elements, its pointer
// is memory of that device. Without CUDA: Unsupported.
void check_device_tensor(const TensorView& t, const std::string& what);

// Copies `host` (dst.numel floats) into the device tensor `dst` on `stream` and waits
// for it, so `host` may go once it returns. Without CUDA: Unsupported.
void copy_to_device(const float* host, TensorView dst, void* stream);

}  // namespace gradcomm::detail
