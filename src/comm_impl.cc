// CommunicatorImpl's own state (comm_impl.h): construction and teardown, the published
// Stats, and the failure state every call checks and reports to (the CallContext side
// that is neither issuing nor running calls). The issuing side is comm_issue.cc; the
// engine thread runs the calls through the CallRunner (call_runner.h).
#include "comm_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "compressors/auto_spec.h"
#include "device_path.h"
#include "engine.h"
#include "fusion.h"
#include "hierarchy.h"
#include "logging.h"
#include "node_shm.h"

namespace gradcomm::detail {

CommunicatorImpl::CommunicatorImpl(std::unique_ptr<Transport> transport, std::chrono::milliseconds timeout,
                                   std::unique_ptr<Store> store, std::optional<NodeMap> nodes,
                                   std::unique_ptr<NodeShm> shm)
    : rank_(transport->rank()),
      size_(transport->size()),
      nodes_(nodes ? std::move(*nodes) : NodeMap::single(transport->size())),
      topology_([&] {
        Topology t = nodes_.view(rank_);
        t.node_shm = shm != nullptr;
        return t;
      }()),
      two_levels_(use_two_levels(nodes_)),
      schedule_mode_(schedule_mode_from_env()),
      transport_(std::move(transport)),
      store_(std::move(store)),
      timeout_(timeout),
      runner_(*this),
      shm_(std::move(shm)) {
  if (nodes_.size() != size_) {
    throw InvalidArgument(fmt::format("rank {}: a topology of {} ranks for a communicator of {}", rank_,
                                      nodes_.size(), size_));
  }
  // Last: from here on the engine thread alone drives the transport.
  engine_ = std::make_unique<Engine>(runner_, FusionConfig::from_env());
}

// The engine first (it fails outstanding work and stops touching everything
// else); then the GPU side (its NCCL communicator finalizes on its own); then, after a
// clean run, the departure (leave); then the transport, whose teardown may still need
// the store's peers, never the reverse.
CommunicatorImpl::~CommunicatorImpl() {
  engine_->stop();
  engine_.reset();
  device_.reset();
  leave();
  transport_.reset();
  store_.reset();
}

// A call that completed here may not have completed everywhere: the last sends of a
// rank's last call can still be on their way when its caller returns (issue 42: at
// 1 Mbit/s a rank that exited took the end of a 4 MB allreduce with it, and its peer
// failed). So a communicator without a failure waits, up to its timeout, until every
// live peer has completed the same calls (transport.h, leave). After a failure there is
// nothing to deliver: the others were told, and destruction does not wait on them.
void CommunicatorImpl::leave() noexcept {
  if (!usable()) return;
  try {
    const auto start = Clock::now();
    const std::vector<int> waiting = transport_->leave(runner_.next_seq(), start + timeout_);
    if (!waiting.empty()) {
      std::string ranks;
      for (int r : waiting) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", r);
      log(LogLevel::kWarn,
          "rank {}: destroyed after call #{} without word from rank(s) {} within the {:.1f} s timeout that they "
          "completed it too: they may not have received all of this rank's data",
          rank_, runner_.next_seq() - 1, ranks, std::chrono::duration<double>(timeout_).count());
    }
  } catch (...) {
    // A destructor's part: the transport's own teardown still runs.
  }
}

Stats CommunicatorImpl::stats() const {
  Stats s = published_stats_.read();
  if (engine_) s.engine_cpu_s = engine_->cpu_seconds();
  s.auto_choices = auto_.report();
  return s;
}

void CommunicatorImpl::publish_stats() { published_stats_.publish(stats_); }

bool CommunicatorImpl::stopping() const { return engine_ && engine_->stopping(); }

void CommunicatorImpl::mark_failed(ErrorCode code, const std::string& message) {
  {
    std::lock_guard lock(failure_mutex_);
    if (!failure_) failure_.emplace(code, message);
    failed_.store(true, std::memory_order_release);
  }
  // NCCL kernels of this or earlier calls may wait on a peer that will never
  // come: aborting the NCCL communicator releases them.
  if (device_) device_->abort();
}

bool CommunicatorImpl::fail_and_tell(ErrorCode code, const std::string& message, uint64_t seq) {
  {
    std::lock_guard lock(failure_mutex_);
    if (failure_) return false;
  }
  mark_failed(code, message);
  transport_->send_abort(ControlMessage{code, rank_, seq, message.substr(0, ControlMessage::kMaxText)});
  transport_->abandon_pending(kAbandonGrace);
  return true;
}

void CommunicatorImpl::refuse_calls(const std::string& why) {
  if (engine_) engine_->refuse(why);
}

std::optional<std::string> CommunicatorImpl::refusal() const {
  if (!engine_) return std::nullopt;
  return engine_->refusal();
}

bool CommunicatorImpl::refused() const { return engine_ && engine_->refused(); }

void CommunicatorImpl::tell_peers_destroyed(uint64_t seq) {
  {
    std::lock_guard lock(failure_mutex_);
    if (told_peers_destroyed_) return;
    told_peers_destroyed_ = true;
  }
  const std::string text = fmt::format("rank {} destroyed its communicator with call #{} outstanding", rank_, seq);
  transport_->send_abort(ControlMessage{ErrorCode::kPeerFailure, rank_, seq, text});
  transport_->abandon_pending(kAbandonGrace);
}

void CommunicatorImpl::set_transport_preference(const std::string& preference) {
  if (preference != "auto" && preference != "ucx" && preference != "nccl") {
    throw InvalidArgument(fmt::format("rank {}: transport '{}' unknown; accepted: auto, ucx, nccl", rank(), preference));
  }
  transport_preference_ = preference;
}

std::string CommunicatorImpl::cuda_path() const {
  return device_ ? device_->name() : "";
}

void CommunicatorImpl::watch_for_aborts() {
  transport_->progress();
  while (auto incoming = transport_->poll_abort()) {
    if (!pending_abort_) pending_abort_ = std::move(*incoming);
  }
  if (pending_abort_) {
    throw_error(pending_abort_->code, fmt::format("rank {}: GPU work abandoned: rank {} reported: {}", rank(),
                                                  pending_abort_->origin, pending_abort_->text));
  }
  if (stopping()) {
    throw InvalidArgument(fmt::format("rank {}: GPU work abandoned: the communicator was destroyed with a call "
                                      "outstanding",
                                      rank()));
  }
}

bool CommunicatorImpl::usable() const {
  if (!failed_.load(std::memory_order_acquire)) return true;
  std::lock_guard lock(failure_mutex_);
  return !failure_;
}

void CommunicatorImpl::check_usable() const {
  if (!failed_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(failure_mutex_);
  if (failure_) {
    throw_error(failure_->first, fmt::format("rank {}: communicator unusable after an earlier failure: {}", rank(),
                                             failure_->second));
  }
}

bool CommunicatorImpl::waited_on() const { return engine_ != nullptr && engine_->waited_on(); }

}  // namespace gradcomm::detail
