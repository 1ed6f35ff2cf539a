// UCX transport: peer failures, abandoned requests and destruction (see the
// lifetime rules in ucx_transport_impl.h). Nothing here may hang: every wait is
// bounded, and endpoints are force-closed rather than closed with a handshake.
#include <fmt/format.h>

#include <algorithm>

#include "logging.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace gradcomm::detail {

// ---- failures -----------------------------------------------------------------------

// Runs inside ucp_worker_progress: records the failure and fails waiting
// requests, leaving the UCX calls (cancel, close) to drive().
void UcxTransport::on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->lost = true;
  peer->transport->fail_peer(peer->rank, fmt::format("ucx: rank {} lost rank {}: {}", peer->transport->rank_,
                                                     peer->rank, ucs_status_string(status)));
}

void UcxTransport::fail_peer(int rank, std::string error) {
  Peer& peer = peers_[static_cast<size_t>(rank)];
  if (peer.failed) return;
  peer.failed = true;
  peer.error = std::move(error);
  peers_newly_failed_ = true;
  ++events_;
  log(LogLevel::kInfo, "{}", peer.error);
  for (auto& [id, op] : ops_) {
    if (op->peer == rank && op->owner != nullptr && op->owner->pending()) {
      op->owner->fail(RequestState::kPeerFailed, peer.error);
    }
  }
}

void UcxTransport::cancel_receives_from_failed() {
  peers_newly_failed_ = false;
  std::vector<std::pair<ucp_worker_h, void*>> doomed;
  for (auto& [id, op] : ops_) {
    if (op->kind == UcxOp::Kind::kRecv && op->ucx_request != nullptr && peers_[static_cast<size_t>(op->peer)].failed) {
      doomed.emplace_back(worker_of(*op), op->ucx_request);
    }
  }
  // Cancelling completes unmatched receives through their callbacks, which erase Ops.
  for (auto [worker, request] : doomed) ucp_request_cancel(worker, request);
}

// Force-closes the endpoint to `rank`: UCX completes its pending sends with an
// error and never touches their buffers again.
void UcxTransport::force_close(int rank) {
  Peer& peer = peers_[static_cast<size_t>(rank)];
  if (peer.ep == nullptr) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t result = ucp_ep_close_nbx(peer.ep, &param);
  peer.ep = nullptr;
  if (UCS_PTR_IS_PTR(result)) close_requests_.push_back(result);
}

// A single-copy receive's queued read goes first (the buffer goes with the
// Request); a single-copy send gets the time a plain one gets, then withdraws.
void UcxTransport::abandon(uint64_t id) {
  drop_cma_read(id);
  abandon_ucx(id);
  withdraw_cma_send(id);
}

void UcxTransport::abandon_ucx(uint64_t id) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  UcxOp* op = it->second.get();
  op->owner = nullptr;
  const int peer = op->peer;
  const UcxOp::Kind kind = op->kind;
  const bool send = kind == UcxOp::Kind::kSend;
  // From here on `op` may be gone: a cancel or a progress can complete it, and its
  // callback erases it. Only `id`, `kind` and `peer` are used.
  if (!send && op->ucx_request != nullptr) ucp_request_cancel(worker_of(*op), op->ucx_request);
  op = nullptr;
  const auto finished = [&] { return !alive(id); };
  const auto leave_to_ucx = [&] {
    // Cancelled if it could be; otherwise see unfinishable().
    progress_until(Clock::now() + kUcxLostDrain, finished);
    if (!finished()) log(LogLevel::kDebug, "ucx: rank {}: a {} with failed rank {} stays with UCX", rank_,
                         send ? "send" : "receive", peer);
  };
  if (finished()) return;
  if (unfinishable(kind, peer)) return leave_to_ucx();
  // After abandon_pending() whatever could finish has; do not wait again per request.
  const auto wait = abandoned_ ? kUcxCancelWait : kUcxAbandonWait;
  progress_until(Clock::now() + wait, finished);
  if (finished()) return;
  if (send) {
    fail_peer(peer, fmt::format("ucx: rank {} closed its endpoint to rank {}: a send was abandoned in flight "
                                "(rendezvous never matched)",
                                rank_, peer));
    force_close(peer);
    progress_until(Clock::now() + kUcxLostDrain, finished);
    if (finished() || unfinishable(kind, peer)) return leave_to_ucx();
  }
  log(LogLevel::kWarn, "ucx: rank {}: an abandoned {} with rank {} is still in flight", rank_,
      send ? "send" : "receive", peer);
}

