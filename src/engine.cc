#include "engine.h"

#include <fmt/format.h>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "call_context.h"
#include "compressors/spec.h"
#include "logging.h"
#include "spin.h"

namespace gradcomm::detail {

namespace {
// Longest sleep with nothing to do: the transport's own wake-ups (I/O, keepalive)
// and interrupt() end it sooner.
constexpr auto kIdleSleep = std::chrono::milliseconds(100);
// The queue the engine looks at for a group: one more than a group may hold.
constexpr size_t kViewCalls = 1025;
// On a one-segment communicator the engine sleeps on its condition variable and looks at
// the transport (aborts, liveness probes) this often while idle; a running call polls it
// itself.
constexpr auto kSegmentIdlePoll = std::chrono::milliseconds(2);
}  // namespace

int64_t Engine::inline_bytes() {
  static const int64_t bytes = env_bytes("GRADCOMM_SHM_INLINE_BYTES", int64_t{64} << 10, 0, int64_t{1} << 30);
  return bytes;
}

Engine::Engine(CallRunner& runner, FusionConfig fusion)
    : runner_(runner),
      comm_(runner.context()),
      fusion_(fusion),
      doorbell_(std::make_shared<Doorbell>()),
      one_segment_(comm_.one_segment()),
      inline_limit_(one_segment_ ? inline_bytes() : 0) {  // a bad value fails creation
  doorbell_->attach(this);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gradcomm-engine");  // what top, perf and gdb show
    loop();
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    final_cpu_ns_.store(int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec, std::memory_order_release);
  });
  if (pthread_getcpuclockid(thread_.native_handle(), &cpu_clock_) != 0) cpu_clock_ = CLOCK_THREAD_CPUTIME_ID;
}

double Engine::cpu_seconds() const {
  timespec ts{};
  // Read the clock only while the thread lives (it reads EINVAL, or worse, once the id
  // is reused); after it ended, the figure it left.
  if (final_cpu_ns_.load(std::memory_order_acquire) < 0 && cpu_clock_ != CLOCK_THREAD_CPUTIME_ID &&
      clock_gettime(cpu_clock_, &ts) == 0 && final_cpu_ns_.load(std::memory_order_acquire) < 0) {
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  const int64_t final_ns = final_cpu_ns_.load(std::memory_order_acquire);
  return final_ns < 0 ? 0.0 : static_cast<double>(final_ns) * 1e-9;
}

Engine::~Engine() { stop(); }

int this_thread_issuer() {
  thread_local const int tid = static_cast<int>(gettid());  // a system call: once per thread
  return tid;
}

int& issuer_override() {
  thread_local int issuer = 0;
  return issuer;
}

void Engine::refuse(const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    if (!refused_.load(std::memory_order_relaxed)) {
      refusal_ = why;
      refused_.store(true, std::memory_order_release);
    }
    ++generation_;
  }
  wake();
}

void Engine::wake() {
  comm_.transport().interrupt();
  cv_.notify_all();
}

bool Engine::may_run_inline(const Call& call) const {
  if (inline_limit_ == 0 || comm_.size() < 2) return false;
  switch (call.kind) {
    case Call::Kind::kBarrier:
      return true;
    case Call::Kind::kBroadcast:
      return call.tensor.device.type == DeviceType::kCpu && call.tensor.nbytes() <= inline_limit_;
    case Call::Kind::kAllreduce:
      return call.tensor.device.type == DeviceType::kCpu && call.tensor.nbytes() <= inline_limit_ &&
             call.key == nullptr && call.auto_spec == nullptr &&
             (call.spec == nullptr || call.spec->id == CompressorId::kNone);
    default:
      return false;
  }
}

