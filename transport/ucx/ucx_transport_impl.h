// Internals of the UCX transport, shared by ucx_transport.cc (set-up, operations,
// progress, control channel) and ucx_teardown.cc (failures, abandoned requests,
// destruction). Nothing outside transport/ucx/ includes this.
//
//
// Request lifetime. Every operation UCX has not finished is an Op record owned by
// the transport (ops_, keyed by a serial id). Its user-facing UcxRequest points at
// it and it points back; whichever side goes first clears the other's pointer:
//  - UCX finishes (callback, only inside ucp_worker_progress, i.e. inside
//    progress()/wait_for_event() or a bounded internal wait): the owner's state is
//    set, the UCX request freed, the Op erased.
//  - The Request is destroyed first: the transport abandons the Op. A receive is
//    cancelled (ucp_request_cancel). A send cannot be cancelled in UCX 1.13, so the
//    worker is progressed until it completes, at most kUcxAbandonWait; if it still has
//    not (a rendezvous send whose receiver never came), the endpoint to that peer
//    is force-closed, which completes the send with an error and guarantees UCX no
//    longer reads the buffer. That peer then counts as failed for this rank: the
//    caller already gave up on the exchange, and after a failure the communicator
//    is unusable anyway.
//  - The transport is destroyed first: pending receives are cancelled, the worker
//    flushed (bounded), every endpoint force-closed, and surviving Requests are
//    detached and marked kFailed; their destructors then touch nothing.
//  - A single-copy exchange (ucx_cma.h) outlives its UCX operation: a send waits for
//    the receiver's ack, a receive for its read in drive(). Abandoned, the send gets
//    the wait above and then clears its slot (the receiver's read then fails); the
//    receive's read is dropped at once.
// A peer failure (endpoint error callback) marks that peer's pending Requests
// kPeerFailed at once, so waits end in seconds; their receives are cancelled right
// after. Callers destroy their Requests before freeing the buffers, which is when
// the transport makes its buffer guarantee.
//
// Dead peers. Endpoints use UCP_ERR_HANDLING_MODE_PEER. With that mode UCX 1.13
// selects shared memory (sysv/posix) only when the mm
// transports' error handling is on, which the transport turns on unless the user
// set it (prefer_shared_memory in ucx_transport.cc). Over TCP a process killed with
// SIGKILL resets its sockets: measured, its peers see kPeerFailed ("Endpoint
// timeout") within 1-20 ms. Over shared memory nothing resets: keepalive's endpoint
// check finds the peer's process gone. For those deaths, UCX keepalive checks every endpoint each
// GRADCOMM_UCX_KEEPALIVE_MS (default 300 ms; UCX's own default is 20 s). UCX
// runs keepalive from inside ucp_worker_progress, only on every 32nd call, and
// has no timer to wake a sleeping worker, so wait_for_event never sleeps longer
// than kUcxMaxSleep and progress() adds a burst of 32 calls every kUcxKeepaliveKick.
// Keepalive's check counts a zombie (a killed process its parent has not reaped yet)
// as alive, so the transport also watches each shared-memory peer's process itself
// (base/process_identity.h) while exchanges are pending: a zombie or a vanished pid fails
// that peer at once, as the endpoint error would (ucx_liveness.cc).
//
// Liveness checks and departures (ucx_liveness.cc; transport.h, find_silent and leave)
// travel on the control channel beside aborts: pings are answered from drive(), a
// goodbye is released once this rank has completed the goodbye's call.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "env.h"
#include "process_identity.h"
#include "transport/ucx/ucx_cma.h"
#include "transport/ucx/ucx_link_watch.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_wire.h"