// After a failure: let outstanding sends (the abort among them) finish within the
// grace, and cancel pending receives. Whatever is still in flight after that is
// stuck on its peer (a send nobody receives, a rendezvous receive whose sender
// stopped: UCX cannot cancel a matched receive), so that peer's endpoint is
// force-closed, which completes everything on it. From then on a destroyed
// Request waits for nothing (abandoned_).
void UcxTransport::abandon_pending(std::chrono::milliseconds grace) {
  if (lanes_.empty() || abandoned_) return;
  abandoned_ = true;
  auto is_data = [](const UcxOp& op) { return op.kind == UcxOp::Kind::kSend || op.kind == UcxOp::Kind::kRecv; };
  auto sends_left = [&] {
    return std::any_of(ops_.begin(), ops_.end(),
                       [&](const auto& entry) { return is_send(entry.second->kind) && !unfinishable(*entry.second); });
  };
  progress_until(Clock::now() + grace, [&] { return !sends_left(); });
  std::vector<std::pair<ucp_worker_h, void*>> receives;
  for (auto& [id, op] : ops_) {
    if (op->kind == UcxOp::Kind::kRecv && op->ucx_request != nullptr) {
      receives.emplace_back(worker_of(*op), op->ucx_request);
    }
  }
  for (auto [worker, request] : receives) ucp_request_cancel(worker, request);
  // What cannot finish (unfinishable: exchanges with failed peers that UCX keeps) is not waited for.
  const auto settled = [&] {
    return std::none_of(ops_.begin(), ops_.end(),
                        [&](const auto& entry) { return is_data(*entry.second) && !unfinishable(*entry.second); });
  };
  progress_until(Clock::now() + kUcxCancelWait, settled);
  std::vector<int> stuck;
  for (auto& [id, op] : ops_) {
    if (is_data(*op) && op->peer >= 0 && !unfinishable(*op)) stuck.push_back(op->peer);
  }
  std::sort(stuck.begin(), stuck.end());
  stuck.erase(std::unique(stuck.begin(), stuck.end()), stuck.end());
  for (int peer : stuck) {
    fail_peer(peer, fmt::format("ucx: rank {} cut off rank {} after a failure: exchanges with it never completed",
                                rank_, peer));
    force_close(peer);
  }
  if (!stuck.empty()) progress_until(Clock::now() + kUcxCloseWait, settled);
}

// ---- teardown --------------------------------------------------------------------

// Step 3b of shutdown: messages that arrived after this rank stopped receiving (a peer's
// release, goodbye or pong crossing this rank's own departure; data of a call a failure
// abandoned) sit in UCX's unexpected queue, and ucp_worker_destroy reports each as a
// warning ("unexpected tag-receive descriptor ... was not matched") on a clean exit. They
// are taken here and dropped, within kUcxDropWait (a large message whose sender is gone
// cannot complete: its request is let go at the bound).
void UcxTransport::drop_unreceived() noexcept {
  const auto deadline = Clock::now() + kUcxDropWait;
  std::vector<uint8_t>& sink = drop_sink_;  // a request let go at the bound may still write here until ucp_worker_destroy
  for (UcxLane& lane : lanes_) {
    if (lane.worker == nullptr) continue;
    for (int n = 0; n < kUcxMaxDropped && Clock::now() < deadline; ++n) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h message = ucp_tag_probe_nb(lane.worker, 0, 0, /*remove=*/1, &info);
      if (message == nullptr) break;
      try {
        sink.resize(std::max<size_t>(sink.size(), info.length));
      } catch (...) {
        return;  // out of memory at teardown: UCX keeps it, and says so at ucp_worker_destroy
      }
      ucp_request_param_t param{};
      ucs_status_ptr_t request = ucp_tag_msg_recv_nbx(lane.worker, sink.data(), info.length, message, &param);
      if (!UCS_PTR_IS_PTR(request)) continue;  // done at once (or failed): nothing to wait for
      while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline) {
        ucp_worker_progress(lane.worker);
      }
      ucp_request_free(request);
    }
  }
}