void Engine::run_inline(Call& call) {
  CallRunner::Ran ran;
  {
    std::lock_guard drive(drive_);
    ran = runner_.run_one(call);
    comm_.mutable_stats().inline_ops += 1;
    runner_.publish_stats();  // before the caller returns, as finish() before a work completes
  }
  {
    // The engine sleeps on cv_ (one segment), never on the transport. Notified under the
    // lock: stop() may destroy the engine as soon as it sees inline_ cleared.
    std::lock_guard lock(mutex_);
    inline_ = false;
    if (issuer_outstanding_ > 0) --issuer_outstanding_;
    // Only when there is something to do: calls queued meanwhile (other threads' local
    // calls) may start, or stop() waits. Waking the engine after every call would take
    // the core from the callers (the very hand-over this path saves).
    if (!queue_.empty() || stop_) {
      ++generation_;
      cv_.notify_all();
    }
  }
  if (ran.error) std::rethrow_exception(ran.error);
}

bool Engine::try_run_blocking(Call& call) {
  {
    std::lock_guard lock(mutex_);
    if (stop_ || refused_.load(std::memory_order_relaxed) || !queue_.empty() || inline_ ||
        concurrent_issue_locked(call)) {
      return false;  // the full path says why, or queues it
    }
    next_ticket_++;
    issuer_ = call.issuer;
    ++issuer_outstanding_;
    inline_ = true;
  }
  run_inline(call);
  return true;
}

std::shared_ptr<WorkState> Engine::submit(Call&& call, bool blocking) {
  if (blocking && may_run_inline(call)) {
    call.issuer = issuer_override() != 0 ? issuer_override() : this_thread_issuer();
    if (try_run_blocking(call)) return nullptr;
  }
  auto work = std::make_shared<WorkState>();
  work->doorbell = doorbell_;
  call.work = work;
  call.issued = Clock::now();
  call.issuer = issuer_override() != 0 ? issuer_override() : this_thread_issuer();
  std::optional<std::string> refused;
  {
    std::lock_guard lock(mutex_);
    if (stop_) {
      throw InvalidArgument(fmt::format("rank {}: the communicator is being destroyed; no new calls", comm_.rank()));
    }
    refused = concurrent_issue_locked(call);
    if (refused) {
      if (!refused_.load(std::memory_order_relaxed)) {
        refusal_ = *refused;
        refused_.store(true, std::memory_order_release);
      }
      ++generation_;  // the engine aborts the communicator (step) or the running call (Op::spin)
    } else {
      work->ticket = next_ticket_++;
      if (call.kind != Call::Kind::kLocal) {
        issuer_ = call.issuer;
        ++issuer_outstanding_;
      }
      queue_.push_back(std::move(call));
      ++generation_;
    }
  }
  wake();
  if (refused) throw InvalidArgument(fmt::format("rank {}: {}", comm_.rank(), *refused));
  return work;
}

std::optional<std::string> Engine::concurrent_issue_locked(const Call& call) const {
  if (call.kind == Call::Kind::kLocal || issuer_outstanding_ == 0 || call.issuer == issuer_) return std::nullopt;
  const char* what = call.kind == Call::Kind::kAllreduce   ? "allreduce"
                     : call.kind == Call::Kind::kAllgather ? "allgather"
                     : call.kind == Call::Kind::kBroadcast ? "broadcast"
                     : call.kind == Call::Kind::kReduceScatter ? "reduce_scatter"
                                                           : "barrier";
  return fmt::format("{} issued on thread {} while {} call(s) that thread {} issued are outstanding: ranks pair calls "
                     "by issue order, and threads issuing concurrently make that order differ between ranks (calls "
                     "of one shape would pair across threads, with wrong results). Wait on one thread's calls before "
                     "another thread issues, or issue every call from one thread. The call is refused and the "
                     "communicator aborted on every rank",
                     what, call.issuer, issuer_outstanding_, issuer_);
}

