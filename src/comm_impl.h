// CommunicatorImpl: owns the transport (and, on rank 0, the store server) and
// the engine that runs the calls (engine.h). The issuing side (any caller
// thread) validates a call and queues it (comm_issue.cc); the engine thread numbers
// it, checks that every rank called the same thing (op.h), runs the algorithm, and
// turns any failure into a typed error on every rank: the CallRunner (call_runner.h),
// the one place a call runs, which reads and writes the state below as the engine
// thread. The algorithms live in src/collectives/, one per file; they see only an Op,
// which sees only the CallContext of call_context.h; the engine sees only the runner.
//
// Threads. Everything below "engine thread" is touched by the thread running calls: the
// engine, or a caller running a small call inline while the engine is held off (engine.h,
// "Calls on the caller's thread"; both under Engine's drive lock). The issuing side shares
// with it only the engine's queue, the spec cache and the
// keys' numel/dtype (under issue_mutex_), and the first failure (failure_mutex_).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "auto_choice.h"
#include "call.h"
#include "call_context.h"
#include "call_runner.h"
#include "compression.h"
#include "env.h"
#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "hierarchy.h"
#include "published_stats.h"
#include "node_shm.h"
#include "op.h"
#include "state.h"
#include "topology.h"
#include "store/store.h"
#include "transport/transport.h"
#include "wire.h"

namespace gradcomm::detail {

class DevicePath;  // device_path.h
class Engine;

class CommunicatorImpl final : public CallContext {
 public:
  // `nodes`: which ranks share a node (topology.h); none given: one node holds every rank.
  // `shm`: this rank's node's shared segment (node_shm.h), or null.
  CommunicatorImpl(std::unique_ptr<Transport> transport, std::chrono::milliseconds timeout,
                   std::unique_ptr<Store> store = nullptr, std::optional<NodeMap> nodes = std::nullopt,
                   std::unique_ptr<NodeShm> shm = nullptr);
  ~CommunicatorImpl();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  const NodeMap& nodes() const override { return nodes_; }
  bool two_levels() const override { return two_levels_; }
  ScheduleMode schedule_mode() const override { return schedule_mode_; }
  NodeShm* node_shm() override { return shm_.get(); }
  bool one_segment() const override {
    return shm_ != nullptr && static_cast<int>(shm_->members().size()) == size_;
  }
  const Topology& topology() const { return topology_; }
  // Counters of the calls completed so far (a snapshot the engine publishes).
  Stats stats() const;

  // ---- issuing side: any thread -------------------------------------------------
  // `blocking` (the blocking calls of communicator.h): a call that ran to its end on this
  // thread returns null instead of a completed WorkState (its error thrown), which saves
  // a small call the WorkState; otherwise the caller waits on what it gets.
  std::shared_ptr<WorkState> allreduce_async(TensorView t, ReduceOp op, const CompressOptions& options,
                                             bool blocking = false);
  std::shared_ptr<WorkState> allgather_async(TensorView in, TensorView out);
  std::shared_ptr<WorkState> reduce_scatter_async(TensorView in, TensorView out, ReduceOp op,
                                                  const CompressOptions& options);
  std::shared_ptr<WorkState> broadcast_async(TensorView t, int root, bool blocking = false);
  std::shared_ptr<WorkState> barrier_async(bool blocking = false);
  // Variable-size allgather: rank r contributes `in` (counts[r] elements, agreed
  // by a first exchange inside); returns the per-rank counts; `out` is resized to
  // the total, rank blocks in rank order. Internal, blocking.
  std::vector<int64_t> allgatherv(const void* in, int64_t count, DType dtype, std::vector<uint8_t>& out);
  // Waits for the stream-ordered work of CUDA calls (with the deadline) and
  // raises its error; for CPU tensors there is nothing to do. Blocking.
  void synchronize();
  // "auto" | "ucx" | "nccl" (InitOptions::transport): how CUDA tensors travel,
  // decided at the first CUDA call (gpu_plan.h). Set before any call.
  void set_transport_preference(const std::string& preference);
  // "nccl" or "staging" once the first CUDA call chose; "" before (tests, logs).
  std::string cuda_path() const;
  // The last step of creation: a barrier numbered 0 (user calls count from 1).
  void connect_barrier();

  // Both run after every call issued before them; the issuing side is held off
  // meanwhile, so no call of another thread sees the state change under it.
  std::vector<uint8_t> save_state();
  void load_state(std::span<const uint8_t> bytes);  // all or nothing
  // The keys' state. Residuals belong to the engine: read one only after the
  // key's last call has completed (introspect.h).
  CompressionState& compression_state() { return state_; }
  // forget_keys (introspect.h): auto's reports of those keys go with their state.
  void forget_auto_reports(std::span<const std::string> keys) { auto_.forget(keys); }
  std::mutex& issue_mutex() { return issue_mutex_; }

