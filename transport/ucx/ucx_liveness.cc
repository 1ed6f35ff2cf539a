// UCX transport: whether peers are alive and answering, and clean departures
// (transport.h, find_silent, note_completed and leave; ucx_transport_impl.h).
//
// Processes. Over shared memory nothing tells a rank that its peer died but UCX's
// keepalive, which asks whether the peer's pid exists: a zombie's does. So every rank
// publishes its process (base/process_identity.h), and a rank reads /proc for each
// shared-memory peer it can observe, every kUcxProcessPoll while exchanges are pending.
// A zombie or a pid that is gone (or reused) fails the peer as lost, as the endpoint
// error would. A peer is watched only if it was seen running at connection, so a /proc
// that hides other processes never reads as a death.
//
// Liveness checks. find_silent pings every live peer and drives progress until each
// has answered or the wait is over; a peer answers from drive() (pongs_due_), which a
// running engine reaches within milliseconds whatever it is doing with its calls.
//
// Departures. leave() sends a goodbye naming the calls this rank completed (those
// numbered below its `next`), then waits for every live peer's release. A peer releases
// a goodbye as soon as it has completed those calls too (note_completed): until then it
// may still be receiving what this rank sent. Releasing also fails the departed peer on the releasing side, so a later
// call that needs it raises PeerFailure at once, naming the departure, instead of
// waiting for a rank that has gone.
#include <fmt/format.h>

#include <algorithm>

#include "logging.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace gradcomm::detail {

void UcxTransport::connect_process_watch(Store& store, const std::string& prefix, const Deadline& deadline) {
  const auto key = [&](int r) { return fmt::format("{}/ucx/proc/{}", prefix, r); };
  const std::optional<ProcessIdentity> mine = this_process();
  store.set(key(rank_), mine ? mine->serialize() : std::vector<uint8_t>{});
  for (Peer& peer : peers_) {
    if (peer.rank == rank_ || !peer.shared_memory) continue;
    const std::optional<ProcessIdentity> theirs = ProcessIdentity::parse(store.get(key(peer.rank), deadline.remaining()));
    const std::optional<ProcessState> state = theirs ? observe(*theirs) : std::nullopt;
    if (state == ProcessState::kRunning) {
      peer.process = theirs;
      watching_processes_ = true;
      log(LogLevel::kDebug, "ucx: rank {} watches rank {}'s process (pid {})", rank_, peer.rank, theirs->pid);
    } else {
      log(LogLevel::kInfo, "ucx: rank {} cannot watch rank {}'s process ({}): a zombie there is found by keepalive "
          "only once it is reaped", rank_, peer.rank,
          !theirs ? "it published none" : !state ? "another machine or pid namespace" : process_state_name(*state));
    }
  }
}

void UcxTransport::poll_processes(Clock::time_point now) {
  next_process_poll_ = now + kUcxProcessPoll;
  if (!exchanging()) return;
  for (Peer& peer : peers_) {
    if (!peer.process || peer.failed) continue;
    const std::optional<ProcessState> state = observe(*peer.process);
    if (state != ProcessState::kZombie && state != ProcessState::kGone) continue;
    peer.lost = true;  // as from on_ep_error: nothing more will come from it
    fail_peer(peer.rank, fmt::format("ucx: rank {} lost rank {}: its process (pid {}) {}", rank_, peer.rank,
                                     peer.process->pid,
                                     *state == ProcessState::kZombie ? "is a zombie (it exited; its parent has not "
                                                                       "reaped it yet)"
                                                                     : "has exited"));
  }
}

void UcxTransport::send_liveness(int peer, ControlKind kind, uint64_t seq) {
  try {
    send_control(peer, encode_control(ControlMessage{ErrorCode::kPeerFailure, rank_, seq, {}}, kind, rank_));
  } catch (...) {
    // Best effort, as every control message: a peer that cannot be reached is found otherwise.
  }
}