std::optional<std::string> Engine::refusal() const {
  if (!refused_.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(mutex_);
  return refusal_;
}

Call Engine::pop_front_locked() {
  Call call = std::move(queue_.front());
  queue_.pop_front();
  if (call.kind != Call::Kind::kLocal && issuer_outstanding_ > 0) --issuer_outstanding_;
  return call;
}

void Engine::ring(uint64_t ticket) {
  {
    std::lock_guard lock(mutex_);
    if (ticket <= flush_ticket_) return;
    flush_ticket_ = ticket;
    ++generation_;
  }
  wake();
}

void Engine::stop() {
  doorbell_->detach();  // no caller reaches this engine through a Work from now on
  {
    std::lock_guard lock(mutex_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    ++generation_;
  }
  stopping_.store(true, std::memory_order_relaxed);
  wake();
  if (thread_.joinable()) thread_.join();
  // A call another thread runs inline sees stopping() at its next check and fails: wait
  // for it, since it uses what the communicator is about to destroy.
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !inline_; });
}

std::vector<Call*> Engine::head(size_t max) {
  std::vector<Call*> view;
  std::lock_guard lock(mutex_);
  for (auto it = queue_.begin(); it != queue_.end() && view.size() < max; ++it) view.push_back(&*it);
  return view;
}

size_t Engine::queued() {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

void Engine::idle(Clock::time_point until, uint64_t seen_generation) {
  Transport& transport = comm_.transport();
  {
    // A caller's inline call holds it: that call polls the transport itself.
    std::unique_lock drive(drive_, std::try_to_lock);
    if (drive.owns_lock()) {
      transport.progress();
      auto& abort = comm_.pending_abort();
      while (auto incoming = transport.poll_abort()) {
        if (!abort) abort = std::move(*incoming);  // raised by the call it names, when it runs
      }
    }
  }
  {
    std::lock_guard lock(mutex_);
    if (generation_ != seen_generation) return;  // new work, a doorbell or stop since the loop looked
  }
  const auto now = Clock::now();
  if (until <= now) return;
  if (now - last_finish_ < spin_before_sleep()) {
    // A call a caller waited on just ended: the next is often close behind
    // (src/spin.h). The loop comes back here after looking at the queue.
    sched_yield();
    return;
  }
  if (one_segment_) {
    // Not on the transport: a caller running a call inline may use it meanwhile, and
    // must never wait for this thread to wake (engine.h).
    std::unique_lock lock(mutex_);
    cv_.wait_until(lock, std::min<Clock::time_point>(until, now + kSegmentIdlePoll),
                   [&] { return generation_ != seen_generation; });
    return;
  }
  const auto wait = std::min<Clock::duration>(until - now, kIdleSleep);
  transport.wait_for_event(std::chrono::duration_cast<std::chrono::microseconds>(wait) +
                           std::chrono::microseconds(1));
}

void Engine::finish(size_t n, std::exception_ptr error) {
  // A caller waited on it: the next call of a loop of blocking calls is close behind.
  if (doorbell_->waited_on()) last_finish_ = Clock::now();
  runner_.publish_stats();  // before the works complete: a waiter then sees its call counted
  std::vector<std::shared_ptr<WorkState>> works;
  {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < n && !queue_.empty(); ++i) works.push_back(std::move(pop_front_locked().work));
  }
  for (auto& work : works) work->complete(error);
}

uint32_t Engine::can_take(uint32_t planned, const FusionClass& cls, uint64_t first_ticket) {
  const std::vector<Call*> queued = head(planned);
  const size_t n = fusable_prefix(queued, cls, fusion_.bytes);
  if (n == planned || n < queued.size()) return static_cast<uint32_t>(n);  // all here, or the group ends before a call
  std::lock_guard lock(mutex_);
  // A caller waits on a call of the group (or later): a caller that waits issues
  // nothing more meanwhile, so what is queued is all this rank can take.
  return flush_ticket_ >= first_ticket ? static_cast<uint32_t>(n) : 0;
}

void Engine::fail_queued() {
  std::lock_guard drive(drive_);  // after a caller's inline call (it fails too: stopping)
  std::deque<Call> left;
  {
    std::lock_guard lock(mutex_);
    left.swap(queue_);
    issuer_outstanding_ = 0;
  }
  if (left.empty()) return;
  const bool collective = std::any_of(left.begin(), left.end(), [](const Call& c) { return c.kind != Call::Kind::kLocal; });
  if (collective) comm_.tell_peers_destroyed(runner_.next_seq());
  const auto error = std::make_exception_ptr(InvalidArgument(
      fmt::format("rank {}: the communicator was destroyed with this call outstanding (not yet started; call #{} "
                  "or later); wait() on every call before destroying it",
                  comm_.rank(), runner_.next_seq())));
  runner_.publish_stats();
  for (Call& call : left) call.work->complete(error);
}