namespace gradcomm::detail {

constexpr auto kUcxMaxSleep = std::chrono::milliseconds{100};       // longest single sleep in wait_for_event
constexpr auto kUcxKeepaliveKick = std::chrono::milliseconds{200};  // how often progress() gives keepalive its turn
constexpr int kUcxKeepaliveIterSkip = 32;                           // UCX checks keepalive every 32nd progress call
constexpr int kUcxMaxProgressRounds = 4096;                         // bound on one progress() loop
constexpr auto kUcxAbandonWait = std::chrono::seconds{2};           // a destroyed Request's send may finish this long
constexpr auto kUcxCancelWait = std::chrono::milliseconds{100};     // cancelled receives report back
constexpr auto kUcxLostDrain = std::chrono::milliseconds{10};       // a failed peer's queued fragments drain
constexpr auto kUcxFlushWait = std::chrono::seconds{1};             // destructor: let queued sends (aborts) leave
constexpr auto kUcxCloseWait = std::chrono::seconds{2};             // destructor: endpoint closes and cancellations
constexpr auto kUcxDropWait = std::chrono::milliseconds{100};       // destructor: unreceived messages taken and dropped
constexpr int kUcxMaxDropped = 4096;                                // at most this many of them a lane
constexpr auto kUcxLinkPoll = std::chrono::seconds{1};              // LinkWatch scans at most this often
constexpr auto kUcxProcessPoll = std::chrono::milliseconds{200};    // shared-memory peers' processes, this often
constexpr int64_t kUcxLinkTimeoutS = 20;                            // GRADCOMM_LINK_TIMEOUT_S default

class UcxTransport;
struct UcxOp;

// A UCX context and its worker. A transport has one per kind of peer it talks to
// (UcxOptions::same_node): its node's ranks, over whatever UCX finds best (shared memory
// on one host), and other nodes' ranks, with shared memory and cma left out, so that
// ranks of different nodes on one host (containers, an emulated cluster) cross the
// network between them as on a real cluster. One when every peer is of one kind, or
// when the user set UCX_TLS (their choice serves every peer).
struct UcxLane {
  enum class Kind : uint8_t { kNode = 0, kNet = 1 };
  Kind kind = Kind::kNode;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int event_fd = -1;
  bool control_posted = false;  // its abort/liveness receive is posted
};

class UcxRequest final : public Request {
 public:
  UcxRequest(UcxTransport* transport, int peer, size_t bytes) : Request(peer, bytes), transport_(transport) {}
  ~UcxRequest() override;
  UcxRequest(const UcxRequest&) = delete;
  UcxRequest& operator=(const UcxRequest&) = delete;

 private:
  friend class UcxTransport;
  UcxTransport* transport_;
  uint64_t op_ = 0;  // id of the in-flight UcxOp; 0 when UCX holds nothing of ours
};

// One operation UCX has not finished. Lives in UcxTransport::ops_.
struct UcxOp {
  enum class Kind : uint8_t { kSend, kRecv, kControlSend, kControlRecv };
  UcxTransport* transport = nullptr;
  uint64_t id = 0;
  Kind kind = Kind::kSend;
  int peer = -1;                // -1 for the control receive (any peer)
  uint64_t tag = 0;             // interface tag, for error messages
  size_t bytes = 0;             // send size or receive capacity
  UcxRequest* owner = nullptr;  // null: nobody waits (control ops, abandoned requests)
  int lane = 0;                 // the lane whose worker holds it (UcxTransport::lanes_)
  void* ucx_request = nullptr;  // the UCX request while UCX owns one
  bool posting = true;          // inside the *_nbx call: the poster erases, not the callback
  bool ucx_done = false;        // UCX finished its part (a single-copy exchange may go on)
  bool done = false;            // finished: erased as soon as UCX holds nothing of it
  std::vector<uint8_t> storage;  // control ops own their bytes; descriptors (ucx_cma.h) too
  // Single-copy exchanges (ucx_cma.h). A send: its descriptor while the slot is live.
  // A receive from a peer that may send descriptors (cma_capable): the user's buffer
  // (UCX receives into `storage` when the buffer is smaller than a descriptor), and
  // the descriptor once one arrived, until its read has run.
  std::optional<CmaDescriptor> cma;
  bool cma_capable = false;
  void* data = nullptr;
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(int rank, int size, Store& store, const UcxOptions& options);
  ~UcxTransport() override { shutdown(); }
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "ucx"; }
  RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  bool progress() override { return drive(); }
  void wait_for_event(std::chrono::microseconds max_wait) override;
  void interrupt() override;
  void send_abort(const ControlMessage& message) override;
  std::optional<ControlMessage> poll_abort() override;
  void abandon_pending(std::chrono::milliseconds grace) override;
  std::vector<Silent> find_silent(std::chrono::milliseconds wait) override;
  void note_completed(uint64_t next) override;
  std::vector<int> leave(uint64_t next, Clock::time_point deadline) override;

  void abandon(uint64_t id);

