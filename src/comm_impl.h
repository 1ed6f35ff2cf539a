// CommunicatorImpl: owns the transport (and, on rank 0, the store server), numbers
// the collective calls, checks that every rank called the same one, and turns any
// failure into a typed error on every rank. The algorithms themselves live in
// src/collectives/, one per file; they see only an Op.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compression.h"
#include "env.h"
#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "state.h"
#include "store/store.h"
#include "transport/transport.h"
#include "wire.h"

namespace gradcomm::detail {

class CommunicatorImpl;
class GpuContext;  // gpu_context.h (CUDA builds only)

// One collective call in flight: its header, deadline and the wait loop. Every
// blocking wait of an algorithm goes through wait(), which drives the transport,
// watches the control channel for aborts, enforces the deadline and turns a
// failed request into an error naming the peer, the call and the step.
class Op {
 public:
  Op(CommunicatorImpl& comm, const WireHeader& header);
  ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const WireHeader& header() const { return header_; }

  // Data messages of this call; `unit` tells messages of one call apart (pipeline
  // step and chunk). Byte counts go to Stats.
  RequestPtr send(int peer, uint32_t unit, const void* data, size_t bytes);
  RequestPtr recv(int peer, uint32_t unit, void* data, size_t bytes);

  // Blocks until `request` completes; a receive must deliver exactly the bytes
  // posted (anything else is CorruptPayload). `what` names the step for errors.
  void wait(Request& request, const char* what);
  void wait_all(std::vector<RequestPtr>& requests, const char* what);

  // Wire traffic that did not go through send()/recv() (NCCL groups), for Stats.
  void count_wire(uint64_t sent, uint64_t received, uint64_t messages);

  // Adds the scope's wall time to one phase of Stats: &Stats::reduce_s,
  // &Stats::encode_s or &Stats::decode_s.
  class PhaseTimer {
   public:
    PhaseTimer(Op& op, double Stats::*phase) : op_(op), phase_(phase), start_(Clock::now()) {}
    ~PhaseTimer();
   private:
    Op& op_;
    double Stats::*phase_;
    Clock::time_point start_;
  };

  // Checks the left neighbour's header (waiting for it if needed) and the right
  // neighbour's receipt of ours. Algorithms need not call it: wait() checks the
  // header first, and the communicator calls finish() after the algorithm.
  void finish();

  // Checks the left neighbour's header now, before any data of this call leaves:
  // for algorithms where a rank sends without first waiting on a receive (a
  // broadcast's root), so a mismatch it can see stops its data going out.
  void confirm_header() { check_header(); }

  // Throws `code` with the call's context after telling the other ranks.
  [[noreturn]] void fail(ErrorCode code, const std::string& what);

 private:
  void check_header();
  void spin_until_done(Request& request, const char* what);
  [[noreturn]] void raise_abort(const ControlMessage& abort);

  CommunicatorImpl& comm_;
  WireHeader header_;
  int rank_, size_;
  Deadline deadline_;
  std::array<uint8_t, WireHeader::kBytes> header_out_{};
  std::array<uint8_t, WireHeader::kBytes> header_in_{};
  RequestPtr header_send_, header_recv_;
  bool header_checked_ = false;
};

class CommunicatorImpl {
 public:
  CommunicatorImpl(std::unique_ptr<Transport> transport, std::chrono::milliseconds timeout,
                   std::unique_ptr<Store> store = nullptr);
  ~CommunicatorImpl();

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  Transport& transport() { return *transport_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  Stats& mutable_stats() { return stats_; }
  Stats stats() const { return stats_; }

  void allreduce(TensorView t, ReduceOp op, const CompressOptions& options);
  void allgather(TensorView in, TensorView out);
  // Variable-size allgather: rank r contributes `in` (counts[r] elements, agreed
  // by a first exchange inside); returns the per-rank counts; `out` is resized to
  // the total, rank blocks in rank order. Internal (sparse allgather builds on it).
  std::vector<int64_t> allgatherv(const void* in, int64_t count, DType dtype, std::vector<uint8_t>& out);
  void broadcast(TensorView t, int root);
  void barrier();
  // Waits for the stream-ordered work of CUDA calls (with the deadline) and
  // raises its error; for CPU tensors, whose calls block, there is nothing to do.
  void synchronize();
  // "auto" | "ucx" | "nccl" (InitOptions::transport): how CUDA tensors travel,
  // decided at the first CUDA call (gpu_plan.h). Set before any call.
  void set_transport_preference(const std::string& preference);
  // "nccl" or "staging" once the first CUDA call chose; "" before (tests, logs).
  std::string cuda_path() const;
  // The last step of creation: a barrier numbered 0 (user calls count from 1).
  void connect_barrier();

  std::vector<uint8_t> save_state() const { return serialize_state(state_, rank(), size()); }
  // All or nothing: on any error the current state is left as it was.
  void load_state(std::span<const uint8_t> bytes) { state_ = parse_state(bytes, rank(), size()); }
  CompressionState& compression_state() { return state_; }

  // Records the first failure; every later call raises it again.
  void mark_failed(ErrorCode code, const std::string& message);
  // Aborts other ranks sent: the first is kept until the call it names (or an
  // earlier call that cannot complete without that rank) raises it.
  std::optional<ControlMessage>& pending_abort() { return pending_abort_; }

 private:
  // Validates state, numbers the call (unless `numbered` is false: seq 0), runs
  // `body` inside an Op and accounts time.
  template <class Body>
  void run(WireHeader header, Body&& body, bool numbered = true);
  void check_usable() const;
  void check_tensor(const TensorView& t, const char* op, const char* name) const;
  // CUDA tensors (comm_impl_cuda.cc, CUDA builds only). gpu_setup runs the
  // numbered setup call at a communicator's first CUDA call (every rank's first
  // CUDA call must be the same call) and checks the device later on; the others
  // run inside the call's Op and only enqueue on the NCCL path.
  void gpu_setup(int device, const char* op);
  // A compressed call: the NCCL path runs the GPU codecs with `spec` and the key's
  // state; the staging path runs `host_engine` (the CPU engine) on a host copy.
  struct GpuCompressed {
    const CompressorSpec* spec;
    KeyState* key;  // null for stateless specs without a key
    uint64_t key_hash;
    const std::function<void(float* host)>* host_engine;
  };
  void gpu_allreduce(Op& op, TensorView t, ReduceOp reduce_op, void* stream, const GpuCompressed* compressed);
  void gpu_allgather(Op& op, TensorView in, TensorView out);
  void gpu_broadcast(Op& op, TensorView t, int root);
  void gpu_synchronize();
  void gpu_abort() noexcept;
  // Raises an abort another rank sent, if one has arrived (GPU waits poll it).
  void watch_for_aborts();

  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Store> store_;  // rank 0 serves the TCP store for the job's lifetime
  std::chrono::milliseconds timeout_;
  uint64_t next_seq_ = 1;
  Stats stats_;
  CompressionState state_;
  CompressionEngine compression_;
  std::optional<std::pair<ErrorCode, std::string>> failure_;
  std::optional<ControlMessage> pending_abort_;
  std::string transport_preference_ = "auto";
  std::unique_ptr<GpuContext> gpu_;  // created at the first CUDA call
};

}  // namespace gradcomm::detail
