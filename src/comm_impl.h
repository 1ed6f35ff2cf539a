// CommunicatorImpl: owns the transport (and, on rank 0, the store server) and
// the engine that runs the calls (engine.h). The issuing side (any caller
// thread) validates a call and queues it; the engine thread numbers it, checks
// that every rank called the same thing (op.h), runs the algorithm, and turns any
// failure into a typed error on every rank. The algorithms live in
// src/collectives/, one per file; they see only an Op.
//
// Threads. Everything below "engine thread" is touched by the engine alone; the
// issuing side shares with it only the engine's queue, the spec cache and the
// keys' numel/dtype (under issue_mutex_), and the first failure (failure_mutex_).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "call.h"
#include "compression.h"
#include "env.h"
#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "op.h"
#include "state.h"
#include "store/store.h"
#include "transport/transport.h"
#include "wire.h"

namespace gradcomm::detail {

class DevicePath;  // device_path.h
class Engine;

// After a failure, how long outstanding sends (the abort to the others among them)
// may take before the transport drops them.
inline constexpr auto kAbandonGrace = std::chrono::milliseconds(300);

class CommunicatorImpl {
 public:
  CommunicatorImpl(std::unique_ptr<Transport> transport, std::chrono::milliseconds timeout,
                   std::unique_ptr<Store> store = nullptr);
  ~CommunicatorImpl();

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Counters of the calls completed so far (a snapshot the engine publishes).
  Stats stats() const;

  // ---- issuing side: any thread -------------------------------------------------
  std::shared_ptr<WorkState> allreduce_async(TensorView t, ReduceOp op, const CompressOptions& options);
  std::shared_ptr<WorkState> allgather_async(TensorView in, TensorView out);
  std::shared_ptr<WorkState> reduce_scatter_async(TensorView in, TensorView out, ReduceOp op,
                                                  const CompressOptions& options);
  std::shared_ptr<WorkState> broadcast_async(TensorView t, int root);
  std::shared_ptr<WorkState> barrier_async();
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
  std::mutex& issue_mutex() { return issue_mutex_; }

  // Runs `fn` on the engine thread after every call issued before it; blocking.
  void run_local(std::function<void()> fn);

  // ---- engine thread -------------------------------------------------------------
  Transport& transport() { return *transport_; }
  Stats& mutable_stats() { return stats_; }
  void publish_stats();
  // Aborts other ranks sent: the first is kept until the call it names (or an
  // earlier call that cannot complete without that rank) raises it.
  std::optional<ControlMessage>& pending_abort() { return pending_abort_; }
  bool stopping() const;
  bool usable() const;  // no failure recorded yet
  uint64_t next_seq() const { return next_seq_; }

  // The header a call puts on the wire, numbered `seq` (reads the key's step).
  WireHeader header_for(const Call& call, uint64_t seq) const;
  // Runs `body` inside an Op numbered `header.seq` (a deferred Op posts its
  // header itself); `body` returns how many calls it ran (a fused group: several;
  // unnumbered: 0). Then accounts them: sequence numbers, Stats::ops and time; on
  // failure marks the communicator failed and tells the others, and rethrows.
  void run_op(const WireHeader& header, Op::HeaderMode mode, const std::function<size_t(Op&)>& body);
  // The algorithm of one call inside its Op (after the header matched), and its
  // key's step.
  void run_body(Op& op, Call& call);
  // Runs one queued call alone: a collective in its own Op, or a local function.
  void execute(Call& call);
  CompressionEngine& compression() { return compression_; }
  // A caller is blocked waiting on a call: the engine's waits poll before sleeping (src/spin.h).
  bool waited_on() const;
  // Communicator::plan_allreduce and sent_mask (introspect.cc).
  AllreducePlan plan_allreduce(int64_t numel, const CompressOptions& options);
  bool sent_mask(const std::string& key, TensorView mask, void* stream);

  // Records the first failure; every later call raises it again (thread-safe).
  void mark_failed(ErrorCode code, const std::string& message);
  // Engine thread: the first failure also goes to every other rank (as an abort
  // naming call `seq`), and what is pending with them is abandoned. Later ones
  // only raise. Returns whether this was the first.
  bool fail_and_tell(ErrorCode code, const std::string& message, uint64_t seq);
  // A call was refused because threads issued concurrently (Engine::submit): every
  // running and queued call fails with this, on every rank.
  std::optional<std::string> refusal() const;
  // Tells the other ranks this one is going away with call `seq` outstanding (once).
  void tell_peers_destroyed(uint64_t seq);

 private:
  void check_usable() const;
  void check_tensor(const TensorView& t, const char* op, const char* name) const;
  // InvalidArgument unless `in` and `out` are on the same device.
  void check_one_device(const TensorView& in, const TensorView& out, const char* op) const;
  // Parses and checks the compressor of an allreduce or reduce_scatter (`what`) of
  // call.tensor, binding its key; caller holds issue_mutex_.
  void resolve_compression(Call& call, const CompressOptions& options, const char* what);
  // Queues a checked call; a CUDA tensor's device must be the communicator's (the
  // first CUDA call binds it).
  std::shared_ptr<WorkState> submit(Call call, const char* op);
  // CUDA tensors (device_path.h). open_device runs the numbered setup call at a
  // communicator's first CUDA call (every rank's first CUDA call must be the same
  // call), which chooses the path; the calls then run on it inside their Op.
  void open_device(int device);
  void check_cuda_device(int device, const char* op);
  // Raises an abort another rank sent, if one has arrived (GPU waits poll it).
  void watch_for_aborts();

  const int rank_, size_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Store> store_;  // rank 0 serves the TCP store for the job's lifetime
  std::chrono::milliseconds timeout_;

  // Issuing side.
  std::mutex issue_mutex_;  // compression_.spec() and the keys' numel/dtype (and map insertions)
  int cuda_device_ = -1;  // the device of the first CUDA call, under issue_mutex_
  std::string transport_preference_ = "auto";

  // Shared.
  mutable std::mutex failure_mutex_;
  std::optional<std::pair<ErrorCode, std::string>> failure_;
  mutable std::mutex stats_mutex_;
  Stats published_stats_;
  bool told_peers_destroyed_ = false;  // under failure_mutex_

  // Engine thread.
  uint64_t next_seq_ = 1;
  Stats stats_;
  CompressionState state_;  // keys: see call.h for who touches which field
  CompressionEngine compression_;
  std::optional<ControlMessage> pending_abort_;
  std::unique_ptr<DevicePath> device_;  // chosen at the first CUDA call

  std::unique_ptr<Engine> engine_;  // last: stopped first, before anything it uses goes
};

}  // namespace gradcomm::detail
