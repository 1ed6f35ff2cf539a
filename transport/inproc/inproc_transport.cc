// In-process transport. One Fabric holds a Mailbox per destination rank; a
// send and a receive with the same (source, destination, tag) match in posting
// order, and whichever of the two arrives second copies the bytes, under the
// destination mailbox's lock. A cancelled request takes the same lock to unlink
// itself, so a copy never races with a request's destruction.
//
// Request states change only in progress() of the owning rank (the contract of
// transport.h): the matching thread fills a shared Completion, and the owner's
// progress() publishes it into the Request.
#include "transport/inproc/inproc_transport.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <unordered_set>

namespace gradcomm::detail {
namespace {

// Filled by whichever thread completes a request; read by the owner's progress().
struct Completion {
  std::atomic<bool> done{false};
  RequestState state = RequestState::kDone;
  size_t bytes = 0;
};

// Wakes one rank's thread from wait_for_event().
struct Signal {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t events = 0;

  void notify() {
    {
      std::lock_guard lock(mutex);
      ++events;
    }
    cv.notify_all();
  }
};

struct PendingSend {
  int source;
  uint64_t tag;
  const void* data;
  size_t bytes;
  std::shared_ptr<Completion> completion;
};
struct PendingRecv {
  int source;
  uint64_t tag;
  void* data;
  size_t capacity;
  std::shared_ptr<Completion> completion;
};

struct Mailbox {
  std::mutex mutex;
  std::list<PendingSend> sends;  // unmatched, in posting order
  std::list<PendingRecv> recvs;  // unmatched, in posting order
  std::deque<ControlMessage> aborts;
};

struct Fabric {
  explicit Fabric(int n) : mailboxes(n), signals(n) {}
  std::vector<Mailbox> mailboxes;
  std::vector<Signal> signals;
};

// Copies a matched pair and completes both. Caller holds the destination's lock.
void deliver(Fabric& fabric, int destination, const PendingSend& send, const PendingRecv& recv) {
  if (send.bytes > recv.capacity) {
    recv.completion->state = RequestState::kTruncated;
    recv.completion->bytes = send.bytes;
  } else {
    if (send.bytes > 0) std::memcpy(recv.data, send.data, send.bytes);
    recv.completion->state = RequestState::kDone;
    recv.completion->bytes = send.bytes;
  }
  send.completion->state = RequestState::kDone;
  send.completion->bytes = send.bytes;
  recv.completion->done.store(true, std::memory_order_release);
  send.completion->done.store(true, std::memory_order_release);
  fabric.signals[destination].notify();
  fabric.signals[send.source].notify();
}

class InprocTransport;

class InprocRequest final : public Request {
 public:
  InprocRequest(InprocTransport* owner, int peer, size_t bytes, bool is_send, int mailbox,
                std::shared_ptr<Completion> completion)
      : Request(peer, bytes), owner_(owner), is_send_(is_send), mailbox_(mailbox), completion_(std::move(completion)) {}
  ~InprocRequest() override;

  // Publishes a completion the matching thread recorded; true when it did.
  bool sync() {
    if (!pending() || !completion_->done.load(std::memory_order_acquire)) return false;
    if (completion_->state == RequestState::kDone) {
      complete(completion_->bytes);
    } else {
      fail(completion_->state, "message of " + std::to_string(completion_->bytes) +
                                   " bytes is longer than the receive buffer of " + std::to_string(bytes()));
    }
    return true;
  }

 private:
  friend class InprocTransport;
  InprocTransport* owner_;
  bool is_send_;
  int mailbox_;  // the destination mailbox the request is queued in
  std::shared_ptr<Completion> completion_;
};

class InprocTransport final : public Transport {
 public:
  InprocTransport(std::shared_ptr<Fabric> fabric, int rank) : fabric_(std::move(fabric)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(fabric_->mailboxes.size()); }
  const char* name() const override { return "inproc"; }

  RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    auto completion = std::make_shared<Completion>();
    auto request = std::make_unique<InprocRequest>(this, peer, bytes, true, peer, completion);
    Mailbox& box = fabric_->mailboxes.at(peer);
    {
      std::lock_guard lock(box.mutex);
      PendingSend send{rank_, tag, data, bytes, completion};
      auto match = std::find_if(box.recvs.begin(), box.recvs.end(),
                                [&](const PendingRecv& r) { return r.source == rank_ && r.tag == tag; });
      if (match != box.recvs.end()) {
        deliver(*fabric_, peer, send, *match);
        box.recvs.erase(match);
      } else {
        box.sends.push_back(std::move(send));
      }
    }
    outstanding_.insert(request.get());
    return request;
  }

  RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    auto completion = std::make_shared<Completion>();
    auto request = std::make_unique<InprocRequest>(this, peer, bytes, false, rank_, completion);
    Mailbox& box = fabric_->mailboxes[rank_];
    {
      std::lock_guard lock(box.mutex);
      PendingRecv recv{peer, tag, data, bytes, completion};
      auto match = std::find_if(box.sends.begin(), box.sends.end(),
                                [&](const PendingSend& s) { return s.source == peer && s.tag == tag; });
      if (match != box.sends.end()) {
        deliver(*fabric_, rank_, *match, recv);
        box.sends.erase(match);
      } else {
        box.recvs.push_back(std::move(recv));
      }
    }
    outstanding_.insert(request.get());
    return request;
  }

  bool progress() override {
    {
      std::lock_guard lock(signal().mutex);
      seen_events_ = signal().events;
    }
    bool any = false;
    for (auto it = outstanding_.begin(); it != outstanding_.end();) {
      auto* request = *it;
      if (request->sync()) any = true;
      it = request->pending() ? std::next(it) : outstanding_.erase(it);
    }
    return any;
  }

  void wait_for_event(std::chrono::microseconds max_wait) override {
    std::unique_lock lock(signal().mutex);
    signal().cv.wait_for(lock, max_wait, [&] { return signal().events != seen_events_; });
  }

  void interrupt() override { signal().notify(); }

  void send_abort(const ControlMessage& message) override {
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank_) continue;
      Mailbox& box = fabric_->mailboxes[peer];
      {
        std::lock_guard lock(box.mutex);
        box.aborts.push_back(message);
      }
      fabric_->signals[peer].notify();
    }
  }

  std::optional<ControlMessage> poll_abort() override {
    Mailbox& box = fabric_->mailboxes[rank_];
    std::lock_guard lock(box.mutex);
    if (box.aborts.empty()) return std::nullopt;
    ControlMessage message = std::move(box.aborts.front());
    box.aborts.pop_front();
    return message;
  }

  // Request destructors never block here: there is nothing to drop early.
  void abandon_pending(std::chrono::milliseconds) override {}

  // Unlinks a request still queued in a mailbox, so nothing copies into or out of
  // its buffer once it is gone.
  void cancel(InprocRequest* request) {
    outstanding_.erase(request);
    if (request->completion_->done.load(std::memory_order_acquire)) return;
    Mailbox& box = fabric_->mailboxes[request->mailbox_];
    std::lock_guard lock(box.mutex);
    auto same = [&](const auto& entry) { return entry.completion == request->completion_; };
    if (request->is_send_) {
      box.sends.remove_if(same);
    } else {
      box.recvs.remove_if(same);
    }
  }

 private:
  Signal& signal() { return fabric_->signals[rank_]; }

  std::shared_ptr<Fabric> fabric_;
  int rank_;
  uint64_t seen_events_ = 0;
  std::unordered_set<InprocRequest*> outstanding_;
};

InprocRequest::~InprocRequest() { owner_->cancel(this); }

}  // namespace

std::vector<std::unique_ptr<Transport>> create_inproc_transports(int world_size) {
  auto fabric = std::make_shared<Fabric>(world_size);
  std::vector<std::unique_ptr<Transport>> transports;
  for (int r = 0; r < world_size; ++r) transports.push_back(std::make_unique<InprocTransport>(fabric, r));
  return transports;
}

}  // namespace gradcomm::detail
