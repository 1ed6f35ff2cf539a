// The communicator's GPU side (CUDA builds only): the device it is bound to, the
// path its CUDA tensors take (NCCL, or pinned-host staging over UCX; chosen once,
// at the first CUDA call, see gpu_plan.h), the NCCL communicator, and the cached
// resources of the stream-ordered collectives.
//
// Stream semantics (docs/architecture.md, "CPU and GPU paths"). A CUDA call is ordered on the caller's stream
// and returns once its work is enqueued. Consecutive calls share scratch memory,
// so begin() makes the new call's stream wait for the previous call's
// completion event (device-side; the host does not block), and end() records it
// again. synchronize() waits for that event, so it covers every call so far.
//
// Resources are grow-only and cached: once warm, a call allocates nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "cuda/buffer.h"
#include "cuda/device_status.h"
#include "env.h"
#include "gpu_plan.h"
#include "state.h"
#include "transport/nccl/nccl_comm.h"

namespace gradcomm::detail {

class GpuContext {
 public:
  // `nccl` is null on the staging path. `watchdog` runs between the polls of
  // every host wait (it raises aborts other ranks sent over the host transport).
  GpuContext(int device, GpuPathChoice choice, std::unique_ptr<NcclComm> nccl, std::chrono::milliseconds timeout,
             NcclComm::Watchdog watchdog);
  ~GpuContext();
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  int device() const { return device_; }
  GpuPath path() const { return choice_.path; }
  const std::string& reason() const { return choice_.reason; }
  NcclComm* nccl() { return nccl_.get(); }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Start of a call on `stream`: raises an asynchronous NCCL error left by an
  // earlier call, then orders `stream` after the previous call.
  void begin(cudaStream_t stream, const char* what);
  // End of a call: `stream` now carries all of its work.
  void end(cudaStream_t stream);
  // Waits (host, polling, with the deadline) for every call enqueued so far.
  void synchronize(const char* what);
  // Host wait for `event` with the deadline, NCCL's async errors and the watchdog
  // checked between polls. TimeoutError (NCCL aborted) when it passes.
  void wait_event(cudaEvent_t event, const Deadline& deadline, const char* what);
  // Tears the NCCL communicator down hard (after a failure elsewhere): kernels
  // stuck on a peer that will never come are released.
  void abort() noexcept;

  // Cached resources (grow-only; contents undefined between calls).
  DeviceBuffer& scratch(size_t bytes);
  PinnedBuffer& pinned(size_t bytes);
  cudaStream_t side_stream() { return side_.get(); }   // reduce kernels of the NCCL ring
  cudaStream_t copy_stream() { return copy_.get(); }   // device-to-host copies of the staging path
  // At least `n` events (created once, reused: a wait captures an event's latest record).
  std::vector<Event>& events(size_t n);
  Event& entry_event() { return entry_; }
  DeviceBuffer& payload_scratch(size_t bytes);  // payloads of the compressed collectives

  // ---- payload validation of the compressed calls ----------------------------------------
  // GPU decoders cannot throw: they record a fault in a DeviceStatus word. A compressed
  // call takes `peers` words (word p: payloads received from rank p), cleared on
  // `stream`; after its decodes, queue_payload_check copies them to a pinned slot
  // on `stream` and records an event. check_payloads() raises CorruptPayload
  // ("<context>: payload from rank p: <fault>") for the oldest finished call with a
  // fault. begin() checks the calls that have already finished (no host wait);
  // synchronize() all of them. At most kPendingChecks calls wait unchecked: the
  // next one waits (with the deadline) for the oldest.
  static constexpr size_t kPendingChecks = 32;
  DeviceStatus* payload_status(int peers, cudaStream_t stream);
  void queue_payload_check(cudaStream_t stream, std::string context);
  void check_payloads(bool wait, const char* what);

  // State for compressed calls without a key (stateless specs): workspaces only.
  std::shared_ptr<DeviceKeyState>& keyless_state() { return keyless_; }

 private:
  int device_;
  GpuPathChoice choice_;
  std::unique_ptr<NcclComm> nccl_;
  std::chrono::milliseconds timeout_;
  NcclComm::Watchdog watchdog_;
  Stream side_, copy_;
  Event last_done_, entry_;
  bool any_call_ = false;
  DeviceBuffer scratch_;
  PinnedBuffer pinned_;
  std::vector<Event> events_;
  DeviceBuffer payloads_;
  // Payload checks: device words, pinned slots, and the calls not yet checked.
  struct PendingCheck {
    std::string context;
    size_t slot;
    Event copied;
  };
  int status_peers_ = 0;
  DeviceBuffer status_words_;
  PinnedBuffer status_slots_;
  size_t next_slot_ = 0;
  std::deque<PendingCheck> pending_checks_;
  std::vector<Event> spare_check_events_;  // recycled: no event is created once warm
  std::shared_ptr<DeviceKeyState> keyless_;
};

// Builds the GPU side at the first CUDA call, inside a numbered call `op` that
// every rank makes (an allgather of GpuRankRecord over the host transport): each
// rank reports its GPU, rank 0 adds an NCCL unique id, every rank derives the same
// path from the same records, and on the NCCL path all ranks create the NCCL
// communicator together. Logs the choice at info level.
class Op;
std::unique_ptr<GpuContext> create_gpu_context(Op& op, int device, const std::string& preference,
                                               std::chrono::milliseconds timeout, NcclComm::Watchdog watchdog);

}  // namespace gradcomm::detail