void UcxTransport::take_liveness(ControlKind kind, int sender, uint64_t seq) {
  Peer& peer = peers_[static_cast<size_t>(sender)];
  switch (kind) {
    case ControlKind::kPing:
      pongs_due_.emplace_back(sender, seq);
      return;
    case ControlKind::kPong:
      peer.answered = std::max(peer.answered, seq);
      return;
    case ControlKind::kGoodbye:
      if (!peer.left_after) peer.left_after = seq;
      departures_due_ = true;
      return;
    case ControlKind::kRelease:
      peer.released = true;
      return;
    case ControlKind::kAbort:
    case ControlKind::kReceipt:
      return;  // finish() takes these
  }
}

void UcxTransport::answer_liveness() {
  std::vector<std::pair<int, uint64_t>> pongs;
  pongs.swap(pongs_due_);
  for (const auto& [peer, check] : pongs) send_liveness(peer, ControlKind::kPong, check);
  if (!departures_due_) return;
  departures_due_ = false;
  for (Peer& peer : peers_) {
    if (!peer.left_after || peer.failed) continue;
    if (completed_ < *peer.left_after) {
      departures_due_ = true;  // note_completed looks again
      continue;
    }
    send_liveness(peer.rank, ControlKind::kRelease, *peer.left_after);
    fail_peer(peer.rank, fmt::format("ucx: rank {} lost rank {}: it left (its communicator was destroyed) after call "
                                     "#{}, its last, which this rank has completed too",
                                     rank_, peer.rank, *peer.left_after - 1));
  }
}

void UcxTransport::note_completed(uint64_t next) {
  completed_ = std::max(completed_, next);
  if (departures_due_) answer_liveness();
}

std::vector<UcxTransport::Silent> UcxTransport::find_silent(std::chrono::milliseconds wait) {
  if (lanes_.empty()) return {};
  const uint64_t check = ++checks_;
  const auto start = Clock::now();
  for (const Peer& peer : peers_) {
    if (peer.rank != rank_ && !peer.failed) send_liveness(peer.rank, ControlKind::kPing, check);
  }
  const auto answered = [&](const Peer& p) { return p.rank == rank_ || p.failed || p.answered >= check; };
  progress_until(start + wait, [&] { return std::all_of(peers_.begin(), peers_.end(), answered); });
  std::vector<Silent> silent;
  const double waited_s = std::chrono::duration<double>(Clock::now() - start).count();
  for (const Peer& peer : peers_) {
    if (answered(peer)) continue;
    const std::optional<ProcessState> state = peer.process ? observe(*peer.process) : std::nullopt;
    std::string why = state && *state != ProcessState::kRunning
                          ? fmt::format("its process (pid {}) is {}", peer.process->pid, process_state_name(*state))
                          : fmt::format("it did not answer a liveness check within {:.1f} s (stopped, hung, or cut off)",
                                        waited_s);
    silent.push_back({peer.rank, std::move(why)});
  }
  return silent;
}

std::vector<int> UcxTransport::leave(uint64_t next, Clock::time_point deadline) {
  if (lanes_.empty() || abandoned_) return {};
  note_completed(next);
  for (const Peer& peer : peers_) {
    if (peer.rank != rank_ && !peer.failed) send_liveness(peer.rank, ControlKind::kGoodbye, next);
  }
  // Done with a peer: it released this rank, left after the same calls itself, or failed
  // (a departure this rank released counts: it left first).
  const auto done = [&](const Peer& p) {
    return p.rank == rank_ || p.failed || p.released || (p.left_after && *p.left_after >= next);
  };
  progress_until(deadline, [&] { return std::all_of(peers_.begin(), peers_.end(), done); });
  std::vector<int> waiting;
  for (const Peer& peer : peers_) {
    if (!done(peer)) waiting.push_back(peer.rank);
  }
  return waiting;
}

}  // namespace gradcomm::detail
