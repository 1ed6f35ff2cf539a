// The stream channel's NCCL streams (stream_ring_channel.h), CUDA builds only: groups on
// the caller's stream, step work on the GpuContext's side stream, events from its pool.
// Wire bytes go to Stats once the ring has been enqueued.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <vector>

#include "collectives/stream_ring_channel.h"
#include "gpu_context.h"
#include "op.h"

namespace gradcomm::detail {

class NcclRingStreams {
 public:
  // `events`: StreamRingChannel::events_needed; `rs_name`, `ag_name` name the groups in errors.
  NcclRingStreams(Op& op, GpuContext& gpu, cudaStream_t stream, int64_t events, const char* rs_name,
                  const char* ag_name)
      : op_(op), nccl_(*gpu.nccl()), stream_(stream), side_(gpu.side_stream()),
        events_(gpu.events(static_cast<size_t>(events) + 2)), arrival_(events_[events]), done_(events_[events + 1]),
        entry_(gpu.entry_event()), right_(op.comm_rank((op.rank() + 1) % op.size())),
        left_(op.comm_rank((op.rank() + op.size() - 1) % op.size())),
        rs_name_(rs_name), ag_name_(ag_name) {}

  cudaStream_t side() const { return side_; }

  void join_side() {
    entry_.record(stream_);
    entry_.wait_on(side_);
  }
  void record(int slot) { events_[slot].record(side_); }
  void wait(int slot) { events_[slot].wait_on(stream_); }
  void exchange(int64_t, const RingMessage& send, const RingMessage& recv, bool reduce_scatter) {
    const std::array<P2pOp, 2> ops{P2pOp{P2pOp::kSend, right_, send.data, send.bytes},
                                   P2pOp{P2pOp::kRecv, left_, recv.data, recv.bytes}};
    nccl_.group(ops, stream_, reduce_scatter ? rs_name_ : ag_name_);
    sent_ += send.bytes;
    received_ += recv.bytes;
    ++messages_;
  }
  void side_waits_arrival() {
    arrival_.record(stream_);  // re-recorded every unit: its wait is enqueued at once
    arrival_.wait_on(side_);
  }
  void join_caller() {
    done_.record(side_);
    done_.wait_on(stream_);
  }
  void finish() { op_.count_wire(sent_, received_, messages_); }

 private:
  Op& op_;
  NcclComm& nccl_;
  const cudaStream_t stream_, side_;
  std::vector<Event>& events_;
  Event& arrival_;
  Event& done_;
  Event& entry_;
  const int right_, left_;
  const char* rs_name_;
  const char* ag_name_;
  uint64_t sent_ = 0, received_ = 0, messages_ = 0;
};

}  // namespace gradcomm::detail