 private:
  struct Peer {
    UcxTransport* transport = nullptr;
    int rank = -1;
    int lane = 0;  // lanes_[lane] reaches it
    ucp_ep_h ep = nullptr;
    bool failed = false;
    // UCX itself reported the endpoint failed (error callback): the process is gone or
    // its connection broke. `failed` alone may also mean this rank cut the peer off.
    bool lost = false;
    // Its lanes are shared memory (sysv/posix): a send to it may wait for FIFO room
    // with no event to say when there is some (see wait_for_event).
    bool shared_memory = false;
    std::string error;
    // Aborts sent to it that it has not yet confirmed (ucx_wire.h: receipts).
    int receipts_owed = 0;
    // Single-copy exchanges (ucx_cma.h): its large messages may come as descriptors
    // (marked with its cookie), read from its process (pid) with its slot table at
    // cma_table; ours go to it so.
    bool cma_from = false;
    bool cma_to = false;
    pid_t pid = 0;
    uint64_t cma_table = 0;
    uint64_t cma_cookie = 0;
    // Liveness (ucx_liveness.cc). Its process, where this rank can observe it (a
    // shared-memory peer on this machine): watched while exchanges are pending.
    std::optional<ProcessIdentity> process;
    uint64_t answered = 0;               // the latest liveness check it answered
    std::optional<uint64_t> left_after;  // it left cleanly, having completed the calls below this (goodbye)
    bool released = false;               // it completed every call this rank left after (release)
  };
  // An exchange UCX may never finish, and that nothing waits for once it has had a
  // brief drain (kUcxLostDrain): its Op is detached and freed at shutdown.
  //  - A receive matched to a rendezvous from a failed peer (lost, or cut off by this
  //    rank). UCX 1.13 cannot cancel a matched receive, and over shared memory neither
  //    the peer's death nor a force-close ends it. A lost peer sends nothing more; a
  //    cut-off one (stopped, say) could still, until this transport is destroyed, which
  //    unmaps the shared-memory FIFO it writes into: after a failure the communicator
  //    only awaits destruction.
  //  - A send to a lost peer, or to one whose endpoint this rank force-closed, that UCX
  //    keeps (a rendezvous waiting for the peer's ready-to-receive, fragments pending
  //    for room in its FIFO): UCX has no endpoint left to move it on, and over TCP the
  //    force-close completes such sends at once.
  bool unfinishable(const UcxOp& op) const { return unfinishable(op.kind, op.peer); }
  // The same from an Op's kind and peer, for callers whose Op a UCX call may have erased.
  bool unfinishable(UcxOp::Kind kind, int rank) const {
    if (rank < 0) return false;
    const Peer& peer = peers_[static_cast<size_t>(rank)];
    if (kind == UcxOp::Kind::kRecv) return peer.failed;
    return kind == UcxOp::Kind::kSend && (peer.lost || (peer.failed && peer.ep == nullptr));
  }

  void connect(Store& store, const UcxOptions& options);
  // The lanes this rank needs (UcxLane), made and published; returns which serves each kind.
  void make_lanes(Store& store, const UcxOptions& options, const Deadline& deadline);
  ucp_worker_h worker_of(int peer) const { return lanes_[static_cast<size_t>(peers_[peer].lane)].worker; }
  ucp_worker_h worker_of(const UcxOp& op) const { return lanes_[static_cast<size_t>(op.lane)].worker; }
  void shutdown() noexcept;
  bool drive();
  void progress_until(Clock::time_point deadline, const auto& done);
  UcxOp* new_op(UcxOp::Kind kind, int peer, uint64_t tag, size_t bytes, UcxRequest* owner);
  // Whether `op` counts in polled_sends_; fixed for its life (its kind and peer are).
  bool polled(const UcxOp& op) const {
    return is_send(op.kind) && op.peer >= 0 && peers_[static_cast<size_t>(op.peer)].shared_memory;
  }
  void erase(UcxOp* op) {
    if (polled(*op)) --polled_sends_;
    ops_.erase(op->id);
  }
  static bool is_send(UcxOp::Kind kind) { return kind == UcxOp::Kind::kSend || kind == UcxOp::Kind::kControlSend; }
  void after_post(UcxOp* op, ucs_status_ptr_t result);
  void finish(UcxOp* op, ucs_status_t status, size_t length);
  void settle(UcxRequest& request, const UcxOp& op, ucs_status_t status, size_t length);
  std::string check_target(int peer, uint64_t tag) const;
  void post_control_recv(int lane);
  // One control message to `peer`, best effort (a failed or closed peer is skipped).
  bool send_control(int peer, const std::vector<uint8_t>& payload);
  // Confirms the aborts taken in since the last call (outside UCX callbacks).
  void send_receipts();
  // Every live peer sent an abort has confirmed it.
  bool receipts_in() const;
  void fail_peer(int peer, std::string error);
  void cancel_receives_from_failed();
  void force_close(int peer);
  // Destructor: takes and drops the messages that arrived but were never received.
  void drop_unreceived() noexcept;
  void abandon_ucx(uint64_t id);
  bool alive(uint64_t id) const { return ops_.count(id) != 0; }