void Engine::loop() {
  while (true) {
    uint64_t generation = 0, flush = 0;
    {
      std::lock_guard lock(mutex_);
      if (stop_) break;
      generation = generation_;
      flush = flush_ticket_;
    }
    try {
      step(generation, flush);
    } catch (...) {
      // Nothing in step() throws by design (calls catch their own errors); should
      // something still escape, the head call fails with it rather than the thread.
      finish(1, std::current_exception());
    }
  }
  fail_queued();
}

void Engine::step(uint64_t generation, uint64_t flush) {
  bool inline_running = false;
  {
    std::lock_guard lock(mutex_);
    inline_running = inline_;
  }
  if (inline_running) {  // a caller's call runs inline: nothing starts until it ends
    idle(Clock::now() + kIdleSleep, generation);
    return;
  }
  // Held while this turn uses the runner or the transport, released before idle() (which
  // takes it itself). No caller's call can start inline meanwhile either way: a queued
  // call keeps the queue from being empty.
  std::unique_lock drive(drive_);
  if (auto refused = refusal(); refused && runner_.usable()) {
    // A call was refused (submit): nothing this rank issued from here on can be
    // paired safely. Every rank learns it, and every call queued here fails with it.
    comm_.fail_and_tell(ErrorCode::kInvalidArgument, fmt::format("rank {}: {}", comm_.rank(), *refused),
                        runner_.next_seq());
  }
  const std::vector<Call*> view = head(kViewCalls);
  if (view.empty()) {
    drive.unlock();
    idle(Clock::now() + kIdleSleep, generation);
    return;
  }
  Call& call = *view.front();
  std::optional<FusionClass> cls;
  if (call.kind != Call::Kind::kLocal && comm_.size() > 1 && fusion_.bytes > 0 && runner_.usable()) {
    cls = fusion_class(call, fusion_.bytes);
    // On one segment a dense call costs a round of flags, not messages: fusing saves
    // nothing, and unfused the same call may run inline on one rank and here on another.
    if (cls && !cls->compressed && one_segment_) cls.reset();
  }
  if (!cls) {
    const CallRunner::Ran ran = runner_.run_one(call);
    finish(ran.calls, ran.error);
    return;
  }
  if (comm_.rank() == 0) {
    // Rank 0 closes the group: the next call cannot join, the group is full, a
    // caller waits on it, or its cycle is over. Until then more calls may come.
    const size_t n = fusable_prefix(view, *cls, fusion_.bytes);
    const Clock::time_point deadline = call.issued + fusion_.cycle;
    const bool closed =
        n < view.size() || n + 1 >= kViewCalls || flush >= call.work->ticket || Clock::now() >= deadline;
    if (!closed) {
      drive.unlock();
      idle(deadline, generation);
      return;
    }
  }
  const CallRunner::Ran ran = runner_.run_group(view, *cls, fusion_.bytes, *this);
  finish(ran.calls, ran.error);
}

// ---- Doorbell, WorkState ----------------------------------------------------------------

void Doorbell::attach(Engine* engine) {
  std::lock_guard lock(mutex_);
  engine_ = engine;
}

void Doorbell::detach() {
  std::lock_guard lock(mutex_);
  engine_ = nullptr;
}

void Doorbell::ring(uint64_t ticket) {
  std::lock_guard lock(mutex_);
  if (engine_ != nullptr) engine_->ring(ticket);
}

void WorkState::complete(std::exception_ptr e) {
  {
    std::lock_guard lock(mutex);
    done = true;
    error = std::move(e);
  }
  cv.notify_all();
}

}  // namespace gradcomm::detail
