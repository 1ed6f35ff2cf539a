// The transport interface: tagged, nonblocking point-to-point messages between
// the ranks of one job. UCX (CPU memory), NCCL (GPU memory) and the in-process
// transport (threads, for tests) implement it; collectives see nothing else.
//
// Contract
//  - isend/irecv start an operation and return at once; the buffer must stay
//    valid, and unmodified for sends, until the request is no longer pending.
//  - Messages from one peer with one tag match receives in the order posted.
//  - A receive may be posted before or after the matching send. A message longer
//    than the receive buffer fails the receive (kTruncated); a shorter one
//    completes it, and Request::bytes() says how many arrived.
//  - progress() drives every outstanding request and never blocks; a request's
//    state changes only inside progress() (or wait_for_event()).
//  - One thread at a time drives a transport (the communicator's engine, or a caller
//    running a call inline under the engine's lock: src/engine.h); interrupt() is the
//    one call any thread may make at any time.
//  - Destroying a pending Request cancels it where the transport can; the
//    transport guarantees it never touches the buffer after the Request object is
//    gone or after the transport itself is destroyed.
//  - Failures are reported, never thrown, by requests: the communicator turns them
//    into typed errors with the operation's context.
//  - A request's destructor may block briefly (a send UCX cannot cancel), except
//    after abandon_pending(), when nothing may block any more.
//  - The control channel carries aborts: a rank that fails a collective tells the
//    others, so they raise at once instead of waiting for their deadline. It also
//    carries liveness checks (find_silent) and departures (leave): see below.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "env.h"  // base/: Clock
#include "gradcomm/errors.h"

namespace gradcomm::detail {

// Tag layout (64 bits): [63..60] kind, [59..32] sequence number (mod 2^28),
// [31..0] kind-specific sub-tag (pipeline unit, round, ...).
enum class TagKind : uint8_t { kHeader = 1, kData = 2, kControl = 3 };
constexpr uint64_t make_tag(TagKind kind, uint64_t seq, uint32_t sub) {
  return (static_cast<uint64_t>(kind) << 60) | ((seq & 0x0FFFFFFFull) << 32) | sub;
}
constexpr TagKind tag_kind(uint64_t tag) { return static_cast<TagKind>(tag >> 60); }

enum class RequestState : uint8_t {
  kPending,
  kDone,
  kPeerFailed,  // the peer died or its connection broke
  kTruncated,   // receive: the message was longer than the buffer
  kFailed,      // any other transport error; see error()
};

class Request {
 public:
  virtual ~Request() = default;
  RequestState state() const { return state_; }
  bool pending() const { return state_ == RequestState::kPending; }
  size_t bytes() const { return bytes_; }  // receive: bytes that arrived; send: bytes sent
  size_t posted_bytes() const { return posted_bytes_; }  // the size the request was posted with
  int peer() const { return peer_; }
  const std::string& error() const { return error_; }  // transport's own words on failure

 protected:
  Request(int peer, size_t bytes) : bytes_(bytes), posted_bytes_(bytes), peer_(peer) {}
  void complete(size_t bytes) { bytes_ = bytes; state_ = RequestState::kDone; }
  void fail(RequestState state, std::string error) { state_ = state; error_ = std::move(error); }

 private:
  RequestState state_ = RequestState::kPending;
  size_t bytes_;
  size_t posted_bytes_;
  int peer_;
  std::string error_;
};
using RequestPtr = std::unique_ptr<Request>;

// An abort travelling on the control channel.
struct ControlMessage {
  ErrorCode code = ErrorCode::kTransport;
  int origin = -1;       // rank that raised first
  uint64_t seq = 0;      // the collective call that failed there
  std::string text;      // its full error message
  static constexpr size_t kMaxText = 2048;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "ucx", "inproc", "nccl"

  virtual RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  virtual RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;

  // Drives all outstanding requests; returns true when anything completed.
  virtual bool progress() = 0;
  // Sleeps until the transport has something to progress or `max_wait` passes
  // (may return early, spuriously). Callers loop: progress, check, wait_for_event.
  virtual void wait_for_event(std::chrono::microseconds max_wait) = 0;
  // Thread-safe: makes a wait_for_event() in progress, or the next one, return
  // at once (the engine's doorbell: new work, a wait on open work, shutdown).
  virtual void interrupt() = 0;

  // Best effort, nonblocking: tells every other rank that this one failed.
  virtual void send_abort(const ControlMessage& message) = 0;
  // An abort some peer sent, if one has arrived (progress() receives them).
  virtual std::optional<ControlMessage> poll_abort() = 0;

  // The communicator has failed: sends still outstanding (aborts included) get up
  // to `grace` to complete; then every exchange still pending is dropped, cutting
  // off peers whose sends never completed, so that no later Request destruction
  // blocks. The transport stays usable for poll_abort() and destruction only.
  virtual void abandon_pending(std::chrono::milliseconds grace) = 0;

  // ---- liveness and departure (docs/fault-model.md) --------------------------------
  // Which peers do not answer: every peer not known failed is asked at once, and its
  // transport answers from its progress loop (a running engine, busy or idle, does so
  // within milliseconds; a stopped or hung process never). Drives progress for at most
  // `wait`. Each entry names the rank and what was observed ("does not answer", or,
  // for a process on this machine, its state). A waiting call's timeout asks, so that
  // its error names the rank that stalls the job, not the neighbour waiting on it.
  // Transports whose peers cannot stall apart from this process (threads) find none.
  struct Silent {
    int rank = -1;
    std::string why;
  };
  virtual std::vector<Silent> find_silent(std::chrono::milliseconds /*wait*/) { return {}; }

  // Calls are numbered alike on every rank, from 0; every call numbered below `next` has
  // completed here. A peer that left with the same `next` (below) is released once this
  // rank got there, and from then on counts as failed: a later call that needs it
  // raises at once.
  virtual void note_completed(uint64_t /*next*/) {}
  // A clean departure (the communicator is destroyed with nothing outstanding): tells
  // every live peer that this rank completed the calls below `next` and will make no
  // more, then drives progress until each has released it (it completed those calls
  // too, so it needs nothing more of this rank's: a send that completed here may still
  // be on its way there), has failed, or `deadline` passes. Returns the ranks that had
  // not.
  virtual std::vector<int> leave(uint64_t /*next*/, Clock::time_point /*deadline*/) { return {}; }
};

}  // namespace gradcomm::detail
