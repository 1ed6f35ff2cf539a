// The ring driver's host channel (ring_driver.h): messages are the call's Op sends and
// receives over the transport, tagged unit_base + u. Receives are posted `depth` units
// ahead of the one being waited for (GRADCOMM_PIPELINE_DEPTH), so a step's message is
// usually in place before the loop reaches it. A receive that lands where an earlier
// send still reads (recv_overwrites: the dense allgather into the caller's buffer) is
// posted only once that send has completed; if the send is not even posted yet,
// posting stops there and resumes on a later unit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "collectives/ring_driver.h"
#include "op.h"

namespace gradcomm::detail {

class HostRingChannel {
 public:
  // `rs_name`, `ag_name`: what a wait on a reduce-scatter or allgather unit is called in
  // a TimeoutError.
  HostRingChannel(Op& op, const RingShape& ring, int64_t units, int depth, uint32_t unit_base,
                  const char* rs_name, const char* ag_name)
      : op_(op), ring_(ring), units_(units), depth_(std::max(depth, 1)), unit_base_(unit_base),
        right_((op.rank() + 1) % op.size()), left_((op.rank() + op.size() - 1) % op.size()),
        rs_name_(rs_name), ag_name_(ag_name), sends_(units), recvs_(units), send_posted_(units, 0) {}

  void send(int64_t u, const RingMessage& m) {
    sends_[u] = op_.send(right_, unit_base_ + static_cast<uint32_t>(u), m.data, m.bytes);
    send_posted_[u] = 1;
  }

  template <class Steps>
  void receive(int64_t u, Steps& steps) {
    post_until(u + depth_, steps);
    op_.wait(*recvs_[u], ring_.reduce_scatter(u) ? rs_name_ : ag_name_);
    recvs_[u].reset();
  }

  template <class Steps>
  void absorbed(int64_t, Steps&) {}  // the host's step work is done when absorb returns

  void finish() {
    for (auto& send : sends_) {
      if (send) op_.wait(*send, "ring: final send");
    }
  }

 private:
  template <class Steps>
  void post_until(int64_t limit, Steps& steps) {
    for (limit = std::min(limit, units_); posted_ < limit; ++posted_) {
      const int64_t twin = steps.recv_overwrites(posted_);
      if (twin >= 0) {
        if (!send_posted_[twin]) break;
        if (sends_[twin]) {
          op_.wait(*sends_[twin], "ring: send before the receive that overwrites it");
          sends_[twin].reset();
        }
      }
      const RingMessage m = steps.recv_message(posted_);
      recvs_[posted_] = op_.recv(left_, unit_base_ + static_cast<uint32_t>(posted_), m.data, m.bytes);
    }
  }

  Op& op_;
  const RingShape ring_;
  const int64_t units_;
  const int depth_;
  const uint32_t unit_base_;
  const int right_, left_;
  const char* rs_name_;
  const char* ag_name_;
  std::vector<RequestPtr> sends_, recvs_;
  std::vector<uint8_t> send_posted_;
  int64_t posted_ = 0;
};

}  // namespace gradcomm::detail