void UcxTransport::shutdown() noexcept {
  // Steps 0 and 2 share one bound: a stopped peer neither returns a receipt nor
  // drains a flush, and it must cost the bound once, not once per step.
  const auto flush_deadline = Clock::now() + kUcxFlushWait;
  if (!lanes_.empty()) {
    try {
      // 0. Aborts this rank sent: wait (bounded) until every live peer confirmed
      //    taking it in, so that its notice, not this rank's departure, is what the
      //    peer sees first (ucx_wire.h: receipts). The control receive stays posted
      //    meanwhile: receipts arrive on it, and peers waiting on ours get them.
      progress_until(flush_deadline, [&] { return receipts_in(); });
    } catch (...) {
    }
  }
  closing_ = true;
  if (!lanes_.empty()) {
    try {
      // 1. Nobody will read what pending receives (the abort receive included) get.
      std::vector<std::pair<ucp_worker_h, void*>> receives;
      for (auto& [id, op] : ops_) {
        if ((op->kind == UcxOp::Kind::kRecv || op->kind == UcxOp::Kind::kControlRecv) && op->ucx_request != nullptr) {
          receives.emplace_back(worker_of(*op), op->ucx_request);
        }
      }
      for (auto [worker, request] : receives) ucp_request_cancel(worker, request);
      // 2. Give queued sends (an abort sent just before) a bounded chance to leave:
      //    endpoint by endpoint, to live peers only (a flush that includes a failed
      //    peer's endpoint would wait out the whole bound).
      std::vector<void*> flushes;
      for (const Peer& peer : peers_) {
        if (peer.rank == rank_ || peer.failed || peer.ep == nullptr) continue;
        ucp_request_param_t flush_param{};
        ucs_status_ptr_t flush = ucp_ep_flush_nbx(peer.ep, &flush_param);
        if (UCS_PTR_IS_PTR(flush)) flushes.push_back(flush);
      }
      progress_until(flush_deadline, [&] {
        return std::all_of(flushes.begin(), flushes.end(),
                           [](void* f) { return ucp_request_check_status(f) != UCS_INPROGRESS; });
      });
      for (void* flush : flushes) ucp_request_free(flush);  // released by UCX once it completes, if not yet
      // 3. Force-close every endpoint: no close handshake with peers that may be dead.
      for (int r = 0; r < size_ && r < static_cast<int>(peers_.size()); ++r) force_close(r);
      progress_until(Clock::now() + kUcxCloseWait, [&] {
        return std::all_of(close_requests_.begin(), close_requests_.end(),
                           [](void* r) { return ucp_request_check_status(r) != UCS_INPROGRESS; });
      });
    } catch (...) {
      // Teardown continues regardless; nothing above is expected to throw.
    }
    for (void* request : close_requests_) ucp_request_free(request);
    close_requests_.clear();
    drop_unreceived();
    // 4. Whatever is still in flight is detached: its Request reports kFailed and
    //    its destructor touches nothing. ucp_request_free also drops the
    //    completion callback, so UCX never calls back into a freed UcxOp.
    for (auto& [id, op] : ops_) {
      if (UcxRequest* owner = op->owner) {
        owner->op_ = 0;
        if (owner->pending()) {
          owner->fail(RequestState::kFailed, fmt::format("ucx: rank {} destroyed the transport while this "
                                                         "request was in flight",
                                                         rank_));
        }
      }
      if (op->ucx_request != nullptr) ucp_request_free(op->ucx_request);
    }
    ops_.clear();
    if (cma_reads_done_ > 0) {
      log(LogLevel::kInfo, "ucx: rank {} read {} messages ({} bytes) from its peers by single-copy read (cma)", rank_,
          cma_reads_done_, cma_bytes_read_);
    }
    cma_slots_.reset();  // cleared, then freed: a late reader finds its exchange gone
  }
  for (UcxLane& lane : lanes_) {  // lanes made before a failed connect too
    if (lane.worker != nullptr) ucp_worker_destroy(lane.worker);
    if (lane.context != nullptr) ucp_cleanup(lane.context);
  }
  lanes_.clear();
}

}  // namespace gradcomm::detail