  // Runs `fn` on the engine thread after every call issued before it; blocking.
  void run_local(std::function<void()> fn);
  // The engine thread's runner: inside run_local, a test may run a numbered call of its
  // own through it (CallRunner::run_numbered).
  CallRunner& runner() { return runner_; }

  // Test hook (auto_choice.h, AutoChooser::set_test_override), applied on the engine
  // after every call issued before it.
  void set_auto_test_override(double compute_scale, std::optional<LinkModel> link);

  // Communicator::plan_allreduce and sent_mask (introspect.cc).
  AllreducePlan plan_allreduce(int64_t numel, const CompressOptions& options);
  bool sent_mask(const std::string& key, TensorView mask, void* stream);

  // ---- engine thread: the CallContext of call_context.h -----------------------------
  Transport& transport() override { return *transport_; }
  Stats& mutable_stats() override { return stats_; }
  std::optional<ControlMessage>& pending_abort() override { return pending_abort_; }
  bool stopping() const override;
  std::optional<std::string> refusal() const override;
  bool refused() const override;
  void refuse_calls(const std::string& why);  // any thread: Engine::refuse
  bool waited_on() const override;
  void mark_failed(ErrorCode code, const std::string& message) override;
  bool fail_and_tell(ErrorCode code, const std::string& message, uint64_t seq) override;
  void tell_peers_destroyed(uint64_t seq) override;

  bool usable() const;  // no failure recorded yet
  // Makes the Stats of the calls completed so far visible to stats() (any thread).
  void publish_stats();

 private:
  friend class CallRunner;  // the engine thread's side: runs the calls on the state below

  void check_usable() const;
  // At destruction: a clean run waits until the live peers completed its calls too.
  void leave() noexcept;
  void check_tensor(const TensorView& t, const char* op, const char* name) const;
  // InvalidArgument unless `in` and `out` are on the same device.
  void check_one_device(const TensorView& in, const TensorView& out, const char* op) const;
  // Parses and checks the compressor of an allreduce or reduce_scatter (`what`) of
  // call.tensor, binding its key; caller holds issue_mutex_.
  void resolve_compression(Call& call, const CompressOptions& options, const char* what);
  void resolve_auto(Call& call, const CompressOptions& options, const std::string& text, const char* what);
  // An auto spec parsed once per text, its hash set (InvalidArgument as parse_auto_spec);
  // caller holds issue_mutex_.
  const AutoSpec& auto_spec(const std::string& text);
  // Queues a checked call; a CUDA tensor's device must be the communicator's (the
  // first CUDA call binds it).
  std::shared_ptr<WorkState> submit(Call&& call, const char* op, bool blocking = false);
  // CUDA tensors (device_path.h): the issuing side's device check. The runner opens
  // the path at the first CUDA call (a numbered setup call that chooses it).
  void check_cuda_device(int device, const char* op);
  // Raises an abort another rank sent, if one has arrived (GPU waits poll it).
  void watch_for_aborts();

  const int rank_, size_;
  const NodeMap nodes_;
  const Topology topology_;
  const bool two_levels_;
  const ScheduleMode schedule_mode_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Store> store_;  // rank 0 serves the TCP store for the job's lifetime
  std::chrono::milliseconds timeout_;

  // Issuing side.
  std::mutex issue_mutex_;  // compression_.spec() and the keys' numel/dtype (and map insertions)
  int cuda_device_ = -1;  // the device of the first CUDA call, under issue_mutex_
  std::string transport_preference_ = "auto";
  // By spec text; calls point at them, so each is held where it stays.
  std::map<std::string, std::unique_ptr<const AutoSpec>> auto_specs_;

  // Shared.
  mutable std::mutex failure_mutex_;
  std::optional<std::pair<ErrorCode, std::string>> failure_;
  std::atomic<bool> failed_{false};  // failure_ is set: the calls' checks read this first, lock-free
  PublishedStats published_stats_;
  bool told_peers_destroyed_ = false;  // under failure_mutex_

  // Engine thread.
  CallRunner runner_;  // numbers the calls and runs them on the state below
  Stats stats_;
  CompressionState state_;  // keys: see call.h for who touches which field
  HostCompression compression_;
  AutoChooser auto_;  // compressor=auto's choices (its report: any thread)
  std::optional<ControlMessage> pending_abort_;
  std::unique_ptr<DevicePath> device_;  // chosen at the first CUDA call
  std::unique_ptr<NodeShm> shm_;        // the node's shared segment, or null

  std::unique_ptr<Engine> engine_;  // last: stopped first, before anything it uses goes
};

}  // namespace gradcomm::detail