  // Cut-off hosts (ucx_link_watch.h): every rank publishes its interface addresses;
  // a rank with TCP peers watches their connections while data exchanges are pending.
  void connect_link_watch(Store& store, const std::string& prefix, const Deadline& deadline);
  void poll_links(Clock::time_point now);
  // A data exchange is pending (the watches above and below scan only then).
  bool exchanging() const;

  // Liveness and departures (ucx_liveness.cc). Every rank publishes its process; a rank
  // watches its shared-memory peers' processes.
  void connect_process_watch(Store& store, const std::string& prefix, const Deadline& deadline);
  void poll_processes(Clock::time_point now);
  // A ping, pong, goodbye or release from `sender` (inside a UCX callback: only
  // records; drive() answers).
  void take_liveness(ControlKind kind, int sender, uint64_t seq);
  void send_liveness(int peer, ControlKind kind, uint64_t seq);
  // Pongs owed, and departures whose call this rank has completed: answered here.
  void answer_liveness();

  // Single-copy exchanges (ucx_cma.cc).
  void connect_cma(Store& store, const std::string& prefix, const Deadline& deadline);
  // A send that goes by descriptor: fills op.cma and op.storage, true.
  bool cma_describe(UcxOp& op, const Peer& target, const void* data, size_t bytes);
  // Where a receive from `source` lands (target, capacity).
  void cma_receive_into(UcxOp& op, const Peer& source, void* data, void*& target, size_t& capacity);
  // From finish(): true while the exchange goes on (a send awaits its ack, a read is
  // queued); may turn a plain OK into kTruncated (status) for a bounced receive.
  bool cma_continues(UcxOp& op, ucs_status_t& status, size_t length);
  void run_cma_reads();
  void send_cma_ack(int peer, const CmaDescriptor& descriptor, CmaOutcome outcome);
  void drop_cma_read(uint64_t id);
  void withdraw_cma_send(uint64_t id);
  static ucs_status_t on_cma_ack(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                 const ucp_am_recv_param_t* param);
  static std::string lanes(ucp_ep_h ep);

  static void on_send(void* request, ucs_status_t status, void* user_data);
  static void recv_params(UcxOp* op, ucp_request_param_t& param);
  static void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  int rank_;
  int size_;
  std::vector<UcxLane> lanes_;  // empty once destroyed
  std::vector<Peer> peers_;  // sized once: endpoint error callbacks hold &peers_[r]
  std::unordered_map<uint64_t, std::unique_ptr<UcxOp>> ops_;
  uint64_t next_op_id_ = 1;
  uint64_t events_ = 0;  // completions, arrivals, failures: progress() reports changes
  size_t polled_sends_ = 0;  // sends in ops_ to shared-memory peers: while any, wait_for_event polls
  bool closing_ = false;
  std::vector<uint8_t> drop_sink_;  // drop_unreceived's buffer: lives until the workers are destroyed
  bool peers_newly_failed_ = false;
  bool abandoned_ = false;  // abandon_pending() ran: destroyed Requests wait for nothing
  std::deque<ControlMessage> aborts_;
  std::vector<ControlMessage> receipts_due_;  // origin: the rank that sent us the abort
  std::vector<void*> close_requests_;  // force-closes still finishing
  Clock::time_point last_kick_ = Clock::now();
  std::unique_ptr<CmaSlots> cma_slots_;  // this rank's exchanges as a sender
  int64_t cma_min_bytes_ = 0;            // GRADCOMM_CMA_MIN_BYTES
  std::vector<uint64_t> cma_reads_;      // receives whose descriptor arrived, read in drive()
  uint64_t cma_reads_done_ = 0;          // for the info line at destruction
  uint64_t cma_bytes_read_ = 0;
  std::unique_ptr<LinkWatch> link_watch_;  // null: no TCP peer, or GRADCOMM_LINK_TIMEOUT_S=0
  Clock::time_point next_link_poll_{};
  bool watching_processes_ = false;  // some peer's process is watched
  Clock::time_point next_process_poll_{};
  uint64_t completed_ = 0;  // every call numbered below it has completed here (note_completed)
  uint64_t checks_ = 0;     // liveness checks this rank sent
  std::vector<std::pair<int, uint64_t>> pongs_due_;  // (peer, its check)
  bool departures_due_ = false;  // a goodbye waits for answer_liveness()
};

// Progresses until done() or the deadline; sleeps on the worker between rounds.
inline void UcxTransport::progress_until(Clock::time_point deadline, const auto& done) {
  while (!done() && Clock::now() < deadline) {
    if (!drive()) wait_for_event(std::chrono::microseconds(1000));
  }
}

}  // namespace gradcomm::detail
